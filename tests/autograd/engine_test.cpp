// The engine: accumulation across backward calls, retain_graph, no-grad mode,
// detach, non-leaf grads, tg::autograd::grad, a 100 000-op chain, and every bad
// call as a tg::Error. Values are checked against closed forms computed on the host.
#include <cmath>
#include <string>
#include <vector>

#include <tapegrad/autograd/function.h>

#include "tests/autograd/common.h"
#include "tests/common/error_of.h"

namespace tg::testing {
namespace {

TensorOptions f64() { return TensorOptions().dtype(kFloat64); }

class Engine : public ::testing::TestWithParam<Dev> {
 protected:
  void SetUp() override { TG_SKIP_WITHOUT_CUDA(GetParam()); }
  Device dev() const { return to_device(GetParam()); }
};

TEST_P(Engine, AccumulatesAcrossBackwardCalls) {
  auto x = tg::tensor<double>({1, -2, 3}, f64().device(dev()));
  x.requires_grad_();
  EXPECT_TRUE(x.is_leaf());
  (x * x).sum().backward();  // the same leaf on both edges: 2x
  expect_near_vec(host(x.grad()), {2, -4, 6}, 1e-12, 0, "first");
  (x * x).sum().backward();
  expect_near_vec(host(x.grad()), {4, -8, 12}, 1e-12, 0, "accumulated");
  x.mutable_grad() = Tensor();  // clearing, as zero_grad(set_to_none) does
  (x * 3).sum().backward();
  expect_near_vec(host(x.grad()), {3, 3, 3}, 1e-12, 0, "after clearing");
}

TEST_P(Engine, GradIsDenseAndOwnedEvenFromExpand) {
  auto x = tg::tensor<double>({1, 2}, f64().device(dev()));
  x.requires_grad_();
  x.sum().backward();  // sum's backward is an expanded (stride 0) view
  EXPECT_TRUE(x.grad().is_contiguous());
  expect_near_vec(host(x.grad()), {1, 1}, 0, 0, "sum grad");
  // add's backward passes the caller's gradient through unchanged: the leaf must
  // get its own copy, not alias the caller's tensor.
  auto w = tg::tensor<double>({1, 2}, f64().device(dev()));
  w.requires_grad_();
  auto g = tg::ones({2}, f64().device(dev()));
  (w + 0.0).backward(g);
  expect_near_vec(host(w.grad()), {1, 1}, 0, 0, "pass-through grad");
  EXPECT_NE(w.grad().data_ptr(), g.data_ptr());
}

// loss.backward() of a CUDA scalar starts from a shared read-only 1 (no fill launch). Every
// way that gradient can reach user code must hand out a copy, or writing into it would
// change the next backward's implicit gradient.
TEST_P(Engine, ImplicitRootGradientIsNeverHandedOutWritable) {
  auto opts = f64().device(dev());
  auto check_fresh_backward = [&](const char* what) {
    auto z = tg::tensor<double>({2, 5}, opts).requires_grad_();
    (z * z).sum().backward();
    expect_near_vec(host(z.grad()), {4, 10}, 0, 0, what);
  };
  // A scalar leaf: its .grad() is the root gradient itself.
  auto w = tg::tensor<double>({3}, opts).reshape({}).requires_grad_();
  Tensor wl = w.detach().requires_grad_();
  wl.backward();
  expect_near_vec(host(wl.grad()), {1}, 0, 0, "leaf grad");
  wl.mutable_grad().mul_(7);
  check_fresh_backward("after writing a leaf's grad");
  wl.backward();
  expect_near_vec(host(wl.grad()), {8}, 0, 0, "accumulated onto the written grad");
  // Non-leaf retain_grad and autograd::grad of the root itself.
  auto x = tg::tensor<double>({1.5}, opts).requires_grad_();
  Tensor y = (x * 2).sum();
  y.retain_grad();
  y.backward({}, {.retain_graph = true});
  y.mutable_grad().mul_(5);
  check_fresh_backward("after writing a retained grad");
  std::vector<Tensor> gy = tg::autograd::grad({y}, {y}, {}, /*retain_graph=*/true);
  ASSERT_EQ(gy.size(), 1u);
  expect_near_vec(host(gy[0]), {1}, 0, 0, "grad of the root itself");
  gy[0].mul_(9);
  check_fresh_backward("after writing autograd::grad's result");
  std::vector<Tensor> gx = tg::autograd::grad({y}, {x});
  expect_near_vec(host(gx[0]), {2}, 0, 0, "grad after the writes");
}

TEST_P(Engine, RetainGraphAllowsASecondBackward) {
  auto x = tg::tensor<double>({0.5, -1.0}, f64().device(dev()));
  x.requires_grad_();
  auto z = x.exp().sum();
  z.backward({}, {.retain_graph = true});
  z.backward();
  expect_near_vec(host(x.grad()), {2 * std::exp(0.5), 2 * std::exp(-1.0)}, 1e-12, 1e-12, "twice");
  std::string msg = error_of([&] { z.backward(); });
  EXPECT_NE(msg.find("retain_graph"), std::string::npos) << msg;
}

TEST_P(Engine, NoGradAndDetach) {
  auto x = tg::randn({3}, f64().device(dev()).requires_grad(true));
  EXPECT_TRUE(autograd::GradMode::is_enabled());
  {
    tg::NoGradGuard outer;
    {
      tg::NoGradGuard inner;
      EXPECT_FALSE(autograd::GradMode::is_enabled());
    }
    EXPECT_FALSE(autograd::GradMode::is_enabled());
    auto y = x * 2;
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(y.grad_fn(), nullptr);
    x.mul_(1.0);  // in-place updates of leaves are fine without grad mode
  }
  EXPECT_TRUE(autograd::GradMode::is_enabled());
  auto d = x.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_EQ(d.data_ptr(), x.data_ptr());
  auto y = x * 2;
  EXPECT_TRUE(y.requires_grad());
  EXPECT_FALSE(y.is_leaf());
  EXPECT_NE(y.grad_fn(), nullptr);
  EXPECT_STREQ(y.grad_fn()->name(), "mul");
  // Integer results never require grad.
  EXPECT_FALSE(tg::argmax(x).requires_grad());
  EXPECT_FALSE((x > 0).requires_grad());
}

TEST_P(Engine, NonLeafGrads) {
  auto x = tg::tensor<double>({1, 2, 3}, f64().device(dev()));
  x.requires_grad_();
  auto h = x * 2;
  h.retain_grad();
  auto k = x + 1;  // not retained
  (h * h + k).sum().backward();
  expect_near_vec(host(h.grad()), {4, 8, 12}, 1e-12, 0, "h.grad = 2h");
  expect_near_vec(host(x.grad()), {9, 17, 25}, 1e-12, 0, "x.grad = 8x + 1");
  EXPECT_FALSE(k.grad().defined());
}

TEST_P(Engine, AutogradGradLeavesDotGradAlone) {
  auto x = tg::tensor<double>({1, 2}, f64().device(dev()));
  auto w = tg::tensor<double>({3, 4}, f64().device(dev()));
  x.requires_grad_();
  w.requires_grad_();
  auto h = x * w;
  auto out = (h * x).sum();  // x^2 w
  auto g = autograd::grad({out}, {x, h});
  ASSERT_EQ(g.size(), 2u);
  expect_near_vec(host(g[0]), {6, 16}, 1e-12, 0, "d/dx = 2xw");
  expect_near_vec(host(g[1]), {1, 2}, 1e-12, 0, "d/dh = x");
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
  // With explicit output gradients and an unused input.
  auto u = tg::ones({2}, f64().device(dev()).requires_grad(true));
  auto y = x.exp();
  auto gy = tg::tensor<double>({2, 3}, f64().device(dev()));
  auto g2 = autograd::grad({y}, {x, u}, {gy});
  expect_near_vec(host(g2[0]), {2 * std::exp(1.0), 3 * std::exp(2.0)}, 1e-12, 1e-12, "vjp");
  EXPECT_FALSE(g2[1].defined());
}

TEST_P(Engine, SharedSubgraphsSumTheirGradients) {
  // A diamond: h feeds two branches that meet again; the engine must run h once
  // with the sum of both branch gradients.
  auto x = tg::tensor<double>({0.3, -0.7}, f64().device(dev()));
  x.requires_grad_();
  auto h = x.tanh();
  auto out = (h.exp() + h * h).sum();
  out.backward();
  std::vector<double> want;
  for (double v : {0.3, -0.7}) {
    double t = std::tanh(v);
    want.push_back((std::exp(t) + 2 * t) * (1 - t * t));
  }
  expect_near_vec(host(x.grad()), want, 1e-12, 1e-12, "diamond");
}

TEST_P(Engine, LongChainNeedsNoRecursion) {
  // 100 000 recorded ops: topological order, backward and the graph's release are
  // all iterative. d/dx of x * c^n is c^n.
  auto x = tg::tensor<double>({1.0}, f64().device(dev()));
  x.requires_grad_();
  const int n = 100000;
  const double c = 1.000001;
  Tensor y = x;
  for (int i = 0; i < n; ++i) y = y * c;
  y.sum().backward();
  expect_near_vec(host(x.grad()), {std::pow(c, n)}, 1e-9, 1e-9, "chain");
  y = Tensor();
  // A chain that is dropped without ever running backward is released iteratively too.
  Tensor z = x;
  for (int i = 0; i < n; ++i) z = z + 1.0;
  z = Tensor();
  SUCCEED();
}

TEST_P(Engine, BadCallsThrow) {
  auto x = tg::randn({2, 3}, f64().device(dev()).requires_grad(true));
  auto y = x * 2;
  // Non-scalar backward without a gradient.
  std::string msg = error_of([&] { y.backward(); });
  EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("scalar"), std::string::npos) << msg;
  // A tensor that requires no grad.
  auto c = tg::randn({1}, f64().device(dev()));
  msg = error_of([&] { c.backward(); });
  EXPECT_NE(msg.find("does not require grad"), std::string::npos) << msg;
  // A gradient of the wrong shape / dtype.
  msg = error_of([&] { y.backward(tg::ones({3, 2}, f64().device(dev()))); });
  EXPECT_NE(msg.find("[3, 2]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
  msg = error_of([&] { y.backward(tg::ones({2, 3}, TensorOptions(kFloat32).device(dev()))); });
  EXPECT_NE(msg.find("float32"), std::string::npos) << msg;
  // requires_grad on an integer tensor.
  msg = error_of([&] { tg::arange(3).requires_grad_(); });
  EXPECT_NE(msg.find("int64"), std::string::npos) << msg;
  // requires_grad_(false) on a non-leaf.
  msg = error_of([&] { y.requires_grad_(false); });
  EXPECT_NE(msg.find("leaf"), std::string::npos) << msg;
  // create_graph on a graph already freed (higher_order_test.cpp covers create_graph itself).
  Tensor s = y.sum();
  s.backward();
  msg = error_of([&] { s.backward({}, {.create_graph = true}); });
  EXPECT_NE(msg.find("retain_graph"), std::string::npos) << msg;
}

TEST_P(Engine, InPlaceModifiedSavedTensorThrows) {
  auto x = tg::randn({3}, f64().device(dev()).requires_grad(true));
  auto a = tg::randn({3}, f64().device(dev()));  // saved by mul for x's gradient
  auto z = (x * a).sum();
  a.add_(1.0);  // allowed: a takes no part in autograd; bumps its version
  std::string msg = error_of([&] { z.backward(); });
  EXPECT_NE(msg.find("modified in place"), std::string::npos) << msg;
  EXPECT_NE(msg.find("mul"), std::string::npos) << msg;
  // A saved output modified through a view under no-grad.
  auto e = x.exp();
  auto loss = e.sum();
  {
    tg::NoGradGuard g;
    e.slice(0, 0, 1).mul_(2.0);
  }
  msg = error_of([&] { loss.backward(); });
  EXPECT_NE(msg.find("modified in place"), std::string::npos) << msg;
}

TEST_P(Engine, InPlaceOnTensorsInTheGraphIsRefused) {
  auto x = tg::randn({3}, f64().device(dev()).requires_grad(true));
  std::string msg = error_of([&] { autograd::check_inplace(x, "add_"); });
  EXPECT_NE(msg.find("add_"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3]"), std::string::npos) << msg;
  msg = error_of([&] { x.add_(1.0); });
  EXPECT_NE(msg.find("add_"), std::string::npos) << msg;
  auto y = x * 2;
  EXPECT_NO_THROW(y.mul_(2.0));  // a non-leaf: recorded (tests/autograd/inplace_test.cpp)
  tg::NoGradGuard g;
  EXPECT_NO_THROW(autograd::check_inplace(x, "add_"));
}

// y = 3x with a backward that takes x's waiting gradient (take_pending_grad) and adds it in,
// recording what it found in `seen`.
Tensor triple_taking_pending(const Tensor& x, std::vector<Tensor>& seen) {
  Tensor out = native::mul(x, Scalar(3.0));
  if (!autograd::should_record(x)) return out;
  return autograd::record(
      "triple", {x}, std::move(out),
      [&seen](const Tensor& g, const autograd::FunctionNode& n) -> std::vector<Tensor> {
        Tensor mine = native::mul(g, Scalar(3.0));
        Tensor pending = autograd::take_pending_grad(n, 0, mine.sizes(), mine.dtype(), mine.device());
        // Only the node being run may take: another node's request is refused.
        EXPECT_FALSE(autograd::take_pending_grad(*n.next_edges[0].fn, 0, mine.sizes(), mine.dtype(), mine.device())
                         .defined());
        seen.push_back(pending);
        return {pending.defined() ? native::add(mine, pending) : mine};
      },
      autograd::Backward::kFirstOrder);
}

TEST_P(Engine, PendingGradientIsTakenOnceAndSummedByTheBackward) {
  auto x = tg::tensor<double>({1, -2, 3}, f64().device(dev()));
  x.requires_grad_();
  std::vector<Tensor> seen;
  // h's node waits for the mul's gradient and the triple's; the engine runs the add's last input's
  // branch first (a stack), so the mul's arrives before triple runs.
  Tensor h = x * 1.0;
  Tensor y = triple_taking_pending(h, seen) + h * tg::tensor<double>({2, 5, 7}, f64().device(dev()));
  y.backward(tg::tensor<double>({1, 10, 100}, f64().device(dev())));
  ASSERT_EQ(seen.size(), 1u);
  ASSERT_TRUE(seen[0].defined()) << "the mul's gradient of h was waiting when triple ran";
  expect_near_vec(host(seen[0]), {2, 50, 700}, 0, 0, "pending = the other consumer's gradient");
  expect_near_vec(host(x.grad()), {5, 80, 1000}, 1e-12, 0, "x's gradient: both consumers, each once");

  // The other consumer's gradient reduced from a broadcast: taken once reduced to h's shape, and
  // the leaf's .grad accumulates over both calls.
  seen.clear();
  Tensor hb = x * 1.0;
  Tensor yb = triple_taking_pending(hb, seen).sum() + (hb.reshape({3, 1}) + tg::zeros({3, 2}, f64().device(dev()))).sum();
  yb.backward();
  ASSERT_EQ(seen.size(), 1u);
  ASSERT_TRUE(seen[0].defined());
  expect_near_vec(host(seen[0]), {2, 2, 2}, 0, 0, "the broadcast gradient, reduced");
  expect_near_vec(host(x.grad()), {5 + 5, 80 + 5, 1000 + 5}, 1e-12, 0, "accumulated over both calls");

  // Nothing is taken when it is the only gradient, nor outside the engine, nor under create_graph.
  seen.clear();
  triple_taking_pending(x * 1.0, seen).sum().backward();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_FALSE(seen[0].defined());
  EXPECT_FALSE(autograd::take_pending_grad(*h.grad_fn(), 0, h.sizes(), h.dtype(), h.device()).defined());
  seen.clear();
  Tensor hc = x * 1.0;
  auto gs = tg::autograd::grad({(triple_taking_pending(hc, seen) + hc * 2.0).sum()}, {x},
                               tg::autograd::GradOptions{.create_graph = true});
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_FALSE(seen[0].defined()) << "create_graph sums with recorded ops";
  expect_near_vec(host(gs[0]), {5, 5, 5}, 1e-12, 0, "create_graph gradient");
}

INSTANTIATE_TEST_SUITE_P(Devices, Engine, ::testing::Values(Dev::CPU, Dev::CUDA), dev_name);

}  // namespace
}  // namespace tg::testing
