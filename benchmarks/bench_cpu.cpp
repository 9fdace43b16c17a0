// CPU matmul, 1024x1024 float32: tapegrad's tg::matmul against Eigen called directly on
// the same data (each allocating its output, as a user's code would). Median of >= 10
// repeats after warm-up, host clock. Prints one JSON line with the ratio tapegrad / Eigen.
// Also (issue 17) conv2d 3x3, 32 -> 32 channels, 32x32, batch 16, padding 1, float32 forward
// (no baseline here: compare_torch.py's torch run is the comparison).
//
//   tg_bench_cpu [--reps N] [--warmup N] [--only SUBSTRING] (n is fixed at 1024)
#include <tapegrad/tapegrad.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "benchmarks/bench_util.h"

namespace {
using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
}

// ---- issue 17: conv2d forward; checks a few outputs against a direct float64 sum. Returns 1 on a mismatch.
static int bench_conv2d(const tg::bench::Options& o) {
  using tg::bench::median;
  using tg::bench::now_s;
  const int64_t n = 16, c = 32, hw = 32, k = 3;
  tg::manual_seed(0);
  auto x = tg::randn({n, c, hw, hw});
  auto w = tg::randn({c, c, k, k});
  auto b = tg::randn({c});
  tg::NoGradGuard no_grad;
  tg::Tensor y;
  auto run = [&] { y = tg::nn::functional::conv2d(x, w, b, {.padding = 1}); };
  for (int i = 0; i < o.warmup; ++i) run();
  std::vector<double> ms;
  for (int r = 0; r < o.reps; ++r) {
    const double t0 = now_s();
    run();
    ms.push_back((now_s() - t0) * 1e3);
  }
  const double t = median(ms);
  auto xa = x.accessor<float, 4>();
  auto wa = w.accessor<float, 4>();
  auto ya = y.accessor<float, 4>();
  double worst = 0;
  for (int64_t s = 0; s < 64; ++s) {
    const int64_t ni = s % n, o2 = (s * 7) % c, oh = (s * 5) % hw, ow = (s * 11) % hw;
    double ref = b.data_ptr<float>()[o2];
    for (int64_t ci = 0; ci < c; ++ci)
      for (int64_t i = 0; i < k; ++i)
        for (int64_t j = 0; j < k; ++j) {
          const int64_t ih = oh - 1 + i, iw = ow - 1 + j;
          if (ih >= 0 && ih < hw && iw >= 0 && iw < hw) ref += double(xa[ni][ci][ih][iw]) * double(wa[o2][ci][i][j]);
        }
    worst = std::max(worst, std::abs(ref - double(ya[ni][o2][oh][ow])));
  }
  if (worst > 1e-3) std::fprintf(stderr, "tg_bench_cpu: conv2d differs from the direct sum by %g\n", worst);
  const double flops = 2.0 * n * c * hw * hw * c * k * k;
  char extra[128];
  std::snprintf(extra, sizeof(extra), "\"tg_threads\": %d", tg::get_num_threads());
  tg::bench::emit("cpu_conv2d_3x3_c32_32x32_b16", flops / (t * 1e-3) / 1e9, "GFLOP/s", t, extra);
  return worst > 1e-3 ? 1 : 0;
}

int main(int argc, char** argv) try {
  using tg::bench::median;
  using tg::bench::now_s;
  tg::bench::Options o = tg::bench::parse_options(argc, argv);
  const int conv_rc = o.wants("cpu_conv2d_3x3_c32_32x32_b16") ? bench_conv2d(o) : 0;
  if (!o.wants("cpu_matmul_1024")) return conv_rc;
  const int64_t n = 1024;
  const double flops = 2.0 * n * n * n;
  tg::manual_seed(0);
  auto a = tg::rand({n, n});
  auto b = tg::rand({n, n});
  Eigen::Map<const RowMatrix> ea(a.data_ptr<float>(), n, n);
  Eigen::Map<const RowMatrix> eb(b.data_ptr<float>(), n, n);

  auto time_ms = [&](auto&& fn) {
    for (int i = 0; i < o.warmup; ++i) fn();
    std::vector<double> ms;
    for (int r = 0; r < o.reps; ++r) {
      double t0 = now_s();
      fn();
      ms.push_back((now_s() - t0) * 1e3);
    }
    return median(ms);
  };
  tg::Tensor c;
  double tg_ms = time_ms([&] { c = tg::matmul(a, b); });
  RowMatrix ec;
  double eigen_ms = time_ms([&] { ec = ea * eb; });

  // Same product from both: a wrong result would make the timing meaningless.
  std::vector<float> hc = c.to_vector<float>();
  double worst = 0;
  for (int64_t i = 0; i < n * n; i += 4099) {
    worst = std::max(worst, std::abs(double(hc[i]) - double(ec.data()[i])) / std::abs(double(ec.data()[i])));
  }
  if (worst > 1e-4) std::fprintf(stderr, "tg_bench_cpu: tapegrad and Eigen differ by %g (relative)\n", worst);

  double tg_gflops = flops / (tg_ms * 1e-3) / 1e9, eigen_gflops = flops / (eigen_ms * 1e-3) / 1e9;
  char extra[256];
  std::snprintf(extra, sizeof(extra),
                "\"baseline\": %.6g, \"baseline_name\": \"Eigen\", \"ratio\": %.4g, \"tg_threads\": %d, "
                "\"eigen_threads\": %d",
                eigen_gflops, tg_gflops / eigen_gflops, tg::get_num_threads(), Eigen::nbThreads());
  tg::bench::emit("cpu_matmul_1024", tg_gflops, "GFLOP/s", tg_ms, extra);
  return worst > 1e-4 || conv_rc != 0 ? 1 : 0;
} catch (const tg::Error& e) {
  std::fprintf(stderr, "tg_bench_cpu: %s\n", e.what());
  return 1;
}
