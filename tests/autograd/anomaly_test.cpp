// tg::autograd::DetectAnomalyGuard: a backward that produces NaN / Inf throws a tg::Error naming
// the forward op and its node's sequence number; off (the default) the same backward runs through
// and leaves the non-finite gradient for the user.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tests/autograd/common.h"
#include "tests/common/error_of.h"

namespace tg::testing {
namespace {

class Anomaly : public ::testing::TestWithParam<Dev> {
 protected:
  void SetUp() override { TG_SKIP_WITHOUT_CUDA(GetParam()); }
  Tensor leaf(std::vector<float> v) const {
    auto t = tg::tensor<float>(v, TensorOptions().device(to_device(GetParam())));
    t.requires_grad_();
    return t;
  }
};

TEST_P(Anomaly, SqrtOfNegativeNamesSqrtAndItsSequenceNumber) {
  auto x = leaf({4, -1, 9});
  auto y = x.sqrt();  // NaN at -1; backward g / (2 sqrt x) is NaN there
  const auto seq = y.grad_fn()->sequence_nr;
  auto loss = (y * 2).sum();
  EXPECT_FALSE(tg::autograd::AnomalyMode::is_enabled());
  std::string e;
  {
    tg::autograd::DetectAnomalyGuard guard;
    EXPECT_TRUE(tg::autograd::AnomalyMode::is_enabled());
    e = error_of([&] { loss.backward(); });
  }
  EXPECT_FALSE(tg::autograd::AnomalyMode::is_enabled());
  EXPECT_NE(e.find("'sqrt'"), std::string::npos) << e;
  EXPECT_NE(e.find("NaN"), std::string::npos) << e;
  EXPECT_NE(e.find("sequence number " + std::to_string(seq)), std::string::npos) << e;
  EXPECT_FALSE(x.grad().defined());  // stopped before reaching the leaf
}

TEST_P(Anomaly, LogOfZeroGivesInfInBackward) {
  auto x = leaf({1, 0, 2});
  auto y = x.log();  // -inf at 0: forward values are not checked, backward 1/x is +inf there
  auto loss = (y * 3).sum();
  tg::autograd::DetectAnomalyGuard guard;
  const std::string e = error_of([&] { loss.backward(); });
  EXPECT_NE(e.find("'log'"), std::string::npos) << e;
  EXPECT_NE(e.find("Inf"), std::string::npos) << e;
  EXPECT_NE(e.find("sequence number " + std::to_string(y.grad_fn()->sequence_nr)), std::string::npos) << e;
  EXPECT_NE(e.find("[3]"), std::string::npos) << e;
}

TEST_P(Anomaly, OffByDefaultAndWhenDisabledTheGradientIsLeftAsIs) {
  auto x = leaf({1, 0, 4});
  x.log().sum().backward();  // no guard: no error
  auto g = host(x.grad());
  EXPECT_DOUBLE_EQ(g[0], 1.0);
  EXPECT_TRUE(std::isinf(g[1]) && g[1] > 0);
  EXPECT_DOUBLE_EQ(g[2], 0.25);
  tg::autograd::DetectAnomalyGuard on;
  {
    tg::autograd::DetectAnomalyGuard off(false);  // nests
    EXPECT_FALSE(tg::autograd::AnomalyMode::is_enabled());
    auto z = leaf({-1});
    EXPECT_NO_THROW(z.sqrt().sum().backward());
    EXPECT_TRUE(std::isnan(host(z.grad())[0]));
  }
  EXPECT_TRUE(tg::autograd::AnomalyMode::is_enabled());
}

TEST_P(Anomaly, FiniteBackwardPassesWithTheGuardOnAndValuesAreUnchanged) {
  auto x = leaf({1, 4, 9});
  tg::autograd::DetectAnomalyGuard guard;
  (x.sqrt() * x).sum().backward();  // d/dx x^1.5 = 1.5 sqrt(x)
  expect_near_vec(host(x.grad()), {1.5, 3, 4.5}, 1e-6, 1e-6, "grad");
}

TEST_P(Anomaly, SequenceNumbersFollowTheForwardOrder) {
  auto x = leaf({1});
  auto a = x * 2;
  auto b = a + 1;
  auto c = b.exp();
  EXPECT_LT(a.grad_fn()->sequence_nr, b.grad_fn()->sequence_nr);
  EXPECT_LT(b.grad_fn()->sequence_nr, c.grad_fn()->sequence_nr);
}

struct Throws : tg::autograd::Function<Throws> {
  static Tensor forward(tg::autograd::AutogradContext*, const Tensor& x) { return x * 2; }
  static std::vector<Tensor> backward(tg::autograd::AutogradContext*, std::vector<Tensor>) {
    TG_ERROR("boom in a user backward");
  }
};

TEST_P(Anomaly, AnErrorRaisedInABackwardNamesItsNode) {
  auto x = leaf({1, 2});
  auto y = Throws::apply(x);
  const auto seq = y.grad_fn()->sequence_nr;
  auto loss = y.sum();
  const std::string plain = error_of([&] { y.sum().backward(); });
  EXPECT_NE(plain.find("boom"), std::string::npos) << plain;
  EXPECT_EQ(plain.find("anomaly mode"), std::string::npos) << plain;
  tg::autograd::DetectAnomalyGuard guard;
  const std::string e = error_of([&] { loss.backward(); });
  EXPECT_NE(e.find("boom"), std::string::npos) << e;
  EXPECT_NE(e.find("anomaly mode: raised in the backward of"), std::string::npos) << e;
  EXPECT_NE(e.find("sequence number " + std::to_string(seq)), std::string::npos) << e;
}

INSTANTIATE_TEST_SUITE_P(Devices, Anomaly, ::testing::Values(Dev::CPU, Dev::CUDA), dev_name);

}  // namespace
}  // namespace tg::testing
