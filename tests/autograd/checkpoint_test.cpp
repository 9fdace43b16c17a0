// tg::utils::checkpoint: the segment's nodes save into one recompute frame; backward reruns fn
// with the forward's random generators and autocast state up to the last op that saves, so the
// gradients of a Linear + GELU + Dropout stack are bit-identical to an uncheckpointed run, on each
// device. Closed forms check the values and where the recompute stops; the peak-memory cases count
// activations kept by each variant.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <tapegrad/core/backend/cpu/cpu.h>

#include "tests/autograd/common.h"
#include "tests/common/error_of.h"

namespace tg::testing {
namespace {

Tensor f64(std::vector<double> v) { return tg::tensor<double>(v, TensorOptions().dtype(kFloat64)); }

// fn = 2 (x^2 w): the forward records mul, mul, mul-by-scalar; the recompute stops inside the
// second mul (the last op that saves a tensor), so the scalar product never reruns.
TEST(Checkpoint, ClosedFormAndRecomputeStopsAfterTheLastSave) {
  auto w = f64({3, -2});
  w.requires_grad_();  // a parameter the segment uses, not an input
  auto x = f64({1.5, 4});
  x.requires_grad_();
  std::vector<int> reached;
  auto y = tg::utils::checkpoint(
      [&](const std::vector<Tensor>& in) {
        EXPECT_TRUE(tg::autograd::GradMode::is_enabled());
        Tensor a = in[0] * in[0];
        reached.push_back(1);
        Tensor b = a * w;
        reached.push_back(2);
        Tensor c = b * 2.0;
        reached.push_back(3);
        return c;
      },
      {x});
  EXPECT_EQ(reached, (std::vector<int>{1, 2, 3}));
  ASSERT_TRUE(y.requires_grad());
  expect_near_vec(host(y), {13.5, -64}, 0, 0, "forward values 2 x^2 w");
  (y * f64({1, 10})).sum().backward();
  EXPECT_EQ(reached, (std::vector<int>{1, 2, 3, 1})) << "recomputed once, up to the last save";
  expect_near_vec(host(x.grad()), {2 * 2 * 1.5 * 3, 10 * 2 * 2 * 4 * -2.0}, 1e-12, 0, "dx = 4 x w g");
  expect_near_vec(host(w.grad()), {2 * 1.5 * 1.5, 10 * 2 * 16.0}, 1e-12, 0, "dw = 2 x^2 g");
}

TEST(Checkpoint, MultipleOutputsAndPlainCallWithoutGradMode) {
  auto x = f64({2, 3});
  x.requires_grad_();
  int calls = 0;
  auto fn = [&](const std::vector<Tensor>& in) {
    ++calls;
    return std::vector<Tensor>{in[0] * 2, in[0].exp()};
  };
  {
    NoGradGuard g;
    auto outs = tg::utils::checkpoint(fn, {x});
    EXPECT_FALSE(outs[0].requires_grad());
    EXPECT_EQ(calls, 1);
  }
  auto outs = tg::utils::checkpoint(fn, {x});
  (outs[0].sum() + outs[1].sum() * 0.5).backward();  // d/dx = 2 + e^x / 2
  EXPECT_EQ(calls, 3);
  expect_near_vec(host(x.grad()), {2 + std::exp(2.0) / 2, 2 + std::exp(3.0) / 2}, 1e-12, 1e-12, "dx");
  // Only one output used: the other gets a zero gradient.
  x.mutable_grad() = Tensor();
  outs = tg::utils::checkpoint(fn, {x});
  outs[1].sum().backward();
  expect_near_vec(host(x.grad()), {std::exp(2.0), std::exp(3.0)}, 1e-12, 1e-12, "dx from exp only");
  // A segment that saves nothing (x * 2) is never recomputed.
  x.mutable_grad() = Tensor();
  calls = 0;
  tg::utils::checkpoint(
      [&](const std::vector<Tensor>& in) {
        ++calls;
        return in[0] * 2;
      },
      {x})
      .sum()
      .backward();
  EXPECT_EQ(calls, 1);
  expect_near_vec(host(x.grad()), {2, 2}, 0, 0, "dx of 2x");
}

// The nodes are the segment's own, run by the outer pass: autograd::grad (no .grad() written),
// retain_graph (the refilled values kept for the second pass), create_graph (a second derivative)
// all work as without checkpoint; a second pass without retain_graph is the engine's error.
TEST(Checkpoint, GradRetainGraphAndSecondOrderAsWithoutCheckpoint) {
  auto x = f64({1, 2});
  x.requires_grad_();
  int calls = 0;
  auto fn = [&](const std::vector<Tensor>& in) {
    ++calls;
    return in[0] * in[0] * in[0];
  };
  auto y = tg::utils::checkpoint(fn, {x * 1.0}).sum();
  auto g = tg::autograd::grad({y}, {x});
  expect_near_vec(host(g[0]), {3, 12}, 1e-12, 0, "grad 3x^2");
  EXPECT_FALSE(x.grad().defined()) << "autograd::grad writes no .grad()";

  auto z = tg::utils::checkpoint(fn, {x}).sum();
  z.backward({}, {.retain_graph = true});
  z.backward();
  EXPECT_EQ(calls, 4) << "two forwards, two recomputes: the retained graph keeps the refilled values";
  expect_near_vec(host(x.grad()), {6, 24}, 1e-12, 0, "two passes accumulate");
  std::string e = error_of([&] { z.backward(); });
  EXPECT_NE(e.find("retain_graph"), std::string::npos) << e;

  auto u = tg::utils::checkpoint(fn, {x}).sum();
  auto g1 = tg::autograd::grad({u}, {x}, tg::autograd::GradOptions{.create_graph = true});
  ASSERT_TRUE(g1[0].requires_grad());
  auto g2 = tg::autograd::grad({g1[0].sum()}, {x});
  expect_near_vec(host(g2[0]), {6, 12}, 1e-12, 0, "second derivative 6x");
}

// A custom Function's ctx saves through the same hook: a segment holding one is recomputed (its
// saved input is a slot, not kept), and the gradient is its backward's.
struct Cube : tg::autograd::Function<Cube> {
  static Tensor forward(tg::autograd::AutogradContext* ctx, const Tensor& x) {
    ctx->save_for_backward({x});
    return x * x * x;
  }
  static std::vector<Tensor> backward(tg::autograd::AutogradContext* ctx, std::vector<Tensor> grads) {
    const Tensor x = ctx->saved_tensors()[0];
    return {grads[0] * x * x * 3.0};
  }
};

TEST(Checkpoint, CustomFunctionSavesAreRecomputed) {
  auto x = f64({0.5, -2});
  x.requires_grad_();
  int calls = 0;
  auto y = tg::utils::checkpoint(
      [&](const std::vector<Tensor>& in) {
        ++calls;
        return Cube::apply(in[0] * 1.0) * 2.0;
      },
      {x});
  y.sum().backward();
  EXPECT_EQ(calls, 2) << "the ctx's saved input came back through the recompute";
  expect_near_vec(host(x.grad()), {6 * 0.25, 6 * 4.0}, 1e-12, 0, "d/dx 2 x^3 = 6 x^2");
}

// A gradient penalty computed inside the segment (a create_graph backward that fn runs): that
// inner backward reads the segment's first saves mid-forward, which recomputes them early, and the
// recompute's own inner backward reads the recompute's saves. Same gradients as without checkpoint.
TEST(Checkpoint, GradientPenaltyInsideTheSegment) {
  auto w = f64({0.8, -1.3, 0.4});
  w.requires_grad_();
  auto x = f64({0.3, 0.9, -1.7});
  x.requires_grad_();
  int calls = 0;
  auto fn = [&](const std::vector<Tensor>& in) {
    ++calls;
    Tensor h = tg::tanh(in[0] * w);
    auto g = tg::autograd::grad({h.sum()}, {in[0]}, tg::autograd::GradOptions{.create_graph = true});
    return h * h + g[0] * g[0];
  };
  tg::utils::checkpoint(fn, {x * 1.0}).sum().backward();
  const auto gx = host(x.grad()), gw = host(w.grad());
  EXPECT_GE(calls, 2);
  x.mutable_grad() = Tensor();
  w.mutable_grad() = Tensor();
  fn({x * 1.0}).sum().backward();
  expect_near_vec(gx, host(x.grad()), 1e-14, 1e-14, "dx against plain");
  expect_near_vec(gw, host(w.grad()), 1e-14, 1e-14, "dw against plain");
}

// Nested segments: the inner checkpoint's inputs are slots of the outer one, so the outer
// recompute refills them and the inner one recomputes from there.
TEST(Checkpoint, NestedSegmentsGiveThePlainGradients) {
  auto w = f64({0.5, -1.5, 2});
  w.requires_grad_();
  auto x = f64({0.3, -0.7, 1.1});
  x.requires_grad_();
  auto inner = [&](const std::vector<Tensor>& in) { return tg::tanh(in[0] * w).exp(); };
  auto outer = [&](const std::vector<Tensor>& in) {
    Tensor h = tg::sin(in[0]) * in[0];
    return tg::utils::checkpoint(inner, {h}) * h;
  };
  tg::utils::checkpoint(outer, {x}).sum().backward();
  const auto gx = host(x.grad()), gw = host(w.grad());
  x.mutable_grad() = Tensor();
  w.mutable_grad() = Tensor();
  Tensor h = tg::sin(x) * x;
  (tg::tanh(h * w).exp() * h).sum().backward();
  expect_near_vec(gx, host(x.grad()), 1e-14, 1e-14, "dx nested against plain");
  expect_near_vec(gw, host(w.grad()), 1e-14, 1e-14, "dw nested against plain");
}

// What the recompute refuses: an input changed in place since the forward, and an fn that saves
// other tensors the second time.
TEST(Checkpoint, ErrorsOnInPlaceInputsAndOnAnFnThatChanges) {
  auto x = f64({1, 2});
  x.requires_grad_();
  auto x1 = x * 1.0;
  auto y = tg::utils::checkpoint([](const std::vector<Tensor>& in) { return in[0].exp(); }, {x1}).sum();
  {
    NoGradGuard g;
    x1.add_(1.0);
  }
  std::string e = error_of([&] { y.backward(); });
  EXPECT_NE(e.find("checkpoint"), std::string::npos) << e;
  EXPECT_NE(e.find("modified in place"), std::string::npos) << e;

  int call = 0;
  auto changing = [&](const std::vector<Tensor>& in) {
    return ++call == 1 ? in[0].exp() : in[0].slice(0, 0, 1).exp() * in[0];
  };
  e = error_of([&] { tg::utils::checkpoint(changing, {x}).sum().backward(); });
  EXPECT_NE(e.find("checkpoint: saved tensor 0 was recomputed with shape [1]"), std::string::npos) << e;
  EXPECT_NE(e.find("fn must do the same on every call"), std::string::npos) << e;
  call = 0;
  auto fewer = [&](const std::vector<Tensor>& in) { return ++call == 1 ? in[0].exp() : in[0] * 2.0; };
  e = error_of([&] { tg::utils::checkpoint(fewer, {x}).sum().backward(); });
  EXPECT_NE(e.find("checkpoint: the recompute saved 0 tensors for backward, the forward 1"), std::string::npos) << e;
}

// Blocks of Linear + GELU + Dropout, run plainly or each through checkpoint.
struct Result {
  std::vector<std::vector<float>> grads;  // parameters', then the input's (when it requires grad)
  std::vector<float> out, rand_after;
};

std::vector<std::shared_ptr<nn::Sequential>> make_blocks(int depth, int64_t d, Device dev) {
  tg::manual_seed(7);
  std::vector<std::shared_ptr<nn::Sequential>> blocks;
  for (int i = 0; i < depth; ++i) {
    auto b = std::make_shared<nn::Sequential>(nn::Linear(d, d), nn::GELU(), nn::Dropout(0.3));
    b->to(dev);
    blocks.push_back(b);
  }
  return blocks;
}

Result run_blocks(const std::vector<std::shared_ptr<nn::Sequential>>& blocks, const Tensor& x, bool ckpt,
                  bool autocast = false) {
  for (auto& b : blocks) b->zero_grad();
  if (x.requires_grad()) x.mutable_grad() = Tensor();
  tg::manual_seed(1234);
  Tensor h = x;
  {
    std::optional<amp::Autocast> ac;
    if (autocast) ac.emplace(x.device().type(), kBFloat16);
    for (auto& b : blocks) {
      if (ckpt)
        h = tg::utils::checkpoint([b](const std::vector<Tensor>& in) { return (*b)(in[0]); }, {h});
      else
        h = (*b)(h);
    }
  }
  auto loss = (h.to(kFloat32) * h.to(kFloat32)).mean();
  loss.backward();
  Result r;
  r.out = h.to(kFloat32).to_vector<float>();
  for (auto& b : blocks)
    for (auto& p : b->parameters()) r.grads.push_back(p.grad().to_vector<float>());
  if (x.requires_grad()) r.grads.push_back(x.grad().to_vector<float>());
  r.rand_after = tg::rand({16}, x.device()).to_vector<float>();
  return r;
}

void expect_bit_identical(const Result& a, const Result& b) {
  EXPECT_EQ(a.out, b.out) << "forward outputs";
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) EXPECT_EQ(a.grads[i], b.grads[i]) << "gradient " << i;
  EXPECT_EQ(a.rand_after, b.rand_after) << "the generator continues as without checkpoint";
}

class CheckpointBlocks : public ::testing::TestWithParam<Dev> {
 protected:
  void SetUp() override { TG_SKIP_WITHOUT_CUDA(GetParam()); }
  Device dev() const { return to_device(GetParam()); }
};

TEST_P(CheckpointBlocks, GradientsAreBitIdenticalToAnUncheckpointedRun) {
  auto blocks = make_blocks(3, 32, dev());
  tg::manual_seed(99);
  auto x = tg::randn({8, 32}, dev());
  for (bool input_requires_grad : {false, true}) {
    if (input_requires_grad) x.requires_grad_();
    Result plain = run_blocks(blocks, x, false);
    Result ckpt = run_blocks(blocks, x, true);
    SCOPED_TRACE(input_requires_grad ? "input requires grad" : "input requires no grad");
    expect_bit_identical(plain, ckpt);
    // Dropout was active: some activations are exactly zero, and the masks differ per block
    // (a replay that reused one mask, or none, would not match the plain run above).
    size_t zeros = 0;
    for (float v : plain.out) zeros += v == 0.0f;
    EXPECT_GT(zeros, 0u);
    ASSERT_EQ(plain.grads.size(), 6u + input_requires_grad);
    double norm = 0;
    for (float v : plain.grads[0]) norm += static_cast<double>(v) * v;
    EXPECT_GT(norm, 0.0);
  }
}

// On each device: one recompute serves both nodes that saved something (matmul: x; GELU: u), and
// it stops inside GELU, the last op that saves: the product by 3 after it never reruns.
TEST_P(CheckpointBlocks, RecomputeRunsOnceAndStopsAtTheLastSave) {
  tg::manual_seed(3);
  auto w = tg::randn({32, 32}, dev());
  w.requires_grad_();
  auto x = tg::randn({16, 32}, dev());
  std::vector<int> reached;
  auto y = tg::utils::checkpoint(
      [&](const std::vector<Tensor>& in) {
        Tensor u = tg::matmul(in[0], w);
        reached.push_back(1);
        Tensor o = tg::gelu(u);
        reached.push_back(2);
        Tensor out = o * 3.0;
        reached.push_back(3);
        return out;
      },
      {x});
  (y * y).sum().backward();
  EXPECT_EQ(reached, (std::vector<int>{1, 2, 3, 1}));
  // And the gradient is right: d/dw sum((3 gelu(x w))^2) = x^T (18 gelu(u) gelu'(u)), through a plain run.
  auto w2 = w.detach().clone();
  w2.requires_grad_();
  Tensor o2 = tg::gelu(tg::matmul(x, w2)) * 3.0;
  (o2 * o2).sum().backward();
  expect_near_vec(host(w.grad()), host(w2.grad()), 1e-4, 1e-5, "dw against an uncheckpointed run");
}

TEST_P(CheckpointBlocks, AutocastStateIsReplayed) {
  auto blocks = make_blocks(2, 16, dev());
  tg::manual_seed(5);
  auto x = tg::randn({4, 16}, dev());
  Result plain = run_blocks(blocks, x, false, /*autocast=*/true);
  Result ckpt = run_blocks(blocks, x, true, /*autocast=*/true);
  expect_bit_identical(plain, ckpt);
  // The recompute really ran in bfloat16: a float32 recompute would not match the plain run.
  Result fp32 = run_blocks(blocks, x, false, /*autocast=*/false);
  EXPECT_NE(plain.grads[0], fp32.grads[0]);
}

INSTANTIATE_TEST_SUITE_P(Devices, CheckpointBlocks, ::testing::Values(Dev::CPU, Dev::CUDA), dev_name);

// Peak allocated above the baseline while fn runs: the host allocator's counters on the CPU,
// max_memory_allocated on CUDA. In activations of act_bytes.
template <class Fn>
double peak_in_activations(Device dev, int64_t act_bytes, Fn&& fn) {
  const bool cuda = dev.type() == kCUDA;
  if (cuda) tg::cuda::synchronize();
  const int64_t base = static_cast<int64_t>(cuda ? tg::cuda::memory_allocated() : tg::cpu::allocated_bytes());
  if (cuda)
    tg::cuda::reset_peak_memory_stats();
  else
    tg::cpu::reset_peak_allocated_bytes();
  fn();
  if (cuda) tg::cuda::synchronize();
  const int64_t peak = static_cast<int64_t>(cuda ? tg::cuda::max_memory_allocated() : tg::cpu::max_allocated_bytes());
  return static_cast<double>(peak - base) / static_cast<double>(act_bytes);
}

// Peak CUDA memory: a plain run keeps every block's activations until backward; a checkpointed
// one keeps only the blocks' inputs, plus one block's activations while it is recomputed.
TEST(CheckpointCuda, PeakMemoryIsLower) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int depth = 16;
  const int64_t d = 512, batch = 8192;
  const int64_t act_bytes = batch * d * 4;
  auto blocks = make_blocks(depth, d, Device(kCUDA));
  auto x = tg::randn({batch, d}, kCUDA);
  auto peak = [&](bool ckpt) {
    return peak_in_activations(Device(kCUDA), act_bytes, [&] { run_blocks(blocks, x, ckpt); });
  };
  peak(false);  // warm-up: gradients allocated, kernels loaded
  const double plain = peak(false), ckpt = peak(true);
  std::printf("peak above baseline: plain %.2f, checkpoint %.2f activations (one %.1f MiB)\n", plain, ckpt,
              act_bytes / 1048576.0);
  // Each block saves two activations plainly (Linear's input, GELU's input) and one checkpointed.
  EXPECT_LT(ckpt, plain - 4);
}

// Issue 14's memory stack: 8 blocks of Linear(d, d) + GELU + Dropout at batch d (so a weight
// gradient is one activation too), peak allocated above the baseline (parameters, their
// gradients, the input) with and without checkpointing each block, and each pair of blocks, in
// activations. A plain block keeps two activations (Linear's input, GELU's input); a
// checkpointed one keeps its input only, so the stack keeps 8 instead of 16, plus one block's (or
// pair's) recompute and the backward's transients.
struct StackPeaks {
  double plain, per_block, per_pair;
};
StackPeaks deep_stack_peaks(Device dev, int64_t d) {
  const int depth = 8;
  const int64_t act_bytes = d * d * 4;
  auto blocks = make_blocks(depth, d, dev);
  auto x = tg::randn({d, d}, dev);
  auto run = [&](int segment) {  // segment 0: plain; else blocks per checkpoint
    for (auto& b : blocks) b->zero_grad();
    Tensor h = x;
    for (int i = 0; i < depth; i += std::max(segment, 1)) {
      if (segment == 0) {
        h = (*blocks[i])(h);
      } else {
        h = tg::utils::checkpoint(
            [&, i](const std::vector<Tensor>& in) {
              Tensor t = in[0];
              for (int k = i; k < std::min(depth, i + segment); ++k) t = (*blocks[k])(t);
              return t;
            },
            {h});
      }
    }
    // As a separate statement: a temporary h * h would live to the end of a one-line
    // `(h * h).mean().backward()`, one activation more held through the whole backward.
    Tensor loss = (h * h).mean();
    loss.backward();
  };
  run(0);  // warm-up: gradients allocated, kernels and cuBLAS workspaces set up
  StackPeaks p{};
  p.plain = peak_in_activations(dev, act_bytes, [&] { run(0); });
  p.per_block = peak_in_activations(dev, act_bytes, [&] { run(1); });
  p.per_pair = peak_in_activations(dev, act_bytes, [&] { run(2); });
  std::printf(
      "8 x (Linear %lld + GELU + Dropout), batch %lld on %s, one activation %.2f MiB: peak above baseline\n"
      "  plain %.2f activations, checkpoint per block %.2f (%.2fx less), per 2 blocks %.2f (%.2fx less);"
      " issue target 3x: %s\n",
      static_cast<long long>(d), static_cast<long long>(d), dev.str().c_str(), act_bytes / 1048576.0, p.plain,
      p.per_block, p.plain / p.per_block, p.per_pair, p.plain / p.per_pair,
      std::max(p.plain / p.per_block, p.plain / p.per_pair) >= 3 ? "met" : "not met");
  return p;
}

// The accounting of the stack on the host allocator, which frees as the engine drops (no
// workspaces, no rounding at these sizes): what the CUDA figure below must show too. Measured
// (2026-12-07): plain 11 activations (16 saved, less the 8 old gradients zero_grad frees, plus the
// loss's backward: 3); per block 3 (the 8 kept inputs and 8 new gradients cancel the freed ones;
// the recompute stops inside GELU, which saves Linear's output z, so at its peak the incoming
// gradient, z and GELU's output are alive, and the Dropout never reruns): 3.67x less; per pair 4.
// (The reentrant checkpoint, which reran the whole block, peaked at 4 and 5: 2.75x.)
TEST(CheckpointCpu, PeakMemoryOfDeepStackInActivations) {
  const StackPeaks p = deep_stack_peaks(Device(kCPU), 256);
  EXPECT_GT(p.plain, 10.5);
  EXPECT_LT(p.per_block, 3.5);
  EXPECT_LT(p.per_pair, 4.5);
  EXPECT_GE(p.plain / p.per_block, 3.0) << "issue 14's target";
}

// Issue 14's memory target, measured: the stack above at d = batch = 4096 (one activation 64 MiB).
TEST(CheckpointCuda, PeakMemoryOfDeepStackIssueTarget) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const StackPeaks p = deep_stack_peaks(Device(kCUDA), 4096);
  // Measured on the H200 (2026-12-03), with the reentrant checkpoint and the loss's h * h held
  // through backward: plain 768 MiB (12 activations), per block 384 MiB (6), per pair 448 MiB (7).
  // Today's accounting is the CPU test's above (11 / 3 / 4); the issue asks for 3x.
  EXPECT_GT(p.plain, 10);
  EXPECT_GE(p.plain / p.per_block, 3.0) << "issue 14's target";
  EXPECT_LT(p.per_pair, p.plain - 6);
}

}  // namespace
}  // namespace tg::testing
