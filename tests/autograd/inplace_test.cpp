// In-place ops on tensors inside a graph, recorded as in PyTorch: history rebased on a non-leaf,
// CopySlices for views of non-leaves (and of plain tensors), views' histories following their
// base, the saved-tensor version check, shared version counters, and the errors PyTorch raises
// (leaf, view of a leaf, no-grad view, overlapping memory). Gradients are checked against hand
// values and against central differences in float64 (gradcheck).
#include <functional>
#include <string>
#include <vector>

#include "tests/autograd/common.h"
#include "tests/common/error_of.h"

namespace tg::testing {
namespace {

using Inputs = std::vector<Tensor>;

TensorOptions f64(Device d = Device(kCPU)) { return TensorOptions().dtype(kFloat64).device(d); }
Tensor vals(std::vector<double> v, Shape s, Device d = Device(kCPU)) { return tg::tensor<double>(v, s, f64(d)); }
Tensor leaf(std::vector<double> v, Shape s, Device d = Device(kCPU)) {
  Tensor t = vals(std::move(v), s, d);
  t.requires_grad_();
  return t;
}
void expect_has(const std::string& msg, const std::string& part) {
  EXPECT_NE(msg.find(part), std::string::npos) << "missing \"" << part << "\" in: " << msg;
}

class InPlace : public ::testing::TestWithParam<Dev> {
 protected:
  Dev dev() const { return GetParam(); }
  Device device() const { return to_device(GetParam()); }
};

// ---------------------------------------------------------------- chains on a non-leaf
TEST_P(InPlace, ChainOnNonLeafRebasesHistory) {
  TG_SKIP_WITHOUT_CUDA(dev());
  Tensor x = leaf({-1.5, -0.2, 0.3, 2.0}, {4}, device());
  Tensor w = vals({1, 2, 3, 4}, {4}, device());
  Tensor y = x * 2;
  y.add_(1.0);
  EXPECT_EQ(std::string(y.grad_fn()->name()), "add_");
  y.mul_(3.0);
  y.relu_();  // last: relu_ saves its result, which a later in-place op would invalidate (as PyTorch)
  EXPECT_FALSE(y.is_leaf());
  EXPECT_EQ(std::string(y.grad_fn()->name()), "relu_");
  EXPECT_EQ(std::string(y.grad_fn()->next_edges.at(0).fn->name()), "mul_");
  EXPECT_EQ(std::string(y.grad_fn()->next_edges.at(0).fn->next_edges.at(0).fn->name()), "add_");
  // y = 3 relu(2x + 1): 2x + 1 = [-2, 0.6, 1.6, 5].
  expect_near_vec(host(y), {0, 1.8, 4.8, 15}, 1e-12, 0, "y");
  (y * w).sum().backward();
  // dy/dx = 3 * [2x + 1 > 0] * 2, times w.
  expect_near_vec(host(x.grad()), {0, 12, 18, 24}, 1e-12, 0, "x.grad");
}

// ---------------------------------------------------------------- every form, through gradcheck
struct Case {
  std::string name;
  std::function<Inputs(Device)> inputs;
  std::function<Tensor(const Inputs&)> fn;
};

Tensor N(Shape s, Device d) { return tg::randn(s, f64(d)); }
Tensor P(Shape s, Device d) { return tg::rand(s, f64(d)) + 0.5; }

std::vector<Case> cases() {
  std::vector<Case> c;
  auto two = [](Shape a, Shape b) { return [a, b](Device d) { return Inputs{N(a, d), N(b, d)}; }; };
  auto one = [](Shape a) { return [a](Device d) { return Inputs{N(a, d)}; }; };
  c.push_back({"add_ tensor, alpha, broadcast", two({3, 4}, {4}), [](const Inputs& v) {
                 Tensor y = v[0] * 1.0;
                 y.add_(v[1], 2.5);
                 return y * v[0];
               }});
  c.push_back({"sub_ tensor, alpha", two({3, 4}, {3, 4}), [](const Inputs& v) {
                 Tensor y = v[0] * 1.0;
                 y.sub_(v[1], 0.5);
                 return y * y;
               }});
  c.push_back({"mul_ tensor (old self read by the operand's gradient)", two({3, 4}, {1, 4}), [](const Inputs& v) {
                 Tensor y = v[0] * 1.0;
                 y.mul_(v[1]);
                 return y;
               }});
  c.push_back({"div_ tensor", [](Device d) { return Inputs{N({3, 4}, d), P({3, 4}, d)}; }, [](const Inputs& v) {
                 Tensor y = v[0] * 1.0;
                 y.div_(v[1]);
                 return y;
               }});
  c.push_back({"scalar add_ mul_ sub_ div_", one({5}), [](const Inputs& v) {
                 Tensor y = v[0] * v[0];
                 y.add_(1.5).mul_(-2.0).sub_(0.25).div_(4.0);
                 return y;
               }});
  c.push_back({"relu_", one({6}), [](const Inputs& v) {
                 Tensor y = v[0] * 1.0;
                 y.relu_();
                 return y * v[0];
               }});
  c.push_back({"sigmoid_", one({6}), [](const Inputs& v) {
                 Tensor y = v[0] * 1.0;
                 return y.sigmoid_() * 1.0;
               }});
  c.push_back({"tanh_", one({6}), [](const Inputs& v) {
                 Tensor y = v[0] * 2.0;
                 y.tanh_();
                 return y * v[0];
               }});
  c.push_back({"exp_", one({6}), [](const Inputs& v) {
                 Tensor y = v[0] * 0.5;
                 y.exp_();
                 return y;
               }});
  c.push_back({"clamp_ clamp_min_ clamp_max_", one({3, 6}), [](const Inputs& v) {
                 Tensor y = v[0] * 1.0;
                 y.select(0, 0).clamp_(-0.5, 0.5);
                 y.select(0, 1).clamp_min_(0.2);
                 y.select(0, 2).clamp_max_(-0.3);
                 return y * v[0];
               }});
  c.push_back({"masked_fill_ (broadcast mask)", one({3, 4}), [](const Inputs& v) {
                 Tensor mask =
                     tg::tensor<bool>({true, false, false, true}, {4}, TensorOptions(kBool).device(v[0].device()));
                 Tensor y = v[0] * 1.0;
                 y.masked_fill_(mask, 2.0);
                 return y * v[0];
               }});
  c.push_back({"index_add_", two({4, 3}, {3, 3}), [](const Inputs& v) {
                 Tensor index = tg::tensor<int64_t>({0, 2, 0}, TensorOptions(kInt64).device(v[0].device()));
                 Tensor y = v[0] * 1.0;
                 y.index_add_(0, index, v[1], 1.5);
                 return y * y;
               }});
  c.push_back({"copy_ (broadcast source), fill_, zero_", two({3, 4}, {4}), [](const Inputs& v) {
                 Tensor y = v[0] * 1.0;
                 y.copy_(v[1]);
                 Tensor z = v[0] * 2.0;
                 z.fill_(1.5);
                 z.add_(v[1]);
                 Tensor u = v[0] * 3.0;
                 u.zero_();
                 return y * v[0] + z * v[0] + u;
               }});
  c.push_back({"a chain of in-place ops", two({3, 4}, {3, 4}), [](const Inputs& v) {
                 Tensor y = v[0] * 1.0;
                 y.add_(v[1]).mul_(v[1]).sub_(0.5).div_(v[1] * v[1] + 1.0).tanh_();
                 return y;
               }});
  c.push_back({"mul_ on a slice of a non-leaf", [](Device d) { return Inputs{N({3, 4}, d), N({3, 2}, d)}; },
               [](const Inputs& v) {
                 Tensor y = v[0] * 1.0;
                 y.slice(1, 1, 3).mul_(v[1]);
                 return y * v[0];
               }});
  c.push_back({"copy_ into a select of a non-leaf", two({3, 4}, {4}), [](const Inputs& v) {
                 Tensor y = v[0] * 1.0;
                 y.select(0, 1).copy_(v[1] * 2.0);
                 return y * y;
               }});
  c.push_back({"views of views, transposed views", two({3, 4}, {2}), [](const Inputs& v) {
                 Tensor y = v[0] * 1.0;
                 y.slice(0, 0, 2).select(1, 1).add_(v[1]);
                 y.t().slice(0, 0, 2).mul_(v[1].unsqueeze(1));  // columns 0 and 1, by a [2, 1] operand
                 y.t().select(0, 3).sigmoid_();  // last: it saves its result (the storage's version)
                 return y * y;
               }});
  c.push_back({"masked_fill_, index_add_, exp_, relu_ on views", two({4, 3}, {2, 4}), [](const Inputs& v) {
                 Tensor mask = tg::tensor<bool>({false, true, true}, {3}, TensorOptions(kBool).device(v[0].device()));
                 Tensor index = tg::tensor<int64_t>({1, 1}, TensorOptions(kInt64).device(v[0].device()));
                 Tensor y = v[0] * 1.0;
                 y.slice(0, 1, 3).masked_fill_(mask, 0.5);
                 y.t().index_add_(0, index, v[1], -2.0);  // row 1 of y.t(): column 1 of y
                 y.select(1, 2).exp_();
                 return y * v[0];
               }});
  c.push_back({"a view taken before its base changed in place", two({3, 4}, {3, 4}), [](const Inputs& v) {
                 Tensor y = v[0] * 1.0;
                 Tensor row = y.select(0, 2);
                 y.mul_(v[1]);
                 return row * 1.0;
               }});
  c.push_back({"slices of a plain tensor written from the graph", one({4}), [](const Inputs& v) {
                 Tensor a = tg::zeros({2, 4}, f64(v[0].device()));
                 a.select(0, 1).copy_(v[0]);
                 a.select(0, 0).add_(v[0] * v[0]);
                 return a * 1.0;
               }});
  return c;
}

TEST_P(InPlace, GradcheckEveryForm) {
  TG_SKIP_WITHOUT_CUDA(dev());
  tg::manual_seed(7);
  for (const Case& k : cases()) {
    Inputs in = k.inputs(device());
    try {
      autograd::GradcheckReport r = autograd::gradcheck(k.fn, in);
      EXPECT_TRUE(r) << k.name << ": " << r;
    } catch (const tg::Error& e) {
      ADD_FAILURE() << k.name << ": " << e.what();
    }
  }
}

// ---------------------------------------------------------------- views of non-leaves, by hand
TEST(InPlaceViews, SliceMulOnNonLeafRewritesTheBase) {
  Tensor x = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor w = vals({1, 1, 1, 2, 2, 2}, {2, 3});
  Tensor y = x * 2;
  y.slice(1, 1, 3).mul_(3.0);
  EXPECT_EQ(std::string(y.grad_fn()->name()), "CopySlices");
  expect_near_vec(host(y), {2, 12, 18, 8, 30, 36}, 1e-12, 0, "y");
  (y * w).sum().backward();
  expect_near_vec(host(x.grad()), {2, 6, 6, 4, 12, 12}, 1e-12, 0, "x.grad");
}

TEST_P(InPlace, CopyIntoSelectGivesTheSourceItsGradient) {
  TG_SKIP_WITHOUT_CUDA(dev());
  Tensor x = leaf({1, 2, 3, 4, 5, 6}, {3, 2}, device());
  Tensor z = leaf({-7, 8}, {2}, device());
  Tensor w = vals({1, 2, 3, 4, 5, 6}, {3, 2}, device());
  Tensor y = x * 2;
  y.select(0, 1).copy_(z);
  expect_near_vec(host(y), {2, 4, -7, 8, 10, 12}, 1e-12, 0, "y");
  (y * w).sum().backward();
  expect_near_vec(host(x.grad()), {2, 4, 0, 0, 10, 12}, 1e-12, 0, "x.grad (the overwritten row gets none)");
  expect_near_vec(host(z.grad()), {3, 4}, 1e-12, 0, "z.grad");
  // A float32 source on another layout: its gradient comes back in float32.
  Tensor x2 = leaf({1, 2, 3, 4}, {2, 2}, device());
  Tensor z32 = tg::tensor<float>({5, 6}, {2}, TensorOptions(kFloat32).device(device()));
  z32.requires_grad_();
  Tensor y2 = x2 * 1.0;
  y2.t().select(0, 0).copy_(z32);  // column 0
  (y2 * vals({1, 2, 3, 4}, {2, 2}, device())).sum().backward();
  EXPECT_EQ(z32.grad().dtype(), kFloat32);
  expect_near_vec(host(z32.grad()), {1, 3}, 0, 0, "z32.grad");
  expect_near_vec(host(x2.grad()), {0, 2, 0, 4}, 0, 0, "x2.grad");
}

TEST(InPlaceViews, ViewHistoryFollowsInPlaceChanges) {
  // In place on the view itself: the view's history is its region of the base's new one.
  Tensor x = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor y = x * 2;
  Tensor v = y.select(0, 1);
  v.mul_(3.0);
  EXPECT_EQ(std::string(v.grad_fn()->name()), "as_strided");
  v.sum().backward();
  expect_near_vec(host(x.grad()), {0, 0, 0, 6, 6, 6}, 1e-12, 0, "x.grad through the view");

  // A view taken before its base changed in place sees the change.
  Tensor x2 = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor y2 = x2 * 2;
  Tensor v2 = y2.select(0, 0);
  EXPECT_EQ(std::string(v2.grad_fn()->name()), "select");
  y2.mul_(5.0);
  EXPECT_EQ(std::string(v2.grad_fn()->name()), "as_strided");
  v2.sum().backward();
  expect_near_vec(host(x2.grad()), {10, 10, 10, 0, 0, 0}, 1e-12, 0, "x2.grad through a stale view");

  // A sibling view changed in place.
  Tensor x3 = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor y3 = x3 * 2;
  Tensor a = y3.select(0, 0), b = y3.select(0, 1);
  b.mul_(4.0);
  (a.sum() + b.sum() + y3.sum()).backward();
  expect_near_vec(host(x3.grad()), {4, 4, 4, 16, 16, 16}, 1e-12, 0, "x3.grad");
}

TEST(InPlaceViews, PlainTensorTakesHistoryFromTheOperand) {
  Tensor w = leaf({1, 2, 3}, {3});
  Tensor a = tg::zeros({3}, f64());
  a.add_(w);
  EXPECT_TRUE(a.requires_grad());
  EXPECT_FALSE(a.is_leaf());
  (a * a).sum().backward();
  expect_near_vec(host(w.grad()), {2, 4, 6}, 1e-12, 0, "w.grad");

  // Written through a view: the plain base takes the history (CopySlices).
  Tensor w2 = leaf({1, 2, 3}, {3});
  Tensor b = tg::zeros({2, 3}, f64());
  Tensor row = b.select(0, 1);  // taken before b took part in autograd
  b.select(0, 1).copy_(w2);
  EXPECT_EQ(std::string(b.grad_fn()->name()), "CopySlices");
  EXPECT_TRUE(row.requires_grad());
  (b * vals({1, 2, 3, 4, 5, 6}, {2, 3})).sum().backward();
  expect_near_vec(host(w2.grad()), {4, 5, 6}, 1e-12, 0, "w2.grad");
}

TEST(InPlaceViews, IndexAddAndMaskedFillByHand) {
  Tensor x = leaf({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor src = leaf({1, 1, 2, 2, 3, 3}, {3, 2});
  Tensor w = vals({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor y = x * 1.0;
  y.index_add_(0, tg::tensor<int64_t>({0, 2, 0}, TensorOptions(kInt64)), src, 2.0);
  expect_near_vec(host(y), {1 + 2 + 6, 2 + 2 + 6, 3, 4, 5 + 4, 6 + 4}, 1e-12, 0, "y");
  (y * w).sum().backward();
  expect_near_vec(host(x.grad()), {1, 2, 3, 4, 5, 6}, 1e-12, 0, "x.grad");
  expect_near_vec(host(src.grad()), {2, 4, 10, 12, 2, 4}, 1e-12, 0, "src.grad = 2 w[index]");

  Tensor x2 = leaf({1, 2, 3}, {3});
  Tensor y2 = x2 * 3.0;
  y2.masked_fill_(tg::tensor<bool>({false, true, false}, {3}, TensorOptions(kBool)), 7.0);
  expect_near_vec(host(y2), {3, 7, 9}, 0, 0, "y2");
  y2.sum().backward();
  expect_near_vec(host(x2.grad()), {3, 0, 3}, 0, 0, "x2.grad");
  std::string msg = error_of([&] { (x2 * 1.0).masked_fill_(tg::ones({2, 3}, TensorOptions(kBool)), 1.0); });
  expect_has(msg, "masked_fill_");
}

// ---------------------------------------------------------------- saved tensors and versions
TEST(InPlaceVersions, ModifiedSavedTensorNamesTheOpAndVersions) {
  Tensor x = leaf({0.1, -0.4, 0.9}, {3});
  // sigmoid saved its output (version 0); mul_ changed it.
  Tensor y = x.sigmoid();
  y.mul_(2.0);
  std::string msg = error_of([&] { y.sum().backward(); });
  expect_has(msg, "sigmoid");
  expect_has(msg, "modified in place");
  expect_has(msg, "version 1, expected 0");
  // relu_ saved its result after its own bump (version 1); add_ made it 2.
  Tensor y2 = x * 2;
  y2.relu_();
  y2.add_(1.0);
  msg = error_of([&] { y2.sum().backward(); });
  expect_has(msg, "relu_");
  expect_has(msg, "version 2, expected 1");
  // exp's saved output changed through a view (recorded on the base).
  Tensor y3 = x.exp();
  y3.select(0, 0).mul_(2.0);
  msg = error_of([&] { y3.sum().backward(); });
  expect_has(msg, "exp");
  expect_has(msg, "version 1, expected 0");
  // An operand the in-place op saved, changed afterwards.
  Tensor y4 = x * 2;
  Tensor o = x * 3;
  y4.mul_(o);
  o.add_(1.0);
  msg = error_of([&] { y4.sum().backward(); });
  expect_has(msg, "mul_");
  expect_has(msg, "version 1, expected 0");
  // Unchanged: passes.
  Tensor y5 = x.sigmoid() * 1.0;
  y5.mul_(2.0);
  EXPECT_NO_THROW(y5.sum().backward());
}

TEST(InPlaceVersions, ViewsShareTheVersionCounter) {
  Tensor y = tg::zeros({2, 3}, f64());
  Tensor v = y.slice(1, 0, 2);
  Tensor s = y.select(0, 1);
  Tensor d = y.detach();
  const uint32_t v0 = y.version();
  EXPECT_EQ(v.version(), v0);
  v.add_(1.0);
  EXPECT_EQ(y.version(), v0 + 1);
  EXPECT_EQ(s.version(), v0 + 1);
  y.mul_(2.0);
  EXPECT_EQ(v.version(), v0 + 2);
  d.fill_(0.0);
  EXPECT_EQ(s.version(), v0 + 3);
  // One recorded in-place op on a view bumps once.
  Tensor x = leaf({1, 2, 3, 4}, {2, 2});
  Tensor g = x * 2;
  const uint32_t g0 = g.version();
  g.select(0, 0).mul_(2.0);
  EXPECT_EQ(g.version(), g0 + 1);
  EXPECT_EQ(g.select(1, 1).version(), g0 + 1);
}

// ---------------------------------------------------------------- what PyTorch refuses
TEST(InPlaceErrors, LeafAndViewsOfLeaves) {
  Tensor x = leaf({1, 2, 3}, {3});
  std::string msg = error_of([&] { x.add_(1.0); });
  expect_has(msg, "a leaf Variable that requires grad is being used in an in-place operation");
  expect_has(msg, "add_");
  expect_has(msg, "[3]");
  expect_has(error_of([&] { x.relu_(); }), "relu_: a leaf Variable that requires grad");
  expect_has(error_of([&] { x.copy_(vals({0, 0, 0}, {3})); }), "copy_: a leaf Variable");
  msg = error_of([&] { x.select(0, 1).mul_(2.0); });
  expect_has(msg, "a view of a leaf Variable that requires grad is being used in an in-place operation");
  expect_has(msg, "mul_");
  EXPECT_EQ(x.version(), 0u);  // refused before writing
  expect_near_vec(host(x), {1, 2, 3}, 0, 0, "x unchanged");

  // Under NoGradGuard the same updates are plain writes (optimizers).
  {
    tg::NoGradGuard g;
    x.add_(1.0);
    x.select(0, 1).mul_(2.0);
  }
  EXPECT_TRUE(x.is_leaf());
  EXPECT_EQ(x.grad_fn(), nullptr);
  EXPECT_EQ(x.version(), 2u);
  expect_near_vec(host(x), {2, 6, 4}, 0, 0, "x after no-grad updates");
}

TEST(InPlaceErrors, NoGradViewsAndOverlappingMemory) {
  Tensor x = leaf({1, 2, 3, 4}, {2, 2});
  Tensor w = leaf({5, 6}, {2});
  Tensor y = x * 2;
  Tensor v;
  {
    tg::NoGradGuard g;
    v = y.select(0, 0);
  }
  std::string msg = error_of([&] { v.mul_(w); });
  expect_has(msg, "created in no_grad mode");
  expect_has(msg, "mul_");
  // Writing an expanded view would write one element several times.
  Tensor e = (x.select(0, 0) * 1.0).unsqueeze(0).expand({3, 2});
  msg = error_of([&] { e.mul_(2.0); });
  expect_has(msg, "more than one element of the written-to tensor");
  // An integer tensor cannot take a floating result in place.
  expect_has(error_of([&] { tg::arange(3).sigmoid_(); }), "int64");
}

TEST(InPlaceGraph, NoGradFastPathLeavesTheGraphAlone) {
  Tensor x = leaf({1, 2, 3, 4}, {2, 2});
  Tensor y = x * 2;
  auto fn = y.grad_fn();
  const uint32_t v0 = y.version();
  {
    tg::NoGradGuard g;
    y.add_(1.0);
    y.select(0, 0).mul_(3.0);
    y.relu_();
  }
  EXPECT_EQ(y.grad_fn().get(), fn.get());
  EXPECT_EQ(y.version(), v0 + 3);
  y.sum().backward();  // mul saved nothing of y: the old history still runs
  expect_near_vec(host(x.grad()), {2, 2, 2, 2}, 0, 0, "x.grad");
}

TEST(InPlaceGraph, CopySlicesWithRetainGraphAndWithout) {
  Tensor x = leaf({1, 2, 3, 4}, {2, 2});
  Tensor w = leaf({3, -1}, {2});
  Tensor y = x * 2;
  y.select(0, 1).mul_(w);
  Tensor loss = (y * y).sum();
  loss.backward({}, {.retain_graph = true});
  loss.backward();
  // y = [[2, 4], [6 * 3, 8 * -1]]; dloss/dy = 2y; twice.
  expect_near_vec(host(x.grad()), {2 * 8, 2 * 16, 2 * 216, 2 * 32}, 1e-12, 0, "x.grad");
  expect_near_vec(host(w.grad()), {2 * 216, 2 * -128}, 1e-12, 0, "w.grad (2 y old_y)");
  expect_has(error_of([&] { loss.backward(); }), "backward through the graph a second time");
}

TEST(InPlaceGraph, RetainGradFollowsTheTensor) {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor w = vals({1, -2, 4}, {3});
  Tensor y = x * 2;
  y.retain_grad();
  y.mul_(3.0);
  (y * w).sum().backward();
  expect_near_vec(host(y.grad()), {1, -2, 4}, 0, 0, "y.grad (of its final value)");
  expect_near_vec(host(x.grad()), {6, -12, 24}, 0, 0, "x.grad");
}

INSTANTIATE_TEST_SUITE_P(Devices, InPlace, ::testing::Values(Dev::CPU, Dev::CUDA), dev_name);

}  // namespace
}  // namespace tg::testing
