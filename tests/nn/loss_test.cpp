// mse_loss: every reduction against a float64 reference, broadcasting,
// errors, gradcheck; MSELoss.
#include <gtest/gtest.h>

#include <tapegrad/tapegrad.h>

#include <vector>

namespace {

using tg::Tensor;
namespace F = tg::nn::functional;

std::vector<double> host(const Tensor& t) {
  return t.to(tg::Device(tg::kCPU), tg::kFloat64).contiguous().to_vector<double>();
}

TEST(MseLoss, Reductions) {
  Tensor a = tg::randn({4, 3}), b = tg::randn({4, 3});
  auto A = host(a), B = host(b);
  double sum = 0;
  std::vector<double> none;
  for (size_t i = 0; i < A.size(); ++i) {
    none.push_back((A[i] - B[i]) * (A[i] - B[i]));
    sum += none.back();
  }
  EXPECT_NEAR(F::mse_loss(a, b).item<double>(), sum / 12, 1e-6);
  EXPECT_NEAR(F::mse_loss(a, b, "sum").item<double>(), sum, 1e-5);
  Tensor n = F::mse_loss(a, b, "none");
  EXPECT_EQ(n.sizes(), a.sizes());
  auto N = host(n);
  for (size_t i = 0; i < N.size(); ++i) EXPECT_NEAR(N[i], none[i], 1e-6);
  EXPECT_EQ(F::mse_loss(a, b).dim(), 0);
  tg::nn::MSELoss loss("sum");
  EXPECT_NEAR(loss(a, b).item<double>(), sum, 1e-5);
}

TEST(MseLoss, BroadcastsLikePyTorch) {
  Tensor a = tg::randn({4, 3}), b = tg::randn({3});
  auto A = host(a), B = host(b);
  double sum = 0;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) sum += (A[i * 3 + j] - B[j]) * (A[i * 3 + j] - B[j]);
  EXPECT_NEAR(F::mse_loss(a, b).item<double>(), sum / 12, 1e-6);
}

TEST(MseLoss, Errors) {
  Tensor a = tg::randn({4, 3});
  EXPECT_THROW(F::mse_loss(a, tg::randn({4, 2})), tg::Error);
  EXPECT_THROW(F::mse_loss(a, a, "avg"), tg::Error);
  EXPECT_THROW(tg::nn::MSELoss("elementwise"), tg::Error);
  try {
    F::mse_loss(a, tg::randn({2, 4}));
  } catch (const tg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("mse_loss"), std::string::npos) << e.what();
  }
}

TEST(MseLoss, Gradcheck) {
  for (const char* r : {"mean", "sum", "none"}) {
    auto rep = tg::autograd::gradcheck([&](const std::vector<Tensor>& in) { return F::mse_loss(in[0], in[1], r); },
                                       {tg::randn({3, 4}, tg::kFloat64), tg::randn({3, 4}, tg::kFloat64)});
    EXPECT_TRUE(rep) << r << ": " << rep;
  }
  auto rep = tg::autograd::gradcheck([&](const std::vector<Tensor>& in) { return F::mse_loss(in[0], in[1]); },
                                     {tg::randn({3, 4}, tg::kFloat64), tg::randn({4}, tg::kFloat64)});
  EXPECT_TRUE(rep) << rep;
}

TEST(MseLoss, Cuda) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Tensor a = tg::randn({64, 3}), b = tg::randn({64, 3});
  EXPECT_NEAR(F::mse_loss(a.cuda(), b.cuda()).item<double>(), F::mse_loss(a, b).item<double>(), 1e-5);
  EXPECT_THROW(F::mse_loss(a.cuda(), b), tg::Error);
}

}  // namespace
