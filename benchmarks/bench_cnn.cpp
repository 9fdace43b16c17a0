// Convolutional workloads of issue #17's table (compare_torch.py times the same in PyTorch):
//   resnet18_amp_step          ms/step  ResNet-18 (examples/resnet.h, 10 classes), batch 512 of 3x32x32,
//                                       autocast fp16 + GradScaler, SGD(lr 0.1, momentum 0.9, weight_decay
//                                       5e-4), cross_entropy; eager, 10 steps between two CUDA events
//   resnet18_amp_step_graph    ms/step  the same step captured once into a tg::cuda::Graph and replayed
//   conv2d_3x3_64_56x56_b128_bf16_fwd_bwd  ms  conv2d 3x3 64->64 pad 1, [128, 64, 56, 56] bf16, no bias:
//                                       forward + autograd::grad for input and weight
//   cpu_conv2d_3x3_32_32x32_b16_fp32_fwd   ms  CPU conv2d 3x3 32->32 pad 1, [16, 32, 32, 32] fp32, no bias,
//                                       forward only (host clock)
// The input and labels are drawn once and reused (PyTorch's side does the same). Channels-last:
// The CUDA rows run channels-last with cuDNN autotuning on (tg::backends::cudnn::set_benchmark), as
// PyTorch's rows (channels_last, cudnn.benchmark) in the table.
//
//   tg_bench_cnn [--reps N] [--warmup N] [--only SUBSTRING]
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.h>
#include "benchmarks/bench_util.h"
#include "examples/resnet.h"

namespace {

using tg::bench::emit;
using tg::bench::median;
namespace F = tg::nn::functional;

constexpr int64_t kBatch = 512, kClasses = 10, kStepsPerRep = 10;

// The model, optimizer, scaler and the fixed batch of one ResNet-18 AMP training step.
struct ResNetStep {
  ResNetStep() : model(kClasses) {
    model.to(tg::kCUDA);
    x = tg::randn({kBatch, 3, 32, 32}, tg::kCUDA);
    y = (tg::rand({kBatch}, tg::kCUDA) * static_cast<double>(kClasses)).to(tg::kInt64).clamp(0, kClasses - 1);
    // NHWC under AMP: the fast path for CNNs on H100 / H200 (and PyTorch's rows are channels_last).
    model.to(tg::MemoryFormat::ChannelsLast);
    x = x.contiguous(tg::MemoryFormat::ChannelsLast);
  }
  void step() {
    opt.zero_grad();
    tg::Tensor loss;
    {
      tg::amp::autocast guard(tg::kCUDA, tg::kFloat16);
      loss = F::cross_entropy(model(x), y);
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
  }
  resnet::ResNet18 model;
  tg::optim::SGD opt{model.parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4}};
  tg::amp::GradScaler scaler;
  tg::Tensor x, y;
};

// Median ms per call of `fn` over reps, `calls` calls between two CUDA events per repeat.
double cuda_ms(const tg::bench::Options& o, int calls, const std::function<void()>& fn) {
  for (int i = 0; i < o.warmup; ++i) fn();
  tg::cuda::synchronize();
  tg::cuda::Event start, end;
  std::vector<double> ms;
  for (int r = 0; r < o.reps; ++r) {
    start.record();
    for (int i = 0; i < calls; ++i) fn();
    end.record();
    end.synchronize();
    ms.push_back(start.elapsed_ms(end) / calls);
  }
  return median(ms);
}

// Runs one workload; a tg::Error (e.g. an op without a CUDA path yet) is reported, not fatal.
bool run(const tg::bench::Options& o, const std::string& name, const std::function<void()>& fn) {
  if (!o.wants(name)) return true;
  try {
    fn();
    return true;
  } catch (const tg::Error& e) {
    std::fprintf(stderr, "tg_bench_cnn: %s: %s\n", name.c_str(), e.what());
    return false;
  }
}

}  // namespace

int main(int argc, char** argv) {
  auto o = tg::bench::parse_options(argc, argv);
  bool ok = true;
  ok &= run(o, "cpu_conv2d_3x3_32_32x32_b16_fp32_fwd", [&] {
    tg::manual_seed(0);
    const tg::Tensor x = tg::randn({16, 32, 32, 32});
    const tg::Tensor w = tg::randn({32, 32, 3, 3}) * 0.06;
    tg::NoGradGuard no_grad;
    std::vector<double> t;
    for (int r = 0; r < o.warmup + o.reps; ++r) {
      const double t0 = tg::bench::now_s();
      for (int i = 0; i < 10; ++i) F::conv2d(x, w, tg::Tensor(), {.padding = 1});
      if (r >= o.warmup) t.push_back((tg::bench::now_s() - t0) * 1e3 / 10);
    }
    emit("cpu_conv2d_3x3_32_32x32_b16_fp32_fwd", median(t), "ms", median(t));
  });
  if (!tg::cuda::is_available()) {
    std::fprintf(stderr, "tg_bench_cnn: no CUDA device (CPU rows only)\n");
    return ok ? 0 : 1;
  }
  tg::backends::cudnn::set_benchmark(true);
  ok &= run(o, "conv2d_3x3_64_56x56_b128_bf16_fwd_bwd", [&] {
    tg::manual_seed(0);
    constexpr auto cl = tg::MemoryFormat::ChannelsLast;  // the row is NHWC
    const tg::Tensor x =
        tg::randn({128, 64, 56, 56}, tg::kCUDA).to(tg::kBFloat16).contiguous(cl).requires_grad_();
    const tg::Tensor w =
        (tg::randn({64, 64, 3, 3}, tg::kCUDA) * 0.04).to(tg::kBFloat16).contiguous(cl).requires_grad_();
    const tg::Tensor g = tg::randn({128, 64, 56, 56}, tg::kCUDA).to(tg::kBFloat16).contiguous(cl);
    const double ms = cuda_ms(o, 10, [&] {
      tg::Tensor out = F::conv2d(x, w, tg::Tensor(), {.padding = 1});
      tg::autograd::grad({out}, {x, w}, {g});
    });
    emit("conv2d_3x3_64_56x56_b128_bf16_fwd_bwd", ms, "ms", ms);
  });
  {
    ok &= run(o, "resnet18_amp_step", [&] {
      tg::cuda::synchronize();
      tg::cuda::empty_cache();
      tg::cuda::reset_peak_memory_stats();
      tg::manual_seed(0);
      ResNetStep s;
      for (int i = 0; i < 3; ++i) s.step();
      const double ms = cuda_ms(o, kStepsPerRep, [&] { s.step(); });
      emit("resnet18_amp_step", ms, "ms", ms,
           "\"batch\": 512, \"peak_mib\": " +
               std::to_string(static_cast<double>(tg::cuda::max_memory_allocated()) / (1024.0 * 1024.0)));
    });
  }
  ok &= run(o, "resnet18_amp_step_graph", [&] {
    tg::cuda::synchronize();
    tg::cuda::empty_cache();
    tg::manual_seed(0);
    tg::cuda::Stream side;  // capture needs a stream other than the legacy default
    tg::cuda::StreamGuard guard(side);
    ResNetStep s;
    for (int i = 0; i < 3; ++i) s.step();  // eager warm-up on the capture stream
    tg::cuda::Graph graph;
    const double c0 = tg::bench::now_s();
    graph.capture([&] { s.step(); });
    const double capture_ms = (tg::bench::now_s() - c0) * 1e3;
    const double ms = cuda_ms(o, kStepsPerRep, [&] { graph.replay(); });
    emit("resnet18_amp_step_graph", ms, "ms", ms,
         "\"graph_nodes\": " + std::to_string(graph.num_nodes()) + ", \"capture_ms\": " + std::to_string(capture_ms));
  });
  return ok ? 0 : 1;
}
