// The seed's mixed-precision training program: Linear(4096, 4096) trained with SGD
// (lr 1e-3) on batches of 256 randn rows, loss = model(inp).pow(2).mean(), the
// forward under autocast and a GradScaler around backward / step. Prints the loss,
// the final scale, the time per step and the peak GPU memory.
//
//   amp_train [--dtype fp16|bf16|off] [--cpu] [--steps N] [--warmup N] [--batch N] [--features N]
//             [--cuda-graph] [--init FILE --data FILE --init-scale S --log FILE]
//
// Defaults: fp16 on CUDA, 100 timed steps after 5 warm-up steps. --cpu trains on
// the CPU (bfloat16 unless --dtype says otherwise; use fewer steps there).
// --cuda-graph: after the warm-up steps (at least 3, on a side stream), one training
// step is captured into a tg::cuda::Graph and the timed steps replay it. Each step's
// fresh randn batch is drawn into the input tensor the graph reads (normal_) before the replay.
// Fidelity mode (tests/parity/amp_fidelity.py): --init loads "weight" and "bias", --data the
// batches ("x", [steps, batch, features]); every batch is one step from --init-scale, and each
// step's loss and scale after update() go to --log as "step loss scale" lines. No timing.
#include <tapegrad/tapegrad.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include <tapegrad/amp/amp.h>
#include <tapegrad/optim/optim.h>

namespace {

struct Args {
  std::string dtype;  // "" = the device's default
  bool cpu = false;
  int steps = 100;
  int warmup = 5;
  int64_t batch = 256;
  int64_t features = 4096;
  bool cuda_graph = false;
  std::string init, data, log;  // fidelity mode
  double init_scale = 65536.0;
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "%s\nusage: amp_train [--dtype fp16|bf16|off] [--cpu] [--steps N] [--warmup N] [--batch N] "
               "[--features N] [--cuda-graph]\n",
               msg);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    auto next = [&](const char* flag) -> const char* {
      if (i + 1 >= argc) usage((std::string(flag) + " needs a value").c_str());
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--dtype")) a.dtype = next("--dtype");
    else if (!std::strcmp(argv[i], "--cpu")) a.cpu = true;
    else if (!std::strcmp(argv[i], "--steps")) a.steps = std::atoi(next("--steps"));
    else if (!std::strcmp(argv[i], "--warmup")) a.warmup = std::atoi(next("--warmup"));
    else if (!std::strcmp(argv[i], "--batch")) a.batch = std::atoll(next("--batch"));
    else if (!std::strcmp(argv[i], "--features")) a.features = std::atoll(next("--features"));
    else if (!std::strcmp(argv[i], "--cuda-graph")) a.cuda_graph = true;
    else if (!std::strcmp(argv[i], "--init")) a.init = next("--init");
    else if (!std::strcmp(argv[i], "--data")) a.data = next("--data");
    else if (!std::strcmp(argv[i], "--log")) a.log = next("--log");
    else if (!std::strcmp(argv[i], "--init-scale")) a.init_scale = std::atof(next("--init-scale"));
    else usage((std::string("unknown argument ") + argv[i]).c_str());
  }
  if (a.dtype != "" && a.dtype != "fp16" && a.dtype != "bf16" && a.dtype != "off") usage("--dtype: fp16, bf16 or off");
  if (a.steps < 1 || a.warmup < 0 || a.batch < 1 || a.features < 1) usage("sizes and counts must be positive");
  if (a.cuda_graph && a.cpu) usage("--cuda-graph needs the GPU (drop --cpu)");
  if (a.cuda_graph && a.warmup < 3) a.warmup = 3;
  if (a.init.empty() != a.data.empty() || a.init.empty() != a.log.empty())
    usage("--init, --data and --log go together");  // eager warm-up on the capture stream before capturing
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  try {
    const bool on_gpu = !args.cpu;
    if (on_gpu && !tg::cuda::is_available()) {
      std::fprintf(stderr, "amp_train: no CUDA device; run with --cpu\n");
      return 1;
    }
    const tg::Device dev = on_gpu ? tg::Device(tg::kCUDA) : tg::Device(tg::kCPU);
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
