// GradScaler: skipped steps on inf / NaN (parameters and optimizer state
// bit-identical), backoff and growth of the scale, PyTorch's exact sequence of
// scales for a scripted run, unscale_ values, the per-optimizer state machine
// errors, state_dict, and the disabled scaler. Each runs on the CPU and, when a
// GPU is present, on CUDA (the fused kernels).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.h>

#include <tapegrad/core/finite_proxy.h>

namespace tg::testing {
namespace {

std::vector<Device> devices() {
  std::vector<Device> d{Device(kCPU)};
  if (cuda::is_available()) d.emplace_back(kCUDA, 0);
  return d;
}

// Raw bytes of a tensor (for bit-identical comparisons).
std::vector<uint8_t> bytes_of(const Tensor& t) {
  std::vector<uint8_t> b(t.nbytes());
  t.contiguous().copy_to_host(b.data());
  return b;
}

struct Rig {
  explicit Rig(Device dev, optim::SGDOptions o = {.lr = 0.1, .momentum = 0.9}) {
    manual_seed(11);
    w = randn({5, 3}, TensorOptions().device(dev)).requires_grad_();
    b = randn({3}, TensorOptions().device(dev)).requires_grad_();
    x = randn({7, 5}, TensorOptions().device(dev));
    opt = std::make_unique<optim::SGD>(std::vector<Tensor>{w, b}, o);
  }
  Tensor loss() const { return (matmul(x, w) + b).pow(2).mean(); }
  Tensor w, b, x;
  std::unique_ptr<optim::SGD> opt;
};

// Everything a skipped step must leave untouched.
std::vector<std::vector<uint8_t>> snapshot(const Rig& s) {
  std::vector<std::vector<uint8_t>> out{bytes_of(s.w), bytes_of(s.b)};
  for (const auto& [k, v] : s.opt->state_dict())
    if (k.rfind("state.", 0) == 0) out.push_back(bytes_of(v));
  return out;
}

void poison(const Tensor& grad, double value) { grad.view({-1}).slice(0, 1, 2).fill_(value); }

void check_skip(Device dev, double bad) {
  SCOPED_TRACE(dev.str() + " poison " + std::to_string(bad));
  Rig s(dev);
  amp::GradScaler scaler({.init_scale = 1024, .growth_interval = 3});
  // Two clean steps: momentum state exists and the tracker is at 2.
  for (int i = 0; i < 2; ++i) {
    s.opt->zero_grad();
    scaler.scale(s.loss()).backward();
    scaler.step(*s.opt);
    scaler.update();
  }
  EXPECT_EQ(scaler.get_growth_tracker(), 2);
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  s.opt->zero_grad();
  scaler.scale(s.loss()).backward();
  poison(s.b.grad(), bad);  // one element of one gradient
  const auto before = snapshot(s);
  ASSERT_GE(before.size(), 4u);  // params + momentum buffers + steps
  scaler.step(*s.opt);
  EXPECT_EQ(scaler.found_inf(*s.opt).item<float>(), 1.f);
  scaler.update();
  EXPECT_EQ(snapshot(s), before);
  EXPECT_EQ(scaler.get_scale(), 512.0);
  EXPECT_EQ(scaler.get_growth_tracker(), 0);
  // The next clean step moves the parameters again.
  s.opt->zero_grad();
  scaler.scale(s.loss()).backward();
  scaler.step(*s.opt);
  scaler.update();
  EXPECT_NE(snapshot(s), before);
  EXPECT_EQ(scaler.get_growth_tracker(), 1);
}

TEST(GradScaler, InfSkipsStepAndBacksOff) {
  for (Device d : devices()) check_skip(d, std::numeric_limits<double>::infinity());
}
TEST(GradScaler, NegInfSkipsStep) {
  for (Device d : devices()) check_skip(d, -std::numeric_limits<double>::infinity());
}
TEST(GradScaler, NaNSkipsStepAndBacksOff) {
  for (Device d : devices()) check_skip(d, std::numeric_limits<double>::quiet_NaN());
}
TEST(GradScaler, InfAfterExplicitUnscaleSkipsStep) {
  for (Device dev : devices()) {
    Rig s(dev);
    amp::GradScaler scaler;
    s.opt->zero_grad();
    scaler.scale(s.loss()).backward();
    poison(s.w.grad(), std::numeric_limits<double>::infinity());
    const auto before = snapshot(s);
    scaler.unscale_(*s.opt);
    scaler.step(*s.opt);
    scaler.update();
    // The parameters are untouched. A first (skipped) step may still create the optimizer's
    // state, zero-filled, as PyTorch's fused optimizers do: so compare the parameters here;
    // check_skip above compares the state too, after it exists.
    auto after = snapshot(s);
    after.resize(before.size());
    EXPECT_EQ(after, before) << dev;
    EXPECT_EQ(scaler.get_scale(), 32768.0) << dev;
  }
}

// Each optimizer's found_inf is one persistent flag: set by the check, read by the
// step, cleared by update() (no zero-fill launch per iteration), reused next time.
TEST(GradScaler, FoundInfIsPersistentAndClearedByUpdate) {
  for (Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    Rig s(dev);
    amp::GradScaler scaler({.init_scale = 1024});
    s.opt->zero_grad();
    scaler.scale(s.loss()).backward();
    poison(s.w.grad(), std::numeric_limits<double>::infinity());
    scaler.step(*s.opt);
    const Tensor flag = scaler.found_inf(*s.opt);
    ASSERT_TRUE(flag.defined());
    EXPECT_EQ(flag.item<float>(), 1.f);
    scaler.update();
    EXPECT_FALSE(scaler.found_inf(*s.opt).defined());
    EXPECT_EQ(flag.item<float>(), 0.f);  // consumed by the update
    EXPECT_EQ(scaler.get_scale(), 512.0);
    for (int i = 0; i < 2; ++i) {  // clean steps read the cleared flag
      s.opt->zero_grad();
      scaler.scale(s.loss()).backward();
      scaler.step(*s.opt);
      EXPECT_TRUE(scaler.found_inf(*s.opt).is_same(flag));
      EXPECT_EQ(flag.item<float>(), 0.f);
      scaler.update();
    }
    EXPECT_EQ(scaler.get_growth_tracker(), 2);
    // update(new_scale) does not clear a flag: the next check zero-fills it first.
    s.opt->zero_grad();
    scaler.scale(s.loss()).backward();
    poison(s.w.grad(), std::numeric_limits<double>::quiet_NaN());
    scaler.unscale_(*s.opt);
    scaler.step(*s.opt);
    scaler.update(256.0);
    EXPECT_EQ(flag.item<float>(), 1.f);
    s.opt->zero_grad();
    scaler.scale(s.loss()).backward();
    scaler.step(*s.opt);
    EXPECT_EQ(flag.item<float>(), 0.f);
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), 256.0);
    EXPECT_EQ(scaler.get_growth_tracker(), 3);  // update(new_scale) leaves the tracker alone
  }
}

// Two optimizers, one update: an overflow in either backs off the scale and both flags clear.
TEST(GradScaler, UpdateReadsEveryOptimizersFlag) {
  for (Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    Rig a(dev), b(dev);
    amp::GradScaler scaler({.init_scale = 64});
    for (int overflow_in : {1, 0, -1}) {  // b overflows, a overflows, none
      a.opt->zero_grad();
      b.opt->zero_grad();
      scaler.scale(a.loss() + b.loss()).backward();
      if (overflow_in == 1) poison(b.w.grad(), std::numeric_limits<double>::infinity());
      if (overflow_in == 0) poison(a.b.grad(), std::numeric_limits<double>::infinity());
      scaler.step(*a.opt);
      scaler.step(*b.opt);
      const Tensor fa = scaler.found_inf(*a.opt), fb = scaler.found_inf(*b.opt);
      scaler.update();
      EXPECT_EQ(fa.item<float>(), 0.f);
      EXPECT_EQ(fb.item<float>(), 0.f);
    }
    EXPECT_EQ(scaler.get_scale(), 16.0);
    EXPECT_EQ(scaler.get_growth_tracker(), 1);
  }
}

TEST(GradScaler, GrowsAfterIntervalOfCleanSteps) {
  for (Device dev : devices()) {
    Rig s(dev, {.lr = 1e-3});
    amp::GradScaler scaler({.init_scale = 8, .growth_factor = 2, .growth_interval = 4});
    std::vector<int64_t> trackers;
    std::vector<double> scales;
    for (int i = 0; i < 9; ++i) {
      s.opt->zero_grad();
      scaler.scale(s.loss()).backward();
      scaler.step(*s.opt);
      scaler.update();
      trackers.push_back(scaler.get_growth_tracker());
      scales.push_back(scaler.get_scale());
    }
    EXPECT_EQ(trackers, (std::vector<int64_t>{1, 2, 3, 0, 1, 2, 3, 0, 1})) << dev;
    EXPECT_EQ(scales, (std::vector<double>{8, 8, 8, 16, 16, 16, 16, 32, 32})) << dev;
  }
}

// A scripted run of overflowing ('O') and clean ('.') steps gives PyTorch's scales
// exactly. The expectation is computed here by the _amp_update_scale_ formula in
// float32 arithmetic (scale * factor in double, rounded to float).
TEST(GradScaler, ScriptedSequenceMatchesPyTorchFormula) {
  const std::string script = "..O...O..........OO.O.....O......";
  const double growth = 2.0, backoff = 0.25;
  const int64_t interval = 5;
  for (Device dev : devices()) {
    Rig s(dev, {.lr = 1e-4});
    amp::GradScaler scaler({.init_scale = 3.0, .growth_factor = growth, .backoff_factor = backoff,
                            .growth_interval = interval});
    float expect_scale = 3.0f;
    int64_t expect_tracker = 0;
    for (size_t i = 0; i < script.size(); ++i) {
      s.opt->zero_grad();
      scaler.scale(s.loss()).backward();
      if (script[i] == 'O') poison(s.w.grad(), std::numeric_limits<double>::infinity());
      scaler.step(*s.opt);
      scaler.update();
      if (script[i] == 'O') {
        expect_scale = static_cast<float>(static_cast<double>(expect_scale) * backoff);
        expect_tracker = 0;
      } else if (++expect_tracker == interval) {
        expect_scale = static_cast<float>(static_cast<double>(expect_scale) * growth);
        expect_tracker = 0;
      }
      ASSERT_EQ(scaler.scale_tensor().item<float>(), expect_scale) << dev << " step " << i;
      ASSERT_EQ(scaler.get_growth_tracker(), expect_tracker) << dev << " step " << i;
    }
  }
}

TEST(GradScaler, ScaleAndUnscaleValues) {
  for (Device dev : devices()) {
    Rig s(dev, {.lr = 0.1});
    amp::GradScaler scaler({.init_scale = 256});
    // Reference gradients without scaling.
    s.opt->zero_grad();
    s.loss().backward();
    std::vector<float> gw = s.w.grad().cpu().to_vector<float>(), gb = s.b.grad().cpu().to_vector<float>();
    std::vector<float> w0 = s.w.detach().cpu().to_vector<float>();
    s.opt->zero_grad();
    Tensor scaled = scaler.scale(s.loss());
    EXPECT_FLOAT_EQ(scaled.item<float>(), s.loss().item<float>() * 256.f);
    scaled.backward();
    // Scaled by a power of two: exactly 256 times the unscaled gradients.
    std::vector<float> sw = s.w.grad().cpu().to_vector<float>();
    for (size_t i = 0; i < gw.size(); ++i) EXPECT_EQ(sw[i], gw[i] * 256.f) << i;
    scaler.unscale_(*s.opt);
    EXPECT_EQ(scaler.found_inf(*s.opt).item<float>(), 0.f);
    EXPECT_EQ(s.w.grad().cpu().to_vector<float>(), gw) << dev;
    EXPECT_EQ(s.b.grad().cpu().to_vector<float>(), gb) << dev;
    scaler.step(*s.opt);
    scaler.update();
    std::vector<float> w1 = s.w.detach().cpu().to_vector<float>();
    for (size_t i = 0; i < w0.size(); ++i) EXPECT_NEAR(w1[i], w0[i] - 0.1f * gw[i], 1e-6) << i;
  }
}

// Without unscale_, step lets the optimizer divide by the scale: same update.
TEST(GradScaler, StepWithoutUnscaleMatchesUnscaledStep) {
  for (Device dev : devices()) {
    Rig a(dev), b(dev);
    amp::GradScaler sa, sb;
    for (int i = 0; i < 3; ++i) {
      a.opt->zero_grad();
      sa.scale(a.loss()).backward();
      sa.step(*a.opt);
      sa.update();
      b.opt->zero_grad();
      sb.scale(b.loss()).backward();
      sb.unscale_(*b.opt);
      sb.step(*b.opt);
      sb.update();
    }
    EXPECT_EQ(a.w.detach().cpu().to_vector<float>(), b.w.detach().cpu().to_vector<float>()) << dev;
    EXPECT_EQ(a.b.detach().cpu().to_vector<float>(), b.b.detach().cpu().to_vector<float>()) << dev;
  }
}

TEST(GradScaler, StateMachineErrors) {
  Rig s{Device(kCPU)};
  amp::GradScaler scaler;
  EXPECT_THROW(scaler.step(*s.opt), Error);      // step before any scale()
  EXPECT_THROW(scaler.unscale_(*s.opt), Error);  // likewise
  EXPECT_THROW(scaler.update(), Error);
  scaler.scale(s.loss()).backward();
  EXPECT_THROW(scaler.update(), Error);  // no inf checks recorded yet
  scaler.unscale_(*s.opt);
  try {
    scaler.unscale_(*s.opt);
    ADD_FAILURE() << "unscale_ twice did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already been called"), std::string::npos) << e.what();
  }
  scaler.step(*s.opt);
  EXPECT_THROW(scaler.step(*s.opt), Error);     // step twice
  EXPECT_THROW(scaler.unscale_(*s.opt), Error);  // unscale_ after step
  scaler.update();
  // After update() the optimizer is ready again.
  s.opt->zero_grad();
  scaler.scale(s.loss()).backward();
  EXPECT_NO_THROW(scaler.unscale_(*s.opt));
  EXPECT_NO_THROW(scaler.step(*s.opt));
  EXPECT_NO_THROW(scaler.update());
}

TEST(GradScaler, OptionsValidated) {
  EXPECT_THROW(amp::GradScaler({.init_scale = -1}), Error);
  EXPECT_THROW(amp::GradScaler({.growth_factor = 0.5}), Error);
  EXPECT_THROW(amp::GradScaler({.backoff_factor = 1.5}), Error);
  EXPECT_THROW(amp::GradScaler({.growth_interval = 0}), Error);
}

TEST(GradScaler, StateDictRoundTrip) {
  for (Device dev : devices()) {
    Rig s(dev);
    amp::GradScaler scaler({.init_scale = 128, .growth_interval = 10});
    for (int i = 0; i < 3; ++i) {
      s.opt->zero_grad();
      scaler.scale(s.loss()).backward();
      scaler.step(*s.opt);
      scaler.update();
    }
    auto sd = scaler.state_dict();
    EXPECT_EQ(sd.keys(), (std::vector<std::string>{"scale", "growth_factor", "backoff_factor", "growth_interval",
                                                    "_growth_tracker"}));
    for (const auto& [k, v] : sd) {
      EXPECT_EQ(v.dim(), 0) << k;
      EXPECT_EQ(v.device(), Device(kCPU)) << k;
      EXPECT_EQ(v.dtype(), k == "growth_interval" || k == "_growth_tracker" ? kInt64 : kFloat64) << k;
    }
    EXPECT_EQ(sd.at("scale").item<double>(), 128.0);
    EXPECT_EQ(sd.at("_growth_tracker").item<int64_t>(), 3);
    EXPECT_EQ(sd.at("growth_interval").item<int64_t>(), 10);
    EXPECT_EQ(sd.at("growth_factor").item<double>(), 2.0);
    EXPECT_EQ(sd.at("backoff_factor").item<double>(), 0.5);
    amp::GradScaler fresh;
    fresh.load_state_dict(sd);
    EXPECT_EQ(fresh.get_scale(), 128.0);
    EXPECT_EQ(fresh.get_growth_tracker(), 3);
    EXPECT_EQ(fresh.get_growth_interval(), 10);
    // The loaded tracker reaches the device with the scale.
    s.opt->zero_grad();
    fresh.scale(s.loss()).backward();
    fresh.step(*s.opt);
    fresh.update();
    EXPECT_EQ(fresh.get_growth_tracker(), 4) << dev;
    EXPECT_THROW(fresh.load_state_dict({}), Error);
  }
}

// Found by tests/fuzz/fuzz_grad_scaler_state_dict: values a file can carry that no scaler
// saves (a growth_interval of 3e160 was converted to int64: undefined behaviour) are a
// tg::Error, and a refused state changes nothing.
TEST(GradScaler, LoadStateDictRejectsValuesOutOfRange) {
  const StateDict good = amp::GradScaler().state_dict();
  auto values = [](const StateDict& sd) {
    std::vector<double> out;
    for (const auto& [k, v] : sd) out.push_back(v.item<double>());
    return out;
  };
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<std::pair<std::string, double>> bad = {
      {"growth_interval", 3.05565e+160}, {"growth_interval", -inf}, {"growth_interval", nan},
      {"growth_interval", 0},            {"growth_interval", 2.5},  {"growth_interval", 4294967296.0},
      {"_growth_tracker", 1e300},        {"_growth_tracker", -1},   {"_growth_tracker", nan},
      {"scale", inf},                    {"scale", 0},              {"scale", nan},
      {"growth_factor", 0.5},            {"growth_factor", inf},    {"backoff_factor", 1.5},
      {"backoff_factor", nan}};
  for (const auto& [key, value] : bad) {
    amp::GradScaler scaler;
    auto state = good;
    state.insert(key, tg::full({}, value, kFloat64));
    EXPECT_THROW(scaler.load_state_dict(state), Error) << key << " = " << value;
    EXPECT_EQ(values(scaler.state_dict()), values(good)) << key << " = " << value;
  }
  // Entries that are not one number, and unknown or missing keys, are refused the same way.
  for (const auto& [key, t] : std::vector<std::pair<std::string, Tensor>>{
           {"scale", tg::ones({2}, kFloat64)}, {"scale", tg::full({}, true, kBool)}, {"scale", Tensor()},
           {"growth_intervals", tg::full({}, 10, kInt64)}}) {
    amp::GradScaler scaler;
    auto state = good;
    state.insert(key, t);
    EXPECT_THROW(scaler.load_state_dict(state), Error) << key;
    EXPECT_EQ(values(scaler.state_dict()), values(good)) << key;
  }
  auto missing = good;
  missing.erase("_growth_tracker");
  EXPECT_THROW(amp::GradScaler().load_state_dict(missing), Error);
  // A float32 or int32 entry (as another writer may store it) loads by value.
  StateDict narrow{{"scale", tg::full({}, 256.0f)},
                   {"growth_factor", tg::full({}, 4.0f)},
                   {"backoff_factor", tg::full({}, 0.25f)},
                   {"growth_interval", tg::full({}, 7, kInt32)},
                   {"_growth_tracker", tg::full({}, 2, kInt32)}};
  amp::GradScaler loaded;
  loaded.load_state_dict(narrow);
  EXPECT_EQ(values(loaded.state_dict()), (std::vector<double>{256.0, 4.0, 0.25, 7.0, 2.0}));
}

TEST(GradScaler, DisabledIsTransparent) {
  Rig s(Device(kCPU), {.lr = 0.1});
  amp::GradScaler scaler({.enabled = false});
  Tensor loss = s.loss();
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  std::vector<float> w0 = s.w.detach().to_vector<float>();
  loss.backward();
  scaler.unscale_(*s.opt);  // no-op
  scaler.step(*s.opt);
  scaler.update();
  EXPECT_NE(s.w.detach().to_vector<float>(), w0);
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_TRUE(scaler.state_dict().empty());
}

// The check reads the float16 operands of a float32 weight gradient instead of the gradient
// (core/finite_proxy.h). Whatever the operands hold, found_inf must equal whether the
// gradient itself has a non-finite element (computed here on the host), including an
// infinity met by zeros (inf * 0 = NaN) and the largest float16 values (no overflow in
// float32). x @ w under float16 autocast, w a float32 leaf [256, 256], x [32, 256]; the
// gradient reaching the product is the float16 tensor gout (loss = sum(out * gout), scale 1).
struct WitnessCase {
  const char* name;
  float x_fill;          // every element of x
  float gout_fill;       // every element of gout
  int inf_row = -1;      // x[inf_row][5] = +inf and gout[inf_row][:] = 0
  int nan_row = -1;      // gout[nan_row][7] = NaN
  bool expect_non_finite;
};

void run_witness_case(Device dev, const WitnessCase& c) {
  SCOPED_TRACE(std::string(c.name) + " on " + dev.str());
  constexpr int64_t kB = 32, kIn = 256, kOut = 256;
  manual_seed(5);
  Tensor w = (randn({kIn, kOut}, TensorOptions().device(dev)) * 0.01).requires_grad_();
  std::vector<float> xv(kB * kIn, c.x_fill), gv(kB * kOut, c.gout_fill);
  if (c.inf_row >= 0) {
    xv[c.inf_row * kIn + 5] = std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < kOut; ++j) gv[c.inf_row * kOut + j] = 0.f;
  }
  if (c.nan_row >= 0) gv[c.nan_row * kOut + 7] = std::numeric_limits<float>::quiet_NaN();
  Tensor x = tensor(xv, {kB, kIn}, TensorOptions().device(dev));
  Tensor gout = tensor(gv, {kB, kOut}, TensorOptions().device(dev)).to(kFloat16);
  optim::SGD opt({w}, {.lr = 0.1});
  amp::GradScaler scaler({.init_scale = 1.0});
  tg::detail::reset_finite_proxy_hits();
  Tensor loss;
  {
    amp::autocast ac(dev.type(), kFloat16);
    loss = (matmul(x, w) * gout).sum();
  }
  scaler.scale(loss).backward();
  ASSERT_EQ(w.grad().dtype(), kFloat32);
  // The reference: the gradient itself, read on the host.
  bool non_finite = false;
  for (float v : w.grad().to_vector<float>()) non_finite |= !std::isfinite(v);
  ASSERT_EQ(non_finite, c.expect_non_finite) << "the case does not test what it says";
  const std::vector<uint8_t> before = bytes_of(w);
  scaler.step(opt);
  EXPECT_EQ(tg::detail::finite_proxy_hits(), 1) << "the check did not use the gemm's operands";
  EXPECT_EQ(scaler.found_inf(opt).item<float>(), non_finite ? 1.f : 0.f);
  EXPECT_EQ(bytes_of(w) == before, non_finite) << "a step must run exactly when the gradient is finite";
  scaler.update();
  EXPECT_FALSE(tg::detail::has_finite_proxy(w.grad())) << "the check must take the proxy";
}

TEST(GradScaler, FiniteWitnessAgreesWithTheGradient) {
  const WitnessCase cases[] = {
      {"finite", 0.5f, 0.25f, -1, -1, false},
      {"largest float16 values", 65504.f, 65504.f, -1, -1, false},
      {"inf in x meets zeros", 0.5f, 0.25f, 3, -1, true},
      {"NaN in gout", 0.5f, 0.25f, -1, 2, true},
      {"inf and NaN", 1.f, -1.f, 4, 9, true},
  };
  for (Device dev : devices())
    for (const WitnessCase& c : cases) run_witness_case(dev, c);
}

// nn::Linear's weight and bias gradients: the weight's is checked through its proxy (x and the
// output gradient), the bias's (smaller than its operand) itself. found_inf follows an inf in
// the input.
TEST(GradScaler, FiniteProxyCoversLinearWeight) {
  for (Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    manual_seed(8);
    nn::Linear lin(256, 192, true, TensorOptions().device(dev));
    optim::SGD opt(lin.parameters(), {.lr = 0.1});
    amp::GradScaler scaler;
    for (bool poison : {false, true}) {
      Tensor x = randn({24, 256}, TensorOptions().device(dev));
      if (poison) {
        NoGradGuard ng;
        x.slice(0, 5, 6).fill_(std::numeric_limits<float>::infinity());
      }
      opt.zero_grad();
      Tensor loss;
      {
        amp::autocast ac(dev.type(), kFloat16);
        loss = lin(x).pow(2).mean();
      }
      scaler.scale(loss).backward();
      bool non_finite = false;
      for (const Tensor& p : lin.parameters())
        for (float v : p.grad().to(kFloat32).to_vector<float>()) non_finite |= !std::isfinite(v);
      ASSERT_EQ(non_finite, poison);
      tg::detail::reset_finite_proxy_hits();
      scaler.step(opt);
      EXPECT_EQ(tg::detail::finite_proxy_hits(), 1) << "the weight's gradient is not covered";
      EXPECT_EQ(scaler.found_inf(opt).item<float>(), poison ? 1.f : 0.f);
      scaler.update();
    }
  }
}

// A gradient changed in place after backward, or an unscale_, checks the gradient itself.
TEST(GradScaler, FiniteWitnessDroppedWhenStale) {
  for (Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    manual_seed(6);
    Tensor w = (randn({256, 256}, TensorOptions().device(dev)) * 0.01).requires_grad_();
    Tensor x = randn({16, 256}, TensorOptions().device(dev));
    optim::SGD opt({w}, {.lr = 0.1});
    amp::GradScaler scaler({.init_scale = 1.0});
    auto backward = [&] {
      opt.zero_grad();
      Tensor loss;
      {
        amp::autocast ac(dev.type(), kFloat16);
        loss = matmul(x, w).sum();
      }
      scaler.scale(loss).backward();
    };
    tg::detail::reset_finite_proxy_hits();
    backward();
    {
      NoGradGuard ng;
      w.grad().view({-1}).slice(0, 0, 1).fill_(std::numeric_limits<float>::infinity());
    }
    scaler.step(opt);
    EXPECT_EQ(tg::detail::finite_proxy_hits(), 0);
    EXPECT_EQ(scaler.found_inf(opt).item<float>(), 1.f) << "the inf written after backward was missed";
    scaler.update();
    backward();
    scaler.unscale_(opt);
    EXPECT_FALSE(tg::detail::has_finite_proxy(w.grad())) << "unscale_ must take the proxy";
    scaler.step(opt);
    scaler.update();
    EXPECT_EQ(tg::detail::finite_proxy_hits(), 0);
  }
}

// Operands larger than a quarter of the gradient are not kept (they would hold activations
// until the step): a large batch through a small layer checks the gradients themselves.
TEST(GradScaler, FiniteWitnessSkippedForLargeOperands) {
  for (Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    manual_seed(9);
    nn::Linear lin(64, 64, true, TensorOptions().device(dev));
    optim::SGD opt(lin.parameters(), {.lr = 0.1});
    amp::GradScaler scaler;
    Tensor x = randn({512, 64}, TensorOptions().device(dev));
    Tensor loss;
    {
      amp::autocast ac(dev.type(), kFloat16);
      loss = lin(x).pow(2).mean();
    }
    scaler.scale(loss).backward();
    for (const Tensor& p : lin.parameters()) EXPECT_FALSE(tg::detail::has_finite_proxy(p.grad())) << p.sizes();
    tg::detail::reset_finite_proxy_hits();
    scaler.step(opt);
    EXPECT_EQ(tg::detail::finite_proxy_hits(), 0);
    EXPECT_EQ(scaler.found_inf(opt).item<float>(), 0.f);
    scaler.update();
  }
}

// The proxy is the gradient's: without a GradScaler to take it, it lives exactly as long as the
// gradient does (its operands are freed with it), and the next backward's gradient has its own.
TEST(GradScaler, FiniteProxyLivesWithTheGradient) {
  for (Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    Tensor w = (randn({256, 256}, TensorOptions().device(dev)) * 0.01).requires_grad_();
    Tensor x = randn({16, 256}, TensorOptions().device(dev));
    optim::SGD opt({w}, {.lr = 0.1});
    std::weak_ptr<TensorImpl> operand;
    for (int i = 0; i < 2; ++i) {
      opt.zero_grad();
      EXPECT_TRUE(operand.expired()) << "the previous gradient's operands outlived it";
      {
        amp::autocast ac(dev.type(), kFloat16);
        matmul(x, w).pow(2).mean().backward();
      }
      ASSERT_TRUE(tg::detail::has_finite_proxy(w.grad()));
      operand = w.grad().impl().finite_proxy->operands.at(0).impl_ptr();
      EXPECT_FALSE(operand.expired());
    }
  }
}

}  // namespace
}  // namespace tg::testing
