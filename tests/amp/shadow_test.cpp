// The kept lower-precision copies of parameters (core/cast_copies.h): after N autocast steps
// with a fused CUDA optimizer the copy of every parameter equals param.to(float16) bit for bit;
// it is reused (counted casts); an in-place edit, load_state_dict and a stale copy behave; a
// step skipped on inf keeps it valid; training is bit-identical to training without copies; a
// captured CUDA graph reads and updates it, and its replays recast stale ones. CUDA cases skip
// without a GPU; the CPU case checks that the CPU keeps none.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.h>

#include <tapegrad/core/cast_copies.h>

namespace tg::testing {
namespace {

namespace sh = tg::detail;

std::vector<unsigned char> bytes_of(const Tensor& t) {
  Tensor c = t.detach().cpu().contiguous();
  std::vector<unsigned char> out(c.nbytes());
  c.copy_to_host(out.data());
  return out;
}

// Linear(64, 32) then a bare float32 leaf [32, 16] in a matmul: both lowered to float16 under
// autocast.
struct Model : nn::Module {
  explicit Model(Device dev) {
    lin = register_module("lin", std::make_shared<nn::Linear>(64, 32, true, TensorOptions().device(dev)));
    w2 = register_parameter("w2", randn({32, 16}, TensorOptions().device(dev)) * 0.1);
  }
  Tensor forward(const Tensor& x) override { return matmul((*lin)(x).tanh(), w2); }
  std::shared_ptr<nn::Linear> lin;
  Tensor w2;
};

using MakeOpt = std::function<std::unique_ptr<optim::Optimizer>(const std::vector<Tensor>&)>;

std::vector<std::pair<std::string, MakeOpt>> optimizers() {
  using Ps = std::vector<Tensor>;
  return {
      {"SGD", [](const Ps& ps) { return std::make_unique<optim::SGD>(ps, optim::SGDOptions{.lr = 1e-2}); }},
      {"SGD momentum",
       [](const Ps& ps) { return std::make_unique<optim::SGD>(ps, optim::SGDOptions{.lr = 1e-2, .momentum = 0.9}); }},
      {"Adam", [](const Ps& ps) { return std::make_unique<optim::Adam>(ps, optim::AdamOptions{.lr = 1e-3}); }},
      {"AdamW amsgrad",
       [](const Ps& ps) {
         return std::make_unique<optim::AdamW>(ps, optim::AdamWOptions{.lr = 1e-3, .amsgrad = true});
       }},
      {"RMSprop centered momentum",
       [](const Ps& ps) {
         return std::make_unique<optim::RMSprop>(
             ps, optim::RMSpropOptions{.lr = 1e-3, .momentum = 0.9, .centered = true});
       }},
      {"Adagrad", [](const Ps& ps) { return std::make_unique<optim::Adagrad>(ps, optim::AdagradOptions{.lr = 1e-2}); }},
  };
}

struct Rig {
  Rig(Device dev, const MakeOpt& make_opt, uint64_t seed = 21) {
    manual_seed(seed);
    model = std::make_shared<Model>(dev);
    x = randn({48, 64}, TensorOptions().device(dev));
    opt = make_opt(model->parameters());
  }
  Tensor forward() {
    amp::autocast guard(x.device().type());
    return (*model)(x).pow(2).mean();
  }
  // One AMP training step; `poison` puts an inf into a gradient (the step is skipped).
  Tensor step(bool poison = false) {
    opt->zero_grad();
    Tensor loss = forward();
    scaler.scale(loss).backward();
    if (poison) model->w2.grad().view({-1}).slice(0, 0, 1).fill_(std::numeric_limits<double>::infinity());
    scaler.step(*opt);
    scaler.update();
    return loss;
  }
  std::vector<Tensor> lowered() const { return {model->lin->weight, model->w2}; }
  std::shared_ptr<Model> model;
  Tensor x;
  std::unique_ptr<optim::Optimizer> opt;
  amp::GradScaler scaler{{.init_scale = 1024, .growth_interval = 1000}};
};

void expect_shadows_are_fresh_casts(const Rig& r, const std::string& what) {
  for (const Tensor& p : r.lowered()) {
    Tensor s = sh::cast_copy_of(p, kFloat16);
    ASSERT_TRUE(s.defined()) << what << ": no valid shadow for a parameter of shape " << p.sizes();
    EXPECT_EQ(s.dtype(), kFloat16);
    EXPECT_EQ(bytes_of(s), bytes_of(p.detach().to(kFloat16))) << what << ": shadow of shape " << p.sizes();
  }
}

TEST(Shadow, EqualsFreshCastAfterStepsAndIsReused) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int steps = 5;
  for (const auto& [name, make] : optimizers()) {
    SCOPED_TRACE(name);
    sh::reset_cast_copy_counters();
    Rig r(Device(kCUDA), make);
    for (int i = 0; i < steps; ++i) {
      r.step();
      expect_shadows_are_fresh_casts(r, name + " step " + std::to_string(i));
    }
    // Each lowered parameter was cast once (first region), then reused by every later region.
    const int64_t n = sh::cast_copy_count();
    EXPECT_GE(n, 2);  // weight and w2 (a bias lowered by a fused linear would add one)
    EXPECT_EQ(sh::cast_copy_casts(), n);
    EXPECT_EQ(sh::cast_copy_hits(), n * (steps - 1));
    // Activations and tensors that need no grad get no shadow.
    {
      amp::autocast guard(kCUDA);
      Tensor act = randn({64, 64}, Device(kCUDA)).requires_grad_() * 2.0;
      matmul(r.x, act);
      matmul(r.x, randn({64, 8}, Device(kCUDA)));
    }
    EXPECT_EQ(sh::cast_copy_count(), n);
  }
}

// Bit-identical training with and without shadows: same losses, same weights.
TEST(Shadow, TrainingIsBitIdenticalToFreshCasts) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const auto& [name, make] : optimizers()) {
    SCOPED_TRACE(name);
    std::vector<std::vector<unsigned char>> runs[2];
    for (int with : {1, 0}) {
      sh::set_cast_copies_enabled(with == 1);
      Rig r(Device(kCUDA), make);
      for (int i = 0; i < 4; ++i) runs[with].push_back(bytes_of(r.step()));
      for (const Tensor& p : r.model->parameters()) runs[with].push_back(bytes_of(p));
      if (with == 0) EXPECT_EQ(sh::cast_copy_count(), 0);
    }
    sh::set_cast_copies_enabled(true);
    EXPECT_EQ(runs[1], runs[0]);
  }
}

TEST(Shadow, GradientsReachTheFloat32Parameter) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Rig r(Device(kCUDA), optimizers()[0].second);
  r.step();  // the next forward reads shadows
  sh::reset_cast_copy_counters();
  r.opt->zero_grad();
  r.forward().backward();
  EXPECT_GE(sh::cast_copy_hits(), 2);
  std::vector<std::vector<unsigned char>> with;
  for (const Tensor& p : r.lowered()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().dtype(), kFloat32);
    with.push_back(bytes_of(p.grad()));
  }
  sh::set_cast_copies_enabled(false);
  r.opt->zero_grad();
  r.forward().backward();
  sh::set_cast_copies_enabled(true);
  for (size_t i = 0; i < with.size(); ++i) EXPECT_EQ(bytes_of(r.lowered()[i].grad()), with[i]) << i;
}

TEST(Shadow, InPlaceEditInvalidates) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Rig r(Device(kCUDA), optimizers()[2].second);
  r.step();
  r.step();
  const Tensor w = r.model->lin->weight;
  ASSERT_TRUE(sh::cast_copy_of(w, kFloat16).defined());
  {
    NoGradGuard ng;
    w.mul_(0.5);
  }
  EXPECT_FALSE(sh::cast_copy_of(w, kFloat16).defined());
  EXPECT_TRUE(sh::cast_copy_of(r.model->w2, kFloat16).defined());  // the other one is untouched
  sh::reset_cast_copy_counters();
  Tensor loss = r.forward();
  EXPECT_EQ(sh::cast_copy_casts(), 1);  // only the edited weight is cast again
  EXPECT_GE(sh::cast_copy_hits(), 1);
  EXPECT_EQ(bytes_of(sh::cast_copy_of(w, kFloat16)), bytes_of(w.detach().to(kFloat16)));
  r.step();
  expect_shadows_are_fresh_casts(r, "after the edit and a step");
}

TEST(Shadow, LoadStateDictInvalidates) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Rig r(Device(kCUDA), optimizers()[1].second);
  Rig other(Device(kCUDA), optimizers()[1].second, 99);
  r.step();
  r.step();
  r.model->load_state_dict(other.model->state_dict());
  for (const Tensor& p : r.lowered()) EXPECT_FALSE(sh::cast_copy_of(p, kFloat16).defined());
  // The next forward sees the loaded weights: the same loss as the model they came from.
  other.x = r.x;
  EXPECT_EQ(bytes_of(r.forward()), bytes_of(other.forward()));
  expect_shadows_are_fresh_casts(r, "after load_state_dict");
}

TEST(Shadow, SkippedStepKeepsItValid) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const auto& [name, make] : optimizers()) {
    SCOPED_TRACE(name);
    Rig r(Device(kCUDA), make);
    r.step();
    std::vector<std::vector<unsigned char>> before;
    for (const Tensor& p : r.lowered()) before.push_back(bytes_of(p));
    r.step(/*poison=*/true);
    EXPECT_EQ(r.scaler.get_scale(), 512.0);  // the step was skipped
    for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(bytes_of(r.lowered()[i]), before[i]);
    expect_shadows_are_fresh_casts(r, "after a skipped step");
    sh::reset_cast_copy_counters();
    r.step();
    EXPECT_EQ(sh::cast_copy_casts(), 0);  // still reused
    expect_shadows_are_fresh_casts(r, "after the next step");
  }
}

// A stale copy that nothing else holds is recast in its own memory by the next region.
TEST(Shadow, StaleCopyIsRecastInPlace) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Rig r(Device(kCUDA), optimizers()[0].second);
  r.step();
  const Tensor w = r.model->w2;
  void* const addr = sh::cast_copy_of(w, kFloat16).data_ptr();  // the address only: holding it would pin it
  ASSERT_NE(addr, nullptr);
  {
    NoGradGuard ng;
    w.add_(1.0);
  }
  EXPECT_FALSE(sh::cast_copy_of(w, kFloat16).defined());
  sh::reset_cast_copy_counters();
  r.forward();
  EXPECT_EQ(sh::cast_copy_casts(), 1);
  Tensor now = sh::cast_copy_of(w, kFloat16);
  ASSERT_TRUE(now.defined());
  EXPECT_EQ(now.data_ptr(), addr);
  EXPECT_EQ(bytes_of(now), bytes_of(w.detach().to(kFloat16)));
}

// A captured step reads the shadows (no cast in the graph) and its optimizer
// launch keeps them equal to the casts of the replayed weights.
TEST(Shadow, CapturedStepReadsAndUpdatesShadows) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  cuda::Stream side;
  cuda::StreamGuard guard(side);
  Rig graphed(Device(kCUDA), optimizers()[0].second), eager(Device(kCUDA), optimizers()[0].second);
  for (int i = 0; i < 3; ++i) graphed.step();
  sh::reset_cast_copy_counters();
  cuda::Graph graph;
  graph.capture([&] { graphed.step(); });
  EXPECT_EQ(sh::cast_copy_casts(), 0);
  EXPECT_GE(sh::cast_copy_hits(), 2);
  for (int i = 0; i < 3; ++i) graph.replay();
  for (int i = 0; i < 6; ++i) eager.step();
  side.synchronize();
  expect_shadows_are_fresh_casts(graphed, "after replays");
  for (size_t i = 0; i < graphed.lowered().size(); ++i)
    EXPECT_EQ(bytes_of(graphed.lowered()[i]), bytes_of(eager.lowered()[i])) << i;

  // The graph holds the copies' addresses: they are pinned, and a stale one is recast in place,
  // by an eager region or by the replay itself (a prologue the capture registered).
  const Tensor w2 = graphed.model->w2;
  void* const addr = sh::cast_copy_of(w2, kFloat16).data_ptr();
  for (bool by_region : {true, false}) {
    auto halve = [](Rig& r) {
      NoGradGuard ng;
      r.model->w2.mul_(0.5);
    };
    halve(graphed);
    if (by_region) {
      graphed.forward();
      ASSERT_TRUE(sh::cast_copy_of(w2, kFloat16).defined());
      EXPECT_EQ(sh::cast_copy_of(w2, kFloat16).data_ptr(), addr);
    } else {
      EXPECT_FALSE(sh::cast_copy_of(w2, kFloat16).defined());  // stale until the replay
    }
    halve(eager);
    graph.replay();
    eager.step();
    side.synchronize();
    ASSERT_TRUE(sh::cast_copy_of(w2, kFloat16).defined());
    EXPECT_EQ(sh::cast_copy_of(w2, kFloat16).data_ptr(), addr);
    expect_shadows_are_fresh_casts(graphed, by_region ? "replay after a region" : "replay alone");
    for (size_t i = 0; i < graphed.lowered().size(); ++i)
      EXPECT_EQ(bytes_of(graphed.lowered()[i]), bytes_of(eager.lowered()[i])) << i;
  }
}

TEST(Shadow, CpuKeepsNone) {
  Rig r(Device(kCPU), optimizers()[0].second);
  r.step();
  r.step();
  EXPECT_EQ(sh::cast_copy_count(), 0);
}

}  // namespace
}  // namespace tg::testing
