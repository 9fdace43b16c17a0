// Export a model for inference: trace it, print the graph, save it, load it back
// without the code that defined it, run it, and write an ONNX file for other
// runtimes (ONNX Runtime, TensorRT, ...). CUDA when available, else the CPU.
//
//   export_model [--device cpu|cuda]
#include <cstdio>
#include <iostream>
#include <string>
#include <tapegrad/tapegrad.h>

#include "cli.h"

struct Net : tg::nn::Module {
  tg::Tensor forward(const tg::Tensor& x) override { return x * 2 + 1; }
};

int main(int argc, char** argv) {
  std::string device_name;
  examples::App app{"Trace, save, reload and run a model; write it as ONNX (into the working directory)",
                    "export_model"};
  examples::add_device_option(app, device_name);
  if (int rc = examples::parse(app, argc, argv); rc >= 0) return rc;
  const auto picked = examples::pick_device(app, device_name);
  if (!picked) return 2;
  const tg::Device device = *picked;
  std::cout << "device: " << device << "\n";

  Net net;
  auto ep = tg::export_module(net, {tg::randn({4, 4}, device)});
  std::cout << ep.graph();
  ep.save("net.tgx");
  ep.save_onnx("net.onnx");  // for ONNX Runtime, TensorRT, ...
  auto x = tg::randn({4, 4}, device);
  auto out = tg::ExportedProgram::load("net.tgx").run({x});
  std::printf("max |run - forward| = %g\n", (out[0] - net(x)).abs().max().item<double>());

  // An MLP with a symbolic batch dim.
  tg::nn::Sequential mlp(tg::nn::Linear(16, 32), tg::nn::ReLU(), tg::nn::Linear(32, 4));
  mlp.to(device);
  auto mep = tg::export_module(mlp, {tg::randn({8, 16}, device)}, {.dynamic_batch = true});
  std::cout << mep.graph();
  mep.save("mlp.tgx");
  mep.save_onnx("mlp.onnx");
  auto xb = tg::randn({100, 16}, device);
  auto yb = tg::ExportedProgram::load("mlp.tgx").run({xb})[0];
  std::printf("mlp: batch %lld -> %s, max |run - forward| = %g\n", static_cast<long long>(xb.size(0)),
              yb.sizes().str().c_str(), (yb - mlp(xb)).abs().max().item<double>());
  std::printf("wrote net.tgx/, net.onnx, mlp.tgx/, mlp.onnx\n");
}
