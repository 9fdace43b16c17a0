// The seed's preprocessing step: standardize the columns of a 1M x 64 float32 matrix on
// the GPU, `(x - x.mean(0)) / x.std(0)`, timed with events. Without a GPU it runs on the
// CPU with 100k rows. Two columns are checked against float64 host statistics.
//
//   standardize [--rows N] [--device cpu|cuda] [--reps R]
#include <tapegrad/tapegrad.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli.h"

int main(int argc, char** argv) try {
  int64_t rows = 0;
  std::string device;
  int reps = 5;
  examples::App app{"Standardize the columns of a float32 matrix, (x - x.mean(0)) / x.std(0), timed", "standardize"};
  app.add_option("--rows", rows, "rows (0: 1M on the GPU, 100k on the CPU)")->check(examples::kNonNegative);
  examples::add_device_option(app, device);
  app.add_option("--reps", reps, "timed repetitions after a warm-up run")->check(examples::kNonNegative);
  if (int rc = examples::parse(app, argc, argv); rc >= 0) return rc;
  const auto picked = examples::pick_device(app, device);
  if (!picked) return 2;
  const bool gpu = picked->is_cuda();
  if (rows <= 0) rows = gpu ? 1'000'000 : 100'000;
  const int64_t cols = 64;
  const tg::Device dev = gpu ? tg::Device(tg::kCUDA) : tg::Device(tg::kCPU);
  tg::manual_seed(0);
  std::printf("standardize %lld x %lld float32 on %s\n", static_cast<long long>(rows), static_cast<long long>(cols),
              dev.str().c_str());

  auto raw = tg::rand({rows, cols}, dev);
  tg::Tensor feat;
  for (int r = 0; r < reps + 1; ++r) {
    double ms = 0;
    if (gpu) {
      tg::cuda::synchronize();
      tg::cuda::Event start, end;
      start.record();
      feat = ((raw - raw.mean(0)) / raw.std(0)).contiguous();
      end.record();
      end.synchronize();
      ms = start.elapsed_ms(end);
    } else {
      auto t0 = std::chrono::steady_clock::now();
      feat = ((raw - raw.mean(0)) / raw.std(0)).contiguous();
      ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
    std::printf("standardize %s%.3f ms\n", r == 0 ? "(warm-up) " : "", ms);
  }

  // Each column of the result should have mean 0 and (unbiased) std 1; check two of them in float64.
  std::vector<float> hraw = raw.to_vector<float>(), hfeat = feat.to_vector<float>();
  double worst = 0;
  for (int64_t c : {int64_t{0}, cols - 1}) {
    double mean = 0, m2 = 0;
    for (int64_t i = 0; i < rows; ++i) mean += hraw[i * cols + c];
    mean /= static_cast<double>(rows);
    for (int64_t i = 0; i < rows; ++i) m2 += (hraw[i * cols + c] - mean) * (hraw[i * cols + c] - mean);
    double sd = std::sqrt(m2 / static_cast<double>(rows - 1));
    for (int64_t i = 0; i < rows; i += rows / 97 + 1) {
      double ref = (hraw[i * cols + c] - mean) / sd;
      worst = std::max(worst, std::abs(hfeat[i * cols + c] - ref));
    }
  }
  const double tol = 1e-4;
  std::printf("check vs float64: max abs error %.2e (tolerance %.0e) %s\n", worst, tol, worst <= tol ? "ok" : "FAILED");
  return worst <= tol ? 0 : 1;
} catch (const tg::Error& e) {
  std::fprintf(stderr, "standardize: %s\n", e.what());
  return 1;
}
