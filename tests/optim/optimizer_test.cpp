// The optimizer base: zero_grad, parameter groups and lr, skipped parameters,
// bad input, state_dict round trip, and the AMP inputs (found_inf skips bit-exactly
// without advancing the step count; grad_scale divides) on the CPU and on CUDA.
#include <gtest/gtest.h>

#include "tests/optim/reference.h"

namespace tg::testing {
namespace {

TEST(Optimizer, ZeroGrad) {
  auto p = tg::randn({3}).requires_grad_();
  optim::SGD opt({p}, {.lr = 0.1});
  (p * p).sum().backward();
  ASSERT_TRUE(p.grad().defined());
  opt.zero_grad(/*set_to_none=*/false);
  ASSERT_TRUE(p.grad().defined());
  EXPECT_EQ(host(p.grad()), Vec(3, 0.0));
  opt.zero_grad();
  EXPECT_FALSE(p.grad().defined());
}

TEST(Optimizer, TrainsThroughAutograd) {
  // minimize |p - 3|^2 with plain SGD: p -> 3.
  auto p = tg::zeros({2}).requires_grad_();
  optim::SGD opt({p}, {.lr = 0.1});
  for (int i = 0; i < 200; ++i) {
    opt.zero_grad();
    ((p - 3.0) * (p - 3.0)).sum().backward();
    opt.step();
  }
  expect_close(host(p), {3.0, 3.0}, 1e-5, 0, "p");
}

TEST(Optimizer, ParamGroupsWithDifferentLr) {
  auto a = tg::randn({4}).requires_grad_();
  auto b = tg::randn({5}).requires_grad_();
  auto c = tg::randn({2}).requires_grad_();
  optim::SGD opt({{{a}, {.lr = 0.1}}, {{b}, {.lr = 0.01}}}, {.lr = 1.0});
  opt.add_param_group({{c}, {}});  // lr not given: the defaults' (1.0)
  ASSERT_EQ(opt.num_param_groups(), 3u);
  EXPECT_EQ(opt.lr(0), 0.1);
  EXPECT_EQ(opt.lr(1), 0.01);
  EXPECT_EQ(opt.lr(2), 1.0);
  EXPECT_EQ(opt.parameters().size(), 3u);
  const Vec a0 = host(a), b0 = host(b), c0 = host(c);
  for (auto* t : {&a, &b, &c}) t->mutable_grad() = tg::ones(t->sizes());
  opt.step();
  for (size_t i = 0; i < a0.size(); ++i) EXPECT_NEAR(host(a)[i], a0[i] - 0.1, 1e-6);
  for (size_t i = 0; i < b0.size(); ++i) EXPECT_NEAR(host(b)[i], b0[i] - 0.01, 1e-6);
  for (size_t i = 0; i < c0.size(); ++i) EXPECT_NEAR(host(c)[i], c0[i] - 1.0, 1e-6);
  // Schedulers set lr per group or for all.
  opt.set_lr(1, 0.5);
  EXPECT_EQ(opt.lr(1), 0.5);
  opt.set_lr(0.25);
  for (size_t g = 0; g < 3; ++g) EXPECT_EQ(opt.lr(g), 0.25);
  opt.param_groups()[2].options.lr = 2.0;
  EXPECT_EQ(opt.lr(2), 2.0);
  EXPECT_THROW(opt.lr(3), Error);
}

TEST(Optimizer, BadInput) {
  auto p = tg::randn({3}).requires_grad_();
  auto not_leaf = p * 2;
  EXPECT_THROW(optim::SGD({not_leaf}, {.lr = 0.1}), Error);
  EXPECT_THROW(optim::SGD(std::vector<Tensor>{}, {.lr = 0.1}), Error);
  EXPECT_THROW(optim::SGD({p, p}, {.lr = 0.1}), Error);
  EXPECT_THROW(optim::Adam({tg::arange(3)}), Error);  // not floating
  optim::SGD opt({p}, {.lr = 0.1});
  EXPECT_THROW(opt.add_param_group({{p}, {.lr = 0.1}}), Error);  // already in a group
  // A parameter without a gradient is skipped.
  const Vec before = host(p);
  opt.step();
  EXPECT_EQ(host(p), before);
  // A gradient that does not match its parameter is an error naming both.
  p.mutable_grad() = tg::ones({4});
  EXPECT_THROW(opt.step(), Error);
  p.mutable_grad() = tg::ones({3}, kFloat64);
  EXPECT_THROW(opt.step(), Error);
  // Bad AMP inputs.
  p.mutable_grad() = tg::ones({3});
  EXPECT_THROW(opt.step({.grad_scale = tg::ones({2})}), Error);
  EXPECT_THROW(opt.step({.found_inf = tg::zeros({}, kFloat64)}), Error);
  if (has_cuda()) {
    EXPECT_THROW(opt.step({.found_inf = tg::zeros({}, Device(kCUDA))}), Error);  // CPU params, CUDA found_inf
  }
}

// Parameters, state and step counts after one optimizer run, as bytes.
std::vector<std::vector<unsigned char>> snapshot(const optim::Optimizer& opt) {
  std::vector<std::vector<unsigned char>> out;
  for (const auto& kv : opt.state_dict()) out.push_back(bytes_of(kv.second));
  for (const auto& p : opt.parameters()) out.push_back(bytes_of(p));
  return out;
}

void check_found_inf_and_grad_scale(Device dev) {
  for (int which = 0; which < 3; ++which) {
    auto params = make_params(dev, kFloat32, 3);
    auto twins = make_params(dev, kFloat32, 3);
    std::unique_ptr<optim::Optimizer> opt, twin;
    if (which == 0) {
      opt = std::make_unique<optim::Adam>(params, optim::AdamOptions{.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true});
      twin = std::make_unique<optim::Adam>(twins, optim::AdamOptions{.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true});
    } else if (which == 1) {
      opt = std::make_unique<optim::AdamW>(params, optim::AdamWOptions{.lr = 1e-2});
      twin = std::make_unique<optim::AdamW>(twins, optim::AdamWOptions{.lr = 1e-2});
    } else {
      opt = std::make_unique<optim::SGD>(params, optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true});
      twin = std::make_unique<optim::SGD>(twins, optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true});
    }
    const auto opts = TensorOptions().device(dev);
    Tensor no_inf = tg::zeros({}, opts), inf = tg::ones({}, opts), scale = tg::full({}, 1024.0, opts);
    // A skipped first step creates no progress: the next step is still "step 1".
    set_grads(params, make_grads(0, 5));
    opt->step({.grad_scale = scale, .found_inf = inf});
    for (int k = 0; k < 3; ++k) {
      auto grads = make_grads(k, 5);
      std::vector<Tensor> scaled;
      for (auto& g : grads) scaled.push_back(g * 1024.0);  // exact: a power of two
      set_grads(twins, grads);
      twin->step();
      set_grads(params, scaled);
      opt->step({.grad_scale = scale, .found_inf = no_inf});
      // found_inf set: nothing changes, bit for bit, even with garbage gradients.
      const auto before = snapshot(*opt);
      std::vector<Tensor> garbage;
      for (auto& g : grads) garbage.push_back(g * 1e30);
      set_grads(params, garbage);
      opt->step({.grad_scale = scale, .found_inf = inf});
      EXPECT_EQ(snapshot(*opt), before) << opt->name() << " on " << dev << ": a skipped step changed something";
    }
    // grad_scale divides exactly: the scaled run equals the unscaled twin bit for bit.
    EXPECT_EQ(snapshot(*opt), snapshot(*twin)) << opt->name() << " on " << dev;
    if (which < 2) EXPECT_EQ(opt->state(params[0])->at("step").item<float>(), 3.f);
  }
}

TEST(Optimizer, FoundInfSkipsAndGradScaleDividesCpu) { check_found_inf_and_grad_scale(Device(kCPU)); }
TEST(Optimizer, FoundInfSkipsAndGradScaleDividesCuda) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  check_found_inf_and_grad_scale(Device(kCUDA));
}

void check_state_dict_round_trip(Device dev) {
  auto params = make_params(dev, kFloat32, 21);
  optim::Adam opt(params, {.lr = 1e-2, .betas = {0.8, 0.99}, .amsgrad = true});
  for (int k = 0; k < 3; ++k) {
    set_grads(params, make_grads(k, 2));
    opt.step();
  }
  const auto sd = opt.state_dict();
  EXPECT_EQ(sd.at("state.0.step").item<float>(), 3.f);
  EXPECT_EQ(sd.at("state.2.exp_avg").sizes(), params[2].sizes());
  EXPECT_TRUE(sd.contains("state.1.max_exp_avg_sq"));
  EXPECT_EQ(sd.at("param_groups.0.lr").item<double>(), 1e-2);
  EXPECT_EQ(host(sd.at("param_groups.0.betas")), Vec({0.8, 0.99}));
  EXPECT_EQ(sd.at("param_groups.0.amsgrad").item<bool>(), true);
  EXPECT_EQ(sd.at("param_groups.0.params").to_vector<int64_t>(), std::vector<int64_t>({0, 1, 2}));

  // A fresh optimizer over copies of the parameters, loaded from a CPU copy of the dict.
  std::vector<Tensor> copies;
  for (auto& p : params) copies.push_back(p.detach().clone().requires_grad_());
  optim::Adam other(copies);  // different options: the dict's win
  StateDict cpu_sd;
  for (const auto& [k, v] : sd) cpu_sd.insert(k, v.cpu().clone());
  other.load_state_dict(cpu_sd);
  EXPECT_EQ(other.lr(), 1e-2);
  EXPECT_TRUE(other.param_groups()[0].options.amsgrad);
  EXPECT_EQ(other.state(copies[0])->at("step").device(), copies[0].device());
  for (int k = 3; k < 5; ++k) {
    set_grads(params, make_grads(k, 2));
    set_grads(copies, make_grads(k, 2));
    opt.step();
    other.step();
  }
  EXPECT_EQ(snapshot(opt), snapshot(other));

  // Mismatches are errors naming what differs.
  optim::Adam two_groups({{{copies[0]}, {}}, {{copies[1], copies[2]}, {}}});
  EXPECT_THROW(two_groups.load_state_dict(cpu_sd), Error);
  optim::Adam fewer({copies[0], copies[1]});
  EXPECT_THROW(fewer.load_state_dict(cpu_sd), Error);
  auto bad = cpu_sd;
  bad.insert("state.0.bogus.x", tg::zeros({1}));
  bad.insert("param_groups.0.unknown", tg::zeros({}));
  EXPECT_THROW(other.load_state_dict(bad), Error);
  bad = cpu_sd;
  bad.insert("state.0.exp_avg", tg::zeros({2, 2}));
  EXPECT_THROW(other.load_state_dict(bad), Error);
  bad = cpu_sd;
  ASSERT_TRUE(bad.erase("param_groups.0.eps"));
  EXPECT_THROW(other.load_state_dict(bad), Error);
}

TEST(Optimizer, StateDictRoundTripCpu) { check_state_dict_round_trip(Device(kCPU)); }
TEST(Optimizer, StateDictRoundTripCuda) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  check_state_dict_round_trip(Device(kCUDA));
}

TEST(Optimizer, SgdStateDictHasMomentumBuffer) {
  auto p = tg::randn({3}).requires_grad_();
  optim::SGD opt({p}, {.lr = 0.1, .momentum = 0.9});
  p.mutable_grad() = tg::ones({3});
  opt.step();
  auto sd = opt.state_dict();
  ASSERT_TRUE(sd.contains("state.0.momentum_buffer"));
  EXPECT_EQ(host(sd.at("state.0.momentum_buffer")), Vec(3, 1.0));
  optim::SGD none({p}, {.lr = 0.1});
  none.step();
  EXPECT_FALSE(none.state_dict().contains("state.0.momentum_buffer"));
}

// Issue #19's finding 3: saved parameter indices were bounded by 2^40 only, and sized a vector
// from the file (terabytes for 2^40 - 1; 16 GB accepted for 1000000007). They are bounded by the
// optimizer's own parameter count now, before any allocation, and a refused dict changes nothing.
TEST(Optimizer, LoadStateDictBoundsIndicesByParameterCount) {
  auto a = tg::randn({3}).requires_grad_(), b = tg::randn({2}).requires_grad_();
  optim::AdamOptions o;
  o.lr = 0.5;
  optim::Adam opt({a, b}, o);
  a.mutable_grad() = tg::ones({3});
  b.mutable_grad() = tg::ones({2});
  opt.step();
  const auto good = opt.state_dict();
  for (int64_t bad_index : {int64_t{2}, int64_t{1000000007}, (int64_t{1} << 40) - 1, int64_t{1} << 62, int64_t{-1}}) {
    auto sd = good;
    sd.insert("param_groups.0.params", tg::tensor(std::vector<int64_t>{0, bad_index}));
    try {
      opt.load_state_dict(sd);
      ADD_FAILURE() << "index " << bad_index << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("bad parameter index"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("2 parameters"), std::string::npos) << e.what();
    }
  }
  // A huge weight decay loads (PyTorch accepts any value >= 0) and is kept exactly.
  auto sd = good;
  sd.insert("param_groups.0.weight_decay", tg::full({}, 1e300, kFloat64));
  opt.load_state_dict(sd);
  EXPECT_EQ(opt.param_groups()[0].options.weight_decay, 1e300);
  // Infinite and NaN options are refused where the constructor refuses them, with no change.
  sd = good;
  sd.insert("param_groups.0.lr", tg::full({}, std::nan(""), kFloat64));
  EXPECT_THROW(opt.load_state_dict(sd), Error);
  EXPECT_EQ(opt.param_groups()[0].options.weight_decay, 1e300);
  EXPECT_EQ(opt.lr(), 0.5);
}

}  // namespace
}  // namespace tg::testing
