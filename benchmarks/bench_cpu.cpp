// CPU matmul, 1024x1024 float32: tapegrad's tg::matmul against Eigen called directly on
// the same data (each allocating its output, as a user's code would). Median of >= 10
// repeats after warm-up, host clock. Prints one JSON line with the ratio tapegrad / Eigen.
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

int main(int argc, char** argv) try {
  using tg::bench::median;
  using tg::bench::now_s;
  tg::bench::Options o = tg::bench::parse_options(argc, argv);
  if (!o.wants("cpu_matmul_1024")) return 0;
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
  return worst > 1e-4 ? 1 : 0;
} catch (const tg::Error& e) {
  std::fprintf(stderr, "tg_bench_cpu: %s\n", e.what());
  return 1;
}
