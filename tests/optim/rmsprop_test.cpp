// RMSprop against the float64 reference of torch.optim.RMSprop's single-tensor path (every
// centered x momentum x weight_decay x maximize combination), on the CPU (float32, float64,
// bfloat16) and on CUDA (the fused multi-tensor kernel); defaults and validation; state names;
// several groups and parameters without a gradient; state_dict continuation; AMP inputs.
#include <gtest/gtest.h>

#include "tests/optim/reference.h"

namespace tg::testing {
namespace {

std::vector<optim::RMSpropOptions> rmsprop_cases() {
  std::vector<optim::RMSpropOptions> out{{}};
  for (bool centered : {false, true})
    for (double momentum : {0.0, 0.9})
      for (double wd : {0.0, 0.1})
        for (bool maximize : {false, true})
          out.push_back(
              {.lr = 1e-2, .weight_decay = wd, .momentum = momentum, .centered = centered, .maximize = maximize});
  out.push_back({.lr = 1e-3, .alpha = 0.9, .eps = 1e-6, .momentum = 0.5, .centered = true});
  out.push_back({.lr = 5e-3, .alpha = 0.5, .eps = 1e-4, .weight_decay = 1e-2});
  return out;
}

std::string describe(const optim::RMSpropOptions& o) {
  return "RMSprop(lr=" + std::to_string(o.lr) + " alpha=" + std::to_string(o.alpha) + " eps=" + std::to_string(o.eps) +
         " wd=" + std::to_string(o.weight_decay) + " momentum=" + std::to_string(o.momentum) +
         " centered=" + std::to_string(o.centered) + " maximize=" + std::to_string(o.maximize) + ")";
}

void check_all(Device dev, DType dtype, double atol, double rtol) {
  for (const auto& o : rmsprop_cases()) {
    check_against_reference(
        dev, dtype, [&](const std::vector<Tensor>& ps) { return std::make_unique<optim::RMSprop>(ps, o); },
        [&] { return std::make_unique<RefRmsprop>(o); }, 6, atol, rtol, describe(o) + " on " + dev.str());
  }
}

TEST(RMSprop, MatchesReferenceCpuFloat32) { check_all(Device(kCPU), kFloat32, 2e-5, 1e-5); }
TEST(RMSprop, MatchesReferenceCpuFloat64) { check_all(Device(kCPU), kFloat64, 1e-12, 1e-12); }
TEST(RMSprop, MatchesReferenceCpuBFloat16) { check_all(Device(kCPU), kBFloat16, 5e-2, 2e-2); }
TEST(RMSprop, MatchesReferenceCpuFloat16) { check_all(Device(kCPU), kFloat16, 2e-2, 1e-2); }

TEST(RMSprop, MatchesReferenceCuda) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  check_all(Device(kCUDA), kFloat32, 2e-5, 1e-5);
  check_all(Device(kCUDA), kFloat64, 1e-12, 1e-12);
  check_all(Device(kCUDA), kBFloat16, 5e-2, 2e-2);
}

TEST(RMSprop, DefaultsAreTorchs) {
  auto p = tg::randn({4}).requires_grad_();
  optim::RMSprop opt({p});
  const auto& d = opt.defaults();
  EXPECT_EQ(d.lr, 1e-2);
  EXPECT_EQ(d.alpha, 0.99);
  EXPECT_EQ(d.eps, 1e-8);
  EXPECT_EQ(d.weight_decay, 0);
  EXPECT_EQ(d.momentum, 0);
  EXPECT_FALSE(d.centered);
  EXPECT_FALSE(d.maximize);
  EXPECT_STREQ(opt.name(), "RMSprop");
  EXPECT_EQ(opt.state(p), nullptr);  // state comes with the first step
}

// Bad options are errors naming the optimizer and the option, in the constructor, a new group
// and a loaded state dict (which then changes nothing).
TEST(RMSprop, Validation) {
  auto p = tg::randn({4}).requires_grad_();
  auto expect_error = [](const std::function<void()>& f, const std::string& option) {
    try {
      f();
      ADD_FAILURE() << option << " was accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("RMSprop"), std::string::npos) << msg;
      EXPECT_NE(msg.find(option), std::string::npos) << msg;
    }
  };
  expect_error([&] { optim::RMSprop({p}, {.lr = -1e-3}); }, "learning rate");
  expect_error([&] { optim::RMSprop({p}, {.alpha = -0.1}); }, "alpha");
  expect_error([&] { optim::RMSprop({p}, {.eps = -1}); }, "epsilon");
  expect_error([&] { optim::RMSprop({p}, {.weight_decay = -1}); }, "weight_decay");
  expect_error([&] { optim::RMSprop({p}, {.momentum = -0.5}); }, "momentum");
  expect_error([&] { optim::RMSprop({p}, {.lr = std::nan("")}); }, "learning rate");
  optim::RMSprop opt({p}, {.lr = 0.0, .alpha = 0.0, .eps = 0.0});  // all bounds inclusive, as PyTorch
  auto q = tg::randn({2}).requires_grad_();
  expect_error([&] { opt.add_param_group({{q}, {.momentum = -1}}); }, "momentum");
  auto sd = opt.state_dict();
  sd.insert("param_groups.0.alpha", tg::full({}, -1.0, kFloat64));
  expect_error([&] { opt.load_state_dict(sd); }, "alpha");
  EXPECT_EQ(opt.param_groups()[0].options.alpha, 0.0);
}

// State names and shapes for each combination, and their values after one step of a constant gradient.
TEST(RMSprop, StateNames) {
  for (bool centered : {false, true}) {
    for (double momentum : {0.0, 0.9}) {
      auto p = tg::zeros({3}).requires_grad_();
      optim::RMSprop opt({p}, {.lr = 0.1, .alpha = 0.75, .momentum = momentum, .centered = centered});
      p.mutable_grad() = tg::full({3}, 2.0);
      opt.step();
      const optim::ParamState* st = opt.state(p);
      ASSERT_NE(st, nullptr);
      EXPECT_EQ(st->at("step").item<float>(), 1.f);
      EXPECT_EQ(st->at("step").dtype(), kFloat32);
      EXPECT_EQ(st->at("step").dim(), 0);
      expect_close(host(st->at("square_avg")), Vec(3, 0.25 * 4), 1e-6, 0, "square_avg");
      EXPECT_EQ(st->find("momentum_buffer") != nullptr, momentum > 0);
      EXPECT_EQ(st->find("grad_avg") != nullptr, centered);
      // avg = sqrt(1 - 0.25) (centered: sqrt(1 - 0.5^2)) or 1, plus eps; update lr * 2 / avg.
      const double avg = (centered ? std::sqrt(0.75) : 1.0) + 1e-8;
      if (centered) expect_close(host(st->at("grad_avg")), Vec(3, 0.5), 1e-6, 0, "grad_avg");
      if (momentum > 0) expect_close(host(st->at("momentum_buffer")), Vec(3, 2.0 / avg), 1e-5, 1e-6, "momentum_buffer");
      expect_close(host(p), Vec(3, -0.1 * 2.0 / avg), 1e-6, 1e-6, "param");
      auto sd = opt.state_dict();
      EXPECT_TRUE(sd.contains("state.0.square_avg"));
      EXPECT_EQ(sd.contains("state.0.momentum_buffer"), momentum > 0);
      EXPECT_EQ(sd.contains("state.0.grad_avg"), centered);
      for (const char* o : {"lr", "alpha", "eps", "weight_decay", "momentum", "centered", "maximize"})
        EXPECT_TRUE(sd.contains(std::string("param_groups.0.") + o)) << o;
      EXPECT_EQ(sd.at("param_groups.0.centered").item<bool>(), centered);
      EXPECT_EQ(sd.at("param_groups.0.alpha").item<double>(), 0.75);
    }
  }
}

// Momentum or centering switched on in a group after some steps: the new buffers start at zero
// (PyTorch's step would fail on the missing state); a loaded state without "step" is an error.
TEST(RMSprop, OptionsSwitchedOnLaterAndIncompleteState) {
  auto ps = make_params(Device(kCPU), kFloat32, 4);
  const optim::RMSpropOptions plain{.lr = 1e-2};
  optim::RMSprop opt(ps, plain);
  std::vector<Vec> ref_p;
  std::vector<RefRmsprop> refs;
  for (const auto& p : ps) {
    ref_p.push_back(host(p));
    refs.emplace_back(plain);
  }
  for (int k = 0; k < 5; ++k) {
    if (k == 2) {
      opt.param_groups()[0].options.momentum = 0.9;
      opt.param_groups()[0].options.centered = true;
      for (auto& r : refs) {
        r.momentum = 0.9;
        r.centered = true;
      }
    }
    auto grads = make_grads(k, 4);
    set_grads(ps, grads);
    opt.step();
    for (size_t i = 0; i < ps.size(); ++i) refs[i].step(ref_p[i], host(grads[i]));
  }
  for (size_t i = 0; i < ps.size(); ++i) expect_close(host(ps[i]), ref_p[i], 2e-5, 1e-5, "param " + std::to_string(i));
  EXPECT_EQ(opt.state(ps[0])->at("step").item<float>(), 5.f);
  auto sd = opt.state_dict();
  sd.erase("state.1.step");
  opt.load_state_dict(sd);
  try {
    opt.step();
    ADD_FAILURE() << "a state without step was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lacks step"), std::string::npos) << e.what();
  }
}

// Two groups with different options, and a parameter that has no gradient (skipped: unchanged,
// no state) until the last steps; each parameter follows its own reference.
void check_groups(Device dev) {
  SCOPED_TRACE(dev.str());
  auto ps = make_params(dev, kFloat32, 5);
  auto idle = tg::randn({4}).to(dev).requires_grad_();
  const optim::RMSpropOptions a{.lr = 1e-2, .momentum = 0.9, .centered = true};
  const optim::RMSpropOptions b{.lr = 3e-3, .alpha = 0.9, .weight_decay = 0.1, .maximize = true};
  optim::RMSprop opt({{{ps[0], idle}, a}, {{ps[1], ps[2]}, b}});
  std::vector<Vec> ref_p;
  std::vector<std::unique_ptr<RefOptimizer>> refs;
  for (size_t i = 0; i < ps.size(); ++i) {
    ref_p.push_back(host(ps[i]));
    refs.push_back(std::make_unique<RefRmsprop>(i == 0 ? a : b));
  }
  Vec idle_ref = host(idle);
  RefRmsprop idle_opt(a);
  for (int k = 0; k < 5; ++k) {
    auto grads = make_grads(k, 9);
    set_grads(ps, grads);
    if (k >= 3) idle.mutable_grad() = tg::full({4}, 0.5 * k, dev);
    opt.step();
    for (size_t i = 0; i < ps.size(); ++i) refs[i]->step(ref_p[i], host(grads[i]));
    if (k >= 3) idle_opt.step(idle_ref, Vec(4, 0.5 * k));
    if (k < 3) {
      EXPECT_EQ(opt.state(idle), nullptr);
      expect_close(host(idle), idle_ref, 0, 0, "idle parameter");
    }
  }
  for (size_t i = 0; i < ps.size(); ++i) expect_close(host(ps[i]), ref_p[i], 2e-5, 1e-5, "param " + std::to_string(i));
  expect_close(host(idle), idle_ref, 2e-5, 1e-5, "idle parameter");
  EXPECT_EQ(opt.state(idle)->at("step").item<float>(), 2.f);
  EXPECT_EQ(opt.state(ps[0])->at("step").item<float>(), 5.f);
}

TEST(RMSprop, GroupsAndParametersWithoutGradCpu) { check_groups(Device(kCPU)); }
TEST(RMSprop, GroupsAndParametersWithoutGradCuda) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  check_groups(Device(kCUDA));
}

void check_state_dict(Device dev) {
  using Ps = std::vector<Tensor>;
  for (const optim::RMSpropOptions& o :
       {optim::RMSpropOptions{.lr = 1e-2, .alpha = 0.9, .weight_decay = 0.01, .momentum = 0.8, .centered = true},
        optim::RMSpropOptions{.lr = 1e-2, .maximize = true}}) {
    check_state_dict_continues(
        dev, [&](const Ps& ps) { return std::make_unique<optim::RMSprop>(ps, o); },
        [&](const Ps& ps) { return std::make_unique<optim::RMSprop>(ps, optim::RMSpropOptions{.lr = 0.5}); },
        describe(o));
  }
}

TEST(RMSprop, StateDictRoundTripContinuesCpu) { check_state_dict(Device(kCPU)); }
TEST(RMSprop, StateDictRoundTripContinuesCuda) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  check_state_dict(Device(kCUDA));
}

void check_amp(Device dev) {
  using Ps = std::vector<Tensor>;
  for (const optim::RMSpropOptions& o :
       {optim::RMSpropOptions{.lr = 1e-2},
        optim::RMSpropOptions{.lr = 1e-2, .weight_decay = 0.1, .momentum = 0.9, .centered = true}}) {
    check_amp_step_args(
        dev, [&](const Ps& ps) { return std::make_unique<optim::RMSprop>(ps, o); }, describe(o));
  }
}

TEST(RMSprop, FoundInfSkipsAndGradScaleDividesCpu) { check_amp(Device(kCPU)); }
TEST(RMSprop, FoundInfSkipsAndGradScaleDividesCuda) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  check_amp(Device(kCUDA));
}

}  // namespace
}  // namespace tg::testing
