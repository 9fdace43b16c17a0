// Issue 15's fused kernels on CUDA: layer_norm forward + backward (input, weight and bias
// gradients) on [32768, 768] and [8192, 4096] in float32 and bfloat16, and embedding forward +
// backward (50304 x 768 float32 table, 32768 indices, deterministic backward). Device time with
// CUDA events around kItersPerRep iterations, median over --reps. One JSON line per workload, with
// the bytes each iteration must move and the bandwidth that is (against the H200's 4.8 TB/s).
//
//   tg_bench_norm [--reps N] [--warmup N] [--only SUBSTRING]
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

constexpr int kItersPerRep = 10;

double time_ms(const Options& o, const std::function<void()>& iter) {
  for (int i = 0; i < o.warmup * kItersPerRep; ++i) iter();
  tg::cuda::synchronize();
  tg::cuda::Event start, end;
  std::vector<double> ms;
  for (int r = 0; r < o.reps; ++r) {
    start.record();
    for (int i = 0; i < kItersPerRep; ++i) iter();
    end.record();
    end.synchronize();
    ms.push_back(start.elapsed_ms(end) / kItersPerRep);
  }
  return median(ms);
}

void emit_bw(const std::string& name, double ms, double bytes) {
  char extra[160];
  std::snprintf(extra, sizeof(extra), "\"bytes\": %.6g, \"tb_per_s\": %.3g", bytes, bytes / (ms * 1e-3) / 1e12);
  emit(name, ms, "ms", ms, extra);
}

void layer_norm(const Options& o, int64_t rows, int64_t cols, tg::DType dt, const char* dname) {
  const std::string name = "layer_norm_fwd_bwd_" + std::to_string(rows) + "x" + std::to_string(cols) + "_" + dname;
  if (!o.wants(name)) return;
  auto opts = tg::TensorOptions().device(tg::kCUDA).dtype(dt);
  tg::Tensor x = tg::randn({rows, cols}, opts).requires_grad_();
  tg::Tensor w = tg::randn({cols}, opts).requires_grad_();
  tg::Tensor b = tg::randn({cols}, opts).requires_grad_();
  tg::Tensor g = tg::randn({rows, cols}, opts);
  const double ms = time_ms(o, [&] {
    x.mutable_grad() = tg::Tensor();
    w.mutable_grad() = tg::Tensor();
    b.mutable_grad() = tg::Tensor();
    tg::nn::functional::layer_norm(x, {cols}, w, b).backward(g);
  });
  // Forward reads x, writes y; backward reads x and dy, writes dx (weights and stats are small).
  emit_bw(name, ms, 5.0 * static_cast<double>(rows * cols) * static_cast<double>(tg::element_size(dt)));
}

void embedding(const Options& o) {
  const std::string name = "embedding_fwd_bwd_50304x768_32768";
  if (!o.wants(name)) return;
  const int64_t num = 50304, dim = 768, n = 32768;
  tg::Tensor w = tg::randn({num, dim}, tg::kCUDA).requires_grad_();
  tg::Tensor idx = (tg::rand({n}, tg::kCUDA) * static_cast<double>(num)).to(tg::kInt64).clamp(0, num - 1);
  tg::Tensor g = tg::randn({n, dim}, tg::kCUDA);
  const double ms = time_ms(o, [&] {
    w.mutable_grad() = tg::Tensor();
    tg::nn::functional::embedding(idx, w).backward(g);
  });
  // Forward gathers n rows and writes them; backward zero-fills the table gradient, reads the n
  // gradient rows and writes at most n rows.
  const double row = dim * 4.0;
  emit_bw(name, ms, 4.0 * n * row + static_cast<double>(num) * row);
}

}  // namespace

int main(int argc, char** argv) {
  Options o = tg::bench::parse_options(argc, argv);
  if (!tg::cuda::is_available()) {
    std::fprintf(stderr, "tg_bench_norm: no CUDA device\n");
    return 0;
  }
  layer_norm(o, 32768, 768, tg::kFloat32, "fp32");
  layer_norm(o, 32768, 768, tg::kBFloat16, "bf16");
  layer_norm(o, 8192, 4096, tg::kFloat32, "fp32");
  layer_norm(o, 8192, 4096, tg::kBFloat16, "bf16");
  embedding(o);
  return 0;
}
