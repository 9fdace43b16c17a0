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
// Issue #16's DataLoader row (a GPU-bound consumer loses <= 5% to the loader; tapegrad only): the step fed
// by a DataLoader over a map-style Dataset of 50000 uint8 3x32x32 images in host memory (shuffled,
// drop_last, 4 workers, pinned, copied on the loader's side stream, normalize_images on the GPU),
// against the same step on loader batches kept resident on the GPU (normalised the same way);
// 30 steps per repeat, host clock around synchronised runs, the two interleaved:
//   resnet18_amp_dataloader_step           ms/step  fed by the DataLoader
//   resnet18_amp_dataloader_resident_step  ms/step  the batches already on the GPU
//   resnet18_amp_dataloader_loss           fraction fed / resident - 1 (target <= 0.05)
//
//   tg_bench_cnn [--reps N] [--warmup N] [--only SUBSTRING]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
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
  void step() { step(x, y); }
  // One step on another batch (xb on the GPU; channels-last is the fast layout).
  void step(const tg::Tensor& xb, const tg::Tensor& yb) {
    opt.zero_grad();
    tg::Tensor loss;
    {
      tg::amp::autocast guard(tg::kCUDA, tg::kFloat16);
      loss = F::cross_entropy(model(xb), yb);
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

// ---- issue 16: the DataLoader feeding the ResNet-18 step.
constexpr int64_t kImages = 50000, kFedSteps = 30;

// 50000 uint8 3x32x32 images and int64 labels in [0, 10) in host memory (tg_bench_dataloader's
// CIFAR-10-shaped data, with class labels); sample i is views of row i (no copy).
class HostImages : public tg::data::Dataset {
 public:
  HostImages() {
    images_ = tg::tensor(tg::bench::random_bytes(static_cast<size_t>(kImages * 3 * 32 * 32)), {kImages, 3, 32, 32});
    std::vector<int64_t> labels(static_cast<size_t>(kImages));
    for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i) % kClasses;
    labels_ = tg::tensor(labels, {kImages});
  }
  int64_t size() const override { return kImages; }
  std::vector<tg::Tensor> get(int64_t i) const override { return {images_.select(0, i), labels_.select(0, i)}; }

 private:
  tg::Tensor images_, labels_;
};

// uint8 [N, 3, 32, 32] on the GPU -> the float32 channels-last input of the step.
tg::Tensor prepare(const tg::Tensor& images) {
  static const std::vector<double> mean{0.4914, 0.4822, 0.4465}, stdv{0.2470, 0.2435, 0.2616};
  return tg::data::normalize_images(images, mean, stdv).contiguous(tg::MemoryFormat::ChannelsLast);
}

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
  if (o.wants("resnet18_amp_dataloader_step") || o.wants("resnet18_amp_dataloader_resident_step") ||
      o.wants("resnet18_amp_dataloader_loss")) {
    ok &= run(o, "resnet18_amp_dataloader_step", [&] {
      tg::cuda::synchronize();
      tg::cuda::empty_cache();
      tg::manual_seed(0);
      auto ds = std::make_shared<HostImages>();
      tg::data::DataLoader loader(ds, {.batch_size = kBatch, .shuffle = true, .drop_last = true, .num_workers = 4,
                                       .pin_memory = true, .device = tg::Device(tg::kCUDA), .seed = 0});
      // The loader's batches without end: a new epoch (shuffle, workers) starts when one is used up.
      auto it = loader.begin();
      auto next = [&] {
        if (it == loader.end()) {
          it = {};  // the finished epoch's workers are joined before the next one starts
          it = loader.begin();
        }
        std::vector<tg::Tensor> b = *it;
        ++it;
        return b;
      };
      ResNetStep s;
      auto fed = [&] {
        const std::vector<tg::Tensor> b = next();
        s.step(prepare(b[0]), b[1]);
      };
      // The same kind of batches, kept on the GPU: uint8 images and labels as the loader delivers them.
      std::vector<std::vector<tg::Tensor>> resident;
      for (int64_t i = 0; i < kFedSteps; ++i) resident.push_back(next());
      size_t r_next = 0;
      auto on_gpu = [&] {
        const std::vector<tg::Tensor>& b = resident[r_next++ % resident.size()];
        s.step(prepare(b[0]), b[1]);
      };
      for (int i = 0; i < std::max(o.warmup, 3); ++i) {  // cuDNN's autotuning, the workers started
        fed();
        on_gpu();
      }
      auto ms_per_step = [&](const std::function<void()>& step) {
        tg::cuda::synchronize();
        const double t0 = tg::bench::now_s();
        for (int64_t i = 0; i < kFedSteps; ++i) step();
        tg::cuda::synchronize();
        return (tg::bench::now_s() - t0) * 1e3 / static_cast<double>(kFedSteps);
      };
      std::vector<double> fed_ms, gpu_ms;
      for (int r = 0; r < o.reps; ++r) {  // interleaved, so that drift touches both alike
        gpu_ms.push_back(ms_per_step(on_gpu));
        fed_ms.push_back(ms_per_step(fed));
      }
      const double a = median(fed_ms), b = median(gpu_ms), loss = a / b - 1.0;
      const std::string extra = "\"batch\": 512, \"workers\": 4, \"steps\": " + std::to_string(kFedSteps) +
                                ", \"fed_ms\": " + std::to_string(a) + ", \"resident_ms\": " + std::to_string(b);
      emit("resnet18_amp_dataloader_step", a, "ms", a, extra);
      emit("resnet18_amp_dataloader_resident_step", b, "ms", b, extra);
      emit("resnet18_amp_dataloader_loss", loss, "fraction", a, extra);
      std::fprintf(stderr,
                   "resnet18_amp_dataloader: %.3f ms/step fed by the DataLoader, %.3f ms/step resident: "
                   "%+.1f%% (target <= +5%%)\n",
                   a, b, loss * 100.0);
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
