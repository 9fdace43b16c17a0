// softmax / cross_entropy forward + backward on CUDA (issue 15): the fused row kernels against
// PyTorch's in compare_torch.py. Device time with CUDA events around one fwd+bwd; the median of
// --reps repeats after --warmup. Each line also gives the bandwidth achieved over the minimum bytes
// the step must move (softmax: read x, write y, read y and g, write the gradient; cross_entropy:
// read the logits, write their gradient), against the H200's 4.8 TB/s.
//
//   tg_bench_softmax [--reps N] [--warmup N] [--only SUBSTRING]
#include <tapegrad/tapegrad.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "benchmarks/bench_util.h"

namespace {

using tg::bench::emit;
using tg::bench::median;
using tg::bench::Options;

double time_ms(const Options& o, const std::function<void()>& step) {
  for (int i = 0; i < o.warmup; ++i) step();
  tg::cuda::synchronize();
  tg::cuda::Event start, end;
  std::vector<double> ms;
  for (int r = 0; r < o.reps; ++r) {
    start.record();
    step();
    end.record();
    end.synchronize();
    ms.push_back(start.elapsed_ms(end));
  }
  return median(ms);
}

void report(const std::string& name, double ms, double bytes) {
  char extra[160];
  const double gbps = bytes / (ms * 1e-3) / 1e9;
  std::snprintf(extra, sizeof(extra), "\"GB_per_s\": %.1f, \"of_4800_GB_per_s\": %.3f, \"min_bytes\": %.0f", gbps,
                gbps / 4800.0, bytes);
  emit(name, ms, "ms", ms, extra);
}

void softmax_fwd_bwd(const Options& o, int64_t rows, int64_t cols, tg::DType dt, const char* tag) {
  const std::string name = "softmax_fwd_bwd_" + std::to_string(rows) + "x" + std::to_string(cols) + "_" + tag;
  if (!o.wants(name)) return;
  tg::Tensor x = tg::randn({rows, cols}, tg::kCUDA).to(dt).requires_grad_(true);
  tg::Tensor g = tg::randn({rows, cols}, tg::kCUDA).to(dt);
  const double ms = time_ms(o, [&] {
    x.mutable_grad() = tg::Tensor();
    tg::softmax(x, -1).backward(g);
  });
  report(name, ms, 5.0 * static_cast<double>(x.nbytes()));
}

void cross_entropy_fwd_bwd(const Options& o, int64_t rows, int64_t cols, tg::DType dt, const char* tag) {
  const std::string name = "cross_entropy_fwd_bwd_" + std::to_string(rows) + "x" + std::to_string(cols) + "_" + tag;
  if (!o.wants(name)) return;
  tg::Tensor x = tg::randn({rows, cols}, tg::kCUDA).to(dt).requires_grad_(true);
  // random class indices in [0, cols)
  tg::Tensor t = tg::clamp(tg::rand({rows}, tg::kCUDA) * static_cast<double>(cols), 0, cols - 1).to(tg::kInt64);
  const double ms = time_ms(o, [&] {
    x.mutable_grad() = tg::Tensor();
    tg::nn::functional::cross_entropy(x, t).backward();
  });
  report(name, ms, 2.0 * static_cast<double>(x.nbytes()));
}

}  // namespace

int main(int argc, char** argv) {
  Options o = tg::bench::parse_options(argc, argv);
  if (!tg::cuda::is_available()) {
    std::fprintf(stderr, "tg_bench_softmax: no CUDA device\n");
    return 0;
  }
  softmax_fwd_bwd(o, 16384, 4096, tg::kFloat32, "fp32");
  softmax_fwd_bwd(o, 16384, 4096, tg::kBFloat16, "bf16");
  softmax_fwd_bwd(o, 4096, 50304, tg::kFloat32, "fp32");
  softmax_fwd_bwd(o, 4096, 50304, tg::kBFloat16, "bf16");
  cross_entropy_fwd_bwd(o, 16384, 50304, tg::kBFloat16, "bf16");
  return 0;
}
