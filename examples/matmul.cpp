// The seed's first program: an event-timed matmul of two random 8000x8000 float32
// matrices on the GPU, copied back to the host with to_vector. Without a GPU it runs
// on the CPU at 1024x1024. A few entries are checked against a float64 host product.
//
//   matmul [--n N] [--device cpu|cuda] [--reps R] [--tf32]
#include <tapegrad/tapegrad.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli.h"

namespace {

struct Args {
  int64_t n = 0;  // 0: 8000 on the GPU, 1024 on the CPU
  std::string device;
  int reps = 3;
  bool tf32 = false;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) try {
  Args args;
  examples::App app{"An event-timed float32 matmul, checked against a float64 product", "matmul"};
  app.add_option("--n", args.n, "matrix size (0: 8000 on the GPU, 1024 on the CPU)")->check(examples::kNonNegative);
  examples::add_device_option(app, args.device);
  app.add_option("--reps", args.reps, "timed repetitions after a warm-up run")->check(examples::kNonNegative);
  app.add_flag("--tf32", args.tf32, "allow TF32 tensor cores (CUDA)");
  if (int rc = examples::parse(app, argc, argv); rc >= 0) return rc;
  const auto dev = examples::pick_device(app, args.device);
  if (!dev) return 2;
  const bool gpu = dev->is_cuda();
  const int64_t n = args.n > 0 ? args.n : (gpu ? 8000 : 1024);
  tg::set_allow_tf32(args.tf32);
  tg::manual_seed(0);
  std::printf("tapegrad %s: %lld x %lld float32 matmul on %s%s\n", tg::version(), static_cast<long long>(n),
              static_cast<long long>(n), gpu ? "cuda" : "cpu", args.tf32 ? " (tf32 allowed)" : "");

  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  tg::Tensor x, y, z;
  if (gpu) {
    // The seed's program, as a user writes it.
    x = tg::rand({n, n}, tg::kCUDA);
    y = tg::rand({n, n}, tg::kCUDA);
    tg::cuda::synchronize();
    for (int r = 0; r < args.reps + 1; ++r) {  // the first run pays for cuBLAS set-up
      tg::cuda::Event start, end;
      start.record();
      z = tg::matmul(x, y);
      end.record();
      end.synchronize();
      float ms = start.elapsed_ms(end);
      std::printf("matmul %s%.2f ms  (%.1f TFLOP/s)\n", r == 0 ? "(warm-up) " : "", ms, flops / (ms * 1e-3) / 1e12);
    }
  } else {
    x = tg::rand({n, n});
    y = tg::rand({n, n});
    for (int r = 0; r < args.reps + 1; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      z = tg::matmul(x, y);
      double s = seconds_since(t0);
      std::printf("matmul %s%.2f ms  (%.1f GFLOP/s)\n", r == 0 ? "(warm-up) " : "", s * 1e3, flops / s / 1e9);
    }
  }

  auto t0 = std::chrono::steady_clock::now();
  std::vector<float> host = z.to_vector<float>();
  std::printf("to_vector: %.2f ms for %.0f MB\n", seconds_since(t0) * 1e3, host.size() * 4.0 / 1e6);

  // Check a few entries against a float64 product of the same inputs.
  std::vector<float> hx = x.to_vector<float>(), hy = y.to_vector<float>();
  double worst = 0;
  const int64_t probes[][2] = {{0, 0}, {n - 1, n - 1}, {n / 2, n / 3}, {n / 7, n - 2}, {1, n / 5}};
  for (const auto& p : probes) {
    double ref = 0;
    for (int64_t k = 0; k < n; ++k) ref += double(hx[p[0] * n + k]) * double(hy[k * n + p[1]]);
    worst = std::max(worst, std::abs(host[p[0] * n + p[1]] - ref) / std::abs(ref));
  }
  // float32 accumulation over n products of U[0,1) values: ~1e-6 relative; tf32 ~1e-3.
  const double tol = args.tf32 ? 5e-3 : 1e-4;
  std::printf("check vs float64: max relative error %.2e (tolerance %.0e) %s\n", worst, tol,
              worst <= tol ? "ok" : "FAILED");
  return worst <= tol ? 0 : 1;
} catch (const tg::Error& e) {
  std::fprintf(stderr, "matmul: %s\n", e.what());
  return 1;
}
