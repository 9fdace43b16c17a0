// Issue 15's masking, indexing, scan and sort ops against hand-computed references: every
// floating dtype and the integer ones PyTorch allows, broadcasting and non-contiguous inputs,
// gradients, and errors that name the op and the offending shapes / dtypes. CPU always; CUDA
// when present (the same cases).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "tests/autograd/common.h"

namespace tg::testing {
namespace {

class IndexingOps : public ::testing::TestWithParam<Dev> {
 protected:
  Device dev() const { return to_device(GetParam()); }
  TensorOptions opt(DType t = kFloat32) const { return TensorOptions().dtype(t).device(dev()); }
  Tensor f64(std::vector<double> v, Shape s) const { return tg::tensor<double>(v, s, opt(kFloat64)); }
  Tensor i64(std::vector<int64_t> v, Shape s) const { return tg::tensor<int64_t>(v, s, opt(kInt64)); }
};

const DType kAllFloat[] = {kFloat64, kFloat32, kFloat16, kBFloat16};

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one with '" << parts[0] << "'";
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

// ---- masked_fill
TEST_P(IndexingOps, MaskedFillBroadcastsAndDtypes) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  std::vector<double> xv(12);
  std::iota(xv.begin(), xv.end(), 1.0);
  Tensor mask = tg::tensor<bool>({true, false, false, true}, {1, 4}, TensorOptions(kBool).device(dev()));
  for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16, kInt64, kInt32}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = f64(xv, {4, 3}).to(dt).t();  // [3, 4], non-contiguous
    Tensor y = x.masked_fill(mask, -2);
    EXPECT_EQ(y.dtype(), dt);
    std::vector<double> want;
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 4; ++c) want.push_back(c == 0 || c == 3 ? -2 : xv[c * 3 + r]);
    expect_near_vec(host(y), want, 0, 0, "masked_fill");
  }
  // Gradient: zero where filled, summed over the broadcast.
  Tensor x = f64({1, 2, 3, 4}, {4});
  x.requires_grad_();
  Tensor m2 = tg::tensor<bool>({true, false, false, false, false, false, true, false}, {2, 4},
                               TensorOptions(kBool).device(dev()));
  tg::masked_fill(x, m2, 5.0).sum().backward();
  expect_near_vec(host(x.grad()), {1, 2, 1, 2}, 0, 0, "masked_fill grad");
  expect_error([&] { x.masked_fill(tg::ones({4}, opt()), 0); }, {"masked_fill", "bool", "float32"});
  expect_error([&] { x.masked_fill(tg::ones({3}, opt(kBool)), 0); }, {"masked_fill", "[4]", "[3]"});
}

// ---- tril / triu
TEST_P(IndexingOps, TrilTriuDiagonalsBatchesAndGrad) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  std::vector<double> xv(2 * 3 * 4);
  std::iota(xv.begin(), xv.end(), 1.0);
  for (int64_t diag : {-1, 0, 2}) {
    for (DType dt : {kFloat64, kFloat16, kBFloat16, kInt64}) {
      Tensor x = f64(xv, {2, 3, 4}).to(dt);
      std::vector<double> lo, up;
      for (int b = 0; b < 2; ++b)
        for (int r = 0; r < 3; ++r)
          for (int c = 0; c < 4; ++c) {
            double v = xv[(b * 3 + r) * 4 + c];
            lo.push_back(c - r <= diag ? v : 0);
            up.push_back(c - r >= diag ? v : 0);
          }
      expect_near_vec(host(tg::tril(x, diag)), lo, 0, 0, "tril");
      expect_near_vec(host(x.triu(diag)), up, 0, 0, "triu");
    }
  }
  Tensor x = f64({1, 2, 3, 4, 5, 6, 7, 8, 9}, {3, 3});
  x.requires_grad_();
  (x.t().tril() * 2).sum().backward();  // non-contiguous input; grad 2 on x^T's lower triangle
  expect_near_vec(host(x.grad()), {2, 2, 2, 0, 2, 2, 0, 0, 2}, 0, 0, "tril grad");
  expect_error([&] { tg::tril(f64({1, 2}, {2})); }, {"tril", "at least 2 dims", "[2]"});
}

// ---- one_hot
TEST_P(IndexingOps, OneHot) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  Tensor idx = i64({2, 0, 1, 2}, {2, 2});
  Tensor oh = tg::one_hot(idx);
  EXPECT_EQ(oh.dtype(), kInt64);
  EXPECT_EQ(oh.sizes(), Shape({2, 2, 3}));
  expect_near_vec(host(oh), {0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1}, 0, 0, "one_hot");
  EXPECT_EQ(tg::one_hot(idx, 5).sizes(), Shape({2, 2, 5}));
  expect_error([&] { tg::one_hot(idx, 2); }, {"one_hot", "[0, 2)", "[0, 2]"});
  expect_error([&] { tg::one_hot(i64({-1}, {1}), 3); }, {"one_hot", "[-1, -1]"});
  expect_error([&] { tg::one_hot(f64({1}, {1})); }, {"one_hot", "int64", "float64"});
}

// ---- stack
TEST_P(IndexingOps, StackEveryDimAndGrad) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  Tensor a = f64({1, 2, 3, 4, 5, 6}, {2, 3}), b = f64({7, 8, 9, 10, 11, 12}, {3, 2}).t();
  a.requires_grad_();
  b.requires_grad_();  // b is a leaf; b.t() below is its non-contiguous view
  Tensor bt = b;
  Tensor s0 = tg::stack({a, bt}, 0), s1 = tg::stack({a, bt}, 1), s2 = tg::stack({a, bt}, -1);
  EXPECT_EQ(s0.sizes(), Shape({2, 2, 3}));
  EXPECT_EQ(s1.sizes(), Shape({2, 2, 3}));
  EXPECT_EQ(s2.sizes(), Shape({2, 3, 2}));
  std::vector<double> av = host(a), bv = host(bt), want2;
  for (int i = 0; i < 6; ++i) {
    want2.push_back(av[i]);
    want2.push_back(bv[i]);
  }
  expect_near_vec(host(s2), want2, 0, 0, "stack dim -1");
  (s1 * tg::tensor<double>({1, 2}, {1, 2, 1}, opt(kFloat64))).sum().backward();
  expect_near_vec(host(a.grad()), std::vector<double>(6, 1), 0, 0, "stack grad a");
  expect_near_vec(host(b.grad()), std::vector<double>(6, 2), 0, 0, "stack grad b");
  Tensor mixed = tg::stack({tg::ones({2}, opt(kFloat16)), tg::ones({2}, opt(kFloat32))});
  EXPECT_EQ(mixed.dtype(), kFloat32);
  expect_error([&] { tg::stack({a, f64({1, 2}, {2})}); }, {"stack", "[2, 3]", "[2]"});
  expect_error([&] { tg::stack({}); }, {"stack", "non-empty"});
}

// ---- gather / scatter / scatter_add / index_add
TEST_P(IndexingOps, GatherValuesSmallIndexAndGrad) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  // x [3, 4]; index [2, 3] (smaller than x outside dim 1).
  std::vector<double> xv = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  std::vector<int64_t> iv = {3, 0, 3, 1, 1, 2};
  for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16, kInt64, kInt32}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = f64(xv, {3, 4}).to(dt);
    Tensor g = tg::gather(x, 1, i64(iv, {2, 3}));
    EXPECT_EQ(g.dtype(), dt);
    expect_near_vec(host(g), {4, 1, 4, 6, 6, 7}, 0, 0, "gather dim 1");
    // dim 0 on a transposed view: x.t() [4, 3]; out[i][j] = x.t()[idx[i][j]][j] = x[j][idx].
    Tensor g0 = x.t().gather(0, i64({1, 0, 3}, {1, 3}));
    expect_near_vec(host(g0), {2, 5, 12}, 0, 0, "gather dim 0 transposed");
  }
  Tensor x = f64(xv, {3, 4});
  x.requires_grad_();
  (tg::gather(x, 1, i64(iv, {2, 3})) * 2).sum().backward();  // repeated index 3 in row 0 adds up
  expect_near_vec(host(x.grad()), {2, 0, 0, 4, 0, 4, 2, 0, 0, 0, 0, 0}, 0, 0, "gather grad");
  expect_error([&] { tg::gather(x, 1, i64({4}, {1, 1})); }, {"gather", "out of range", "[4, 4]", "size 4"});
  expect_error([&] { tg::gather(x, 1, i64({0}, {1})); }, {"gather", "[1]", "[3, 4]"});
  expect_error([&] { tg::gather(x, 1, tg::zeros({1, 1}, opt(kInt32))); }, {"gather", "int64", "int32"});
  expect_error([&] { tg::gather(x, 0, i64({0, 0, 0, 0, 0}, {1, 5})); }, {"gather", "larger", "[1, 5]"});
}

TEST_P(IndexingOps, ScatterAndScatterAdd) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  std::vector<double> base = {1, 2, 3, 4, 5, 6, 7, 8};  // [2, 4]
  for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16, kInt64, kInt32}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor a = f64(base, {2, 4}).to(dt);
    Tensor idx = i64({3, 0, 1, 1}, {2, 2});
    Tensor src = f64({10, 20, 30, 40, 50, 60}, {2, 3}).to(dt);  // larger than index: only [:, :2] used
    // (no repeated index for the set form: which write wins is unspecified on CUDA)
    expect_near_vec(host(tg::scatter(a, 1, i64({3, 0, 1, 2}, {2, 2}), src)), {20, 2, 3, 10, 5, 40, 50, 8}, 0, 0,
                    "scatter");
    expect_near_vec(host(tg::scatter_add(a, 1, idx, src)), {21, 2, 3, 14, 5, 96, 7, 8}, 0, 0, "scatter_add");
    expect_near_vec(host(a.scatter(1, idx, -1)), {-1, 2, 3, -1, 5, -1, 7, 8}, 0, 0, "scatter value");
    // dim 0 into a transposed (non-contiguous) self
    Tensor at = a.t();  // [4, 2]
    Tensor r = at.scatter_add(0, i64({2, 2}, {1, 2}), src.slice(1, 0, 2));
    expect_near_vec(host(r), {1, 5, 2, 6, 13, 27, 4, 8}, 0, 0, "scatter_add dim 0");
  }
  // Gradients: scatter_add passes g to self, gathers it for src; scatter zeroes the overwritten.
  Tensor a = f64(base, {2, 4}), src = f64({10, 20, 30, 40}, {2, 2});
  a.requires_grad_();
  src.requires_grad_();
  Tensor w = f64({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  (tg::scatter(a, 1, i64({3, 0, 1, 1}, {2, 2}), src) * w).sum().backward();
  expect_near_vec(host(a.grad()), {0, 2, 3, 0, 5, 0, 7, 8}, 0, 0, "scatter grad self");
  expect_near_vec(host(src.grad()), {4, 1, 6, 6}, 0, 0, "scatter grad src");
  a.mutable_grad() = Tensor();
  src.mutable_grad() = Tensor();
  (tg::scatter_add(a, 1, i64({3, 0, 1, 1}, {2, 2}), src) * w).sum().backward();
  expect_near_vec(host(a.grad()), host(w), 0, 0, "scatter_add grad self");
  expect_near_vec(host(src.grad()), {4, 1, 6, 6}, 0, 0, "scatter_add grad src");
  expect_error(
      [&] {
        tg::scatter_add(a, 1, i64({0}, {1, 1}), f64({1}, {1, 1}).to(kFloat32));
      },
      {"scatter_add", "float32", "float64"});
  expect_error([&] { tg::scatter(a, 1, i64({-1}, {1, 1}), src); }, {"scatter", "out of range", "[-1, -1]"});
}

TEST_P(IndexingOps, ScatterAddManyDuplicatesMatchesHostSum) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const int64_t n = 5000, bins = 7;
  std::vector<int64_t> iv(n);
  std::vector<double> sv(n), want(bins, 0);
  for (int64_t i = 0; i < n; ++i) {
    iv[i] = (i * 31) % bins;
    sv[i] = static_cast<double>(i % 13) - 6;
    want[iv[i]] += sv[i];
  }
  Tensor out = tg::scatter_add(tg::zeros({bins}, opt(kFloat64)), 0, i64(iv, {n}), f64(sv, {n}));
  expect_near_vec(host(out), want, 1e-9, 0, "scatter_add f64");
  Tensor out32 = tg::scatter_add(tg::zeros({bins}, opt(kFloat32)), 0, i64(iv, {n}), f64(sv, {n}).to(kFloat32));
  expect_near_vec(host(out32), want, 1e-3, 0, "scatter_add f32");
  Tensor outi = tg::scatter_add(tg::zeros({bins}, opt(kInt64)), 0, i64(iv, {n}), f64(sv, {n}).to(kInt64));
  expect_near_vec(host(outi), want, 0, 0, "scatter_add int64");
}

TEST_P(IndexingOps, IndexAddPublic) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16, kInt64, kInt32}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor a = f64({1, 2, 3, 4, 5, 6}, {3, 2}).to(dt);
    Tensor src = f64({10, 20, 30, 40}, {2, 2}).to(dt);
    Tensor r = tg::index_add(a, 0, i64({2, 2}, {2}), src, 2);  // repeats add up
    expect_near_vec(host(r), {1, 2, 3, 4, 85, 126}, 0, 0, "index_add dim 0");
    Tensor r1 = a.index_add(1, i64({1}, {1}), f64({1, 1, 1}, {3, 1}).to(dt));
    expect_near_vec(host(r1), {1, 3, 3, 5, 5, 7}, 0, 0, "index_add dim 1");
  }
  Tensor a = f64({1, 2, 3, 4, 5, 6}, {3, 2}), src = f64({10, 20, 30, 40}, {2, 2});
  a.requires_grad_();
  src.requires_grad_();
  Tensor w = f64({1, 2, 3, 4, 5, 6}, {3, 2});
  (tg::index_add(a, 0, i64({2, 0}, {2}), src, 0.5) * w).sum().backward();
  expect_near_vec(host(a.grad()), host(w), 0, 0, "index_add grad self");
  expect_near_vec(host(src.grad()), {2.5, 3, 0.5, 1}, 0, 0, "index_add grad source");
  expect_error(
      [&] {
        tg::index_add(a, 0, i64({3}, {1}), f64({1, 1}, {1, 2}));
      },
      {"index_add", "out of range", "size 3"});
  expect_error([&] { tg::index_add(a, 0, i64({0}, {1}), f64({1, 1, 1}, {1, 3})); }, {"index_add", "[1, 3]", "[3, 2]"});
}

// ---- cumsum
TEST_P(IndexingOps, CumsumDimsDtypesAndGrad) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  std::vector<double> xv = {1, -2, 3, 0.5, 4, -1, 2, 2, 0.25, 1, 1, -3};  // [3, 4]
  for (DType dt : kAllFloat) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = f64(xv, {3, 4}).to(dt);
    Tensor c1 = x.cumsum(1), c0 = tg::cumsum(x, 0), ct = tg::cumsum(x.t(), 1);
    EXPECT_EQ(c1.dtype(), dt);
    std::vector<double> w1, w0(12);
    for (int r = 0; r < 3; ++r) {
      double s = 0;
      for (int c = 0; c < 4; ++c) w1.push_back(s += xv[r * 4 + c]);
    }
    for (int c = 0; c < 4; ++c) {
      double s = 0;
      for (int r = 0; r < 3; ++r) w0[r * 4 + c] = (s += xv[r * 4 + c]);
    }
    const double tol = dt == kBFloat16 ? 0.05 : dt == kFloat16 ? 5e-3 : 1e-6;
    expect_near_vec(host(c1), w1, tol, 0, "cumsum dim 1");
    expect_near_vec(host(c0), w0, tol, 0, "cumsum dim 0");
    expect_near_vec(host(ct), host(c0.t()), tol, 0, "cumsum of a transpose");
  }
  Tensor xi = i64({1, 2, 3, 4}, {4});
  EXPECT_EQ(tg::cumsum(xi, 0).dtype(), kInt64);
  expect_near_vec(host(tg::cumsum(xi.to(kInt32), 0)), {1, 3, 6, 10}, 0, 0, "cumsum int32");
  expect_near_vec(host(tg::cumsum(xi.gt(2), 0)), {0, 0, 1, 2}, 0, 0, "cumsum bool");
  // A long row (CUB device scan on CUDA) against a host sum.
  const int64_t n = 100000;
  std::vector<double> lv(n), lw(n);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) lw[i] = (s += (lv[i] = static_cast<double>(i % 7) - 3));
  expect_near_vec(host(tg::cumsum(f64(lv, {n}), 0)), lw, 1e-9, 0, "cumsum long f64");
  expect_near_vec(host(tg::cumsum(f64(lv, {1, n}).to(kFloat32), 1)), lw, 1e-3, 0, "cumsum long f32");
  // Gradient: reversed prefix sums of g.
  Tensor x = f64(xv, {3, 4});
  x.requires_grad_();
  (x.cumsum(1) * f64({1, 2, 3, 4}, {4})).sum().backward();
  std::vector<double> want;
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 4; ++c) want.push_back(c == 0 ? 10 : c == 1 ? 9 : c == 2 ? 7 : 4);
  expect_near_vec(host(x.grad()), want, 1e-12, 0, "cumsum grad");
  expect_error([&] { tg::cumsum(x, 2); }, {"cumsum", "2"});
}

// ---- sort / argsort / topk
TEST_P(IndexingOps, SortStableBothDirectionsEveryDtype) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  std::vector<double> xv = {3, 1, 2, 1, 5, 3, 0, -1, 2, 2, 7, 2};  // [2, 6] with ties
  for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16, kInt64, kInt32}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = f64(xv, {2, 6}).to(dt);
    auto [v, i] = tg::sort(x);
    EXPECT_EQ(v.dtype(), dt);
    EXPECT_EQ(i.dtype(), kInt64);
    expect_near_vec(host(v), {1, 1, 2, 3, 3, 5, -1, 0, 2, 2, 2, 7}, 0, 0, "sort values");
    expect_near_vec(host(i), {1, 3, 2, 0, 5, 4, 1, 0, 2, 3, 5, 4}, 0, 0, "sort indices (stable)");
    auto [vd, id] = x.sort(1, true);
    expect_near_vec(host(vd), {5, 3, 3, 2, 1, 1, 7, 2, 2, 2, 0, -1}, 0, 0, "sort descending");
    expect_near_vec(host(id), {4, 0, 5, 2, 1, 3, 4, 2, 3, 5, 0, 1}, 0, 0, "descending ties keep order");
    expect_near_vec(host(x.argsort(0)), {1, 1, 0, 0, 0, 1, 0, 0, 1, 1, 1, 0}, 0, 0, "argsort dim 0");
    // Non-contiguous: sort x^T along dim 0 == sort x along dim 1, transposed.
    auto [vt, it] = tg::sort(x.t(), 0);
    expect_near_vec(host(vt.t()), host(v), 0, 0, "sort transposed");
    expect_near_vec(host(it.t()), host(i), 0, 0, "sort transposed indices");
  }
  Tensor b = tg::tensor<bool>({true, false, true, false}, TensorOptions(kBool).device(dev()));
  auto [bv, bi] = tg::sort(b);
  expect_near_vec(host(bv), {0, 0, 1, 1}, 0, 0, "sort bool");
  expect_near_vec(host(bi), {1, 3, 0, 2}, 0, 0, "sort bool indices");
}

TEST_P(IndexingOps, SortLargeRowsAgainstStdSort) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const int64_t rows = 37, n = 1000;
  std::vector<double> xv(rows * n);
  for (size_t k = 0; k < xv.size(); ++k) xv[k] = static_cast<double>((k * 7919) % 1009) / 8.0;  // many ties
  Tensor x = f64(xv, {rows, n}).to(kFloat32);
  auto [v, i] = tg::sort(x, -1, true);
  std::vector<double> hv = host(v), hi = host(i);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> p(n);
    std::iota(p.begin(), p.end(), 0);
    std::stable_sort(p.begin(), p.end(), [&](int64_t a, int64_t b) { return xv[r * n + a] > xv[r * n + b]; });
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_EQ(hi[r * n + j], static_cast<double>(p[j])) << r << " " << j;
      ASSERT_EQ(hv[r * n + j], xv[r * n + p[j]]);
    }
  }
}

TEST_P(IndexingOps, SortNaNIsLargest) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  Tensor x = tg::tensor<float>({2.f, NAN, -1.f, 5.f}, opt());
  auto [v, i] = tg::sort(x);
  expect_near_vec(host(i), {2, 0, 3, 1}, 0, 0, "NaN last ascending");
  EXPECT_TRUE(std::isnan(host(v)[3]));
  expect_near_vec(host(tg::argsort(x, 0, true)), {1, 3, 0, 2}, 0, 0, "NaN first descending");
}

TEST_P(IndexingOps, TopkValuesIndicesAndGrad) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  std::vector<double> xv = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8};  // [2, 6]
  for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16, kInt64}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = f64(xv, {2, 6}).to(dt);
    auto [v, i] = tg::topk(x, 3);
    EXPECT_EQ(v.sizes(), Shape({2, 3}));
    expect_near_vec(host(v), {9, 5, 4, 8, 6, 5}, 0, 0, "topk values");
    expect_near_vec(host(i), {5, 4, 2, 5, 1, 2}, 0, 0, "topk indices");
    auto [vs, is] = x.topk(2, 1, false);
    expect_near_vec(host(vs), {1, 1, 2, 3}, 0, 0, "topk smallest");
    expect_near_vec(host(is), {1, 3, 0, 3}, 0, 0, "topk smallest indices");
    auto [v0, i0] = tg::topk(x, 1, 0);
    expect_near_vec(host(v0), {3, 6, 5, 3, 5, 9}, 0, 0, "topk dim 0");
    expect_near_vec(host(i0), {0, 1, 1, 1, 0, 0}, 0, 0, "topk dim 0 indices");
  }
  Tensor x = f64(xv, {2, 6});
  x.requires_grad_();
  auto [v, i] = tg::topk(x, 2);
  (v * f64({1, 10}, {2})).sum().backward();
  expect_near_vec(host(x.grad()), {0, 0, 0, 0, 10, 1, 0, 10, 0, 0, 0, 1}, 0, 0, "topk grad");
  Tensor y = f64({3, 1, 2}, {3});
  y.requires_grad_();
  (std::get<0>(tg::sort(y)) * f64({1, 2, 3}, {3})).sum().backward();
  expect_near_vec(host(y.grad()), {3, 1, 2}, 0, 0, "sort grad");
  expect_error([&] { tg::topk(x, 7); }, {"topk", "k = 7", "size 6", "[2, 6]"});
  expect_error([&] { tg::sort(x, 2); }, {"sort", "2"});
}

// uint8 / int8 / int16 (CUDA scatter_add: a CAS loop on the 32-bit word; cumsum into int64).
TEST_P(IndexingOps, SmallIntegerDtypes) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  for (DType dt : {kUInt8, kInt8, kInt16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor z = tg::zeros({5}, opt(dt));
    Tensor r = tg::scatter_add(z, 0, i64({0, 1, 0, 3, 0, 4, 4}, {7}), f64({1, 2, 3, 4, 5, 6, 7}, {7}).to(dt));
    EXPECT_EQ(r.dtype(), dt);
    expect_near_vec(host(r), {9, 2, 0, 4, 13}, 0, 0, "scatter_add");
    Tensor x = f64({3, 1, 2, 1}, {4}).to(dt);
    Tensor c = tg::cumsum(x, 0);
    EXPECT_EQ(c.dtype(), kInt64);
    expect_near_vec(host(c), {3, 4, 6, 7}, 0, 0, "cumsum");
    auto [v, i] = tg::sort(x);
    expect_near_vec(host(v), {1, 1, 2, 3}, 0, 0, "sort");
    expect_near_vec(host(i), {1, 3, 2, 0}, 0, 0, "sort indices");
    expect_near_vec(host(tg::gather(x, 0, i64({2, 0}, {2}))), {2, 3}, 0, 0, "gather");
    expect_near_vec(host(x.masked_fill(x.eq(1), 7)), {3, 7, 2, 7}, 0, 0, "masked_fill");
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, IndexingOps, ::testing::Values(Dev::CPU, Dev::CUDA), dev_name);

}  // namespace
}  // namespace tg::testing

namespace tg::testing {
namespace {

// CUDA against the CPU in float64 on larger, strided inputs (grid-stride loops, 3-d geometry,
// many rows, long rows): skipped without a GPU.
TEST(IndexingOpsCuda, MatchesCpuOnLargeInputs) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  tg::manual_seed(99);
  auto both = [](const Tensor& cpu) { return std::make_pair(cpu, cpu.to(Device(kCUDA))); };
  {  // gather / scatter_add over a permuted [33, 64, 17] input
    auto [x, xc] = both(tg::randn({64, 17, 33}, kFloat64).permute({2, 0, 1}));
    Tensor idx = (tg::rand({33, 50, 17}, kFloat64) * 64).to(kInt64);
    auto [i, ic] = both(idx);
    expect_near_vec(host(tg::gather(xc, 1, ic)), host(tg::gather(x, 1, i)), 0, 0, "gather 3-d");
    auto [s, sc] = both(tg::randn({33, 50, 17}, kFloat64));
    expect_near_vec(host(tg::scatter_add(xc, 1, ic, sc)), host(tg::scatter_add(x, 1, i, s)), 1e-12, 1e-12,
                    "scatter_add 3-d");
    for (DType dt : {kFloat32, kFloat16, kBFloat16}) {
      Tensor want = tg::scatter_add(x, 1, i, s);  // float64 reference; narrow atomics add in any order
      Tensor got = tg::scatter_add(xc.to(dt), 1, ic, sc.to(dt));
      const double tol = dt == kFloat32 ? 1e-4 : dt == kFloat16 ? 3e-2 : 2.5e-1;
      expect_near_vec(host(got), host(want), tol, tol, std::string("scatter_add ") + dtype_name(dt));
    }
  }
  {  // cumsum: many rows (block scan) and one long row (device scan), float32 and float16 in float
    auto [x, xc] = both(tg::rand({300, 1000}, kFloat64));
    for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16}) {
      Tensor in = xc.to(dt);
      std::vector<double> want = host(tg::cumsum(in.to(Device(kCPU), kFloat64), 1));
      const double tol = dt == kFloat64 ? 1e-9 : dt == kFloat32 ? 1e-3 : 2;  // half: the stored sums round
      expect_near_vec(host(tg::cumsum(in, 1)), want, tol, dt == kFloat16 || dt == kBFloat16 ? 1e-2 : 1e-6,
                      std::string("cumsum rows ") + dtype_name(dt));
    }
    auto [l, lc] = both(tg::rand({1 << 20}, kFloat64) - 0.5);
    expect_near_vec(host(tg::cumsum(lc, 0)), host(tg::cumsum(l, 0)), 1e-9, 1e-9, "cumsum long f64");
    expect_near_vec(host(tg::cumsum(lc.to(kFloat32), 0)), host(tg::cumsum(l, 0)), 2e-2, 1e-4, "cumsum long f32");
    auto [n, nc] = both((tg::rand({7, 3000}, kFloat64) * 10).to(kInt32));
    expect_near_vec(host(tg::cumsum(nc, 1)), host(tg::cumsum(n, 1)), 0, 0, "cumsum int32");
  }
  {  // sort / topk: stable, with ties, float16 / bfloat16 keys, a 50304-wide row
    auto [x, xc] = both((tg::rand({50, 4096}, kFloat64) * 300).to(kInt64).to(kFloat64));
    for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16, kInt64, kInt32}) {
      for (bool desc : {false, true}) {
        auto [v, i] = tg::sort(x.to(dt), 1, desc);
        auto [vc, ic] = tg::sort(xc.to(dt), 1, desc);
        expect_near_vec(host(vc), host(v), 0, 0, std::string("sort values ") + dtype_name(dt));
        expect_near_vec(host(ic), host(i), 0, 0, std::string("sort indices ") + dtype_name(dt));
      }
    }
    auto [w, wc] = both(tg::randn({8, 50304}, kFloat64));
    auto [tv, ti] = tg::topk(w.to(kBFloat16), 50);
    auto [tvc, tic] = tg::topk(wc.to(kBFloat16), 50);
    expect_near_vec(host(tvc), host(tv), 0, 0, "topk bf16 values");
    expect_near_vec(host(tic), host(ti), 0, 0, "topk bf16 indices");
  }
}

}  // namespace
}  // namespace tg::testing
