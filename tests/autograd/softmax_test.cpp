// softmax / log_softmax / logsumexp and the classification losses against float64 references
// computed here by hand (host loops), on the CPU and on CUDA when present: every dim, non-contiguous
// inputs, extreme logits, float16 / bfloat16 with stated tolerances, gradients, bad inputs.
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "tests/autograd/common.h"

namespace tg::testing {
namespace {

using nn::functional::binary_cross_entropy_with_logits;
using nn::functional::cross_entropy;
using nn::functional::nll_loss;

// softmax / log_softmax of a row-major [rows, cols] host buffer along its rows.
std::vector<double> ref_softmax(const std::vector<double>& x, int64_t rows, int64_t cols, bool log) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double m = -INFINITY;
    for (int64_t j = 0; j < cols; ++j) m = std::max(m, x[r * cols + j]);
    double s = 0;
    for (int64_t j = 0; j < cols; ++j) s += std::exp(x[r * cols + j] - m);
    for (int64_t j = 0; j < cols; ++j) {
      const double v = x[r * cols + j] - m - std::log(s);
      y[r * cols + j] = log ? v : std::exp(v);
    }
  }
  return y;
}

class Softmax : public ::testing::TestWithParam<Dev> {};

TEST_P(Softmax, LastDimMatchesReference) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  tg::manual_seed(7);
  for (int64_t cols : {1, 7, 33, 1000, 5000}) {
    Tensor x = tg::randn({5, cols}, TensorOptions(kFloat64).device(dev)) * 3.0;
    auto hx = host(x);
    for (bool log : {false, true}) {
      Tensor y = log ? tg::log_softmax(x, -1) : x.softmax(1);
      expect_near_vec(host(y), ref_softmax(hx, 5, cols, log), 1e-12, 1e-12, log ? "log_softmax" : "softmax");
      Tensor yf = log ? tg::log_softmax(x.to(kFloat32), 1) : tg::softmax(x.to(kFloat32), 1);
      EXPECT_EQ(yf.dtype(), kFloat32);
      expect_near_vec(host(yf), ref_softmax(hx, 5, cols, log), 1e-6, 1e-5, "float32");
    }
  }
}

TEST_P(Softmax, EveryDimAndNonContiguous) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  tg::manual_seed(8);
  Tensor x = tg::randn({3, 4, 5}, TensorOptions(kFloat64).device(dev));
  for (int64_t d = -3; d < 3; ++d) {
    const int64_t dd = d < 0 ? d + 3 : d;
    // reference: move dim dd last, softmax rows, move back
    Tensor moved = x.transpose(dd, 2).contiguous();
    auto want = ref_softmax(host(moved), moved.numel() / moved.size(2), moved.size(2), false);
    Tensor wt = tg::tensor<double>(want, moved.sizes(), TensorOptions(kFloat64)).transpose(dd, 2);
    expect_near_vec(host(tg::softmax(x, d)), host(wt), 1e-12, 1e-12, "softmax dim " + std::to_string(d));
  }
  // a transposed (non-contiguous) input over its last dim
  Tensor xt = x.transpose(0, 2);  // [5, 4, 3]
  auto want = ref_softmax(host(xt), 20, 3, true);
  expect_near_vec(host(tg::log_softmax(xt, 2)), want, 1e-12, 1e-12, "transposed");
}

TEST_P(Softmax, ExtremeLogitsStayFinite) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    Tensor x = tg::tensor<double>({1e4, -1e4, 0.0, 1e4, 1e4, -1e4}, {2, 3}, TensorOptions(kFloat64).device(dev))
                   .to(dt == kFloat16 ? kFloat32 : dt);  // float16 cannot hold 1e4 exactly: run it on +-6e4 below
    if (dt == kFloat16) x = (x * 6.0).to(kFloat16);
    auto y = host(tg::softmax(x, 1));
    auto ly = host(tg::log_softmax(x, 1));
    auto lse = host(tg::logsumexp(x, {1}));
    for (double v : y) EXPECT_TRUE(std::isfinite(v)) << dt;
    for (double v : ly) EXPECT_FALSE(std::isnan(v)) << dt;
    for (double v : lse) EXPECT_TRUE(std::isfinite(v)) << dt;
    EXPECT_NEAR(y[0], 1.0, 1e-3);
    EXPECT_NEAR(y[3], 0.5, 1e-3);
    EXPECT_NEAR(ly[0], 0.0, 1e-3);
  }
}

TEST_P(Softmax, HalfPrecisionMatchesFloat64) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  tg::manual_seed(9);
  for (int64_t cols : {10, 4096}) {
    Tensor x64 = tg::randn({4, cols}, TensorOptions(kFloat64).device(dev)) * 2.0;
    for (DType dt : {kFloat16, kBFloat16}) {
      Tensor x = x64.to(dt);
      auto hx = host(x);  // the rounded inputs, so only the kernel's rounding is measured
      const double tol = dt == kFloat16 ? 2e-3 : 1.6e-2;
      Tensor y = tg::softmax(x, 1);
      EXPECT_EQ(y.dtype(), dt);
      expect_near_vec(host(y), ref_softmax(hx, 4, cols, false), 1e-4, tol, "softmax half");
      expect_near_vec(host(tg::log_softmax(x, 1)), ref_softmax(hx, 4, cols, true), 2e-2, tol, "log_softmax half");
      // backward in half against the float64 formula
      Tensor xr = x.detach().requires_grad_(true);
      Tensor g64 = tg::randn({4, cols}, TensorOptions(kFloat64).device(dev));
      Tensor yy = tg::softmax(xr, 1);
      yy.backward(g64.to(dt));
      auto hy = ref_softmax(hx, 4, cols, false);
      auto hg = host(g64.to(dt));
      std::vector<double> want(hy.size());
      for (int64_t r = 0; r < 4; ++r) {
        double s = 0;
        for (int64_t j = 0; j < cols; ++j) s += hg[r * cols + j] * hy[r * cols + j];
        for (int64_t j = 0; j < cols; ++j) want[r * cols + j] = hy[r * cols + j] * (hg[r * cols + j] - s);
      }
      expect_near_vec(host(xr.grad()), want, 2e-3, 2e-2, "softmax backward half");
    }
  }
}

TEST_P(Softmax, BackwardMatchesFormula) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  tg::manual_seed(10);
  const int64_t rows = 3, cols = 300;
  Tensor x = tg::randn({rows, cols}, TensorOptions(kFloat64).device(dev)).requires_grad_(true);
  Tensor g = tg::randn({rows, cols}, TensorOptions(kFloat64).device(dev));
  tg::log_softmax(x, 1).backward(g);
  auto hx = host(x.detach());
  auto hg = host(g);
  auto p = ref_softmax(hx, rows, cols, false);
  std::vector<double> want(p.size());
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int64_t j = 0; j < cols; ++j) s += hg[r * cols + j];
    for (int64_t j = 0; j < cols; ++j) want[r * cols + j] = hg[r * cols + j] - p[r * cols + j] * s;
  }
  expect_near_vec(host(x.grad()), want, 1e-12, 1e-10, "log_softmax backward");
}

TEST_P(Softmax, LogSumExp) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  const double inf = std::numeric_limits<double>::infinity();
  Tensor x = tg::tensor<double>({1, 2, 3, -inf, -inf, -inf, 1000, 1000, -5}, {3, 3}, TensorOptions(kFloat64).device(dev));
  auto got = host(tg::logsumexp(x, {1}));
  EXPECT_NEAR(got[0], 3 + std::log(1 + std::exp(-1) + std::exp(-2)), 1e-12);
  EXPECT_EQ(got[1], -inf);
  EXPECT_NEAR(got[2], 1000 + std::log(2.0), 1e-9);
  Tensor k = x.logsumexp({0, 1}, true);
  EXPECT_EQ(k.sizes(), Shape({1, 1}));
  // integers compute in float32
  Tensor xi = tg::tensor<int64_t>({0, 0}, TensorOptions(kInt64).device(dev));
  Tensor li = tg::logsumexp(xi, {0});
  EXPECT_EQ(li.dtype(), kFloat32);
  EXPECT_NEAR(li.item<double>(), std::log(2.0), 1e-6);
  // gradient: softmax of the reduced slice
  Tensor xr = tg::tensor<double>({0.5, -1, 2}, TensorOptions(kFloat64).device(dev)).requires_grad_(true);
  tg::logsumexp(xr, {0}).backward();
  expect_near_vec(host(xr.grad()), ref_softmax({0.5, -1, 2}, 1, 3, false), 1e-12, 1e-12, "logsumexp grad");
}

TEST_P(Softmax, BadInputs) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  Tensor xi = tg::zeros({2, 3}, TensorOptions(kInt64).device(dev));
  EXPECT_THROW(
      {
        try {
          tg::softmax(xi, 1);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("softmax"), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find("int64"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  Tensor x = tg::zeros({2, 3}, TensorOptions(kFloat32).device(dev));
  EXPECT_THROW(tg::log_softmax(x, 2), Error);
  EXPECT_THROW(tg::logsumexp(x, {3}), Error);
  // empty input: empty output
  EXPECT_EQ(tg::softmax(tg::zeros({0, 3}, TensorOptions(kFloat32).device(dev)), 1).numel(), 0);
}

TEST_P(Softmax, Modules) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  Tensor x = tg::randn({2, 3}, TensorOptions(kFloat64).device(dev));
  nn::Softmax sm(1);
  nn::LogSoftmax lsm(0);
  expect_near_vec(host(sm(x)), host(tg::softmax(x, 1)), 0, 0, "Softmax");
  expect_near_vec(host(lsm(x)), host(tg::log_softmax(x, 0)), 0, 0, "LogSoftmax");
  EXPECT_EQ(sm.name(), "Softmax");
  EXPECT_EQ(lsm.state_dict().size(), 0u);
}

// ---- cross_entropy against a host float64 reference: per-row loss and gradient.
struct CeRef {
  std::vector<double> loss;  // per row (0 for ignored)
  std::vector<double> grad;  // d(reduced loss)/dx with an upstream gradient of 1
  double reduced = 0;
};
CeRef ref_ce(const std::vector<double>& x, const std::vector<int64_t>& t, int64_t n, int64_t c,
             const std::vector<double>& w, int64_t ignore, double eps, const std::string& red) {
  CeRef r;
  r.loss.assign(n, 0.0);
  r.grad.assign(n * c, 0.0);
  double wsum_all = 0, wsum_t = 0, total = 0;
  auto W = [&](int64_t j) { return w.empty() ? 1.0 : w[j]; };
  for (int64_t j = 0; j < c; ++j) wsum_all += W(j);
  std::vector<std::vector<double>> p(n);
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] == ignore) continue;
    std::vector<double> row(x.begin() + i * c, x.begin() + (i + 1) * c);
    auto lp = ref_softmax(row, 1, c, true);
    double l = -(1 - eps) * W(t[i]) * lp[t[i]];
    for (int64_t j = 0; j < c; ++j) l -= eps / c * W(j) * lp[j];
    r.loss[i] = l;
    total += l;
    wsum_t += W(t[i]);
    for (int64_t j = 0; j < c; ++j) {
      const double pj = std::exp(lp[j]);
      double g = (1 - eps) * W(t[i]) * (pj - (j == t[i])) + eps / c * (wsum_all * pj - W(j));
      r.grad[i * c + j] = g;
    }
  }
  const double scale = red == "mean" ? 1.0 / wsum_t : 1.0;
  r.reduced = red == "mean" ? total / wsum_t : total;
  if (red != "none")
    for (double& g : r.grad) g *= scale;
  return r;
}

TEST_P(Softmax, CrossEntropyMatchesReference) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  tg::manual_seed(11);
  const int64_t n = 6, c = 5;
  std::vector<int64_t> t{0, 4, -100, 2, 2, 1};
  std::vector<double> w{0.5, 1.0, 2.0, 1.5, 0.25};
  for (const char* red : {"mean", "sum", "none"})
    for (double eps : {0.0, 0.3})
      for (bool weighted : {false, true})
        for (DType dt : {kFloat64, kFloat32}) {
          SCOPED_TRACE(std::string(red) + " eps " + std::to_string(eps) + (weighted ? " weighted " : " ") +
                       dtype_name(dt));
          Tensor x64 = tg::randn({n, c}, TensorOptions(kFloat64).device(dev)) * 2.0;
          Tensor x = x64.to(dt).detach().requires_grad_(true);
          Tensor tt = tg::tensor<int64_t>(t, TensorOptions(kInt64).device(dev));
          Tensor wt = weighted ? tg::tensor<double>(w, TensorOptions(kFloat64).device(dev)).to(dt) : Tensor();
          Tensor loss = cross_entropy(x, tt, {.reduction = red, .label_smoothing = eps, .weight = wt});
          auto ref = ref_ce(host(x.detach()), t, n, c, weighted ? w : std::vector<double>{}, -100, eps, red);
          const double tol = dt == kFloat64 ? 1e-12 : 1e-5;
          EXPECT_EQ(loss.dtype(), dt);
          if (std::string(red) == "none") {
            EXPECT_EQ(loss.sizes(), Shape({n}));
            expect_near_vec(host(loss), ref.loss, tol, tol, "loss");
            loss.sum().backward();
          } else {
            EXPECT_EQ(loss.dim(), 0);
            EXPECT_NEAR(loss.item<double>(), ref.reduced, tol * (1 + std::abs(ref.reduced)));
            loss.backward();
          }
          expect_near_vec(host(x.grad()), ref.grad, tol, tol, "grad");
        }
}

TEST_P(Softmax, CrossEntropySpatialAndUnbatched) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  tg::manual_seed(12);
  // [N, C, d] against the same rows as [N * d, C]
  Tensor x = tg::randn({2, 3, 4}, TensorOptions(kFloat64).device(dev)).requires_grad_(true);
  std::vector<int64_t> t{0, 1, 2, 1, 2, 2, 0, -100};
  Tensor tt = tg::tensor<int64_t>(t, {2, 4}, TensorOptions(kInt64).device(dev));
  Tensor loss = cross_entropy(x, tt, {.label_smoothing = 0.1});
  Tensor rows = x.detach().permute({0, 2, 1}).reshape({8, 3});
  auto ref = ref_ce(host(rows), t, 8, 3, {}, -100, 0.1, "mean");
  EXPECT_NEAR(loss.item<double>(), ref.reduced, 1e-12);
  loss.backward();
  Tensor want = tg::tensor<double>(ref.grad, {2, 4, 3}, TensorOptions(kFloat64)).permute({0, 2, 1});
  expect_near_vec(host(x.grad()), host(want), 1e-12, 1e-12, "spatial grad");
  Tensor none = cross_entropy(x.detach(), tt, {.reduction = "none"});
  EXPECT_EQ(none.sizes(), Shape({2, 4}));
  // unbatched [C] with a 0-d target
  Tensor x1 = tg::tensor<double>({1.0, 2.0, 0.5}, TensorOptions(kFloat64).device(dev));
  Tensor t1 = tg::tensor<int64_t>({1}, TensorOptions(kInt64).device(dev)).reshape({});
  EXPECT_NEAR(cross_entropy(x1, t1).item<double>(), -ref_softmax({1.0, 2.0, 0.5}, 1, 3, true)[1], 1e-12);
}

TEST_P(Softmax, CrossEntropyProbabilityTargets) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  std::vector<double> xv{1, 2, 3, -1, 0, 1}, pv{0.2, 0.3, 0.5, 1, 0, 0};
  Tensor x = tg::tensor<double>(xv, {2, 3}, TensorOptions(kFloat64).device(dev));
  Tensor p = tg::tensor<double>(pv, {2, 3}, TensorOptions(kFloat64).device(dev));
  auto lp = ref_softmax(xv, 2, 3, true);
  const double eps = 0.1;
  double total = 0;
  std::vector<double> w{1, 2, 3};
  for (int i = 0; i < 6; ++i) total -= w[i % 3] * (pv[i] * (1 - eps) + eps / 3) * lp[i];
  Tensor wt = tg::tensor<double>(w, TensorOptions(kFloat64).device(dev));
  EXPECT_NEAR(cross_entropy(x, p, {.label_smoothing = eps, .weight = wt}).item<double>(), total / 2, 1e-12);
  EXPECT_NEAR(cross_entropy(x, p, {.reduction = "sum", .label_smoothing = eps, .weight = wt}).item<double>(), total,
              1e-12);
}

TEST_P(Softmax, CrossEntropyHalfPrecision) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  tg::manual_seed(13);
  const int64_t n = 16, c = 3000;
  std::vector<int64_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = (i * 997) % c;
  Tensor tt = tg::tensor<int64_t>(t, TensorOptions(kInt64).device(dev));
  for (DType dt : {kFloat16, kBFloat16}) {
    Tensor x = (tg::randn({n, c}, TensorOptions(kFloat32).device(dev)) * 3.0).to(dt).requires_grad_(true);
    Tensor loss = cross_entropy(x, tt, {.label_smoothing = 0.1});
    EXPECT_EQ(loss.dtype(), dt);
    auto ref = ref_ce(host(x.detach()), t, n, c, {}, -100, 0.1, "mean");
    EXPECT_NEAR(loss.item<double>(), ref.reduced, 2e-2 * std::abs(ref.reduced));
    loss.backward();
    EXPECT_EQ(x.grad().dtype(), dt);
    expect_near_vec(host(x.grad()), ref.grad, 1e-6, 2e-2, "half grad");
  }
}

TEST_P(Softmax, CrossEntropyAutocastKeepsReducedLogits) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  Tensor x = tg::randn({4, 10}, TensorOptions(kFloat32).device(dev)).to(kBFloat16).requires_grad_(true);
  Tensor tt = tg::tensor<int64_t>({1, 2, 3, 4}, TensorOptions(kInt64).device(dev));
  Tensor loss;
  {
    amp::autocast guard(dev.type(), kBFloat16);
    loss = cross_entropy(x, tt);
    EXPECT_EQ(tg::softmax(x, 1).dtype(), kFloat32);
  }
  EXPECT_EQ(loss.dtype(), kFloat32);
  loss.backward();
  EXPECT_EQ(x.grad().dtype(), kBFloat16);
  auto ref = ref_ce(host(x.detach()), {1, 2, 3, 4}, 4, 10, {}, -100, 0, "mean");
  EXPECT_NEAR(loss.item<double>(), ref.reduced, 1e-5);
}

TEST_P(Softmax, CrossEntropyAllIgnoredIsNaN) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  Tensor x = tg::randn({2, 3}, TensorOptions(kFloat32).device(dev));
  Tensor tt = tg::tensor<int64_t>({-100, -100}, TensorOptions(kInt64).device(dev));
  EXPECT_TRUE(std::isnan(cross_entropy(x, tt).item<double>()));
  EXPECT_EQ(cross_entropy(x, tt, {.reduction = "sum"}).item<double>(), 0.0);
  // ignore_index inside the class range
  Tensor t2 = tg::tensor<int64_t>({0, 1}, TensorOptions(kInt64).device(dev));
  auto ref = ref_ce(host(x), {0, 1}, 2, 3, {}, 0, 0, "mean");
  EXPECT_NEAR(cross_entropy(x, t2, {.ignore_index = 0}).item<double>(), ref.reduced, 1e-5);
}

TEST_P(Softmax, CrossEntropyBadInputs) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  Tensor x = tg::randn({2, 3}, TensorOptions(kFloat32).device(dev));
  Tensor t = tg::tensor<int64_t>({0, 1}, TensorOptions(kInt64).device(dev));
  auto expect_msg = [](auto&& f, const std::string& part) {
    try {
      f();
      ADD_FAILURE() << "no error, expected one containing " << part;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_msg([&] { cross_entropy(x, t, {.reduction = "avg"}); }, "reduction");
  expect_msg([&] { cross_entropy(x, tg::tensor<int64_t>({0, 1, 2}, TensorOptions(kInt64).device(dev))); }, "[2, 3]");
  expect_msg([&] { cross_entropy(x, t, {.label_smoothing = 1.5}); }, "label_smoothing");
  expect_msg([&] { cross_entropy(x, t, {.weight = tg::ones({4}, TensorOptions(kFloat32).device(dev))}); }, "weight");
  expect_msg([&] { cross_entropy(x.to(kInt64), t); }, "cross_entropy");
  expect_msg([&] { nll_loss(x, t.to(kFloat32)); }, "nll_loss");
  expect_msg([&] { binary_cross_entropy_with_logits(x, t.to(kFloat32)); }, "binary_cross_entropy_with_logits");
  if (dev.type() == kCPU) {
    expect_msg([&] { cross_entropy(x, tg::tensor<int64_t>({0, 3})); }, "out of bounds");
  }
}

TEST_P(Softmax, NllLossMatchesReference) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  std::vector<double> lp{-1, -2, -0.5, -3, -0.1, -4, -2, -2, -2};
  std::vector<int64_t> t{2, 0, 1};
  std::vector<double> w{0.5, 2, 3};
  Tensor x = tg::tensor<double>(lp, {3, 3}, TensorOptions(kFloat64).device(dev)).requires_grad_(true);
  Tensor tt = tg::tensor<int64_t>(t, TensorOptions(kInt64).device(dev));
  Tensor wt = tg::tensor<double>(w, TensorOptions(kFloat64).device(dev));
  // weighted mean: sum w[t] * -lp / sum w[t], ignoring target 0 (ignore_index = 0): rows 0 and 2
  const double want = (3 * 0.5 + 2 * 2.0) / (3 + 2);
  Tensor loss = nll_loss(x, tt, {.ignore_index = 0, .weight = wt});
  EXPECT_NEAR(loss.item<double>(), want, 1e-12);
  loss.backward();
  expect_near_vec(host(x.grad()), {0, 0, -0.6, 0, 0, 0, 0, -0.4, 0}, 1e-12, 0, "nll grad");
  Tensor none = nll_loss(x.detach(), tt, {.reduction = "none"});
  expect_near_vec(host(none), {0.5, 3, 2}, 1e-12, 0, "nll none");
  // log_softmax + nll_loss == cross_entropy
  Tensor z = tg::randn({4, 5}, TensorOptions(kFloat64).device(dev));
  Tensor t4 = tg::tensor<int64_t>({4, 0, 1, 3}, TensorOptions(kInt64).device(dev));
  EXPECT_NEAR(nll_loss(tg::log_softmax(z, 1), t4).item<double>(), cross_entropy(z, t4).item<double>(), 1e-12);
}

TEST_P(Softmax, BCEWithLogitsMatchesReference) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  std::vector<double> xv{0.0, 2.0, -3.0, 50.0, -50.0, 0.5}, yv{1, 0, 0.3, 1, 0, 0.5}, pw{2.0, 0.5, 1.0};
  Tensor x = tg::tensor<double>(xv, {2, 3}, TensorOptions(kFloat64).device(dev)).requires_grad_(true);
  Tensor y = tg::tensor<double>(yv, {2, 3}, TensorOptions(kFloat64).device(dev));
  Tensor p = tg::tensor<double>(pw, TensorOptions(kFloat64).device(dev));
  double total = 0;
  std::vector<double> grad(6);
  for (int i = 0; i < 6; ++i) {
    const double pi = pw[i % 3];
    const double s = 1 / (1 + std::exp(-xv[i]));
    const double logsig = -std::log1p(std::exp(-std::abs(xv[i]))) - std::max(-xv[i], 0.0);  // log s(x)
    const double log1msig = logsig - xv[i];                                                  // log(1 - s(x))
    total += -(pi * yv[i] * logsig + (1 - yv[i]) * log1msig);
    grad[i] = (((pi - 1) * yv[i] + 1) * s - pi * yv[i]) / 6;
  }
  Tensor loss = binary_cross_entropy_with_logits(x, y, {.pos_weight = p});
  EXPECT_NEAR(loss.item<double>(), total / 6, 1e-12);
  loss.backward();
  expect_near_vec(host(x.grad()), grad, 1e-12, 1e-12, "bce grad");
  // at x = 0 the gradient is sigmoid(0) - y
  Tensor z = tg::zeros({1}, TensorOptions(kFloat64).device(dev)).requires_grad_(true);
  binary_cross_entropy_with_logits(z, tg::zeros({1}, TensorOptions(kFloat64).device(dev)), {.reduction = "sum"})
      .backward();
  EXPECT_NEAR(z.grad().item<double>(), 0.5, 1e-12);
}

TEST_P(Softmax, LossModules) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  Tensor w = tg::tensor<double>({1.0, 2.0, 3.0}, TensorOptions(kFloat64));
  nn::CrossEntropyLoss ce({.label_smoothing = 0.1, .weight = w});
  ce.to(dev);
  EXPECT_TRUE(ce.state_dict().contains("weight"));
  Tensor x = tg::randn({4, 3}, TensorOptions(kFloat64).device(dev));
  Tensor t = tg::tensor<int64_t>({0, 1, 2, 1}, TensorOptions(kInt64).device(dev));
  EXPECT_NEAR(ce(x, t).item<double>(),
              cross_entropy(x, t, {.label_smoothing = 0.1, .weight = w.to(dev)}).item<double>(), 1e-12);
  nn::NLLLoss nll;
  EXPECT_NEAR(nll(tg::log_softmax(x, 1), t).item<double>(), cross_entropy(x, t).item<double>(), 1e-12);
  nn::BCEWithLogitsLoss bce({.reduction = "sum", .pos_weight = tg::ones({3}, TensorOptions(kFloat64))});
  EXPECT_TRUE(bce.state_dict().contains("pos_weight"));
  EXPECT_THROW(ce.forward(x), Error);
}

// CUDA's row kernels against the float64 CPU reference over the shapes that pick each path: one
// warp per row (<= 1024) or one block, 16-byte loads or not (odd row lengths), contiguous or a
// strided view, every dtype.
TEST(SoftmaxCuda, RowKernelsMatchCpuFloat64) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  tg::manual_seed(21);
  for (int64_t cols : {1, 3, 31, 32, 1000, 1024, 1025, 4096, 5003, 50304})
    for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
      SCOPED_TRACE("cols " + std::to_string(cols) + " " + dtype_name(dt));
      const int64_t rows = cols > 5000 ? 3 : 9;
      Tensor base = (tg::randn({rows, cols + 1}, TensorOptions(kFloat64)) * 4.0).to(dt);
      for (bool offset : {false, true}) {
        Tensor x = offset ? base.slice(1, 1, cols + 1) : base.slice(1, 0, cols).contiguous();  // offset: a strided view
        Tensor xc = x.to(kCUDA);
        const double tol = dt == kFloat64 ? 1e-12 : dt == kFloat32 ? 1e-5 : dt == kFloat16 ? 2e-3 : 1.6e-2;
        for (bool log : {false, true}) {
          Tensor want64 = log ? tg::log_softmax(x.to(kFloat64), 1) : tg::softmax(x.to(kFloat64), 1);
          Tensor got = log ? tg::log_softmax(xc, 1) : tg::softmax(xc, 1);
          expect_near_vec(host(got), host(want64), log ? tol * 10 : 1e-6, tol, log ? "log_softmax" : "softmax");
          // backward against the CPU float64 backward from the same rounded gradient
          Tensor g = tg::randn({rows, cols}, TensorOptions(kFloat64)).to(dt);
          Tensor xr = xc.detach().requires_grad_(true);
          (log ? tg::log_softmax(xr, 1) : tg::softmax(xr, 1)).backward(g.to(kCUDA));
          Tensor x64 = x.to(kFloat64).clone().requires_grad_(true);  // a fresh leaf: x itself when float64
          (log ? tg::log_softmax(x64, 1) : tg::softmax(x64, 1)).backward(g.to(kFloat64));
          expect_near_vec(host(xr.grad()), host(x64.grad()), tol * 10, tol * 4, "backward");
        }
      }
    }
}

TEST(SoftmaxCuda, CrossEntropyFusedPathsMatchReference) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  tg::manual_seed(22);
  // 4096 and (half / bfloat16) 50304: rows staged in shared memory; 3001: unaligned, not staged
  for (int64_t c : {10, 1024, 3001, 4096, 50304})
    for (DType dt : {kFloat32, kBFloat16, kFloat16}) {
      SCOPED_TRACE("C " + std::to_string(c) + " " + dtype_name(dt));
      const int64_t n = 7;
      std::vector<int64_t> t(n);
      for (int64_t i = 0; i < n; ++i) t[i] = i == 3 ? -100 : i == 5 ? c - 1 : (i * 7919) % c;  // 0 and c - 1 too
      std::vector<double> w(static_cast<size_t>(c));
      for (int64_t j = 0; j < c; ++j) w[j] = 0.5 + (j % 5) * 0.25;
      Tensor x = (tg::randn({n, c}, kCUDA) * 3.0).to(dt);
      Tensor tt = tg::tensor<int64_t>(t, TensorOptions(kInt64).device(kCUDA));
      Tensor wt = tg::tensor<double>(w, TensorOptions(kFloat64).device(kCUDA)).to(kFloat32);
      const double tol = dt == kFloat32 ? 1e-5 : 2e-2;
      auto hx = host(x);
      for (bool weighted : {false, true})
        for (double eps : {0.0, 0.1}) {
          auto ref = ref_ce(hx, t, n, c, weighted ? w : std::vector<double>{}, -100, eps, "mean");
          nn::functional::CrossEntropyOptions o{.label_smoothing = eps, .weight = weighted ? wt : Tensor()};
          // loss.backward(): the gradient comes from the forward's pass
          Tensor x1 = x.detach().requires_grad_(true);
          Tensor l1 = cross_entropy(x1, tt, o);
          EXPECT_NEAR(l1.item<double>(), ref.reduced, tol * (1 + std::abs(ref.reduced)));
          l1.backward();
          EXPECT_EQ(x1.grad().dtype(), dt);
          expect_near_vec(host(x1.grad()), ref.grad, 1e-6, tol * 2, "eager grad");
          // any other upstream gradient: the backward kernel from the saved logsumexp
          Tensor x2 = x.detach().requires_grad_(true);
          (cross_entropy(x2, tt, o) * 3.0).backward();
          std::vector<double> want3 = ref.grad;
          for (double& v : want3) v *= 3.0;
          expect_near_vec(host(x2.grad()), want3, 3e-6, tol * 2, "backward kernel");
          // a negative and a zero upstream gradient (the row's coefficient is then not > 0)
          for (double up : {-3.0, 0.0}) {
            Tensor x5 = x.detach().requires_grad_(true);
            (cross_entropy(x5, tt, o) * up).backward();
            std::vector<double> want = ref.grad;
            for (double& v : want) v *= up;
            expect_near_vec(host(x5.grad()), want, 3e-6, tol * 2, "negative / zero upstream");
          }
          // retain_graph: the second backward cannot reuse the handed-over gradient
          Tensor x3 = x.detach().requires_grad_(true);
          Tensor l3 = cross_entropy(x3, tt, o);
          l3.backward(Tensor(), {.retain_graph = true});
          l3.backward();
          for (double& v : want3) v = v / 3.0 * 2.0;
          expect_near_vec(host(x3.grad()), want3, 2e-6, tol * 2, "twice");
          // reduction none
          Tensor x4 = x.detach().requires_grad_(true);
          nn::functional::CrossEntropyOptions on = o;
          on.reduction = "none";
          Tensor l4 = cross_entropy(x4, tt, on);
          auto refn = ref_ce(hx, t, n, c, weighted ? w : std::vector<double>{}, -100, eps, "none");
          expect_near_vec(host(l4), refn.loss, tol, tol, "none");
        }
    }
  // every reduction, small (one launch: <= 2^16 logits, rows <= 1024) and not, against the CPU in float64
  for (auto [n, c] : {std::pair<int64_t, int64_t>{6, 9}, {100, 1000}, {300, 2000}})
    for (const char* red : {"mean", "sum", "none"}) {
      SCOPED_TRACE(std::to_string(n) + "x" + std::to_string(c) + " " + red);
      Tensor x = tg::randn({n, c}, kCUDA) * 2.0;
      Tensor tt = (tg::clamp(tg::rand({n}, kCUDA) * static_cast<double>(c), 0, c - 1)).to(kInt64);
      nn::functional::CrossEntropyOptions o{.reduction = red, .ignore_index = 0, .label_smoothing = 0.05};
      Tensor xg = x.detach().requires_grad_(true);
      Tensor l = cross_entropy(xg, tt, o);
      (std::string(red) == "none" ? l.sum() : l).backward();
      Tensor x64 = x.to(kCPU, kFloat64).requires_grad_(true);
      Tensor l64 = cross_entropy(x64, tt.cpu(), o);
      (std::string(red) == "none" ? l64.sum() : l64).backward();
      expect_near_vec(host(l), host(l64), 1e-5, 1e-5, "loss");
      expect_near_vec(host(xg.grad()), host(x64.grad()), 1e-7, 1e-4, "grad");
    }
  // many rows of large classes (more rows than resident blocks): weights, smoothing and ignored rows
  // against float64 on the CPU
  for (auto [n, c, dt] : {std::tuple<int64_t, int64_t, DType>{1500, 4096, kFloat32}, {600, 50304, kBFloat16},
                          {2000, 3000, kFloat16}}) {
    SCOPED_TRACE(std::to_string(n) + "x" + std::to_string(c) + " " + dtype_name(dt));
    Tensor x = (tg::randn({n, c}, kCUDA) * 3.0).to(dt);
    Tensor tt = (tg::clamp(tg::rand({n}, kCUDA) * static_cast<double>(c), 0, c - 1)).to(kInt64);
    Tensor wt = tg::rand({c}, kCUDA) + 0.5;
    nn::functional::CrossEntropyOptions o{.ignore_index = 5, .label_smoothing = 0.1, .weight = wt};
    Tensor xg = x.detach().requires_grad_(true);
    Tensor l = cross_entropy(xg, tt, o);
    l.backward();
    Tensor x64 = x.to(kCPU, kFloat64).requires_grad_(true);
    nn::functional::CrossEntropyOptions o64 = o;
    o64.weight = wt.to(kCPU, kFloat64);
    Tensor l64 = cross_entropy(x64, tt.cpu(), o64);
    l64.backward();
    const double tol = dt == kFloat32 ? 1e-5 : 2e-2;
    EXPECT_NEAR(l.item<double>(), l64.item<double>(), tol * std::abs(l64.item<double>()));
    // float16 flushes gradients below its smallest subnormal (6e-8) to zero
    expect_near_vec(host(xg.grad()), host(x64.grad()), dt == kFloat16 ? 6e-8 : 1e-8, tol * 2, "streamed grad");
  }
  // an out-of-range class index on CUDA: a NaN loss, no synchronisation
  Tensor x = tg::randn({2, 5}, kCUDA);
  Tensor bad = tg::tensor<int64_t>({1, 7}, TensorOptions(kInt64).device(kCUDA));
  EXPECT_TRUE(std::isnan(cross_entropy(x, bad).item<double>()));
}

INSTANTIATE_TEST_SUITE_P(Devices, Softmax, ::testing::Values(Dev::CPU, Dev::CUDA), dev_name);

}  // namespace
}  // namespace tg::testing
