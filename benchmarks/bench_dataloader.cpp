// DataLoader<dynamic_extent> throughput (#16): a map-style Dataset of 50000 uint8 3x32x32 images
// (CIFAR-10 shaped) and int64 labels in host memory; batch 512, shuffled, read by worker threads,
// collated into pinned memory (one memcpy per sample), copied to the GPU on the loader's side
// stream and normalised there (normalize_images). One JSON line per workload with images/s over
// a whole epoch (median over --reps epochs; the GPU work is synchronised at the epoch's end).
// Target on the H200 machine (16 cores): >= 100k images/s for dataloader_w4_pin_cuda. The issue's
// other row, the loader feeding a GPU-bound consumer (ResNet-18's AMP step), is tg_bench_cnn's
// resnet18_amp_dataloader_* (that program has the step).
//
//   tg_bench_dataloader [--reps N] [--warmup N] [--only SUBSTRING]
#include <tapegrad/tapegrad.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/bench_util.h"

namespace {

using tg::bench::emit;
using tg::bench::median;
using tg::bench::now_s;
using tg::bench::Options;

constexpr int64_t kImages = 50000;
constexpr int64_t kBatch = 512;

// Sample i: views of row i of the image and label tensors (no copy).
class Images : public tg::data::Dataset {
 public:
  Images() {
    images_ = tg::tensor(tg::bench::random_bytes(static_cast<size_t>(kImages * 3 * 32 * 32)), {kImages, 3, 32, 32});
    labels_ = tg::randperm(kImages);
  }
  int64_t size() const override { return kImages; }
  std::vector<tg::Tensor> get(int64_t i) const override { return {images_.select(0, i), labels_.select(0, i)}; }

 private:
  tg::Tensor images_, labels_;
};

void run(const Options& o, const std::shared_ptr<Images>& ds, const std::string& name, int64_t workers, bool pin,
         bool cuda) {
  if (!o.wants(name)) return;
  tg::data::DatasetLoaderOptions opts{.batch_size = kBatch, .shuffle = true, .num_workers = workers,
                                      .pin_memory = pin, .seed = 0};
  if (cuda) opts.device = tg::Device(tg::kCUDA);
  tg::data::DataLoader loader(ds, opts);
  const std::vector<double> mean{0.4914, 0.4822, 0.4465}, stdv{0.2470, 0.2435, 0.2616};
  auto epoch = [&] {
    const double t0 = now_s();
    tg::Tensor acc;
    for (const std::vector<tg::Tensor>& b : loader) {
      tg::Tensor x = tg::data::normalize_images(b[0], mean, stdv);
      tg::Tensor s = x.sum();
      acc = acc.defined() ? acc + s : s;
    }
    if (cuda) tg::cuda::synchronize();
    (void)acc.item<float>();
    return now_s() - t0;
  };
  for (int i = 0; i < o.warmup; ++i) epoch();
  std::vector<double> secs;
  for (int r = 0; r < o.reps; ++r) secs.push_back(epoch());
  const double s = median(secs);
  char extra[160];
  std::snprintf(extra, sizeof(extra), "\"images\": %lld, \"batch\": %lld, \"workers\": %lld",
                static_cast<long long>(kImages), static_cast<long long>(kBatch), static_cast<long long>(workers));
  emit(name, kImages / s, "images/s", s * 1e3, extra);
  std::fprintf(stderr, "%s: %.0f images/s (%.1f ms per epoch of %lld images, batch %lld, %lld workers)%s\n",
               name.c_str(), kImages / s, s * 1e3, static_cast<long long>(kImages), static_cast<long long>(kBatch),
               static_cast<long long>(workers), name == "dataloader_w4_pin_cuda" ? "; target >= 100000" : "");
}

}  // namespace

int main(int argc, char** argv) {
  Options o = tg::bench::parse_options(argc, argv);
  auto ds = std::make_shared<Images>();
  const bool gpu = tg::cuda::is_available();
  if (gpu) {
    run(o, ds, "dataloader_w4_pin_cuda", 4, true, true);
    run(o, ds, "dataloader_w8_pin_cuda", 8, true, true);
    run(o, ds, "dataloader_w0_pin_cuda", 0, true, true);
  } else {
    std::fprintf(stderr, "tg_bench_dataloader: no CUDA device; timing the CPU path only\n");
  }
  run(o, ds, "dataloader_w4_cpu", 4, false, false);
  return 0;
}
