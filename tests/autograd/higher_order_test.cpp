// Higher-order gradients (create_graph): Hessian-vector products and gradient penalties against
// finite differences of first gradients, second and third derivatives of closed forms,
// autograd::grad's options, hooks under create_graph, gradgradcheck over the ops that support
// double backward, and the tg::Error of an op that does not.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <tapegrad/autograd/checkpoint.h>
#include <tapegrad/autograd/custom_function.h>
#include <tapegrad/autograd/function.h>

#include "tests/autograd/common.h"
#include "tests/common/error_of.h"

namespace tg::testing {
namespace {

using autograd::GradOptions;
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

TensorOptions f64(Device dev = Device(kCPU)) { return TensorOptions().dtype(kFloat64).device(dev); }

Tensor leaf(const std::vector<double>& v, Shape shape, Device dev = Device(kCPU)) {
  Tensor t = tg::tensor<double>(v, f64(dev)).reshape(shape).clone();
  t.requires_grad_();
  return t;
}

// Deterministic float64 values in [lo, hi).
std::vector<double> values(int64_t n, double lo, double hi, uint64_t seed) {
  std::vector<double> v(static_cast<size_t>(n));
  uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (double& e : v) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    e = lo + (hi - lo) * static_cast<double>(s >> 11) / 9007199254740992.0;
  }
  return v;
}

Tensor rand_leaf(Shape shape, double lo, double hi, uint64_t seed, Device dev = Device(kCPU)) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return leaf(values(n, lo, hi, seed), shape, dev);
}

// The gradient of loss(w) into each of w (computed by the caller: `ana`) against central finite
// differences of loss, element by element.
void expect_matches_finite_differences(const std::vector<Tensor>& w, const std::vector<Tensor>& ana,
                                       const std::function<Tensor(const std::vector<Tensor>&)>& loss) {
  const double e = 1e-6;
  for (size_t k = 0; k < w.size(); ++k) {
    std::vector<double> num;
    for (int64_t j = 0; j < w[k].numel(); ++j) {
      auto at = [&](double s) {
        std::vector<Tensor> q;
        for (size_t i = 0; i < w.size(); ++i) {
          std::vector<double> hv = host(w[i]);
          if (i == k) hv[static_cast<size_t>(j)] += s;
          q.push_back(leaf(hv, w[i].sizes()));
        }
        return loss(q).item<double>();
      };
      num.push_back((at(e) - at(-e)) / (2 * e));
    }
    expect_near_vec(host(ana[k]), num, 1e-7, 1e-5, "d loss / d w" + std::to_string(k));
  }
}

// ---- closed forms
struct ClosedForm {
  const char* name;
  std::function<Tensor(const Tensor&)> f;
  std::function<double(double)> d2;
};

TEST(HigherOrder, SecondDerivativesOfClosedForms) {
  auto sig = [](double x) { return 1 / (1 + std::exp(-x)); };
  const std::vector<ClosedForm> cases = {
      {"x^3", [](const Tensor& x) { return x.pow(3); }, [](double x) { return 6 * x; }},
      {"x*x*x", [](const Tensor& x) { return x * x * x; }, [](double x) { return 6 * x; }},
      {"sin", [](const Tensor& x) { return tg::sin(x); }, [](double x) { return -std::sin(x); }},
      {"cos", [](const Tensor& x) { return tg::cos(x); }, [](double x) { return -std::cos(x); }},
      {"exp", [](const Tensor& x) { return x.exp(); }, [](double x) { return std::exp(x); }},
      {"tanh", [](const Tensor& x) { return x.tanh(); },
       [](double x) { const double t = std::tanh(x); return -2 * t * (1 - t * t); }},
      {"sigmoid", [](const Tensor& x) { return x.sigmoid(); },
       [&](double x) { const double s = sig(x); return s * (1 - s) * (1 - 2 * s); }},
      {"log", [](const Tensor& x) { return (x.abs() + 0.5).log(); },
       [](double x) { return -1 / ((std::abs(x) + 0.5) * (std::abs(x) + 0.5)); }},
      {"sqrt", [](const Tensor& x) { return (x * x + 1.0).sqrt(); },
       [](double x) { return std::pow(x * x + 1, -1.5); }},
      {"1/x", [](const Tensor& x) { return 1.0 / (x * x + 1.0); },
       [](double x) { const double u = x * x + 1; return (6 * x * x - 2) / (u * u * u); }},
  };
  const std::vector<double> xv = {-1.7, -0.6, 0.3, 1.1, 2.2};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor x = leaf(xv, {5});
    Tensor y = c.f(x).sum();
    auto g = tg::autograd::grad({y}, {x}, GradOptions{.create_graph = true});
    ASSERT_TRUE(g[0].requires_grad()) << "the first gradient has a history";
    auto g2 = tg::autograd::grad({g[0].sum()}, {x});
    std::vector<double> want;
    for (double v : xv) want.push_back(c.d2(v));
    expect_near_vec(host(g2[0]), want, 1e-12, 1e-10, c.name);
  }
}

TEST(HigherOrder, ThirdDerivativeOfXToTheFourth) {
  const std::vector<double> xv = {-1.5, 0.5, 2.0};
  for (bool via_pow : {true, false}) {
    Tensor x = leaf(xv, {3});
    Tensor y = (via_pow ? x.pow(4) : x * x * x * x).sum();
    auto g1 = tg::autograd::grad({y}, {x}, GradOptions{.create_graph = true});
    auto g2 = tg::autograd::grad({g1[0].sum()}, {x}, GradOptions{.create_graph = true});
    auto g3 = tg::autograd::grad({g2[0].sum()}, {x});
    std::vector<double> w1, w2, w3;
    for (double v : xv) {
      w1.push_back(4 * v * v * v);
      w2.push_back(12 * v * v);
      w3.push_back(24 * v);
    }
    expect_near_vec(host(g1[0]), w1, 1e-12, 1e-12, "4x^3");
    expect_near_vec(host(g2[0]), w2, 1e-12, 1e-12, "12x^2");
    expect_near_vec(host(g3[0]), w3, 1e-12, 1e-12, "24x");
  }
}

// ---- a small MLP: Hessian-vector product against finite differences of the gradient
struct Mlp {
  Tensor w1, b1, w2, b2;
  std::vector<Tensor> params() const { return {w1, b1, w2, b2}; }
};

Mlp make_mlp(Device dev) {
  return {rand_leaf({5, 3}, -0.8, 0.8, 1, dev), rand_leaf({5}, -0.3, 0.3, 2, dev), rand_leaf({2, 5}, -0.8, 0.8, 3, dev),
          rand_leaf({2}, -0.3, 0.3, 4, dev)};
}

Tensor mlp_loss(const std::vector<Tensor>& p, const Tensor& x, const Tensor& target) {
  Tensor h = tg::linear(x, p[0], p[1]).tanh();
  Tensor h2 = tg::gelu(tg::matmul(h, p[2].t()) + p[3]);
  return tg::nn::functional::mse_loss(h2.softmax(1) * 3.0, target) + (h * h).mean();
}

std::vector<double> flat_host(const std::vector<Tensor>& ts) {
  std::vector<double> out;
  for (const Tensor& t : ts) {
    auto v = host(t);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

void check_hvp(Device dev) {
  Mlp m = make_mlp(dev);
  Tensor x = tg::tensor<double>(values(4 * 3, -1, 1, 5), f64(dev)).reshape({4, 3});
  Tensor target = tg::tensor<double>(values(4 * 2, 0, 1, 6), f64(dev)).reshape({4, 2});
  std::vector<Tensor> p = m.params();
  std::vector<Tensor> v;
  for (size_t i = 0; i < p.size(); ++i) v.push_back(rand_leaf(p[i].sizes(), -1, 1, 10 + i, dev).detach());

  // analytic: H v = d/dp (grad(p) . v)
  Tensor loss = mlp_loss(p, x, target);
  auto g = tg::autograd::grad({loss}, p, GradOptions{.create_graph = true});
  Tensor gv = (g[0] * v[0]).sum();
  for (size_t i = 1; i < p.size(); ++i) gv = gv + (g[i] * v[i]).sum();
  std::vector<double> hv = flat_host(tg::autograd::grad({gv}, p));

  // numeric: (grad(p + e v) - grad(p - e v)) / 2e, first-order gradients only
  const double e = 1e-5;
  auto grad_at = [&](double s) {
    std::vector<Tensor> q;
    for (size_t i = 0; i < p.size(); ++i) {
      Tensor t = (p[i].detach() + v[i] * s).clone();
      t.requires_grad_();
      q.push_back(t);
    }
    return flat_host(tg::autograd::grad({mlp_loss(q, x, target)}, q));
  };
  std::vector<double> plus = grad_at(e), minus = grad_at(-e), num;
  for (size_t i = 0; i < plus.size(); ++i) num.push_back((plus[i] - minus[i]) / (2 * e));
  double norm = 0;
  for (double h : hv) norm += h * h;
  EXPECT_GT(norm, 1e-4) << "a non-trivial Hessian-vector product";
  expect_near_vec(hv, num, 1e-7, 1e-5, "Hessian-vector product");
}

TEST(HigherOrder, HessianVectorProductOfMlpMatchesFiniteDifferences) { check_hvp(Device(kCPU)); }

TEST(HigherOrderCuda, HessianVectorProductOfMlpMatchesFiniteDifferences) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  check_hvp(Device(kCUDA));
}

// Closed form: f(x) = sum((x @ y)^2) has H v = 2 v y y^T (the benchmark graph).
TEST(HigherOrder, HessianVectorProductOfMatmulGraphIsClosedForm) {
  Tensor x = rand_leaf({3, 4}, -1, 1, 21);
  Tensor y = rand_leaf({4, 2}, -1, 1, 22).detach();
  Tensor v = rand_leaf({3, 4}, -1, 1, 23).detach();
  Tensor f = tg::matmul(x, y).pow(2).sum();
  auto g = tg::autograd::grad({f}, {x}, GradOptions{.create_graph = true});
  auto hv = tg::autograd::grad({g[0]}, {x}, GradOptions{.grad_outputs = {v}});
  Tensor want = tg::matmul(tg::matmul(v, y), y.t()) * 2.0;
  expect_near_vec(host(hv[0]), host(want), 1e-12, 1e-12, "2 v y y^T");
}

// ---- gradient penalty (WGAN-GP style): P(w) = mean_i (|d D(x_i) / d x_i|^2 - 1)^2, backpropagated
// into the critic's weights, against finite differences of P.
Tensor critic(const std::vector<Tensor>& w, const Tensor& x) {
  return tg::matmul(tg::linear(x, w[0], w[1]).sigmoid(), w[2]).sum();
}

Tensor penalty(const std::vector<Tensor>& w, const Tensor& x0) {
  Tensor x = x0.detach().clone();
  x.requires_grad_();
  auto gx = tg::autograd::grad({critic(w, x)}, {x}, GradOptions{.create_graph = true});
  Tensor n2 = (gx[0] * gx[0]).sum(1);
  return ((n2.sqrt() - 1.0).pow(2)).mean();
}

TEST(HigherOrder, GradientPenaltyIntoWeightsMatchesFiniteDifferences) {
  std::vector<Tensor> w = {rand_leaf({4, 3}, -1, 1, 31), rand_leaf({4}, -0.5, 0.5, 32), rand_leaf({4}, -1, 1, 33)};
  Tensor x = tg::tensor<double>(values(5 * 3, -1, 1, 34), f64()).reshape({5, 3});
  auto gw = tg::autograd::grad({penalty(w, x)}, w);
  expect_matches_finite_differences(w, gw, [&](const std::vector<Tensor>& q) { return penalty(q, x); });
}

// WGAN-GP style: a critic trained on -mean D(real) + mean D(fake) + 10 * penalty at interpolates with
// SGD; the penalty's gradient reaches the weights through double backward, and the penalty term
// (initially far from 0: |grad| is not near 1) falls.
TEST(HigherOrder, GradientPenaltyTrains) {
  tg::manual_seed(3);
  std::vector<Tensor> w = {rand_leaf({8, 2}, -1.5, 1.5, 41), rand_leaf({8}, -0.5, 0.5, 42), rand_leaf({8}, -1.5, 1.5, 43)};
  tg::optim::SGD opt(w, {.lr = 0.02});
  Tensor real = tg::tensor<double>(values(32 * 2, 0.5, 1.5, 44), f64()).reshape({32, 2});
  Tensor fake = tg::tensor<double>(values(32 * 2, -1.5, -0.5, 45), f64()).reshape({32, 2});
  Tensor mix = tg::tensor<double>(values(32, 0, 1, 46), f64()).reshape({32, 1});
  Tensor inter = real * mix + fake * (1.0 - mix);
  auto term = [&] { return penalty(w, inter).item<double>(); };
  const double first = term();
  for (int step = 0; step < 150; ++step) {
    opt.zero_grad();
    Tensor loss = critic(w, fake) / 32.0 - critic(w, real) / 32.0 + penalty(w, inter) * 10.0;
    loss.backward();
    opt.step();
  }
  const double last = term();
  EXPECT_GT(first, 0.05);
  EXPECT_LT(last, 0.25 * first) << "penalty " << first << " -> " << last;
}

// ---- autograd::grad's options and backward(create_graph)
TEST(HigherOrder, GradOutputsAndDerivativeWithRespectToThem) {
  Tensor x = leaf({1, -2, 3}, {3});
  Tensor v = leaf({0.5, 2, -1}, {3});
  Tensor y = x * x;
  auto g = tg::autograd::grad({y}, {x}, GradOptions{.grad_outputs = {v}, .create_graph = true});
  expect_near_vec(host(g[0]), {1, -8, -6}, 0, 0, "2 x v");
  // d/dv sum(2 x v * x) = 2 x^2; d/dx = 4 x v
  auto h = tg::autograd::grad({(g[0] * x).sum()}, {v, x});
  expect_near_vec(host(h[0]), {2, 8, 18}, 0, 0, "2 x^2");
  expect_near_vec(host(h[1]), {2, -16, -12}, 0, 0, "4 x v");
}

TEST(HigherOrder, AllowUnusedAndItsError) {
  Tensor x = leaf({1, 2}, {2});
  Tensor unused = leaf({3}, {1});
  Tensor y = (x * x).sum();
  std::string e = error_of([&] { tg::autograd::grad({y}, {x, unused}, GradOptions{.retain_graph = true}); });
  EXPECT_NE(e.find("input 1"), std::string::npos) << e;
  EXPECT_NE(e.find("allow_unused"), std::string::npos) << e;
  auto g = tg::autograd::grad({y}, {x, unused}, GradOptions{.create_graph = true, .allow_unused = true});
  expect_near_vec(host(g[0]), {2, 4}, 0, 0, "2x");
  EXPECT_FALSE(g[1].defined());
}

TEST(HigherOrder, RetainGraphDefaultsToCreateGraph) {
  Tensor x = leaf({1.5}, {1});
  Tensor y = x.exp().sum();
  tg::autograd::grad({y}, {x}, GradOptions{.create_graph = true});
  auto again = tg::autograd::grad({y}, {x});  // the graph was kept
  expect_near_vec(host(again[0]), {std::exp(1.5)}, 1e-12, 0, "exp");
  std::string e = error_of([&] { tg::autograd::grad({y}, {x}); });  // that one freed it
  EXPECT_NE(e.find("retain_graph"), std::string::npos) << e;
  // ... and create_graph on a freed graph is the same error
  e = error_of([&] { tg::autograd::grad({y}, {x}, GradOptions{.create_graph = true}); });
  EXPECT_NE(e.find("second time"), std::string::npos) << e;
}

TEST(HigherOrder, BackwardWithCreateGraphGivesDifferentiableGrad) {
  Tensor x = leaf({0.5, -1}, {2});
  Tensor y = (x * x * x).sum();
  y.backward({}, {.create_graph = true});
  Tensor gx = x.grad();
  ASSERT_TRUE(gx.requires_grad());
  expect_near_vec(host(gx), {0.75, 3}, 1e-15, 0, "3x^2");
  x.mutable_grad() = Tensor();
  gx.sum().backward();
  expect_near_vec(host(x.grad()), {3, -6}, 1e-15, 0, "6x");
  // without create_graph nothing is recorded
  Tensor z = (x * x).sum();
  x.mutable_grad() = Tensor();
  z.backward();
  EXPECT_FALSE(x.grad().requires_grad());
}

TEST(HigherOrder, HooksRunUnderCreateGraphAndAreDifferentiated) {
  Tensor x = leaf({1, 2}, {2});
  bool saw_history = false;
  auto handle = x.register_hook([&](const Tensor& g) {
    saw_history = g.requires_grad();
    return g * 2.0;
  });
  Tensor mid = x * x;
  mid.register_hook([](const Tensor& g) { return g * g; });  // mid's gradient 3 becomes 9
  Tensor y = (mid * 3.0).sum();
  auto g = tg::autograd::grad({y}, {x}, GradOptions{.create_graph = true});
  EXPECT_TRUE(saw_history) << "the leaf's hook got the recorded gradient 18 x";
  expect_near_vec(host(g[0]), {36, 72}, 0, 0, "2 * (9 * 2x)");
  auto g2 = tg::autograd::grad({g[0].sum()}, {x}, GradOptions{.retain_graph = true});
  expect_near_vec(host(g2[0]), {72, 72}, 0, 0, "d/dx 36x, hooked again (hooks run in every backward)");
  handle.remove();
  g2 = tg::autograd::grad({g[0].sum()}, {x});
  expect_near_vec(host(g2[0]), {36, 36}, 0, 0, "d/dx 36x");
  // A hook whose own ops act on a gradient with a history: they are recorded and differentiated.
  Tensor m2 = x * x;
  auto h_m2 = m2.register_hook([](const Tensor& gm) { return gm * gm; });
  Tensor y2 = (m2 * m2).sum();  // d y2 / d m2 = 2 x^2, hooked 4 x^4; d/dx = 2 * 4 x^4 * x = 8 x^5
  auto h = tg::autograd::grad({y2}, {x}, GradOptions{.create_graph = true});
  expect_near_vec(host(h[0]), {8, 256}, 1e-12, 1e-12, "8 x^5");
  h_m2.remove();  // else it would also square the second backward's gradient of m2
  auto h2 = tg::autograd::grad({h[0].sum()}, {x});
  expect_near_vec(host(h2[0]), {40, 640}, 1e-12, 1e-12, "40 x^4");
}

TEST(HigherOrder, LeafHookSeesRecordedGradientInBackward) {
  Tensor x = leaf({1, 2}, {2});
  bool saw_history = false;
  x.register_hook([&](const Tensor& g) {
    saw_history = g.requires_grad();
    return g * 2.0;
  });
  (x * x * x).sum().backward({}, {.create_graph = true});
  EXPECT_TRUE(saw_history);
  Tensor gx = x.grad();
  expect_near_vec(host(gx), {6, 24}, 0, 0, "2 * 3x^2");
  auto g2 = tg::autograd::grad({gx.sum()}, {x});
  expect_near_vec(host(g2[0]), {24, 48}, 0, 0, "2 * 12x: the hook runs in the second backward too");
  x.mutable_grad() = Tensor();  // x.grad()'s history holds x: the reference cycle PyTorch documents too
}

// ---- ops without double backward: a tg::Error naming them, only when differentiated twice
// Custom Functions: y = x^2 * w with x saved as an input and y saved as an output (its backward
// reads both), differentiated twice; and the same with once_differentiable, refused at the second.
struct SquareScale : tg::autograd::Function<SquareScale> {
  static Tensor forward(tg::autograd::AutogradContext* ctx, const Tensor& x, const Tensor& w) {
    Tensor y = x * x * w;
    ctx->save_for_backward({x, w, y});
    return y;
  }
  static std::vector<Tensor> backward(tg::autograd::AutogradContext* ctx, std::vector<Tensor> grads) {
    auto s = ctx->saved_tensors();  // dy/dx = 2 y / x, dy/dw = x^2
    return {grads[0] * s[2] * 2.0 / s[0], grads[0] * s[0] * s[0]};
  }
};
struct SquareOnce : tg::autograd::Function<SquareOnce> {
  static constexpr bool once_differentiable = true;
  static Tensor forward(tg::autograd::AutogradContext* ctx, const Tensor& x) {
    ctx->save_for_backward({x});
    return x * x;
  }
  static std::vector<Tensor> backward(tg::autograd::AutogradContext* ctx, std::vector<Tensor> grads) {
    return {grads[0] * ctx->saved_tensors()[0] * 2.0};
  }
};

TEST(HigherOrder, CustomFunctionIsDifferentiatedTwice) {
  Fn fn = [](const std::vector<Tensor>& a) { return SquareScale::apply(a[0] * 1.0, a[1]) * a[0]; };
  Tensor x = tg::tensor<double>({0.7, -1.2, 1.5}, f64()), w = tg::tensor<double>({0.3, 2.0, -0.5}, f64());
  auto r = tg::autograd::gradgradcheck(fn, {x, w});
  EXPECT_TRUE(r.ok) << r;
}

TEST(HigherOrder, OpWithoutDoubleBackwardThrowsNamingIt) {
  // Right at first order under create_graph, refused at second, naming the node.
  Tensor x = leaf({0.3, -0.2, 0.9}, {3});
  auto g = tg::autograd::grad({SquareOnce::apply(x * 1.0).sum()}, {x}, GradOptions{.create_graph = true});
  expect_near_vec(host(g[0]), {0.6, -0.4, 1.8}, 1e-15, 1e-14, "first order is right");
  ASSERT_TRUE(g[0].requires_grad()) << "not silently a constant";
  std::string e = error_of([&] { tg::autograd::grad({g[0].sum()}, {x}); });
  EXPECT_NE(e.find("SquareOnce"), std::string::npos) << e;
  EXPECT_NE(e.find("double backward not implemented"), std::string::npos) << e;
}

// utils::checkpoint under create_graph: the refilled saved tensors (an input's, and tanh's and
// exp's own outputs) get the forward's history back, as a plain SavedTensor's do, nested too.
TEST(HigherOrder, CheckpointedSegmentIsDifferentiatedTwice) {
  Fn seg = [](const std::vector<Tensor>& a) { return tg::tanh(a[0] * a[1]).exp() * a[0]; };
  Fn fn = [&](const std::vector<Tensor>& a) {
    Tensor h = tg::utils::checkpoint(seg, {a[0] * 1.0, a[1]});
    return tg::utils::checkpoint([&](const std::vector<Tensor>& b) { return seg({b[0], b[0]}); }, {h}) * a[1];
  };
  Tensor x = tg::tensor<double>({0.7, -1.2, 1.5}, f64()), w = tg::tensor<double>({0.3, 2.0, -0.5}, f64());
  auto r = tg::autograd::gradgradcheck(fn, {x, w});
  EXPECT_TRUE(r.ok) << r;
}

// In place on views of a graph tensor (CopySlices, and the views' rebuilt as_strided histories):
// y = x^2 with y[0:2] *= x[0:2] and y[2] = x[2]^3 copied in is (x0^3, x1^3, x2^3, x3^2); the
// second derivatives are 6x, 6x, 6x, 2.
TEST(HigherOrder, InPlaceOnViewsHasExactSecondDerivative) {
  Tensor x = leaf({0.3, -0.2, 0.9, 0.5}, {4});
  Tensor y = x * x;
  y.slice(0, 0, 2).mul_(x.slice(0, 0, 2));
  y.select(0, 2).copy_(x.select(0, 2).pow(3));
  Tensor v = y.slice(0, 1, 4);  // a view whose history is rebuilt after the writes
  auto g = tg::autograd::grad({(y.sum() + v.sum())}, {x}, GradOptions{.create_graph = true});
  expect_near_vec(host(g[0]), {3 * 0.09, 2 * 3 * 0.04, 2 * 3 * 0.81, 2 * 2 * 0.5}, 1e-15, 1e-14, "first order");
  auto h = tg::autograd::grad({g[0].sum()}, {x});
  expect_near_vec(host(h[0]), {6 * 0.3, 2 * 6 * -0.2, 2 * 6 * 0.9, 2 * 2}, 1e-14, 1e-14, "second order");
}

// In-place ops that read self's old value (mul_ / div_ by a tensor, clamp_) save a copy that keeps
// self's old history, so the second derivative reaches what self was computed from:
// y = (x^2) *= x is x^3, whose second derivative is 6x (a constant copy would give 2 * 2x = 4x).
TEST(HigherOrder, InPlaceOnOldValueHasExactSecondDerivative) {
  Tensor x = leaf({0.3, -0.2, 0.9}, {3});
  Tensor y = x * x;
  y.mul_(x);
  auto g = tg::autograd::grad({y.sum()}, {x}, GradOptions{.create_graph = true});
  expect_near_vec(host(g[0]), {3 * 0.09, 3 * 0.04, 3 * 0.81}, 1e-15, 1e-14, "3x^2");
  auto h = tg::autograd::grad({g[0].sum()}, {x});
  expect_near_vec(host(h[0]), {6 * 0.3, 6 * -0.2, 6 * 0.9}, 1e-15, 1e-14, "6x");
}

// padding_idx (which gradcheck cannot check: the row's value counts, its gradient is 0 by rule)
// holds in every order: y = sum(emb^2) has dy/dw_r = 2 count_r w_r off the padding row.
TEST(HigherOrder, EmbeddingPaddingRowGetsNoGradientInAnyOrder) {
  Tensor w = leaf({1, -2, 3, 0.5, 4, 5}, {3, 2});
  Tensor idx = tg::tensor<int64_t>({0, 2, 2, 1}, kInt64);
  Tensor y = tg::nn::functional::embedding(idx, w, {.padding_idx = 2}).pow(2).sum();
  auto g = tg::autograd::grad({y}, {w}, GradOptions{.create_graph = true});
  expect_near_vec(host(g[0]), {2, -4, 6, 1, 0, 0}, 0, 0, "2 w_r, padding row 0");
  auto h = tg::autograd::grad({g[0].sum()}, {w});
  expect_near_vec(host(h[0]), {2, 2, 2, 2, 0, 0}, 0, 0, "2, padding row 0");
}

// ---- gradgradcheck over the ops that support double backward
struct OpCase {
  const char* name;
  std::vector<Shape> shapes;
  Fn fn;
  double lo = -1, hi = 1;
};

// The device the cases' own constant tensors (indices, masks, weights) are made on: the cases run
// on the CPU and, in HigherOrderCuda, on the GPU.
Device g_case_device = Device(kCPU);
Tensor ids(std::vector<int64_t> v) { return tg::tensor<int64_t>(v, kInt64).to(g_case_device); }

// The convolutions (nn/conv.cpp's recorded backward): strides, padding (ints and "same", odd and
// even totals), dilation, groups, bias, output_padding (also one >= stride, below the dilation),
// 1-d, unbatched and channels-last inputs.
std::vector<OpCase> conv_cases() {
  namespace F = tg::nn::functional;
  return {
      {"conv1d stride 2, padding 1, groups 2, bias", {{2, 4, 8}, {4, 2, 3}, {4}},
       [](auto& a) { return F::conv1d(a[0], a[1], a[2], {.stride = 2, .padding = 1, .groups = 2}).pow(2); }},
      {"conv1d padding same (odd total), unbatched", {{2, 6}, {3, 2, 4}},
       [](auto& a) { return F::conv1d(a[0], a[1], Tensor(), {.padding = "same"}).pow(2); }},
      {"conv2d stride 2, padding 1, dilation 2, groups 2, bias", {{2, 4, 6, 5}, {4, 2, 2, 3}, {4}},
       [](auto& a) {
         return F::conv2d(a[0], a[1], a[2], {.stride = 2, .padding = 1, .dilation = 2, .groups = 2}).pow(2);
       }},
      {"conv2d padding same, dilation {1, 2}", {{2, 2, 5, 5}, {3, 2, 2, 3}},
       [](auto& a) { return F::conv2d(a[0], a[1], Tensor(), {.padding = "same", .dilation = {1, 2}}).pow(2); }},
      {"conv2d unbatched, asymmetric stride / padding", {{2, 5, 6}, {2, 2, 3, 2}, {2}},
       [](auto& a) {
         return F::conv2d(a[0], a[1], a[2], {.stride = {2, 1}, .padding = {0, 1}}).tanh();
       }},
      {"conv2d channels last", {{2, 2, 4, 4}, {2, 2, 3, 3}},
       [](auto& a) {
         return F::conv2d(a[0].contiguous(MemoryFormat::ChannelsLast), a[1], Tensor(), {.padding = 1}).pow(2);
       }},
      {"conv_transpose1d stride 2, padding 1, output_padding 1, bias", {{2, 2, 4}, {2, 3, 3}, {3}},
       [](auto& a) {
         return F::conv_transpose1d(a[0], a[1], a[2], {.stride = 2, .padding = 1, .output_padding = 1}).pow(2);
       }},
      {"conv_transpose1d output_padding >= stride (dilation 3), unbatched", {{2, 4}, {2, 2, 2}},
       [](auto& a) {
         return F::conv_transpose1d(a[0], a[1], Tensor(), {.output_padding = 2, .dilation = 3}).pow(2);
       }},
      {"conv_transpose2d stride 2, padding 1, output_padding 1, groups 2, bias", {{2, 4, 3, 3}, {4, 1, 3, 3}, {2}},
       [](auto& a) {
         return F::conv_transpose2d(a[0], a[1], a[2],
                                    {.stride = 2, .padding = 1, .output_padding = 1, .groups = 2})
             .pow(2);
       }},
      {"conv_transpose2d dilation 2, asymmetric stride, groups 2", {{1, 2, 3, 2}, {2, 2, 2, 2}},
       [](auto& a) {
         return F::conv_transpose2d(a[0], a[1], Tensor(), {.stride = {1, 2}, .groups = 2, .dilation = 2}).tanh();
       }},
  };
}

std::vector<OpCase> op_cases() {
  namespace F = tg::nn::functional;
  std::vector<OpCase> cases = {
      {"add", {{3, 1}, {1, 4}}, [](auto& a) { return tg::add(a[0], a[1], 0.5) * a[0]; }},
      {"sub", {{3, 4}, {4}}, [](auto& a) { return tg::sub(a[0], a[1], 2.0) * a[1]; }},
      {"mul", {{3, 4}, {3, 4}}, [](auto& a) { return a[0] * a[1] * a[0]; }},
      {"div", {{2, 3}, {2, 3}}, [](auto& a) { return a[0] / (a[1] * a[1] + 0.5); }},
      {"scalar ops", {{5}}, [](auto& a) { return (3.0 - (a[0] * 2.0 + 1.0) / 4.0) * (2.0 / (a[0] * a[0] + 1.0)); }},
      {"neg", {{4}}, [](auto& a) { return -(a[0] * a[0]); }},
      {"pow scalar", {{4}}, [](auto& a) { return a[0].pow(3.5); }, 0.5, 2},
      {"pow tensor", {{4}, {4}}, [](auto& a) { return a[0].pow(a[1]); }, 0.5, 2},
      {"exp", {{4}}, [](auto& a) { return a[0].exp(); }},
      {"log", {{4}}, [](auto& a) { return a[0].log(); }, 0.5, 2},
      {"sqrt", {{4}}, [](auto& a) { return a[0].sqrt(); }, 0.5, 2},
      {"rsqrt", {{4}}, [](auto& a) { return a[0].rsqrt(); }, 0.5, 2},
      {"tanh", {{4}}, [](auto& a) { return a[0].tanh(); }},
      {"sigmoid", {{4}}, [](auto& a) { return a[0].sigmoid(); }},
      {"relu", {{6}}, [](auto& a) { return a[0].relu() * a[0]; }},
      {"abs, clamp, leaky_relu", {{6}},
       [](auto& a) { return a[0].abs() * a[0] + a[0].clamp(-0.5, 0.5) * a[0] + tg::leaky_relu(a[0], 0.1) * a[0]; }},
      {"gelu", {{5}}, [](auto& a) { return a[0].gelu(); }, -2, 2},
      {"silu", {{5}}, [](auto& a) { return tg::silu(a[0]); }, -2, 2},
      {"softplus, elu", {{5}}, [](auto& a) { return tg::softplus(a[0], 2.0) + tg::elu(a[0], 0.7); }, -2, 2},
      {"sin", {{4}}, [](auto& a) { return tg::sin(a[0]); }},
      {"cos", {{4}}, [](auto& a) { return tg::cos(a[0]); }},
      {"where", {{4}, {4}}, [](auto& a) { return tg::where(a[0].gt(Scalar(0.0)), a[0] * a[1], a[1] * a[1]); }},
      {"matmul 2d", {{2, 3}, {3, 4}}, [](auto& a) { return tg::matmul(a[0], a[1]); }},
      {"matmul batched + broadcast", {{2, 2, 3}, {3, 2}}, [](auto& a) { return tg::matmul(a[0], a[1]).pow(2); }},
      {"matmul vec", {{3}, {3, 2}}, [](auto& a) { return tg::matmul(a[0], a[1]) * tg::matmul(a[1].t(), a[0]); }},
      {"dot", {{3}, {3}}, [](auto& a) { return tg::matmul(a[0], a[1]) * a[0]; }},
      {"linear", {{2, 3}, {4, 3}, {4}}, [](auto& a) { return tg::linear(a[0], a[1], a[2]).pow(2); }},
      {"linear 3d", {{2, 2, 3}, {4, 3}, {4}}, [](auto& a) { return tg::linear(a[0], a[1], a[2]).tanh(); }},
      {"sum, mean", {{3, 4}}, [](auto& a) { return a[0].sum(DimList{1}).pow(2) + (a[0] * a[0]).mean(DimList{0}, true).sum(); }},
      {"reshape, view, transpose, permute", {{2, 3, 2}},
       [](auto& a) { return (a[0].reshape({3, 4}).t() * a[0].view({4, 3})).permute({1, 0}).unsqueeze(0).squeeze(0).pow(2); }},
      {"expand", {{3, 1}}, [](auto& a) { return a[0].expand({3, 4}) * a[0].expand({3, 4}).pow(2); }},
      {"slice, select, narrow", {{4, 5}},
       [](auto& a) { return a[0].slice(1, 1, 5, 2).pow(2).sum() * a[0].select(0, 2) + a[0].narrow(0, 1, 2).sum(); }},
      {"index_select", {{4, 3}},
       [](auto& a) { return a[0].index_select(0, ids({3, 0, 3})).pow(3); }},
      {"cat", {{2, 3}, {1, 3}}, [](auto& a) { return tg::cat({a[0] * a[1], a[1].pow(2)}, 0).pow(2); }},
      {"to, clone, contiguous", {{3, 2}},
       [](auto& a) { return (a[0].to(kFloat64) * a[0].clone()).t().contiguous().pow(2); }},
      {"var, std", {{3, 4}}, [](auto& a) { return a[0].var(DimList{1}).pow(2) + (a[0] * a[0]).std(DimList{1}); }},
      {"amax, amin, maximum, minimum", {{3, 4}, {3, 4}},
       [](auto& a) {
         return (a[0] * a[0]).max(DimList{1}) * a[0].min(DimList{1}) +
                (tg::maximum(a[0], a[1]) * tg::minimum(a[0], a[1] * a[0])).sum(DimList{1});
       }},
      {"masked_fill, tril, triu", {{3, 3}},
       [](auto& a) {
         Tensor m = ids({1, 0, 0, 0, 1, 0, 1, 0, 0}).eq(Scalar(1)).reshape({3, 3});
         return a[0].masked_fill(m, 2.0) * a[0] + a[0].tril().pow(2) + a[0].triu(1) * a[0];
       }},
      {"stack", {{2, 3}, {2, 3}}, [](auto& a) { return tg::stack({a[0] * a[1], a[1]}, 1).pow(2); }},
      {"gather, scatter, scatter_add", {{3, 4}, {3, 2}},
       [](auto& a) {
         Tensor idx = ids({0, 2, 3, 1, 2, 2}).reshape({3, 2});
         Tensor sidx = ids({0, 2, 3, 1, 2, 0}).reshape({3, 2});
         return a[0].gather(1, idx).pow(2).sum(DimList{1}) + (a[0].scatter(1, sidx, a[1] * a[1]) * a[0]).sum(DimList{1}) +
                (a[0].scatter(1, sidx, Scalar(1.0)) * a[0]).sum(DimList{1}) +
                a[0].scatter_add(1, idx, a[1] * a[0].slice(1, 0, 2)).pow(2).sum(DimList{1});
       }},
      {"index_add", {{4, 2}, {3, 2}},
       [](auto& a) {
         return a[0].index_add(0, ids({3, 0, 3}), a[1] * a[1], 0.5).pow(2);
       }},
      {"embedding (padding_idx of an unused row: gradcheck cannot see the rule)", {{5, 3}},
       [](auto& a) {
         Tensor idx = ids({0, 2, 4, 2, 1, 4}).reshape({2, 3});
         return F::embedding(idx, a[0] * a[0], {.padding_idx = 3}).pow(2) * F::embedding(idx, a[0]);
       }},
      {"in place: add_, sub_, mul_ / div_ by scalars, tanh_, sigmoid_, exp_, relu_, copy_", {{5}},
       [](auto& a) {
         Tensor y = a[0] * 1.0;  // ops that save their result come last on each tensor (as PyTorch requires)
         y.add_(a[0] * a[0], 0.5);
         y.sub_(a[0], 2.0);
         y.mul_(3.0);
         y.div_(2.0);
         y.add_(1.0);
         y.sub_(0.5);
         y.tanh_();
         Tensor w = y * 1.0;
         w.sigmoid_();
         Tensor u = w * 1.0;
         u.exp_();
         Tensor z = a[0] * 2.0;
         z.relu_();
         Tensor c = tg::zeros({5}, f64(g_case_device));
         c.copy_(a[0] * a[0]);
         return u * z + c * a[0];
       }},
      {"cumsum", {{3, 4}}, [](auto& a) { return (a[0] * a[0]).cumsum(1) * a[0]; }},
      {"sort, topk", {{3, 5}},
       [](auto& a) { return std::get<0>(tg::sort(a[0] * a[0], 1)) * a[0] + std::get<0>(tg::topk(a[0], 2, 1)).pow(3).sum(); }},
      {"logsumexp", {{3, 4}}, [](auto& a) { return a[0].logsumexp(DimList{1}).pow(2) * a[0].logsumexp(DimList{0, 1}); }},
      {"softmax", {{3, 4}}, [](auto& a) { return a[0].softmax(1) * a[0]; }},
      {"log_softmax", {{3, 4}}, [](auto& a) { return a[0].log_softmax(0).pow(2); }},
      {"cross_entropy", {{4, 3}},
       [](auto& a) { return F::cross_entropy(a[0] * a[0], ids({2, 0, 1, 2})); }},
      {"cross_entropy weighted, smoothed, ignore_index", {{5, 3}, {3}},
       [](auto& a) {
         F::CrossEntropyOptions o;
         o.weight = tg::tensor<double>({0.7, 1.3, 2.0}, f64(g_case_device));
         o.label_smoothing = 0.2;
         o.ignore_index = 1;
         return F::cross_entropy(a[0] * a[1], ids({2, 1, 0, 1, 2}), o);
       }},
      {"cross_entropy sum / none", {{4, 3}},
       [](auto& a) {
         F::CrossEntropyOptions s, n;
         s.reduction = "sum";
         n.reduction = "none";
         Tensor t = ids({0, 2, 1, 1});
         return F::cross_entropy(a[0].tanh(), t, s) + F::cross_entropy(a[0] * 2.0, t, n).pow(2).sum();
       }},
      {"mse_loss", {{3, 4}, {3, 4}},
       [](auto& a) { return F::mse_loss(a[0] * a[0], a[1]) + F::mse_loss(a[0], a[1] * a[0], "sum"); }},
      {"mse_loss none / broadcast", {{3, 4}, {4}},
       [](auto& a) { return F::mse_loss(a[0].tanh(), a[1], "none") + F::mse_loss(a[0], a[0].pow(2), "none"); }},
      {"dropout (one mask)", {{12}},
       [](auto& a) {
         tg::manual_seed(5);
         return F::dropout(a[0] * a[0], 0.4, true) * a[0];
       }},
      {"layer_norm", {{3, 4}, {4}, {4}},
       [](auto& a) { return F::layer_norm(a[0], {4}, a[1], a[2]).pow(2); }},
      {"layer_norm 2 dims, no affine", {{2, 2, 3}}, [](auto& a) { return F::layer_norm(a[0], {2, 3}).pow(3); }},
      {"rms_norm", {{3, 4}, {4}}, [](auto& a) { return F::rms_norm(a[0], {4}, a[1], 1e-5).pow(2); }},
      {"batch_norm (training)", {{4, 3, 2}, {3}, {3}},
       [](auto& a) { return F::batch_norm(a[0], Tensor(), Tensor(), a[1], a[2], true).pow(2) * a[0]; }},
      {"batch_norm (eval), group_norm", {{2, 4, 3}, {4}, {4}},
       [](auto& a) {
         Tensor rm = tg::tensor<double>({0.1, -0.2, 0.3, 0.0}, f64(g_case_device));
         Tensor rv = tg::tensor<double>({1.5, 0.5, 2.0, 1.0}, f64(g_case_device));
         return F::batch_norm(a[0], rm, rv, a[1], a[2], false).pow(2) + F::group_norm(a[0], 2, a[1], a[2]).pow(3);
       }},
      {"gelu tanh", {{5}}, [](auto& a) { return tg::gelu(a[0], "tanh") * a[0]; }, -2, 2},
      {"max_pool2d, avg_pool2d, adaptive_avg_pool2d", {{1, 2, 5, 5}},
       [](auto& a) {
         Tensor x2 = a[0] * a[0] * a[0];
         Tensor m = F::max_pool2d(x2, {.kernel_size = 2, .stride = 2, .padding = 1}).pow(2).sum();
         Tensor v = F::avg_pool2d(x2, {.kernel_size = 3, .stride = 2, .padding = 1, .count_include_pad = false})
                        .pow(2)
                        .sum();
         return F::adaptive_avg_pool2d(x2, {2, 3}).pow(2).sum() + m + v;
       }},
      {"interpolate nearest, bilinear, linear", {{1, 2, 3, 4}},
       [](auto& a) {
         Tensor x3 = a[0] * a[0] * a[0];
         Tensor n = F::interpolate(x3, {.size = {5, 7}}).pow(2).sum();
         Tensor b = F::interpolate(x3, {.scale_factor = {2.0}, .mode = "bilinear", .align_corners = false}).pow(2).sum();
         Tensor l = F::interpolate(x3.flatten(1, 2), {.size = 9, .mode = "linear", .align_corners = true}).pow(2).sum();
         return n + b + l;
       }},
      {"in place on views: slice().mul_, select().copy_, narrow().add_", {{3, 4}, {4}},
       [](auto& a) {
         Tensor y = a[0] * a[0];
         y.slice(1, 1, 3).mul_(a[0].slice(1, 0, 2));
         y.select(0, 1).copy_(a[1].pow(3));
         y.narrow(0, 2, 1).add_(a[1] * a[0].select(0, 0), 0.5);
         return y * y.t().reshape({3, 4});
       }},
      {"in place by tensors: mul_, div_, clamp_, masked_fill_, index_add_", {{4}, {4}},
       [](auto& a) {
         Tensor y = a[0] * 1.0;
         y.mul_(a[1]);
         y.div_(a[1] * a[1] + 1.0);
         Tensor z = a[0] * a[1];
         z.clamp_(-0.3, 0.3);
         Tensor w = a[0] * a[0];
         w.masked_fill_(ids({1, 0, 0, 1}).eq(Scalar(1)), 2.0);
         Tensor v = a[0] * 1.0;
         v.index_add_(0, ids({3, 0, 3}), (a[1] * a[1]).slice(0, 0, 3), 0.5);
         return y * a[0] + z * a[0] + w * a[1] + v * v;
       }},
  };
  std::vector<OpCase> conv = conv_cases();
  cases.insert(cases.end(), conv.begin(), conv.end());
  return cases;
}

// Each case's inputs on `dev` (float64, away from the kinks of relu / abs / clamp at |x| = 0, 0.5,
// 0.3); `noncontig`: the case sees strided copies (every other element of a [..., 2] stack).
void check_cases(Device dev, bool noncontig, const std::vector<std::string>& only = {}) {
  g_case_device = dev;
  for (const OpCase& c : op_cases()) {
    if (!only.empty() && std::find(only.begin(), only.end(), c.name) == only.end()) continue;
    SCOPED_TRACE(std::string(c.name) + (noncontig ? " (non-contiguous)" : "") + " on " + dev.str());
    std::vector<Tensor> inputs;
    uint64_t seed = 100;
    for (const Shape& s : c.shapes) {
      int64_t n = 1;
      for (int64_t d : s) n *= d;
      std::vector<double> v = values(n, c.lo, c.hi, seed++);
      for (double& e : v)
        if (std::abs(std::abs(e) - 0.5) < 0.05 || std::abs(std::abs(e) - 0.3) < 0.05 || std::abs(e) < 0.05) e += 0.13;
      inputs.push_back(tg::tensor<double>(v, f64(dev)).reshape(s));
    }
    Fn fn = c.fn;
    if (noncontig) {
      fn = [&c](const std::vector<Tensor>& a) {
        std::vector<Tensor> strided;
        for (const Tensor& t : a) {
          Tensor st = tg::stack({t, t * 2.0}, t.dim()).select(t.dim(), 0);
          EXPECT_TRUE(t.dim() == 0 || t.numel() <= 1 || !st.is_contiguous()) << "not strided";
          strided.push_back(st);
        }
        return c.fn(strided);
      };
    }
    auto r = tg::autograd::gradgradcheck(fn, inputs, {.eps = 1e-6, .atol = 1e-6, .rtol = 1e-4});
    EXPECT_TRUE(r.ok) << r;
    auto r1 = tg::autograd::gradcheck(fn, inputs);
    EXPECT_TRUE(r1.ok) << r1;
  }
  g_case_device = Device(kCPU);
}

TEST(HigherOrder, GradgradcheckEveryCoveredOp) { check_cases(Device(kCPU), false); }
TEST(HigherOrder, GradgradcheckEveryCoveredOpNonContiguous) { check_cases(Device(kCPU), true); }

// The gradients the recorded backward (create_graph) computes are the native backward's.
TEST(HigherOrder, ConvFirstOrderGradientsUnderCreateGraphMatchNative) {
  for (const OpCase& c : conv_cases()) {
    SCOPED_TRACE(c.name);
    std::vector<Tensor> inputs;
    uint64_t seed = 200;
    for (const Shape& s : c.shapes) inputs.push_back(rand_leaf(s, -1, 1, seed++));
    Tensor out = c.fn(inputs);
    Tensor dir = tg::tensor<double>(values(out.numel(), -1, 1, 7), f64()).reshape(out.sizes());
    auto native_g = tg::autograd::grad({(c.fn(inputs) * dir).sum()}, inputs);
    auto recorded_g = tg::autograd::grad({(c.fn(inputs) * dir).sum()}, inputs, GradOptions{.create_graph = true});
    ASSERT_EQ(native_g.size(), recorded_g.size());
    for (size_t i = 0; i < native_g.size(); ++i) {
      EXPECT_TRUE(recorded_g[i].requires_grad()) << "input " << i << ": a gradient with a history";
      EXPECT_EQ(recorded_g[i].dtype(), native_g[i].dtype());
      EXPECT_EQ(recorded_g[i].sizes(), native_g[i].sizes());
      expect_near_vec(host(recorded_g[i]), host(native_g[i]), 1e-12, 1e-12, "input " + std::to_string(i));
    }
  }
}

// A float32 conv: the recorded gradients keep the first-order path's dtype.
TEST(HigherOrder, ConvRecordedGradientsKeepTheDtype) {
  Tensor x = rand_leaf({2, 2, 5, 5}, -1, 1, 61).detach().to(kFloat32).requires_grad_();
  Tensor w = rand_leaf({2, 1, 3, 3}, -1, 1, 62).detach().to(kFloat32).requires_grad_();
  Tensor b = rand_leaf({2}, -1, 1, 63).detach().to(kFloat32).requires_grad_();
  auto f = [&] { return tg::nn::functional::conv2d(x, w, b, {.stride = 2, .padding = 1, .groups = 2}).pow(2).sum(); };
  auto first = tg::autograd::grad({f()}, {x, w, b});
  auto rec = tg::autograd::grad({f()}, {x, w, b}, GradOptions{.create_graph = true});
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(rec[i].dtype(), first[i].dtype());
    expect_near_vec(host(rec[i]), host(first[i]), 1e-5, 1e-5, "input " + std::to_string(i));
  }
}

// Third order: gradgradcheck of a function that is itself a create_graph gradient through conv2d
// and conv_transpose2d (the recorded backward's own nodes are differentiable twice).
TEST(HigherOrder, ConvThirdDerivativesMatchFiniteDifferences) {
  namespace F = tg::nn::functional;
  Fn fn = [](const std::vector<Tensor>& a) {
    Tensor y = F::conv2d(a[0], a[1], Tensor(), {.stride = 2, .padding = 1, .groups = 2}).pow(2).sum() +
               F::conv_transpose2d(a[0], a[1], Tensor(), {.stride = 2, .output_padding = 1}).pow(3).sum();
    auto g = tg::autograd::grad({y}, {a[0], a[1]}, GradOptions{.create_graph = true});
    return g[0].sum(DimList{0}) * 2.0 + g[1].sum();
  };
  Tensor x = tg::tensor<double>(values(2 * 2 * 4 * 4, -1, 1, 71), f64()).reshape({2, 2, 4, 4});
  Tensor w = tg::tensor<double>(values(2 * 1 * 2 * 2, -1, 1, 72), f64()).reshape({2, 1, 2, 2});
  auto r = tg::autograd::gradgradcheck(fn, {x, w}, {.eps = 1e-6, .atol = 1e-6, .rtol = 1e-4});
  EXPECT_TRUE(r.ok) << r;
}

// WGAN-GP through a conv2d critic: the penalty's gradient into the conv weight, bias and the head
// against finite differences of the penalty.
Tensor conv_critic(const std::vector<Tensor>& w, const Tensor& x) {
  Tensor h = tg::nn::functional::conv2d(x, w[0], w[1], {.stride = 2, .padding = 1}).sigmoid();
  return (h * w[2]).sum();
}

Tensor conv_penalty(const std::vector<Tensor>& w, const Tensor& x0) {
  Tensor x = x0.detach().clone();
  x.requires_grad_();
  auto gx = tg::autograd::grad({conv_critic(w, x)}, {x}, GradOptions{.create_graph = true});
  Tensor n2 = (gx[0] * gx[0]).sum(DimList{1, 2, 3});
  return ((n2.sqrt() - 1.0).pow(2)).mean();
}

TEST(HigherOrder, GradientPenaltyThroughConv2dMatchesFiniteDifferences) {
  std::vector<Tensor> w = {rand_leaf({3, 2, 3, 3}, -1, 1, 51), rand_leaf({3}, -0.5, 0.5, 52),
                           rand_leaf({3, 3, 3}, -1, 1, 53)};
  Tensor x = tg::tensor<double>(values(3 * 2 * 5 * 5, -1, 1, 54), f64()).reshape({3, 2, 5, 5});
  auto gw = tg::autograd::grad({conv_penalty(w, x)}, w);
  for (size_t k = 0; k < w.size(); ++k) {
    double norm = 0;
    for (double v : host(gw[k])) norm += v * v;
    EXPECT_GT(norm, 1e-6) << "a non-trivial gradient for w" << k;
  }
  expect_matches_finite_differences(w, gw, [&](const std::vector<Tensor>& q) { return conv_penalty(q, x); });
}

// An op y = x^3 whose recorded backward is right at first order but treats x^2 as a constant
// (a second derivative of 0 instead of 6x): gradcheck passes, gradgradcheck must not.
Tensor cube_with_wrong_double_backward(const Tensor& x) {
  Tensor out = native::mul(native::mul(x, x), x);
  if (!autograd::should_record(x)) return out;
  autograd::SavedTensor sx(x, "cube");
  return autograd::record(
      "cube", {x}, std::move(out),
      [sx](const Tensor& g, const autograd::FunctionNode&) -> std::vector<Tensor> {
        Tensor v = sx.unpack();
        Tensor sq3 = native::mul(native::mul(v, v), Scalar(3.0));  // native: no history
        return {autograd::bw::mul(g, sq3)};
      },
      autograd::kDifferentiable);
}

TEST(HigherOrder, GradgradcheckCatchesAWrongSecondDerivative) {
  Fn fn = [](const std::vector<Tensor>& a) { return cube_with_wrong_double_backward(a[0]); };
  Tensor x = tg::tensor<double>({0.5, 1.5, -1}, f64());
  auto r1 = tg::autograd::gradcheck(fn, {x});
  EXPECT_TRUE(r1.ok) << r1;
  auto r2 = tg::autograd::gradgradcheck(fn, {x});
  EXPECT_FALSE(r2.ok) << r2;
  EXPECT_NE(r2.message.find("input 0"), std::string::npos) << r2;
}

TEST(HigherOrderCuda, GradgradcheckEveryCoveredOpOnCuda) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  check_cases(Device(kCUDA), false);
  check_cases(Device(kCUDA), true);
}

}  // namespace
}  // namespace tg::testing
