// Tensor hooks (register_hook on leaves and non-leaves: order, replacement, removal, with
// retain_grad and autograd::grad), post-accumulate-grad hooks (exactly once per backward per
// leaf, over several backwards), and nn::Module forward hooks. Values are closed forms.
#include <optional>
#include <string>
#include <vector>

#include "tests/autograd/common.h"
#include "tests/common/error_of.h"

namespace tg::testing {
namespace {

TensorOptions f64() { return TensorOptions().dtype(kFloat64); }

class Hooks : public ::testing::TestWithParam<Dev> {
 protected:
  void SetUp() override { TG_SKIP_WITHOUT_CUDA(GetParam()); }
  Device dev() const { return to_device(GetParam()); }
  Tensor leaf(std::vector<double> v) const {
    auto t = tg::tensor<double>(v, f64().device(dev()));
    t.requires_grad_();
    return t;
  }
  // x, w and loss = sum(tanh(x * w) * x) with its gradients without hooks (the saved-tensor cases).
  struct TanhCase {
    Tensor x, w;
    std::vector<double> gx, gw;
    Tensor loss() const { return (tg::tanh(x * w) * x).sum(); }
    void expect_plain_grads(const char* under) const {
      expect_near_vec(host(x.grad()), gx, 0, 0, std::string("dx under ") + under);
      expect_near_vec(host(w.grad()), gw, 0, 0, std::string("dw under ") + under);
    }
  };
  TanhCase tanh_case() const {
    TanhCase c{leaf({0.3, -1.1, 0.8}), leaf({1.5, 0.4, -0.9}), {}, {}};
    c.loss().backward();
    c.gx = host(c.x.grad());
    c.gw = host(c.w.grad());
    c.x.mutable_grad() = Tensor();
    c.w.mutable_grad() = Tensor();
    return c;
  }
};

TEST_P(Hooks, LeafHookSeesTheSummedGradientOnceAndReplacesWhatIsAccumulated) {
  auto x = leaf({1, 2, 3});
  int calls = 0;
  std::vector<double> seen;
  x.register_hook([&](const Tensor& g) {
    ++calls;
    seen = host(g);
    return g * 2;
  });
  (x * x).sum().backward();  // x on both edges of mul: the hook sees 2x once
  EXPECT_EQ(calls, 1);
  expect_near_vec(seen, {2, 4, 6}, 0, 0, "hook input");
  expect_near_vec(host(x.grad()), {4, 8, 12}, 0, 0, "x.grad is the hooked gradient");
  (x * 3).sum().backward();  // accumulation adds the hooked 6
  expect_near_vec(host(x.grad()), {10, 14, 18}, 0, 0, "accumulated");
  EXPECT_EQ(calls, 2);
}

TEST_P(Hooks, RunInRegistrationOrderEachSeeingThePreviousResult) {
  auto x = leaf({1, -1});
  std::vector<std::string> order;
  std::vector<double> second_saw;
  x.register_hook([&](const Tensor& g) {
    order.push_back("first");
    return g + 1;
  });
  x.register_hook([&](const Tensor& g) -> std::optional<Tensor> {
    order.push_back("second");
    second_saw = host(g);
    return std::nullopt;  // keep
  });
  x.register_hook([&](const Tensor& g) -> Tensor {
    order.push_back("third");
    return g * 10;
  });
  x.register_hook([&](const Tensor&) { order.push_back("fourth (void)"); });
  (x * 3).sum().backward();  // d/dx = 3 -> 4 -> 4 -> 40
  EXPECT_EQ(order, (std::vector<std::string>{"first", "second", "third", "fourth (void)"}));
  expect_near_vec(second_saw, {4, 4}, 0, 0, "second hook input");
  expect_near_vec(host(x.grad()), {40, 40}, 0, 0, "x.grad");
}

TEST_P(Hooks, RemoveUnregistersAndIsIdempotent) {
  auto x = leaf({2});
  int calls = 0;
  auto h = x.register_hook([&](const Tensor& g) {
    ++calls;
    return g * 5;
  });
  (x * 1.5).sum().backward();
  expect_near_vec(host(x.grad()), {7.5}, 0, 0, "hooked");
  h.remove();
  h.remove();  // again: nothing
  x.mutable_grad() = Tensor();
  (x * 1.5).sum().backward();
  expect_near_vec(host(x.grad()), {1.5}, 0, 0, "after remove");
  EXPECT_EQ(calls, 1);
  // A handle outliving its tensor is harmless.
  RemovableHandle late;
  {
    auto y = leaf({1});
    late = y.register_hook([](const Tensor& g) { return g; });
  }
  late.remove();
  // A hook that removes itself while running runs once.
  RemovableHandle self;
  int self_calls = 0;
  self = x.register_hook([&](const Tensor&) {
    ++self_calls;
    self.remove();
  });
  (x * 1.0).sum().backward();
  (x * 1.0).sum().backward();
  EXPECT_EQ(self_calls, 1);
}

TEST_P(Hooks, NonLeafHookChangesWhatFlowsUpstreamAndRetainedGrad) {
  auto x = leaf({1, 2, 3});
  auto y = x * x;  // non-leaf
  y.retain_grad();
  std::vector<double> seen;
  y.register_hook([&](const Tensor& g) {
    seen = host(g);
    return g * 3;
  });
  (y * 2).sum().backward();
  expect_near_vec(seen, {2, 2, 2}, 0, 0, "non-leaf hook input");
  expect_near_vec(host(y.grad()), {6, 6, 6}, 0, 0, "retained grad is the hooked one");
  expect_near_vec(host(x.grad()), {12, 24, 36}, 0, 0, "x.grad = 6 * 2x");
}

TEST_P(Hooks, HooksApplyToAutogradGradResults) {
  auto x = leaf({1, 2});
  auto y = x * x;
  y.register_hook([](const Tensor& g) { return g * 3; });
  x.register_hook([](const Tensor& g) { return g + 1; });
  auto z = (y * 2).sum();
  auto gs = tg::autograd::grad({z}, {x, y}, {}, true);
  expect_near_vec(host(gs[1]), {6, 6}, 0, 0, "dz/dy hooked");
  expect_near_vec(host(gs[0]), {13, 25}, 0, 0, "dz/dx = 6 * 2x + 1");
  EXPECT_FALSE(x.grad().defined());
}

TEST_P(Hooks, HookOnAnOutputOfSeveralUsesAndOnOneOfTwoOutputs) {
  auto x = leaf({1, 2, 3, 4});
  auto [vals, idx] = tg::sort(x, 0, /*descending=*/true);  // vals = [4,3,2,1]
  vals.register_hook([](const Tensor& g) { return g * -1; });
  (vals * tg::tensor<double>({1, 10, 100, 1000}, f64().device(dev()))).sum().backward();
  // d/dvals = [1,10,100,1000] -> negated; scattered back to x by idx = [3,2,1,0]
  expect_near_vec(host(x.grad()), {-1000, -100, -10, -1}, 0, 0, "sorted values' hook");
}

TEST_P(Hooks, AHookMayWriteIntoTheGradientItGets) {
  auto x = leaf({1, 2});
  auto loss = (x * 3).sum();
  loss.register_hook([](const Tensor& g) { g.mul_(2); });  // the root gradient (on CUDA, never the shared 1)
  loss.backward();
  expect_near_vec(host(x.grad()), {6, 6}, 0, 0, "doubled in place");
  x.mutable_grad() = Tensor();
  (x * 3).sum().backward();  // a later loss starts from 1 again
  expect_near_vec(host(x.grad()), {3, 3}, 0, 0, "fresh root gradient");
}

TEST_P(Hooks, BadHooksAreErrors) {
  auto c = tg::tensor<double>({1, 2}, f64().device(dev()));  // requires no grad
  EXPECT_NE(error_of([&] { c.register_hook([](const Tensor& g) { return g; }); }).find("does not require grad"),
            std::string::npos);
  auto x = leaf({1, 2});
  x.register_hook([](const Tensor& g) { return g.sum(); });  // wrong shape
  const std::string e = error_of([&] { (x * 2).sum().backward(); });
  EXPECT_NE(e.find("register_hook"), std::string::npos) << e;
  EXPECT_NE(e.find("[2]"), std::string::npos) << e;
}

TEST_P(Hooks, PostAccumulateRunsOncePerBackwardAfterAccumulation) {
  auto w = leaf({1, -2});
  int calls = 0;
  std::vector<std::vector<double>> grads_seen;
  auto h = w.register_post_accumulate_grad_hook([&](Tensor& p) {
    ++calls;
    EXPECT_TRUE(p.is_same(w));
    grads_seen.push_back(host(p.grad()));
  });
  // w reaches the loss along three paths: one accumulation, one hook call.
  auto loss = [&] { return (w * w).sum() + (w * 3).sum() + w.sum(); };  // d/dw = 2w + 4
  loss().backward();
  EXPECT_EQ(calls, 1);
  expect_near_vec(grads_seen.at(0), {6, 0}, 0, 0, "after first backward");
  loss().backward();
  loss().backward();
  EXPECT_EQ(calls, 3);
  expect_near_vec(grads_seen.at(1), {12, 0}, 0, 0, "accumulated twice");
  expect_near_vec(grads_seen.at(2), {18, 0}, 0, 0, "accumulated three times");
  // autograd::grad writes no .grad(): no call.
  tg::autograd::grad({loss()}, {w});
  EXPECT_EQ(calls, 3);
  // A gradient hook runs before accumulation; the post hook sees its result.
  w.register_hook([](const Tensor& g) { return g * 0.5; });
  w.mutable_grad() = Tensor();
  loss().backward();
  EXPECT_EQ(calls, 4);
  expect_near_vec(grads_seen.at(3), {3, 0}, 0, 0, "post hook after the gradient hook");
  h.remove();
  loss().backward();
  EXPECT_EQ(calls, 4);
}

TEST_P(Hooks, PostAccumulateOnlyOnLeavesThatRequireGrad) {
  auto w = leaf({1});
  auto y = w * 2;
  std::string e = error_of([&] { y.register_post_accumulate_grad_hook([](Tensor&) {}); });
  EXPECT_NE(e.find("not a leaf"), std::string::npos) << e;
  auto c = tg::tensor<double>({1}, f64().device(dev()));
  e = error_of([&] { c.register_post_accumulate_grad_hook([](const Tensor&) {}); });
  EXPECT_NE(e.find("does not require grad"), std::string::npos) << e;
}

// Saved-tensor hooks: y = sum(tanh(x * w) * x), each save packed once (stored doubled, halved
// back: the gradients are exact) and unpacked by backward; the same gradients as without hooks.
TEST_P(Hooks, SavedTensorsHooksPackEverySaveAndUnpackInBackward) {
  TanhCase c = tanh_case();
  int packs = 0, unpacks = 0;
  Tensor y;
  {
    tg::autograd::SavedTensorsHooks hooks(
        [&](const Tensor& t) {
          ++packs;
          EXPECT_FALSE(t.requires_grad()) << "pack gets a detached value";
          return t * 2.0;
        },
        [&](const Tensor& p) {
          ++unpacks;
          return p * 0.5;
        });
    y = c.loss();
  }
  // mul saves x and w, tanh its output, the second mul its two operands.
  EXPECT_EQ(packs, 5);
  EXPECT_EQ(unpacks, 0);
  y.backward();
  EXPECT_EQ(unpacks, 5);
  c.expect_plain_grads("hooks");
}

TEST_P(Hooks, SavedTensorsHooksNestAndAreErrorsWhenUnpackChangesTheTensor) {
  auto x = leaf({0.3, -1.1, 0.8});
  int outer = 0, inner = 0;
  Tensor y, z;
  {
    tg::autograd::SavedTensorsHooks a(
        [&](const Tensor& t) {
          ++outer;
          return t;
        },
        [](const Tensor& p) { return p; });
    {
      tg::autograd::SavedTensorsHooks b(
          [&](const Tensor& t) {
            ++inner;
            return t;
          },
          [](const Tensor& p) { return p.slice(0, 0, 2); });
      y = x.exp().sum();
    }
    z = x.sin().sum();
  }
  EXPECT_EQ(inner, 1);
  EXPECT_EQ(outer, 1);
  std::string e = error_of([&] { y.backward(); });
  EXPECT_NE(e.find("saved_tensors_hooks: unpack returned shape [2]"), std::string::npos) << e;
  EXPECT_NE(e.find("for a tensor saved as shape [3]"), std::string::npos) << e;
  z.backward();
  expect_near_vec(host(x.grad()), {std::cos(0.3), std::cos(-1.1), std::cos(0.8)}, 1e-15, 0, "d sin");
  e = error_of([] { tg::autograd::SavedTensorsHooks h(nullptr, [](const Tensor& p) { return p; }); });
  EXPECT_NE(e.find("saved_tensors_hooks: pack and unpack must both be set"), std::string::npos) << e;
}

// save_on_cpu: the same gradients; on CUDA the saved intermediates leave the device until
// backward (two tanh outputs of 1 Mi floats: 8 MiB less allocated after the forward).
TEST_P(Hooks, SaveOnCpuKeepsSavesOnTheHost) {
  TanhCase c = tanh_case();
  Tensor y;
  {
    tg::autograd::SaveOnCpu offload;
    y = c.loss();
  }
  y.backward();
  c.expect_plain_grads("SaveOnCpu");
  if (dev().type() != kCUDA) return;
  auto big = tg::randn({1 << 20}, TensorOptions().device(dev()).requires_grad(true));
  auto after_forward = [&](bool offload) {
    tg::cuda::synchronize();
    const int64_t base = static_cast<int64_t>(tg::cuda::memory_allocated());
    std::optional<tg::autograd::SaveOnCpu> guard;
    if (offload) guard.emplace();
    Tensor loss = tg::tanh(tg::tanh(big * 2.0)).sum();
    guard.reset();
    tg::cuda::synchronize();
    const int64_t used = static_cast<int64_t>(tg::cuda::memory_allocated()) - base;
    loss.backward();
    big.mutable_grad() = Tensor();
    return used;
  };
  const int64_t kept = after_forward(false), offloaded = after_forward(true);
  EXPECT_GE(kept - offloaded, int64_t{2} << 22) << "kept " << kept << " bytes, offloaded " << offloaded;
}

INSTANTIATE_TEST_SUITE_P(Devices, Hooks, ::testing::Values(Dev::CPU, Dev::CUDA), dev_name);

// ---- module forward hooks
struct Affine : nn::Module {
  Tensor forward(const Tensor& x) override { return x * 2 + 1; }
  std::string name() const override { return "Affine"; }
};

TEST(ModuleHooks, PreHookReplacesInputForwardHookReplacesOutput) {
  Affine m;
  auto x = tg::tensor<double>({1, 2}, f64());
  std::vector<std::string> order;
  std::vector<double> post_input, post_output;
  m.register_forward_pre_hook([&](nn::Module& mod, const Tensor& in) {
    order.push_back("pre1 " + mod.name());
    return in + 10;  // [11, 12]
  });
  m.register_forward_pre_hook([&](nn::Module&, const Tensor& in) -> std::optional<Tensor> {
    order.push_back("pre2");
    return in * 2;  // [22, 24]
  });
  m.register_forward_hook([&](nn::Module&, const Tensor& in, const Tensor& out) {
    order.push_back("post1");
    post_input = host(in);
    post_output = host(out);  // 2 * [22, 24] + 1
  });
  auto h = m.register_forward_hook([&](nn::Module&, const Tensor&, const Tensor& out) {
    order.push_back("post2");
    return out - 100;
  });
  auto y = m(x);
  EXPECT_EQ(order, (std::vector<std::string>{"pre1 Affine", "pre2", "post1", "post2"}));
  expect_near_vec(post_input, {22, 24}, 0, 0, "forward hook's input");
  expect_near_vec(post_output, {45, 49}, 0, 0, "forward hook's output");
  expect_near_vec(host(y), {-55, -51}, 0, 0, "replaced output");
  h.remove();
  expect_near_vec(host(m(x)), {45, 49}, 0, 0, "after removing the output hook");
  expect_near_vec(host(m.forward(x)), {3, 5}, 0, 0, "forward() itself runs no hooks");
}

TEST(ModuleHooks, RunForSequentialChildrenAndAreSharedByCopies) {
  Affine a;
  int calls = 0;
  auto h = a.register_forward_hook([&](nn::Module&, const Tensor&, const Tensor& out) {
    ++calls;
    return out * 0;
  });
  nn::Sequential seq(a, Affine());  // holds a shallow copy of a: the hook comes along
  auto x = tg::tensor<double>({1, 2}, f64());
  expect_near_vec(host(seq(x)), {1, 1}, 0, 0, "first child's output zeroed, second gives 0*2+1");
  EXPECT_EQ(calls, 1);
  h.remove();  // removes it from the copy too
  expect_near_vec(host(seq(x)), {7, 11}, 0, 0, "(2x+1)*2+1");
  EXPECT_EQ(calls, 1);
}

TEST(ModuleHooks, GradientsFlowThroughReplacedValues) {
  nn::Linear lin(2, 1, /*bias=*/false, TensorOptions().dtype(kFloat64));
  {
    NoGradGuard g;
    lin.weight.copy_(tg::tensor<double>({3, -1}, {1, 2}, f64()));
  }
  lin.register_forward_pre_hook([](nn::Module&, const Tensor& in) { return in * 2; });
  lin.register_forward_hook([](nn::Module&, const Tensor&, const Tensor& out) { return out * out; });
  auto x = tg::tensor<double>({1, 1}, {1, 2}, f64());
  auto y = lin(x);  // (w . 2x)^2 = (2*(3 - 1))^2 = 16
  expect_near_vec(host(y), {16}, 0, 0, "output");
  y.sum().backward();
  // dy/dw = 2 * (w . 2x) * 2x = 2 * 4 * [2, 2]
  expect_near_vec(host(lin.weight.grad()), {16, 16}, 0, 0, "weight grad");
}

}  // namespace
}  // namespace tg::testing
