// tg::optim::lr_scheduler against float64 closed forms of PyTorch's schedules written here
// (120 steps, two parameter groups), the optimizer's lr following each step, state_dict round
// trips (also through tg::save / tg::load) that continue exactly as an uninterrupted run, bad
// arguments as tg::Errors, and the device lr: a CPU step after set_lr equals the float64
// reference, a CUDA eager step follows set_lr and param_groups() edits, and a captured
// tg::cuda::Graph step replays with the lr the scheduler set between replays (LrSchedulerCuda.*).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <numbers>
#include <string>
#include <type_traits>
#include <vector>

#include "tests/optim/reference.h"

namespace tg::testing {
namespace {

namespace ls = optim::lr_scheduler;
using Group = optim::ParamGroup<optim::SGDOptions>;
constexpr double kPi = std::numbers::pi;
constexpr double kBase0 = 0.1, kBase1 = 0.02;

// An SGD over two float64 groups (lr 0.1 and 0.02), with momentum so OneCycleLR can cycle it.
struct TwoGroups {
  std::vector<Tensor> a{tg::zeros({3}, kFloat64).requires_grad_()}, b{tg::zeros({2}, kFloat64).requires_grad_()};
  optim::SGD opt{std::vector<Group>{{a, {.lr = kBase0, .momentum = 0.9}}, {b, {.lr = kBase1, .momentum = 0.9}}},
                 optim::SGDOptions{.lr = kBase0}};
};

// Steps `s` `steps` times and checks every group's lr at every epoch (0 = after construction)
// against want(epoch, group), within rtol (the chainable forms round differently from closed forms).
void expect_schedule(ls::LRScheduler& s, optim::Optimizer& opt, const std::function<double(int64_t, size_t)>& want,
                     int steps = 120, double rtol = 1e-12, double atol = 1e-16) {
  for (int e = 0; e <= steps; ++e) {
    if (e > 0) s.step();
    const std::vector<double> got = s.get_last_lr();
    ASSERT_EQ(got.size(), opt.num_param_groups()) << s.name();
    EXPECT_EQ(s.last_epoch(), e) << s.name();
    for (size_t g = 0; g < got.size(); ++g) {
      const double w = want(e, g);
      ASSERT_NEAR(got[g], w, atol + rtol * std::abs(w)) << s.name() << " epoch " << e << " group " << g;
      ASSERT_EQ(opt.lr(g), got[g]) << s.name() << " epoch " << e << " group " << g;
    }
  }
}

double base(size_t g) { return g == 0 ? kBase0 : kBase1; }

TEST(LrScheduler, StepLR) {
  TwoGroups t;
  ls::StepLR s(t.opt, 7, 0.5);
  expect_schedule(s, t.opt, [](int64_t e, size_t g) { return base(g) * std::pow(0.5, static_cast<double>(e / 7)); });
}

TEST(LrScheduler, StepLRDefaultGamma) {
  TwoGroups t;
  ls::StepLR s(t.opt, 30);
  expect_schedule(s, t.opt, [](int64_t e, size_t g) { return base(g) * std::pow(0.1, static_cast<double>(e / 30)); });
}

TEST(LrScheduler, MultiStepLRWithRepeatedMilestone) {
  TwoGroups t;
  ls::MultiStepLR s(t.opt, {10, 25, 25, 60}, 0.3);
  expect_schedule(s, t.opt, [](int64_t e, size_t g) {
    int n = (e >= 10) + 2 * (e >= 25) + (e >= 60);
    return base(g) * std::pow(0.3, n);
  });
}

TEST(LrScheduler, ConstantLR) {
  TwoGroups t;
  ls::ConstantLR s(t.opt, 0.25, 12);
  expect_schedule(s, t.opt, [](int64_t e, size_t g) { return e < 12 ? base(g) * 0.25 : base(g); });
}

TEST(LrScheduler, ConstantLRDefaults) {
  TwoGroups t;
  ls::ConstantLR s(t.opt);  // factor 1/3 for 5 steps
  expect_schedule(s, t.opt, [](int64_t e, size_t g) { return e < 5 ? base(g) / 3 : base(g); });
}

TEST(LrScheduler, LinearLR) {
  TwoGroups t;
  ls::LinearLR s(t.opt, 0.2, 0.9, 30);
  expect_schedule(s, t.opt, [](int64_t e, size_t g) {
    return base(g) * (0.2 + 0.7 * static_cast<double>(std::min<int64_t>(e, 30)) / 30.0);
  });
}

TEST(LrScheduler, LinearLRDecayToZero) {
  TwoGroups t;
  ls::LinearLR s(t.opt, 1.0, 0.0, 50);
  expect_schedule(
      s, t.opt,
      [](int64_t e, size_t g) { return base(g) * (1.0 - static_cast<double>(std::min<int64_t>(e, 50)) / 50); }, 120,
      1e-11, 1e-15);
}

TEST(LrScheduler, ExponentialLR) {
  TwoGroups t;
  ls::ExponentialLR s(t.opt, 0.97);
  expect_schedule(s, t.opt, [](int64_t e, size_t g) { return base(g) * std::pow(0.97, static_cast<double>(e)); });
}

TEST(LrScheduler, CosineAnnealingLRPastTMax) {
  TwoGroups t;
  ls::CosineAnnealingLR s(t.opt, 40, 0.001);
  // PyTorch's recursive form follows the cosine past T_max (back up), as the closed form does.
  expect_schedule(
      s, t.opt, [](int64_t e, size_t g) { return 0.001 + (base(g) - 0.001) * (1 + std::cos(kPi * e / 40.0)) / 2; }, 120,
      1e-10, 1e-15);
  EXPECT_DOUBLE_EQ(0.001, [&] {  // exactly eta_min at T_max in the recursion (1 + cos(pi) == 0)
    TwoGroups u;
    ls::CosineAnnealingLR c(u.opt, 40, 0.001);
    for (int i = 0; i < 40; ++i) c.step();
    return c.get_last_lr()[0];
  }());
}

TEST(LrScheduler, CosineAnnealingWarmRestarts) {
  TwoGroups t;
  ls::CosineAnnealingWarmRestarts s(t.opt, 10, 2, 0.0005);
  expect_schedule(s, t.opt, [](int64_t e, size_t g) {
    // Periods 10, 20, 40, 80 starting at 0, 10, 30, 70.
    int64_t start = 0, period = 10;
    while (e >= start + period) {
      start += period;
      period *= 2;
    }
    return 0.0005 + (base(g) - 0.0005) * (1 + std::cos(kPi * static_cast<double>(e - start) / period)) / 2;
  });
}

TEST(LrScheduler, CosineAnnealingWarmRestartsConstantPeriod) {
  TwoGroups t;
  ls::CosineAnnealingWarmRestarts s(t.opt, 13);
  expect_schedule(s, t.opt, [](int64_t e, size_t g) { return base(g) * (1 + std::cos(kPi * (e % 13) / 13.0)) / 2; });
}

TEST(LrScheduler, LambdaLRPerGroup) {
  TwoGroups t;
  ls::LambdaLR s(t.opt,
                 {[](int64_t e) { return 1.0 / (1.0 + 0.05 * e); }, [](int64_t e) { return e < 50 ? 1.0 : 0.1; }});
  expect_schedule(
      s, t.opt, [](int64_t e, size_t g) { return g == 0 ? kBase0 / (1.0 + 0.05 * e) : kBase1 * (e < 50 ? 1.0 : 0.1); });
  TwoGroups u;
  ls::LambdaLR one(u.opt, [](int64_t e) { return std::pow(0.5, e); });
  expect_schedule(
      one, u.opt, [](int64_t e, size_t g) { return base(g) * std::pow(0.5, e); }, 30);
}

TEST(LrScheduler, SequentialLRWarmupThenCosine) {
  TwoGroups t;
  auto warm = std::make_shared<ls::LinearLR>(t.opt, 0.1, 1.0, 5);
  auto cos = std::make_shared<ls::CosineAnnealingLR>(t.opt, 60);
  ls::SequentialLR s(t.opt, {warm, cos}, {5});
  expect_schedule(
      s, t.opt,
      [](int64_t e, size_t g) {
        if (e < 5) return base(g) * (0.1 + 0.9 * e / 5.0);
        return base(g) * (1 + std::cos(kPi * (e - 5) / 60.0)) / 2;
      },
      120, 1e-10, 1e-15);
}

TEST(LrScheduler, SequentialLRThreeSchedulers) {
  TwoGroups t;
  auto a = std::make_shared<ls::ConstantLR>(t.opt, 0.5, 3);
  auto b = std::make_shared<ls::ExponentialLR>(t.opt, 0.9);
  auto c = std::make_shared<ls::StepLR>(t.opt, 10, 0.5);
  // Built on the same optimizer, each later scheduler takes the first's initial_lr as its base.
  EXPECT_EQ(b->base_lrs(), (std::vector<double>{kBase0, kBase1}));
  ls::SequentialLR s(t.opt, {a, b, c}, {10, 30});
  expect_schedule(s, t.opt, [](int64_t e, size_t g) {
    if (e < 10) return e < 3 ? base(g) * 0.5 : base(g);
    if (e < 30) return base(g) * std::pow(0.9, static_cast<double>(e - 10));
    return base(g) * std::pow(0.5, static_cast<double>((e - 30) / 10));
  });
}

// At the milestone CosineAnnealingWarmRestarts restarts through its own step(0) (T_cur back to 0).
TEST(LrScheduler, SequentialLRIntoWarmRestarts) {
  TwoGroups t;
  auto a = std::make_shared<ls::ConstantLR>(t.opt, 0.5, 5);
  auto b = std::make_shared<ls::CosineAnnealingWarmRestarts>(t.opt, 10, 1, 0.001);
  ls::SequentialLR s(t.opt, {a, b}, {8});
  expect_schedule(s, t.opt, [](int64_t e, size_t g) {
    if (e < 8) return e < 5 ? base(g) * 0.5 : base(g);
    return 0.001 + (base(g) - 0.001) * (1 + std::cos(kPi * static_cast<double>((e - 8) % 10) / 10)) / 2;
  });
}

// 1cycle, two phases, cosine: up from max/25 over 30% of 100 steps, then down to max/25/1e4;
// SGD momentum goes 0.95 -> 0.85 -> 0.95. Step 100 extrapolates; step 101 is refused.
TEST(LrScheduler, OneCycleLRCosTwoPhaseWithMomentum) {
  TwoGroups t;
  const double max_lr[2] = {0.5, 0.1};
  ls::OneCycleLR s(t.opt, std::vector<double>{0.5, 0.1}, {.total_steps = 100});
  auto cos_anneal = [](double a, double b, double pct) { return b + (a - b) / 2.0 * (std::cos(kPi * pct) + 1); };
  auto phase = [](int64_t e, double& pct) {
    const double end0 = 0.3 * 100 - 1;
    if (e <= end0) {
      pct = e / end0;
      return 0;
    }
    pct = (e - end0) / (99 - end0);
    return 1;
  };
  for (int64_t e = 0; e <= 100; ++e) {
    if (e > 0) s.step();
    double pct = 0;
    const int ph = phase(e, pct);
    for (size_t g = 0; g < 2; ++g) {
      const double init = max_lr[g] / 25, min = init / 1e4;
      const double want = ph == 0 ? cos_anneal(init, max_lr[g], pct) : cos_anneal(max_lr[g], min, pct);
      const double mom = ph == 0 ? cos_anneal(0.95, 0.85, pct) : cos_anneal(0.85, 0.95, pct);
      ASSERT_NEAR(s.get_last_lr()[g], want, 1e-15 + 1e-13 * want) << "epoch " << e;
      ASSERT_NEAR(t.opt.param_groups()[g].options.momentum, mom, 1e-14) << "epoch " << e;
    }
  }
  const std::vector<double> before = s.get_last_lr();
  try {
    s.step();
    FAIL() << "stepping past total_steps must throw";
  } catch (const tg::Error& err) {
    EXPECT_NE(std::string(err.what()).find("Tried to step 101 times"), std::string::npos) << err.what();
  }
  EXPECT_EQ(s.get_last_lr(), before);
  EXPECT_EQ(s.last_epoch(), 100);
}

// Three phases, linear, Adam's beta1 cycled (beta2 kept), total from epochs * steps_per_epoch.
TEST(LrScheduler, OneCycleLRLinearThreePhaseBeta1) {
  auto p = std::vector<Tensor>{tg::zeros({4}, kFloat64).requires_grad_()};
  optim::Adam opt(p, {.lr = 1.0, .betas = {0.9, 0.98}});
  ls::OneCycleLR s(opt, 0.8,
                   {.epochs = 10,
                    .steps_per_epoch = 12,
                    .pct_start = 0.25,
                    .anneal_strategy = "linear",
                    .base_momentum = {0.8},
                    .max_momentum = {0.9},
                    .div_factor = 10,
                    .final_div_factor = 100,
                    .three_phase = true});
  EXPECT_EQ(s.total_steps(), 120);
  auto lin = [](double a, double b, double pct) { return (b - a) * pct + a; };
  const double init = 0.08, min = 0.0008;
  const double e0 = 0.25 * 120 - 1, e1 = 2 * 0.25 * 120 - 2, e2 = 119;
  for (int64_t e = 0; e <= 120; ++e) {
    if (e > 0) s.step();
    double lr, mom;
    if (e <= e0) {
      lr = lin(init, 0.8, e / e0);
      mom = lin(0.9, 0.8, e / e0);
    } else if (e <= e1) {
      lr = lin(0.8, init, (e - e0) / (e1 - e0));
      mom = lin(0.8, 0.9, (e - e0) / (e1 - e0));
    } else {
      lr = lin(init, min, (e - e1) / (e2 - e1));
      mom = 0.9;
    }
    ASSERT_NEAR(s.get_last_lr()[0], lr, 1e-15 + 1e-13 * lr) << "epoch " << e;
    ASSERT_NEAR(opt.param_groups()[0].options.betas.first, mom, 1e-14) << "epoch " << e;
    ASSERT_EQ(opt.param_groups()[0].options.betas.second, 0.98);
  }
  EXPECT_THROW(s.step(), tg::Error);
}

// An independent ReduceLROnPlateau: PyTorch's documented rule.
struct RefPlateau {
  double factor, threshold, eps;
  int patience, cooldown;
  bool max_mode, abs_mode;
  std::vector<double> min_lr, lr;
  double best;
  int bad = 0, cool = 0;
  void step(double m) {
    bool better;
    if (max_mode)
      better = abs_mode ? m > best + threshold : m > best * (1 + threshold);
    else
      better = abs_mode ? m < best - threshold : m < best * (1 - threshold);
    if (better) {
      best = m;
      bad = 0;
    } else {
      ++bad;
    }
    if (cool > 0) {
      --cool;
      bad = 0;
    }
    if (bad > patience) {
      for (size_t g = 0; g < lr.size(); ++g) {
        double n = std::max(lr[g] * factor, min_lr[g]);
        if (lr[g] - n > eps) lr[g] = n;
      }
      cool = cooldown;
      bad = 0;
    }
  }
};

TEST(LrScheduler, ReduceLROnPlateauHandChecked) {
  TwoGroups t;
  ls::ReduceLROnPlateau s(t.opt, {.factor = 0.5, .patience = 1, .min_lr = {0.03, 0.0}});
  // 5 (best), 5 (bad 1), 5 (bad 2 > 1: halve), 4 (better), 4.0 (bad 1), 4.0 (bad 2: halve, group 0 floors at 0.03)
  const double metrics[] = {5, 5, 5, 4, 4, 4};
  const double want0[] = {0.1, 0.1, 0.05, 0.05, 0.05, 0.03};
  const double want1[] = {0.02, 0.02, 0.01, 0.01, 0.01, 0.005};
  for (int i = 0; i < 6; ++i) {
    s.step(metrics[i]);
    EXPECT_DOUBLE_EQ(s.get_last_lr()[0], want0[i]) << i;
    EXPECT_DOUBLE_EQ(s.get_last_lr()[1], want1[i]) << i;
  }
  EXPECT_EQ(s.best(), 4);
  EXPECT_THROW(s.step(), tg::Error);    // needs a metric
  s.step(tg::full({}, 3.0, kFloat32));  // a 0-d tensor, as PyTorch's float(metrics)
  EXPECT_EQ(s.best(), 3);
  EXPECT_THROW(s.step(tg::zeros({2})), tg::Error);
}

TEST(LrScheduler, ReduceLROnPlateauAgainstReference) {
  for (const char* mode : {"min", "max"})
    for (const char* tmode : {"rel", "abs"}) {
      TwoGroups t;
      ls::ReduceLROnPlateau s(t.opt, {.mode = mode,
                                      .factor = 0.7,
                                      .patience = 3,
                                      .threshold = 0.01,
                                      .threshold_mode = tmode,
                                      .cooldown = 2,
                                      .min_lr = {1e-3}});
      RefPlateau ref{0.7,
                     0.01,
                     1e-8,
                     3,
                     2,
                     std::string(mode) == "max",
                     std::string(tmode) == "abs",
                     {1e-3, 1e-3},
                     {kBase0, kBase1},
                     std::string(mode) == "max" ? -INFINITY : INFINITY};
      for (int e = 0; e < 150; ++e) {
        // Improves for a while, then plateaus with small wiggles (a few steps improve by < threshold).
        const double loss = e < 30 ? 10.0 - 0.2 * e : 4.0 + 0.001 * ((e * 7) % 5);
        const double m = std::string(mode) == "max" ? 20 - loss : loss;  // max: a rising score
        s.step(m);
        ref.step(m);
        for (size_t g = 0; g < 2; ++g) ASSERT_EQ(s.get_last_lr()[g], ref.lr[g]) << mode << tmode << " epoch " << e;
      }
      EXPECT_LT(s.get_last_lr()[0], kBase0 * 0.1) << mode << tmode << ": the plateau reduced the lr";
    }
}

// ---- state_dict

// Runs make() for `total` steps uninterrupted, and for `cut` steps, then saves optimizer and
// scheduler state (through a safetensors file), builds fresh ones, loads, and runs the rest: the
// lrs must be identical at every step.
void expect_resume(const std::function<std::unique_ptr<ls::LRScheduler>(optim::Optimizer&)>& make, int cut = 37,
                   int total = 100) {
  TwoGroups full;
  auto sf = make(full.opt);
  std::vector<std::vector<double>> want;
  for (int e = 0; e < total; ++e) {
    sf->step();
    want.push_back(sf->get_last_lr());
  }
  TwoGroups first;
  auto s1 = make(first.opt);
  for (int e = 0; e < cut; ++e) s1->step();
  const auto path =
      (std::filesystem::temp_directory_path() / ("tg_lr_sched_" + std::string(s1->name()) + ".safetensors")).string();
  tg::save(s1->state_dict(), path);
  const optim::OptimizerStateDict opt_sd = first.opt.state_dict();

  TwoGroups second;
  auto s2 = make(second.opt);
  second.opt.load_state_dict(opt_sd);
  s2->load_state_dict(tg::load(path));
  std::filesystem::remove(path);
  EXPECT_EQ(s2->last_epoch(), s1->last_epoch());
  EXPECT_EQ(s2->get_last_lr(), s1->get_last_lr());
  for (int e = cut; e < total; ++e) {
    s2->step();
    ASSERT_EQ(s2->get_last_lr(), want[e]) << s2->name() << " step " << e;
  }
}

TEST(LrScheduler, StateDictResumesEveryScheduler) {
  expect_resume([](optim::Optimizer& o) { return std::make_unique<ls::StepLR>(o, 9, 0.7); });
  expect_resume([](optim::Optimizer& o) {
    return std::make_unique<ls::MultiStepLR>(o, std::vector<int64_t>{20, 50}, 0.5);
  });
  expect_resume([](optim::Optimizer& o) { return std::make_unique<ls::ConstantLR>(o, 0.5, 40); });
  expect_resume([](optim::Optimizer& o) { return std::make_unique<ls::LinearLR>(o, 0.3, 1.0, 60); });
  expect_resume([](optim::Optimizer& o) { return std::make_unique<ls::ExponentialLR>(o, 0.95); });
  expect_resume([](optim::Optimizer& o) { return std::make_unique<ls::CosineAnnealingLR>(o, 30, 1e-4); });
  expect_resume([](optim::Optimizer& o) { return std::make_unique<ls::CosineAnnealingWarmRestarts>(o, 8, 2, 1e-4); });
  expect_resume(
      [](optim::Optimizer& o) { return std::make_unique<ls::LambdaLR>(o, [](int64_t e) { return 1.0 / (1 + e); }); });
  expect_resume([](optim::Optimizer& o) {
    return std::make_unique<ls::OneCycleLR>(o, 0.4, ls::OneCycleLROptions{.total_steps = 100, .three_phase = true});
  });
  expect_resume([](optim::Optimizer& o) {
    auto a = std::make_shared<ls::LinearLR>(o, 0.1, 1.0, 10);
    auto b = std::make_shared<ls::CosineAnnealingLR>(o, 50);
    return std::make_unique<ls::SequentialLR>(o, std::vector<std::shared_ptr<ls::LRScheduler>>{a, b},
                                              std::vector<int64_t>{20});
  });
}

TEST(LrScheduler, ReduceLROnPlateauStateDictResumes) {
  ls::ReduceLROnPlateauOptions o{.factor = 0.5, .patience = 2, .cooldown = 1};
  auto metric = [](int e) { return e < 10 ? 10.0 - e : 1.0; };
  TwoGroups full, first, second;
  ls::ReduceLROnPlateau sf(full.opt, o), s1(first.opt, o), s2(second.opt, o);
  for (int e = 0; e < 14; ++e) {
    sf.step(metric(e));
    s1.step(metric(e));
  }
  const nn::StateDict sd = s1.state_dict();
  second.opt.load_state_dict(first.opt.state_dict());
  s2.load_state_dict(sd);
  for (int e = 14; e < 40; ++e) {
    sf.step(metric(e));
    s2.step(metric(e));
    ASSERT_EQ(s2.get_last_lr(), sf.get_last_lr()) << e;
    ASSERT_EQ(s2.num_bad_epochs(), sf.num_bad_epochs()) << e;
  }
}

TEST(LrScheduler, StateDictEntries) {
  TwoGroups t;
  ls::StepLR s(t.opt, 5, 0.5);
  for (int i = 0; i < 6; ++i) s.step();
  const nn::StateDict sd = s.state_dict();
  EXPECT_EQ(sd.at("last_epoch").dtype(), kInt64);
  EXPECT_EQ(sd.at("last_epoch").dim(), 0);
  EXPECT_EQ(sd.at("last_epoch").item<int64_t>(), 6);
  EXPECT_EQ(sd.at("_step_count").item<int64_t>(), 7);
  EXPECT_EQ(sd.at("step_size").item<int64_t>(), 5);
  EXPECT_EQ(sd.at("gamma").dtype(), kFloat64);
  EXPECT_EQ(sd.at("gamma").item<double>(), 0.5);
  EXPECT_EQ(sd.at("base_lrs").to_vector<double>(), (std::vector<double>{kBase0, kBase1}));
  EXPECT_EQ(sd.at("_last_lr").to_vector<double>(), (std::vector<double>{kBase0 * 0.5, kBase1 * 0.5}));
  const std::vector<uint8_t> type = sd.at("type").to_vector<uint8_t>();
  EXPECT_EQ(std::string(type.begin(), type.end()), "StepLR");
}

TEST(LrScheduler, LoadStateDictRejectsOtherSchedulersAndBadEntries) {
  TwoGroups t;
  ls::StepLR step(t.opt, 5);
  ls::CosineAnnealingLR cos(t.opt, 10);
  for (int i = 0; i < 3; ++i) cos.step();
  const nn::StateDict before = cos.state_dict();
  try {
    cos.load_state_dict(step.state_dict());
    FAIL() << "loading a StepLR's state into a CosineAnnealingLR must throw";
  } catch (const tg::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("StepLR"), std::string::npos) << msg;
    EXPECT_NE(msg.find("CosineAnnealingLR"), std::string::npos) << msg;
  }
  auto with = [&](const std::string& key, const Tensor& value) {
    nn::StateDict sd = before;
    sd.insert(key, value);
    return sd;
  };
  auto without = [&](const std::string& key) {
    nn::StateDict sd;
    for (const auto& [k, v] : before)
      if (k != key) sd.insert(k, v);
    return sd;
  };
  EXPECT_THROW(cos.load_state_dict(without("T_max")), tg::Error);
  EXPECT_THROW(cos.load_state_dict(without("type")), tg::Error);
  EXPECT_THROW(cos.load_state_dict(with("T_max", tg::full({}, 0, kInt64))), tg::Error);                  // T_max <= 0
  EXPECT_THROW(cos.load_state_dict(with("T_max", tg::full({}, 10.0, kFloat64))), tg::Error);             // dtype
  EXPECT_THROW(cos.load_state_dict(with("base_lrs", tg::tensor(std::vector<double>{0.1}))), tg::Error);  // groups
  EXPECT_THROW(cos.load_state_dict(with("extra", tg::full({}, 1.0, kFloat64))), tg::Error);
  EXPECT_THROW(cos.load_state_dict(with("last_epoch", tg::full({}, -5, kInt64))), tg::Error);
  // Nothing changed.
  const nn::StateDict after = cos.state_dict();
  for (const auto& [k, v] : before) {
    const Tensor& w = after.at(k);
    EXPECT_TRUE(w.dtype() == v.dtype() && w.sizes() == v.sizes() && host(w.to(kFloat64)) == host(v.to(kFloat64))) << k;
  }
}

// ---- bad arguments

TEST(LrScheduler, BadArgumentsAreErrors) {
  TwoGroups t;
  auto expect_error = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      FAIL() << "expected a tg::Error containing '" << needle << "'";
    } catch (const tg::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto& o = t.opt;
  expect_error([&] { ls::StepLR s(o, 0); }, "StepLR: step_size");
  expect_error([&] { ls::StepLR s(o, 5, -0.1); }, "StepLR: gamma");
  expect_error([&] { ls::MultiStepLR s(o, {30, 10}); }, "sorted");
  expect_error([&] { ls::MultiStepLR s(o, {10}, -1); }, "MultiStepLR: gamma");
  expect_error([&] { ls::ExponentialLR s(o, -0.5); }, "ExponentialLR: gamma");
  expect_error([&] { ls::CosineAnnealingLR s(o, 0); }, "CosineAnnealingLR: T_max");
  expect_error([&] { ls::CosineAnnealingLR s(o, -4); }, "-4");
  expect_error([&] { ls::CosineAnnealingWarmRestarts s(o, 0); }, "T_0");
  expect_error([&] { ls::CosineAnnealingWarmRestarts s(o, 5, 0); }, "T_mult");
  expect_error([&] { ls::LinearLR s(o, 0.0); }, "start_factor");
  expect_error([&] { ls::LinearLR s(o, 0.5, 1.5); }, "end_factor");
  expect_error([&] { ls::ConstantLR s(o, 1.5); }, "ConstantLR: factor");
  expect_error([&] { ls::ConstantLR s(o, 0.5, 0); }, "total_iters");
  expect_error([&] { ls::LambdaLR s(o, std::vector<std::function<double(int64_t)>>{[](int64_t) { return 1.0; }}); },
               "expected 2 lr_lambdas");
  expect_error([&] { ls::OneCycleLR s(o, 0.1); }, "total_steps OR (epochs AND steps_per_epoch)");
  expect_error([&] { ls::OneCycleLR s(o, 0.1, {.total_steps = -3}); }, "total_steps");
  expect_error([&] { ls::OneCycleLR s(o, 0.1, {.epochs = 3}); }, "steps_per_epoch");
  expect_error([&] { ls::OneCycleLR s(o, 0.1, {.total_steps = 10, .pct_start = 1.5}); }, "pct_start");
  expect_error([&] { ls::OneCycleLR s(o, 0.1, {.total_steps = 10, .anneal_strategy = "exp"}); }, "anneal_strategy");
  expect_error([&] { ls::OneCycleLR s(o, {0.1, 0.2, 0.3}, {.total_steps = 10}); }, "max_lr");
  expect_error([&] { ls::ReduceLROnPlateau s(o, {.factor = 1.0}); }, "factor");
  expect_error([&] { ls::ReduceLROnPlateau s(o, {.mode = "avg"}); }, "avg");
  expect_error([&] { ls::ReduceLROnPlateau s(o, {.threshold_mode = "pct"}); }, "pct");
  expect_error([&] { ls::ReduceLROnPlateau s(o, {.min_lr = {0.1, 0.2, 0.3}}); }, "min_lr");
  auto a = std::make_shared<ls::ConstantLR>(o);
  auto b = std::make_shared<ls::ExponentialLR>(o, 0.9);
  expect_error([&] { ls::SequentialLR s(o, {a, b}, {}); }, "milestone");
  expect_error([&] { ls::SequentialLR s(o, {a, b}, {0}); }, "milestones");
  expect_error([&] { ls::SequentialLR s(o, {}, {}); }, "at least one");
  expect_error(
      [&] {
        ls::SequentialLR s(o, {a, std::make_shared<ls::ReduceLROnPlateau>(o)}, {5});
      },
      "ReduceLROnPlateau");
  TwoGroups other;
  auto c = std::make_shared<ls::StepLR>(other.opt, 3);
  expect_error([&] { ls::SequentialLR s(o, {a, c}, {5}); }, "different optimizer");
  // OneCycleLR needs momentum or betas to cycle.
  struct NoMomentum : optim::SGD {
    using SGD::SGD;
    bool group_option(size_t, std::string_view, std::vector<double>&) const override { return false; }
  };
  std::vector<Tensor> p{tg::zeros({2}, kFloat64).requires_grad_()};
  NoMomentum nm(p, {.lr = 0.1});
  expect_error([&] { ls::OneCycleLR s(nm, 0.1, {.total_steps = 10}); }, "momentum or beta1");
  ls::OneCycleLR fine(nm, 0.1, {.total_steps = 10, .cycle_momentum = false});
  EXPECT_DOUBLE_EQ(fine.get_last_lr()[0], 0.1 / 25);
}

// ---- the optimizer's side

// A CPU step after set_lr is the float64 reference's step with that lr (SGD momentum with 1cycle
// momentum too; AdamW with cosine annealing).
TEST(LrScheduler, CpuStepsFollowTheScheduledLr) {
  {
    auto params = make_params(Device(kCPU), kFloat64, 3);
    optim::SGDOptions o{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3};
    optim::SGD opt(params, o);
    ls::OneCycleLR s(opt, 0.3, {.total_steps = 30});
    std::vector<Vec> ref_p;
    std::vector<RefSgd> refs;
    for (const auto& p : params) {
      ref_p.push_back(host(p));
      refs.emplace_back(o);
    }
    for (int k = 0; k < 30; ++k) {
      auto grads = make_grads(k, 5);
      set_grads(params, grads);
      opt.step();
      for (size_t i = 0; i < params.size(); ++i) {
        refs[i].lr = s.get_last_lr()[0];
        refs[i].momentum = opt.param_groups()[0].options.momentum;
        refs[i].step(ref_p[i], host(grads[i]));
      }
      s.step();
    }
    for (size_t i = 0; i < params.size(); ++i) expect_close(host(params[i]), ref_p[i], 1e-12, 1e-12, "SGD param");
  }
  {
    auto params = make_params(Device(kCPU), kFloat64, 4);
    optim::AdamWOptions o{.lr = 0.01, .weight_decay = 0.1};
    optim::AdamW opt(params, o);
    ls::CosineAnnealingLR s(opt, 10, 1e-4);
    std::vector<Vec> ref_p;
    std::vector<RefAdam> refs;
    for (const auto& p : params) {
      ref_p.push_back(host(p));
      refs.emplace_back(o, true);
    }
    for (int k = 0; k < 25; ++k) {
      auto grads = make_grads(k, 6);
      set_grads(params, grads);
      opt.step();
      for (size_t i = 0; i < params.size(); ++i) {
        refs[i].lr = 1e-4 + (0.01 - 1e-4) * (1 + std::cos(kPi * k / 10.0)) / 2;
        refs[i].step(ref_p[i], host(grads[i]));
      }
      s.step();
    }
    for (size_t i = 0; i < params.size(); ++i) expect_close(host(params[i]), ref_p[i], 1e-12, 1e-11, "AdamW param");
  }
}

// The optimizer's state_dict carries each group's lr as set by set_lr, and loading it restores it.
TEST(LrScheduler, OptimizerStateDictRoundTripsLr) {
  TwoGroups t;
  ls::ExponentialLR s(t.opt, 0.5);
  s.step();
  s.step();
  const optim::OptimizerStateDict sd = t.opt.state_dict();
  EXPECT_EQ(sd.at("param_groups.0.lr").item<double>(), kBase0 * 0.25);
  EXPECT_EQ(sd.at("param_groups.1.lr").item<double>(), kBase1 * 0.25);
  TwoGroups u;
  u.opt.load_state_dict(sd);
  EXPECT_EQ(u.opt.lr(0), kBase0 * 0.25);
  EXPECT_EQ(u.opt.lr(1), kBase1 * 0.25);
  // initial_lr belongs to the schedulers' bookkeeping, not the optimizer's state dict.
  for (const auto& [k, v] : sd) EXPECT_EQ(k.find("initial_lr"), std::string::npos) << k;
}

// The options by name that OneCycleLR cycles, validated as the constructor does; initial_lr is
// NaN until the first scheduler records it.
TEST(LrScheduler, OptimizerOptionsByName) {
  TwoGroups t;
  std::vector<double> v;
  EXPECT_TRUE(t.opt.group_option(1, "momentum", v));
  EXPECT_EQ(v, std::vector<double>{0.9});
  EXPECT_FALSE(t.opt.group_option(0, "betas", v));
  EXPECT_FALSE(t.opt.group_option(0, "nesterov", v));  // not numeric
  t.opt.set_group_option(1, "momentum", {0.5});
  EXPECT_EQ(t.opt.param_groups()[1].options.momentum, 0.5);
  EXPECT_EQ(t.opt.param_groups()[0].options.momentum, 0.9);
  EXPECT_THROW(t.opt.set_group_option(0, "momentum", {-1.0}), tg::Error);  // SGD's own check
  EXPECT_EQ(t.opt.param_groups()[0].options.momentum, 0.9);
  EXPECT_THROW(t.opt.set_group_option(0, "betas", {0.9, 0.99}), tg::Error);
  EXPECT_THROW(t.opt.set_group_option(0, "momentum", {0.1, 0.2}), tg::Error);
  EXPECT_THROW(t.opt.group_option(2, "momentum", v), tg::Error);  // no group 2
  auto p = std::vector<Tensor>{tg::zeros({2}, kFloat64).requires_grad_()};
  optim::Adam adam(p, {.lr = 0.1});
  EXPECT_TRUE(adam.group_option(0, "betas", v));
  EXPECT_EQ(v, (std::vector<double>{0.9, 0.999}));
  EXPECT_THROW(adam.set_group_option(0, "betas", {1.0, 0.999}), tg::Error);  // beta1 in [0, 1)
  EXPECT_TRUE(std::isnan(t.opt.initial_lr(0)));
  ls::ExponentialLR s(t.opt, 0.5);
  EXPECT_EQ(t.opt.initial_lr(0), kBase0);
  EXPECT_EQ(t.opt.initial_lr(1), kBase1);
}

// ---- CUDA: the device lr

std::vector<float> bits(const std::vector<Tensor>& ps) {
  std::vector<float> out;
  for (const auto& p : ps) {
    auto v = p.detach().cpu().to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// Eager CUDA steps follow set_lr and an lr assigned through param_groups() (refreshed at the
// step), as the CPU does (float32, within 1e-6).
TEST(LrSchedulerCuda, EagerStepsFollowSetLr) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  auto cpu_p = make_params(Device(kCPU), kFloat32, 8);
  auto gpu_p = make_params(Device(kCUDA), kFloat32, 8);
  optim::AdamW cpu_opt(cpu_p, {.lr = 0.01, .weight_decay = 0.05}), gpu_opt(gpu_p, {.lr = 0.01, .weight_decay = 0.05});
  for (int k = 0; k < 8; ++k) {
    const double lr = 0.01 * (1 + k) / (1 + k * k);
    if (k % 2 == 0) {
      cpu_opt.set_lr(lr);
      gpu_opt.set_lr(lr);
    } else {
      cpu_opt.param_groups()[0].options.lr = lr;
      gpu_opt.param_groups()[0].options.lr = lr;
    }
    auto grads = make_grads(k, 9);
    set_grads(cpu_p, grads);
    set_grads(gpu_p, grads);
    cpu_opt.step();
    gpu_opt.step();
  }
  for (size_t i = 0; i < cpu_p.size(); ++i) expect_close(host(gpu_p[i]), host(cpu_p[i]), 1e-6, 1e-6, "param");
}

// One optimizer step captured into a tg::cuda::Graph; between replays new gradients are copied in
// and the scheduler steps (set_lr: an async write of the device lr). The replayed parameters equal
// an eager run bit for bit, and the float64 reference with the scheduled lrs.
template <class Opt, class Options, class Ref>
void graph_follows_scheduler(const Options& o, bool decoupled) {
  cuda::Stream side;
  cuda::StreamGuard guard(side);
  auto pe = make_params(Device(kCUDA), kFloat32, 12), pg = make_params(Device(kCUDA), kFloat32, 12);
  std::vector<Vec> ref_p;
  for (const auto& p : pe) ref_p.push_back(host(p));
  Opt oe(pe, o), og(pg, o);
  ls::CosineAnnealingLR se(oe, 6, 1e-4), sg(og, 6, 1e-4);
  std::vector<std::unique_ptr<Ref>> refs;
  for (size_t i = 0; i < pe.size(); ++i) {
    if constexpr (std::is_same_v<Ref, RefAdam>)
      refs.push_back(std::make_unique<Ref>(o, decoupled));
    else
      refs.push_back(std::make_unique<Ref>(o));
  }
  // Static gradients, written in place before every step.
  std::vector<Tensor> ge, gg;
  for (const auto& p : pe) ge.push_back(tg::zeros(p.sizes(), p.options()));
  for (const auto& p : pg) gg.push_back(tg::zeros(p.sizes(), p.options()));
  for (size_t i = 0; i < pe.size(); ++i) {
    pe[i].mutable_grad() = ge[i];
    pg[i].mutable_grad() = gg[i];
  }
  cuda::Graph graph;
  const int kWarmup = 2, kSteps = 14;  // past T_max: the lr comes back up
  std::vector<double> lrs_seen;
  for (int k = 0; k < kWarmup + kSteps; ++k) {
    auto grads = make_grads(k, 21);
    for (size_t i = 0; i < pe.size(); ++i) {
      ge[i].copy_(grads[i].to(Device(kCUDA)));
      gg[i].copy_(grads[i].to(Device(kCUDA)));
    }
    const double lr = se.get_last_lr()[0];
    lrs_seen.push_back(lr);
    oe.step();
    if (k < kWarmup) {
      og.step();
    } else {
      if (!graph.is_captured()) graph.capture([&] { og.step(); });
      graph.replay();
    }
    for (size_t i = 0; i < pe.size(); ++i) {
      refs[i]->lr = lr;
      refs[i]->step(ref_p[i], host(grads[i]));
    }
    se.step();
    sg.step();
  }
  side.synchronize();
  EXPECT_NE(lrs_seen[kWarmup], lrs_seen[kWarmup + 3]) << "the scheduled lr changes between replays";
  const auto eager = bits(pe), replayed = bits(pg);
  ASSERT_EQ(eager.size(), replayed.size());
  EXPECT_EQ(std::memcmp(eager.data(), replayed.data(), eager.size() * sizeof(float)), 0)
      << "the replayed steps differ from the eager steps";
  for (size_t i = 0; i < pe.size(); ++i) expect_close(host(pg[i]), ref_p[i], 2e-5, 2e-5, "replayed param");
}

TEST(LrSchedulerCuda, CapturedSgdStepReplaysWithScheduledLr) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  graph_follows_scheduler<optim::SGD, optim::SGDOptions, RefSgd>({.lr = 0.05, .momentum = 0.9, .nesterov = true},
                                                                 false);
}

TEST(LrSchedulerCuda, CapturedAdamWStepReplaysWithScheduledLr) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  graph_follows_scheduler<optim::AdamW, optim::AdamWOptions, RefAdam>({.lr = 0.01, .weight_decay = 0.1}, true);
}

// set_lr inside a capture, or a step captured after the lr was assigned without set_lr, would
// freeze a value into the graph: both are tg::Errors.
TEST(LrSchedulerCuda, LrChangesInsideACaptureAreErrors) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  cuda::Stream side;
  cuda::StreamGuard guard(side);
  auto p = make_params(Device(kCUDA), kFloat32, 13);
  optim::SGD opt(p, {.lr = 0.1});
  set_grads(p, make_grads(0, 1));
  opt.step();
  {
    cuda::Graph graph;
    EXPECT_THROW(graph.capture([&] {
      opt.set_lr(0.05);
      opt.step();
    }),
                 tg::Error);
  }
  opt.param_groups()[0].options.lr = 0.02;
  {
    cuda::Graph graph;
    EXPECT_THROW(graph.capture([&] { opt.step(); }), tg::Error);
  }
  opt.step();  // eager: refreshed, and works
  side.synchronize();
}

// Loading an optimizer state dict writes the loaded lr to the device copy: a CUDA step right after
// the load uses it.
TEST(LrSchedulerCuda, LoadedLrReachesTheDevice) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  auto a = make_params(Device(kCUDA), kFloat32, 14), b = make_params(Device(kCUDA), kFloat32, 14);
  optim::SGD oa(a, {.lr = 0.25}), ob(b, {.lr = 1.0});
  ob.load_state_dict(oa.state_dict());
  EXPECT_EQ(ob.lr(0), 0.25);
  const auto grads = make_grads(0, 2);
  set_grads(a, grads);
  set_grads(b, grads);
  oa.step();
  ob.step();
  EXPECT_EQ(bits(a), bits(b));
}

}  // namespace
}  // namespace tg::testing
