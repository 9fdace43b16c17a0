// Shared fixtures of the export tests: the seed's Net, a small MLP, a float64
// host reference for both, and a scratch folder per test.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <tapegrad/tapegrad.h>
#include <vector>

namespace tg_export_test {

// The seed's model.
struct Net : tg::nn::Module {
  tg::Tensor forward(const tg::Tensor& x) override { return x * 2 + 1; }
};

// Linear-ReLU-Linear with torch's names (0.weight, 0.bias, 2.weight, 2.bias).
inline tg::nn::Sequential make_mlp(int64_t in, int64_t hidden, int64_t out) {
  return tg::nn::Sequential(tg::nn::Linear(in, hidden), tg::nn::ReLU(), tg::nn::Linear(hidden, out));
}

inline std::vector<double> to_f64(const tg::Tensor& t) { return t.to(tg::kFloat64).cpu().to_vector<double>(); }

// The MLP in float64 on the host from its own parameters: relu(x W1ᵀ + b1) W2ᵀ + b2.
inline std::vector<double> mlp_reference(tg::nn::Module& m, const tg::Tensor& x) {
  auto sd = m.state_dict();
  auto w1 = to_f64(sd["0.weight"]), b1 = to_f64(sd["0.bias"]);
  auto w2 = to_f64(sd["2.weight"]), b2 = to_f64(sd["2.bias"]);
  const int64_t n = x.size(0), in = x.size(1), hid = sd["0.weight"].size(0), out = sd["2.weight"].size(0);
  auto xv = to_f64(x);
  std::vector<double> y(static_cast<size_t>(n * out));
  std::vector<double> h(static_cast<size_t>(hid));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < hid; ++j) {
      double s = b1[j];
      for (int64_t k = 0; k < in; ++k) s += xv[r * in + k] * w1[j * in + k];
      h[j] = s > 0 ? s : 0;
    }
    for (int64_t j = 0; j < out; ++j) {
      double s = b2[j];
      for (int64_t k = 0; k < hid; ++k) s += h[k] * w2[j * hid + k];
      y[r * out + j] = s;
    }
  }
  return y;
}

inline void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << "at " << i;
}

// A fresh folder under the system temp dir, named after the running test.
inline std::string scratch(const std::string& leaf) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  auto dir = std::filesystem::temp_directory_path() /
             ("tg_export_" + std::string(info->test_suite_name()) + "_" + info->name());
  std::filesystem::create_directories(dir);
  auto p = dir / leaf;
  std::filesystem::remove_all(p);
  return p.string();
}

}  // namespace tg_export_test
