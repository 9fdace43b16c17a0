// Adam and AdamW against the float64 reference (with and without weight decay,
// amsgrad, maximize), on the CPU (float32, float64, float16) and on CUDA (the
// fused multi-tensor kernel).
#include <gtest/gtest.h>

#include "tests/optim/reference.h"

namespace tg::testing {
namespace {

std::vector<optim::AdamOptions> adam_cases() {
  return {
      {},
      {.lr = 1e-2},
      {.lr = 1e-2, .weight_decay = 0.1},
      {.lr = 1e-2, .amsgrad = true},
      {.lr = 1e-2, .betas = {0.8, 0.99}, .eps = 1e-6, .weight_decay = 1e-2, .amsgrad = true},
      {.lr = 1e-2, .maximize = true},
  };
}

std::vector<optim::AdamWOptions> adamw_cases() {
  return {
      {},
      {.lr = 1e-2, .weight_decay = 0.1},
      {.lr = 1e-2, .weight_decay = 0},
      {.lr = 1e-2, .betas = {0.5, 0.9}, .weight_decay = 0.05, .amsgrad = true},
  };
}

template <class O>
std::string describe(const char* name, const O& o) {
  return std::string(name) + "(lr=" + std::to_string(o.lr) + " betas=" + std::to_string(o.betas.first) + "," +
         std::to_string(o.betas.second) + " eps=" + std::to_string(o.eps) + " wd=" + std::to_string(o.weight_decay) +
         " amsgrad=" + std::to_string(o.amsgrad) + " maximize=" + std::to_string(o.maximize) + ")";
}

void check_all(Device dev, DType dtype, double atol, double rtol) {
  for (const auto& o : adam_cases()) {
    check_against_reference(
        dev, dtype, [&](const std::vector<Tensor>& ps) { return std::make_unique<optim::Adam>(ps, o); },
        [&] { return std::make_unique<RefAdam>(o, false); }, 6, atol, rtol, describe("Adam", o) + " on " + dev.str());
  }
  for (const auto& o : adamw_cases()) {
    check_against_reference(
        dev, dtype, [&](const std::vector<Tensor>& ps) { return std::make_unique<optim::AdamW>(ps, o); },
        [&] { return std::make_unique<RefAdam>(o, true); }, 6, atol, rtol, describe("AdamW", o) + " on " + dev.str());
  }
}

TEST(Adam, MatchesReferenceCpuFloat32) { check_all(Device(kCPU), kFloat32, 2e-5, 1e-5); }
TEST(Adam, MatchesReferenceCpuFloat64) { check_all(Device(kCPU), kFloat64, 1e-12, 1e-12); }
TEST(Adam, MatchesReferenceCpuFloat16) { check_all(Device(kCPU), kFloat16, 2e-2, 1e-2); }

TEST(Adam, MatchesReferenceCuda) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  check_all(Device(kCUDA), kFloat32, 2e-5, 1e-5);
  check_all(Device(kCUDA), kFloat64, 1e-12, 1e-12);
  check_all(Device(kCUDA), kBFloat16, 5e-2, 2e-2);
}

TEST(Adam, DefaultsAreTorchs) {
  auto p = tg::randn({4}).requires_grad_();
  optim::Adam adam({p});  // tg::optim::Adam opt(net.parameters()) compiles
  const auto& a = adam.defaults();
  EXPECT_EQ(a.lr, 1e-3);
  EXPECT_EQ(a.betas.first, 0.9);
  EXPECT_EQ(a.betas.second, 0.999);
  EXPECT_EQ(a.eps, 1e-8);
  EXPECT_EQ(a.weight_decay, 0);
  EXPECT_FALSE(a.amsgrad);
  optim::AdamW adamw(std::vector<Tensor>{p});
  EXPECT_EQ(adamw.defaults().weight_decay, 1e-2);
  EXPECT_THROW(optim::Adam({p}, {.betas = {1.0, 0.999}}), Error);
  EXPECT_THROW(optim::Adam({p}, {.eps = -1}), Error);
  EXPECT_THROW(optim::AdamW({p}, {.lr = -1e-3}), Error);
}

TEST(Adam, StepCountIsPerParameterAndStartsAtOne) {
  auto a = tg::randn({3}).requires_grad_();
  auto b = tg::randn({2}).requires_grad_();
  optim::Adam opt({a, b});
  a.mutable_grad() = tg::ones({3});
  opt.step();  // b has no grad yet: skipped, no state
  ASSERT_NE(opt.state(a), nullptr);
  EXPECT_EQ(opt.state(b), nullptr);
  EXPECT_EQ(opt.state(a)->at("step").item<float>(), 1.f);
  EXPECT_EQ(opt.state(a)->at("step").dtype(), kFloat32);
  b.mutable_grad() = tg::ones({2});
  const Vec b_before = host(b);
  opt.step();
  EXPECT_EQ(opt.state(a)->at("step").item<float>(), 2.f);
  EXPECT_EQ(opt.state(b)->at("step").item<float>(), 1.f);
  // A first Adam step moves every element by lr (the bias-corrected update is about sign(g)).
  const Vec b_after = host(b);
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(b_after[i], b_before[i] - 1e-3, 1e-6);
  EXPECT_EQ(opt.state(b)->at("exp_avg").sizes(), Shape({2}));
}

}  // namespace
}  // namespace tg::testing
