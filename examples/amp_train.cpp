// The seed's mixed-precision training program: Linear(4096, 4096) trained with SGD
// (lr 1e-3) on batches of 256 randn rows, loss = model(inp).pow(2).mean(), the
// forward under autocast and a GradScaler around backward / step. Prints the loss,
// the final scale, the time per step and the peak GPU memory.
//
//   amp_train [--dtype fp16|bf16|off] [--device cuda|cpu | --cpu] [--steps N] [--warmup N] [--batch N]
//             [--features N] [--cuda-graph] [--init FILE --data FILE --init-scale S --log FILE]
//
// Defaults: fp16 on CUDA, 100 timed steps after 5 warm-up steps. --device cpu (or --cpu) trains
// on the CPU (bfloat16 unless --dtype says otherwise; use fewer steps there).
// --cuda-graph: after the warm-up steps (at least 3, on a side stream), one training
// step is captured into a tg::cuda::Graph and the timed steps replay it. Each step's
// fresh randn batch is drawn into the input tensor the graph reads (normal_) before the replay.
// Fidelity mode (tests/parity/amp_fidelity.py): --init loads "weight" and "bias", --data the
// batches ("x", [steps, batch, features]); every batch is one step from --init-scale, and each
// step's loss and scale after update() go to --log as "step loss scale" lines. No timing.
#include <tapegrad/tapegrad.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>

#include "cli.h"

#include <tapegrad/amp/amp.h>
#include <tapegrad/optim/optim.h>

namespace {

struct Args {
  std::string dtype;  // "" = the device's default
  bool cpu = false;
  std::string device = "cuda";
  int steps = 100;
  int warmup = 5;
  int64_t batch = 256;
  int64_t features = 4096;
  bool cuda_graph = false;
  std::string init, data, log;  // fidelity mode
  double init_scale = 65536.0;
};

}  // namespace

int main(int argc, char** argv) {
  Args args;
  examples::App app{"Mixed-precision training: Linear(F, F) with SGD under autocast and a GradScaler", "amp_train"};
  app.add_option("--dtype", args.dtype, "autocast dtype: fp16, bf16 or off (default: the device's)")
      ->check(CLI::IsMember({"fp16", "bf16", "off"}));
  examples::add_device_option(app, args.device, "cuda (gpu: cuda) or cpu");
  app.add_flag("--cpu", args.cpu, "train on the CPU (the same as --device cpu)");
  app.add_option("--steps", args.steps, "timed steps")->check(examples::kPositive);
  app.add_option("--warmup", args.warmup, "warm-up steps (at least 3 with --cuda-graph)")
      ->check(examples::kNonNegative);
  app.add_option("--batch", args.batch, "batch size")->check(examples::kPositive);
  app.add_option("--features", args.features, "F: features in and out")->check(examples::kPositive);
  app.add_flag("--cuda-graph", args.cuda_graph, "capture one step into a CUDA graph and replay it");
  app.add_option("--init", args.init, "fidelity mode: initial 'weight' and 'bias' (safetensors)");
  app.add_option("--data", args.data, "fidelity mode: batches 'x' [steps, batch, features] (safetensors)");
  app.add_option("--log", args.log, "fidelity mode: 'step loss scale' lines go here");
  app.add_option("--init-scale", args.init_scale, "fidelity mode: the GradScaler's initial scale")
      ->check(examples::kPositive);
  if (int rc = examples::parse(app, argc, argv); rc >= 0) return rc;
  const bool device_given = app.count("--device") > 0;
  if (args.cpu && device_given && args.device != "cpu")
    return examples::usage_error(app, "--cpu and --device " + args.device);
  if (args.cpu) args.device = "cpu";
  if (args.cuda_graph && args.device == "cpu") return examples::usage_error(app, "--cuda-graph needs the GPU");
  if (args.cuda_graph && args.warmup < 3) args.warmup = 3;  // eager warm-up on the capture stream before capturing
  if (args.init.empty() != args.data.empty() || args.init.empty() != args.log.empty())
    return examples::usage_error(app, "--init, --data and --log go together");
  const auto picked = examples::pick_device(app, args.device);
  if (!picked) return 2;
  try {
    const tg::Device dev = *picked;
    const bool on_gpu = dev.is_cuda();
    const bool amp_on = args.dtype != "off";
    std::optional<tg::DType> low;  // nullopt: the device type's default (fp16 CUDA, bf16 CPU)
    if (args.dtype == "fp16") low = tg::kFloat16;
    if (args.dtype == "bf16") low = tg::kBFloat16;

    if (!args.data.empty()) {  // fidelity mode: the given weights and batches, a log per step
      const tg::nn::StateDict init = tg::load(args.init);
      const tg::Tensor batches = tg::load(args.data).at("x").to(dev);
      tg::nn::Linear model(batches.size(2), init.at("weight").size(0));
      model.load_state_dict(init);
      model.to(dev);
      tg::optim::SGD opt(model.parameters(), {.lr = 1e-3});
      tg::amp::GradScaler scaler({.init_scale = args.init_scale, .enabled = amp_on});
      std::FILE* log = std::fopen(args.log.c_str(), "w");
      if (!log) throw std::runtime_error("cannot write " + args.log);
      for (int64_t i = 0; i < batches.size(0); ++i) {
        opt.zero_grad();
        tg::Tensor loss;
        {
          tg::amp::autocast guard(dev.type(), low, amp_on);
          loss = model(batches.select(0, i)).pow(2).mean();
        }
        scaler.scale(loss).backward();
        scaler.step(opt);
        scaler.update();
        std::fprintf(log, "%lld %.9g %.9g\n", static_cast<long long>(i), loss.item<double>(), scaler.get_scale());
      }
      std::fclose(log);
      tg::save(model.state_dict(), args.log + ".safetensors");
      return 0;
    }
    tg::manual_seed(0);
    tg::nn::Linear model(args.features, args.features);
    model.to(dev);
    tg::optim::SGD opt(model.parameters(), {.lr = 1e-3});
    tg::amp::GradScaler scaler({.enabled = amp_on});

    // With --cuda-graph everything runs on a side stream: capture cannot use the legacy
    // default stream, and warming up on the capture stream lets the capture reuse cached memory.
    std::optional<tg::cuda::Stream> side;
    std::optional<tg::cuda::StreamGuard> side_guard;
    if (args.cuda_graph) {
      side.emplace();
      side_guard.emplace(*side);
    }

    tg::Tensor loss, inp;
    auto train_step = [&] {  // reads `inp`
      opt.zero_grad();
      {
        tg::amp::autocast guard(dev.type(), low, amp_on);
        loss = model(inp).pow(2).mean();
      }
      scaler.scale(loss).backward();
      scaler.step(opt);
      scaler.update();
    };
    tg::cuda::Graph graph;
    auto step = [&] {
      if (graph.is_captured()) {
        inp.normal_();  // new data, drawn straight into the graph's input
        graph.replay();
      } else {
        inp = tg::randn({args.batch, args.features}, dev);
        train_step();
      }
    };

    for (int i = 0; i < args.warmup; ++i) step();
    const double first_loss = args.warmup > 0 ? loss.item<double>() : 0.0;
    if (args.cuda_graph) {
      // Records one step; nothing runs until replay(). `loss` is then the graph's output
      // tensor, rewritten by every replay.
      graph.capture(train_step);
      std::printf("captured one training step: %zu graph nodes\n", graph.num_nodes());
    }
    double ms = 0;
    if (on_gpu) {
      tg::cuda::synchronize();
      tg::cuda::reset_peak_memory_stats();
      tg::cuda::Event start, end;
      start.record();
      for (int i = 0; i < args.steps; ++i) step();
      end.record();
      end.synchronize();
      ms = start.elapsed_ms(end);
    } else {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < args.steps; ++i) step();
      (void)loss.item<double>();
      ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }

    const char* mode = !amp_on ? "float32" : tg::dtype_name(low.value_or(tg::amp::get_dtype(dev.type())));
    std::printf("amp_train: Linear(%lld, %lld), batch %lld, %s on %s%s\n", static_cast<long long>(args.features),
                static_cast<long long>(args.features), static_cast<long long>(args.batch), mode,
                dev.str().c_str(), args.cuda_graph ? ", replaying a CUDA graph" : "");
    if (args.warmup > 0) std::printf("loss after warm-up %.6g, ", first_loss);
    std::printf("loss after %d more steps %.6g, scale %g\n", args.steps, loss.item<double>(), scaler.get_scale());
    std::printf("%d steps: %.3f ms total, %.1f us/step\n", args.steps, ms, ms * 1e3 / args.steps);
    if (on_gpu)
      std::printf("peak GPU memory: %.1f MiB\n",
                  static_cast<double>(tg::cuda::max_memory_allocated()) / (1024.0 * 1024.0));
  } catch (const tg::Error& e) {
    std::fprintf(stderr, "amp_train: %s\n", e.what());
    return 1;
  }
  return 0;
}
