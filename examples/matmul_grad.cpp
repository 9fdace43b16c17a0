// The seed's gradient program: z = matmul(x, y).sum() with x requiring grad,
// z.backward(), print x.grad().sizes(). On the GPU (8000x8000 float32) forward
// and backward are timed with tg::cuda::Event; without a GPU it runs on the CPU
// at 512x512. x.grad() is checked against its closed form: every row equals the
// row sums of y.
//
//   matmul_grad [--size N] [--device cpu|cuda]
#include <tapegrad/tapegrad.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "cli.h"

namespace {

struct Args {
  int64_t n = 0;  // 0: 8000 on the GPU, 512 on the CPU
  std::string device;
};

}  // namespace

int main(int argc, char** argv) try {
  Args args;
  examples::App app{"The gradient of matmul(x, y).sum(), checked against its closed form", "matmul_grad"};
  app.add_option("--size,--n", args.n, "matrix size (0: 8000 on the GPU, 512 on the CPU)")
      ->check(examples::kNonNegative);
  examples::add_device_option(app, args.device);
  if (int rc = examples::parse(app, argc, argv); rc >= 0) return rc;
  const auto picked = examples::pick_device(app, args.device);
  if (!picked) return 2;
  const bool gpu = picked->is_cuda();
  const int64_t n = args.n > 0 ? args.n : (gpu ? 8000 : 512);
  const tg::Device dev = gpu ? tg::Device(tg::kCUDA) : tg::Device(tg::kCPU);
  tg::manual_seed(0);
  std::printf("tapegrad %s: grad of matmul(x, y).sum(), %lld x %lld float32 on %s\n", tg::version(),
              static_cast<long long>(n), static_cast<long long>(n), gpu ? "cuda" : "cpu");

  // The seed's program, as a user writes it.
  auto x = tg::randn({n, n}, tg::TensorOptions().device(dev).requires_grad(true));
  auto y = tg::randn({n, n}, dev);

  double fwd_ms = 0, bwd_ms = 0;
  tg::Tensor z;
  if (gpu) {
    tg::cuda::synchronize();
    tg::cuda::Event start, mid, end;
    start.record();
    z = tg::matmul(x, y).sum();
    mid.record();
    z.backward();
    end.record();
    end.synchronize();
    fwd_ms = start.elapsed_ms(mid);
    bwd_ms = mid.elapsed_ms(end);
  } else {
    auto t0 = std::chrono::steady_clock::now();
    z = tg::matmul(x, y).sum();
    auto t1 = std::chrono::steady_clock::now();
    z.backward();
    auto t2 = std::chrono::steady_clock::now();
    fwd_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    bwd_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
  }
  std::cout << x.grad().sizes() << "\n";
  std::printf("forward %.2f ms, backward %.2f ms\n", fwd_ms, bwd_ms);

  // d sum(x @ y) / dx[i, k] = sum_j y[k, j]: check a few rows against a float64 host sum.
  std::vector<float> hy = y.to_vector<float>();
  std::vector<float> g = x.grad().to_vector<float>();
  double worst = 0;
  for (int64_t i : {int64_t{0}, n / 2, n - 1}) {
    for (int64_t k = 0; k < n; ++k) {
      double ref = 0;
      for (int64_t j = 0; j < n; ++j) ref += hy[k * n + j];
      worst = std::max(worst, std::abs(g[i * n + k] - ref) / std::max(1.0, std::abs(ref)));
    }
  }
  const double tol = 1e-3;  // float32 sums of n normal values
  std::printf("check vs float64: max error %.2e (tolerance %.0e) %s\n", worst, tol, worst <= tol ? "ok" : "FAILED");
  return worst <= tol ? 0 : 1;
} catch (const tg::Error& e) {
  std::fprintf(stderr, "matmul_grad: %s\n", e.what());
  return 1;
}
