// SGD against the float64 reference, every momentum / dampening / weight decay /
// nesterov / maximize combination, on the CPU (float32, float64, bfloat16) and
// on CUDA (the fused multi-tensor kernel).
#include <gtest/gtest.h>

#include "tests/optim/reference.h"

namespace tg::testing {
namespace {

std::vector<optim::SGDOptions> sgd_cases() {
  return {
      {.lr = 0.1},
      {.lr = 0.1, .momentum = 0.9},
      {.lr = 0.1, .momentum = 0.9, .dampening = 0.1},
      {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-2},
      {.lr = 0.1, .weight_decay = 0.1},
      {.lr = 0.05, .momentum = 0.9, .nesterov = true},
      {.lr = 0.05, .momentum = 0.5, .weight_decay = 1e-2, .nesterov = true},
      {.lr = 0.1, .momentum = 0.9, .dampening = 0.5, .weight_decay = 1e-2, .maximize = true},
  };
}

std::string describe(const optim::SGDOptions& o) {
  return "SGD(lr=" + std::to_string(o.lr) + " momentum=" + std::to_string(o.momentum) +
         " dampening=" + std::to_string(o.dampening) + " wd=" + std::to_string(o.weight_decay) +
         " nesterov=" + std::to_string(o.nesterov) + " maximize=" + std::to_string(o.maximize) + ")";
}

void check_all(Device dev, DType dtype, double atol, double rtol) {
  for (const auto& o : sgd_cases()) {
    check_against_reference(
        dev, dtype, [&](const std::vector<Tensor>& ps) { return std::make_unique<optim::SGD>(ps, o); },
        [&] { return std::make_unique<RefSgd>(o); }, 5, atol, rtol, describe(o) + " on " + dev.str());
  }
}

TEST(SGD, MatchesReferenceCpuFloat32) { check_all(Device(kCPU), kFloat32, 1e-5, 1e-5); }
TEST(SGD, MatchesReferenceCpuFloat64) { check_all(Device(kCPU), kFloat64, 1e-12, 1e-12); }
TEST(SGD, MatchesReferenceCpuBFloat16) { check_all(Device(kCPU), kBFloat16, 5e-2, 2e-2); }

TEST(SGD, MatchesReferenceCuda) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  check_all(Device(kCUDA), kFloat32, 1e-5, 1e-5);
  check_all(Device(kCUDA), kFloat64, 1e-12, 1e-12);
  check_all(Device(kCUDA), kFloat16, 5e-2, 2e-2);
}

TEST(SGD, DesignatedInitializersAndValidation) {
  auto p = tg::randn({4}).requires_grad_();
  optim::SGD ok({p}, {.lr = 1e-3});
  EXPECT_DOUBLE_EQ(ok.lr(), 1e-3);
  EXPECT_THROW(optim::SGD({p}, {}), Error);                                                   // lr required
  EXPECT_THROW(optim::SGD({p}, {.lr = -1}), Error);                                           // negative lr
  EXPECT_THROW(optim::SGD({p}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}), Error);
  EXPECT_THROW(optim::SGD({p}, {.lr = 0.1, .nesterov = true}), Error);                         // nesterov needs momentum
  EXPECT_THROW(optim::SGD({p}, {.lr = 0.1, .weight_decay = -1}), Error);
}

}  // namespace
}  // namespace tg::testing
