// scaled_dot_product_attention on CUDA (issue 18): causal bf16, forward and forward + backward, the
// issue's two shapes, against compare_torch.py's torch.nn.functional.scaled_dot_product_attention
// rows. Device time with CUDA events around one call; the median of --reps repeats after --warmup.
// FLOPs as PyTorch's figures in the issue: forward 4 B H T^2 D, halved when causal; forward +
// backward 3.5x the forward. Each shape gives an ms row and a TFLOP/s row; forward + backward also
// once with use_deterministic_algorithms(false) (`_fwd_bwd_atomic_dq`: PyTorch's default algorithm class).
//
//   tg_bench_attention [--reps N] [--warmup N] [--only SUBSTRING] [--cudnn-benchmark]
// --cudnn-benchmark: cuDNN's candidate engines timed at each graph's first call (backends::cudnn).
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
namespace F = tg::nn::functional;

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

void sdpa_causal(const Options& o, int64_t B, int64_t H, int64_t T, int64_t D) {
  const std::string base = "sdpa_causal_bf16_B" + std::to_string(B) + "_H" + std::to_string(H) + "_T" +
                           std::to_string(T) + "_D" + std::to_string(D);
  const double fwd_flops = 4.0 * B * H * static_cast<double>(T) * T * D / 2;
  const auto opts = tg::TensorOptions().dtype(tg::kBFloat16).device(tg::kCUDA);
  tg::Tensor q = tg::randn({B, H, T, D}, opts), k = tg::randn({B, H, T, D}, opts), v = tg::randn({B, H, T, D}, opts);
  tg::Tensor g = tg::randn({B, H, T, D}, opts);
  auto rows = [&](const std::string& name, double ms, double flops) {
    const double tflops = flops / (ms * 1e-3) / 1e12;
    char extra[96];
    std::snprintf(extra, sizeof(extra), "\"TFLOP_per_s\": %.1f", tflops);
    emit(name, ms, "ms", ms, extra);
    emit(name + "_tflops", tflops, "TFLOP/s", ms);
  };
  if (o.wants(base + "_fwd")) {
    tg::NoGradGuard no_grad;
    const double ms = time_ms(o, [&] { F::scaled_dot_product_attention(q, k, v, {.is_causal = true}); });
    rows(base + "_fwd", ms, fwd_flops);
  }
  auto fwd_bwd_ms = [&] {
    tg::Tensor qg = q.detach().requires_grad_(true), kg = k.detach().requires_grad_(true),
               vg = v.detach().requires_grad_(true);
    return time_ms(o, [&] {
      qg.mutable_grad() = tg::Tensor();
      kg.mutable_grad() = tg::Tensor();
      vg.mutable_grad() = tg::Tensor();
      F::scaled_dot_product_attention(qg, kg, vg, {.is_causal = true}).backward(g);
    });
  };
  // tapegrad's default: cuDNN's deterministic backward (use_deterministic_algorithms is true).
  if (o.wants(base + "_fwd_bwd")) rows(base + "_fwd_bwd", fwd_bwd_ms(), 3.5 * fwd_flops);
  // use_deterministic_algorithms(false): cuDNN's atomic dQ accumulation, the algorithm class of
  // PyTorch's default flash backward, so this row compares like with like.
  if (o.wants(base + "_fwd_bwd_atomic_dq")) {
    const bool det = tg::are_deterministic_algorithms_enabled();
    tg::use_deterministic_algorithms(false);
    const double ms = fwd_bwd_ms();
    tg::use_deterministic_algorithms(det);
    rows(base + "_fwd_bwd_atomic_dq", ms, 3.5 * fwd_flops);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool cudnn_benchmark = false;
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--cudnn-benchmark")
      cudnn_benchmark = true;
    else
      argv[out++] = argv[i];
  }
  argc = out;
  Options o = tg::bench::parse_options(argc, argv);
  if (cudnn_benchmark && tg::cuda::is_available()) tg::backends::cudnn::set_benchmark(true);
  if (!tg::cuda::is_available()) {
    std::fprintf(stderr, "tg_bench_attention: no CUDA device\n");
    return 0;
  }
  sdpa_causal(o, 32, 12, 1024, 64);
  sdpa_causal(o, 4, 16, 8192, 128);
  return 0;
}
