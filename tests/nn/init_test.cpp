// nn::init::kaiming_normal_ (torch.nn.init.kaiming_normal_): N(0, gain^2 / fan) with fan_in or
// fan_out, checked on the sample mean and standard deviation of large tensors; bad mode and
// non-floating tensors are tg::Errors naming the initialiser.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include <tapegrad/tapegrad.h>

#include "../common/error_of.h"

namespace {

TEST(Init, KaimingNormalFanInAndFanOutStd) {
  tg::manual_seed(0);
  // [out 400, in 100, 3, 3]: fan_in = 900, fan_out = 3600; 360k samples, sd of the std estimate ~0.12%.
  tg::Tensor w = tg::empty({400, 100, 3, 3});
  tg::nn::init::kaiming_normal_(w, 0, "fan_out", "relu");
  const double want_out = std::sqrt(2.0) / std::sqrt(3600.0);
  EXPECT_NEAR(w.std().item<double>(), want_out, 0.01 * want_out);
  EXPECT_NEAR(w.mean().item<double>(), 0.0, 0.01 * want_out);
  tg::nn::init::kaiming_normal_(w);  // fan_in, leaky_relu(0.01): gain sqrt(2 / (1 + 0.01^2))
  const double want_in = std::sqrt(2.0 / (1.0 + 1e-4)) / std::sqrt(900.0);
  EXPECT_NEAR(w.std().item<double>(), want_in, 0.01 * want_in);
  // Normal, not uniform: about 4.6% of the samples lie beyond 2 sd (uniform: none beyond 1.74 sd).
  const double beyond = (w.abs() > 2.0 * want_in).to(tg::kFloat64).mean().item<double>();
  EXPECT_NEAR(beyond, 0.0455, 0.003);
}

TEST(Init, KaimingNormalErrors) {
  tg::Tensor w = tg::empty({4, 4});
  const std::string mode = tg::testing::error_of([&] { tg::nn::init::kaiming_normal_(w, 0, "fan_avg"); });
  EXPECT_NE(mode.find("kaiming_normal_"), std::string::npos) << mode;
  EXPECT_NE(mode.find("fan_avg"), std::string::npos) << mode;
  tg::Tensor i = tg::zeros({4, 4}, tg::kInt64);
  const std::string dtype = tg::testing::error_of([&] { tg::nn::init::kaiming_normal_(i); });
  EXPECT_NE(dtype.find("kaiming_normal_"), std::string::npos) << dtype;
}

}  // namespace
