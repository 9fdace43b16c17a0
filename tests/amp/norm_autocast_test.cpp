// Autocast of batch_norm and group_norm (issue 17), as PyTorch: batch_norm is on no autocast list
// (it runs in the input's dtype, statistics in float32, float32 weights accepted); group_norm is on
// the float32 list (reduced-precision inputs are cast up, the result is float32).
#include <gtest/gtest.h>

#include <vector>

#include <tapegrad/tapegrad.h>

namespace {

namespace F = tg::nn::functional;

std::vector<double> host(const tg::Tensor& t) { return t.to(tg::kCPU).to(tg::kFloat64).contiguous().to_vector<double>(); }

TEST(NormAutocast, BatchNormKeepsTheInputDtype) {
  tg::manual_seed(61);
  auto x = tg::randn({4, 3, 5}).to(tg::kBFloat16);
  auto w = tg::randn({3}), b = tg::randn({3});
  tg::Tensor y;
  {
    tg::amp::autocast guard(tg::kCPU);
    y = F::batch_norm(x, tg::Tensor(), tg::Tensor(), w, b, true, 0.1, 1e-5);
  }
  EXPECT_EQ(y.dtype(), tg::kBFloat16);
  // the same as without autocast (nothing cast)
  EXPECT_EQ(host(y), host(F::batch_norm(x, tg::Tensor(), tg::Tensor(), w, b, true, 0.1, 1e-5)));
  EXPECT_EQ(tg::autocast_category(tg::OpKind::BatchNorm), tg::AutocastCategory::None);
}

TEST(NormAutocast, GroupNormRunsInFloat32) {
  tg::manual_seed(62);
  auto x = tg::randn({2, 4, 3, 3}).to(tg::kBFloat16).requires_grad_();
  auto w = tg::randn({4}).requires_grad_(), b = tg::randn({4}).requires_grad_();
  tg::Tensor y;
  {
    tg::amp::autocast guard(tg::kCPU);
    y = F::group_norm(x, 2, w, b, 1e-5);
  }
  EXPECT_EQ(y.dtype(), tg::kFloat32);
  const auto want = host(F::group_norm(x.detach().to(tg::kFloat32), 2, w.detach(), b.detach(), 1e-5));
  EXPECT_EQ(host(y), want);
  y.sum().backward();
  EXPECT_EQ(x.grad().dtype(), tg::kBFloat16);
  EXPECT_EQ(w.grad().dtype(), tg::kFloat32);
  EXPECT_EQ(tg::autocast_category(tg::OpKind::GroupNorm), tg::AutocastCategory::Fp32);
}

}  // namespace
