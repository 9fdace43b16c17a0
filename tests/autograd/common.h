// Shared helpers for the autograd tests: the device parameter (CPU always, CUDA
// when present), float64 inputs, and host readback for float64 reference checks.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.h>

namespace tg::testing {

enum class Dev { CPU, CUDA };

inline std::string dev_name(const ::testing::TestParamInfo<Dev>& info) {
  return info.param == Dev::CPU ? "cpu" : "cuda";
}

inline Device to_device(Dev d) { return d == Dev::CPU ? Device(kCPU) : Device(kCUDA); }

#define TG_SKIP_WITHOUT_CUDA(dev)                                                                           \
  do {                                                                                                      \
    if ((dev) == ::tg::testing::Dev::CUDA && !::tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

// Host copy as float64, row-major (any dtype / device / layout).
inline std::vector<double> host(const Tensor& t) {
  return t.to(Device(kCPU), kFloat64).contiguous().to_vector<double>();
}

inline void expect_near_vec(const std::vector<double>& got, const std::vector<double>& want, double atol, double rtol,
                            const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::abs(want[i])) << what << " element " << i;
}

}  // namespace tg::testing
