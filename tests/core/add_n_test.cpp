// native::add_n (fused n-ary sum used for gradient accumulation) against a float64
// host sum, and the autograd engine's lazy accumulation of many small gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <tapegrad/tapegrad.h>

#include <tapegrad/core/native.h>

namespace {

std::vector<tg::Device> test_devices() {
  std::vector<tg::Device> d{tg::kCPU};
  if (tg::cuda::is_available()) d.emplace_back(tg::kCUDA, 0);
  return d;
}

TEST(AddN, MatchesFloat64SumAcrossGroupSizes) {
  for (tg::Device dev : test_devices()) {
    for (int n : {1, 2, 5, 32, 33, 70}) {
      for (tg::DType dt : {tg::kFloat32, tg::kFloat64, tg::kFloat16}) {
        SCOPED_TRACE(dev.str() + " n=" + std::to_string(n) + " " + tg::dtype_name(dt));
        std::vector<tg::Tensor> ts;
        std::vector<double> want(37, 0.0);
        for (int k = 0; k < n; ++k) {
          tg::Tensor t = tg::randn({37}, tg::TensorOptions().dtype(dt).device(dev));
          auto v = t.to(tg::kFloat64).cpu().to_vector<double>();
          for (size_t i = 0; i < v.size(); ++i) want[i] += v[i];
          ts.push_back(t);
        }
        auto got = tg::native::add_n(ts).to(tg::kFloat64).cpu().to_vector<double>();
        // float16 rounds once per group of 32 (plus the inputs' own rounding already in `want`).
        double rtol = dt == tg::kFloat16 ? 2e-3 : dt == tg::kFloat32 ? 1e-6 : 1e-13;
        for (size_t i = 0; i < want.size(); ++i)
          EXPECT_NEAR(got[i], want[i], rtol * (1 + std::fabs(want[i])) * (n > 32 ? 2 : 1)) << "at " << i;
      }
    }
  }
}

// CUDA sums 16-byte vectors where every pointer is aligned: sizes with a scalar tail, an input
// starting one element into its storage (the scalar path), every floating dtype, exact values.
TEST(AddN, VectorAndScalarPathsAgree) {
  for (tg::Device dev : test_devices()) {
    for (tg::DType dt : {tg::kFloat32, tg::kFloat64, tg::kFloat16, tg::kBFloat16}) {
      for (int64_t numel : {int64_t{8}, int64_t{4099}, int64_t{1} << 20}) {
        for (int shift : {0, 1}) {
          SCOPED_TRACE(dev.str() + " " + tg::dtype_name(dt) + " numel=" + std::to_string(numel) + " shift=" +
                       std::to_string(shift));
          // small integers: every partial sum is exact in every dtype, so the sums must agree exactly
          auto ints = [&](int64_t seed) {
            std::vector<double> v(static_cast<size_t>(numel + 1));
            for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * (seed + 1) + seed) % 7) - 3;
            return tg::tensor(v, tg::Shape{numel + 1}).to(dt).to(dev).slice(0, shift, shift + numel);
          };
          std::vector<tg::Tensor> ts{ints(0), ints(1), ints(2)};
          auto got = tg::native::add_n(ts).to(tg::kFloat64).cpu().to_vector<double>();
          auto a = ts[0].to(tg::kFloat64).cpu().to_vector<double>(), b = ts[1].to(tg::kFloat64).cpu().to_vector<double>(),
               c = ts[2].to(tg::kFloat64).cpu().to_vector<double>();
          for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], a[i] + b[i] + c[i]) << "at " << i;
        }
      }
    }
  }
}

TEST(AddN, NonContiguousInputsFallBackToPairwise) {
  for (tg::Device dev : test_devices()) {
    auto a = tg::rand({4, 6}, dev), b = tg::rand({6, 4}, dev).t();
    auto got = tg::native::add_n({a, b, a}).cpu().to_vector<float>();
    auto av = a.cpu().to_vector<float>(), bv = b.contiguous().cpu().to_vector<float>();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_FLOAT_EQ(got[i], av[i] + bv[i] + av[i]);
  }
}

TEST(AddN, MismatchedShapesThrow) {
  EXPECT_THROW((void)tg::native::add_n({tg::zeros({2}), tg::zeros({3})}), tg::Error);
}

// A leaf used 100 times: its gradient is the sum of 100 contributions, which the engine
// accumulates lazily in fused launches on CUDA.
TEST(AddN, EngineAccumulatesManyContributions) {
  for (tg::Device dev : test_devices()) {
    auto w = tg::rand({16}, tg::TensorOptions().device(dev).requires_grad(true));
    tg::Tensor y = w;
    for (int i = 0; i < 100; ++i) y = y + w * 0.5;
    y.sum().backward();
    for (float g : w.grad().cpu().to_vector<float>()) EXPECT_FLOAT_EQ(g, 51.f);
  }
}

}  // namespace
