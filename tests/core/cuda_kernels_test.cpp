// The CUDA kernels (elementwise, reductions, random, index_select, arange) against
// float64 host references computed here, on contiguous, strided and broadcast inputs;
// reductions that split K over blocks also for identical bits from call to call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include <tapegrad/core/cuda.h>
#include <tapegrad/core/ops.h>
#include <tapegrad/core/tensor.h>

namespace {

#define TG_REQUIRE_CUDA() \
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

std::vector<double> host(const tg::Tensor& t) { return t.to(tg::kFloat64).cpu().contiguous().to_vector<double>(); }

// Row-major coordinates of flat index i in shape.
std::vector<int64_t> coords(int64_t i, const tg::Shape& shape) {
  std::vector<int64_t> c(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    c[d] = i % shape[d];
    i /= shape[d];
  }
  return c;
}
// Flat index into `shape` of broadcast coordinates c (trailing alignment, size-1 dims pinned).
int64_t bcast_index(const std::vector<int64_t>& c, const tg::Shape& shape) {
  int64_t idx = 0, off = static_cast<int64_t>(c.size()) - static_cast<int64_t>(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) idx = idx * shape[d] + (shape[d] == 1 ? 0 : c[d + off]);
  return idx;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rtol, double atol,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << what << " at " << i;
      continue;
    }
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::fabs(want[i])) << what << " at " << i;
  }
}

void check_binary(const tg::Tensor& a, const tg::Tensor& b, const tg::Tensor& out,
                  const std::function<double(double, double)>& ref, double rtol, double atol, const char* what) {
  auto ha = host(a), hb = host(b), ho = host(out);
  std::vector<double> want(ho.size());
  for (int64_t i = 0; i < out.numel(); ++i) {
    auto c = coords(i, out.sizes());
    want[i] = ref(ha[bcast_index(c, a.sizes())], hb[bcast_index(c, b.sizes())]);
  }
  expect_close(ho, want, rtol, atol, what);
}

void check_unary(const tg::Tensor& a, const tg::Tensor& out, const std::function<double(double)>& ref, double rtol,
                 double atol, const char* what) {
  auto ha = host(a), ho = host(out);
  std::vector<double> want(ha.size());
  for (size_t i = 0; i < ha.size(); ++i) want[i] = ref(ha[i]);
  expect_close(ho, want, rtol, atol, what);
}

TEST(CudaKernels, BinaryContiguousStridedBroadcast) {
  TG_REQUIRE_CUDA();
  tg::manual_seed(1);
  auto x = tg::randn({37, 129}, tg::kCUDA);
  auto y = tg::randn({37, 129}, tg::kCUDA);
  auto add = [](double a, double b) { return a + b; };
  auto mul = [](double a, double b) { return a * b; };
  check_binary(x, y, x + y, add, 1e-6, 1e-6, "add contiguous");
  check_binary(x, y, x * y, mul, 1e-6, 1e-6, "mul contiguous");
  check_binary(x, y, tg::maximum(x, y), [](double a, double b) { return std::max(a, b); }, 0, 0, "maximum");
  // Transposed / sliced operands take the strided path.
  auto xt = tg::randn({129, 37}, tg::kCUDA).t();
  check_binary(xt, y, xt - y, [](double a, double b) { return a - b; }, 1e-6, 1e-6, "sub transposed");
  auto xs = tg::randn({37, 300}, tg::kCUDA).slice(1, 3, 261, 2);
  check_binary(xs, y, xs * y, mul, 1e-6, 1e-6, "mul sliced");
  // Row vector and column vector broadcasts (the mean(0) / normalisation pattern).
  auto row = tg::randn({1, 129}, tg::kCUDA);
  auto col = tg::randn({37, 1}, tg::kCUDA).abs() + 0.5;
  check_binary(x, row, x - row, [](double a, double b) { return a - b; }, 1e-6, 1e-6, "row broadcast");
  check_binary(x, col, x / col, [](double a, double b) { return a / b; }, 1e-6, 1e-6, "col broadcast");
  auto big = tg::randn({4096, 64}, tg::kCUDA);
  auto brow = tg::randn({64}, tg::kCUDA);
  check_binary(big, brow, big - brow, [](double a, double b) { return a - b; }, 1e-6, 1e-6, "[4096,64] - [64]");
  // Odd sizes leave a tail after the vectorised part.
  auto odd = tg::randn({1001}, tg::kCUDA);
  check_binary(odd, odd, odd + odd, add, 1e-6, 1e-6, "tail");
}

TEST(CudaKernels, UnaryFloat32AndFloat64) {
  TG_REQUIRE_CUDA();
  tg::manual_seed(2);
  for (auto dt : {tg::kFloat32, tg::kFloat64}) {
    double tol = dt == tg::kFloat32 ? 2e-6 : 1e-13;
    auto x = tg::randn({1000}, tg::TensorOptions().dtype(dt).device(tg::kCUDA));
    auto p = x.abs() + 0.1;
    check_unary(x, x.exp(), [](double v) { return std::exp(v); }, tol, 0, "exp");
    check_unary(p, p.log(), [](double v) { return std::log(v); }, tol, tol, "log");
    check_unary(p, p.sqrt(), [](double v) { return std::sqrt(v); }, tol, 0, "sqrt");
    check_unary(x, x.tanh(), [](double v) { return std::tanh(v); }, tol, tol, "tanh");
    check_unary(x, x.sigmoid(), [](double v) { return 1 / (1 + std::exp(-v)); }, tol, tol, "sigmoid");
    check_unary(x, x.gelu(), [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }, tol, tol, "gelu");
    check_unary(x, x.relu(), [](double v) { return v > 0 ? v : 0; }, 0, 0, "relu");
    // The bounds are rounded to the tensor's dtype once (0.7f != 0.7): allow that one rounding.
    check_unary(x, x.clamp(-0.5, 0.7), [](double v) { return std::min(std::max(v, -0.5), 0.7); }, 1.2e-7, 0, "clamp");
    check_unary(p, p.pow(1.7), [](double v) { return std::pow(v, 1.7); }, 4 * tol, tol, "pow");
    check_unary(x, x * 3 + 1, [](double v) { return v * 3 + 1; }, tol, tol, "scalar ops");
  }
}

TEST(CudaKernels, HalfAndBFloat16) {
  TG_REQUIRE_CUDA();
  tg::manual_seed(3);
  for (auto dt : {tg::kFloat16, tg::kBFloat16}) {
    double tol = dt == tg::kFloat16 ? 1e-3 : 8e-3;  // one rounding of the float result
    auto x = tg::randn({513}, tg::kCUDA).to(dt);
    auto y = tg::randn({513}, tg::kCUDA).to(dt);
    check_binary(x, y, x + y, [](double a, double b) { return a + b; }, tol, tol, "half add");
    check_binary(x, y, x * y, [](double a, double b) { return a * b; }, tol, tol, "half mul");
    check_unary(x, x.exp(), [](double v) { return std::exp(v); }, tol, tol, "half exp");
    auto xt = tg::randn({27, 19}, tg::kCUDA).to(dt).t();
    check_unary(xt, xt.neg(), [](double v) { return -v; }, 0, 0, "half neg transposed");
  }
}

TEST(CudaKernels, IntegersComparisonsWhereCopy) {
  TG_REQUIRE_CUDA();
  auto a = tg::tensor(std::vector<int32_t>{1, -2, 3, -4, 5, 6, 7, -8}, tg::Shape{8}).cuda();
  auto b = tg::tensor(std::vector<int32_t>{2, 2, 2, 2, 2, 2, 2, 2}, tg::Shape{8}).cuda();
  EXPECT_EQ((a + b).cpu().to_vector<int32_t>(), (std::vector<int32_t>{3, 0, 5, -2, 7, 8, 9, -6}));
  EXPECT_EQ((a * b).cpu().to_vector<int32_t>(), (std::vector<int32_t>{2, -4, 6, -8, 10, 12, 14, -16}));
  EXPECT_EQ(a.abs().cpu().to_vector<int32_t>(), (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  auto gt = a.gt(b);
  EXPECT_EQ(gt.dtype(), tg::kBool);
  EXPECT_EQ(host(gt), (std::vector<double>{0, 0, 1, 0, 1, 1, 1, 0}));
  auto w = tg::where(gt, a, b);
  EXPECT_EQ(w.cpu().to_vector<int32_t>(), (std::vector<int32_t>{2, 2, 3, 2, 5, 6, 7, 2}));
  auto f = tg::tensor(std::vector<float>{-1.5f, 0.f, 2.7f, 1e6f}, tg::Shape{4}).cuda();
  EXPECT_EQ(f.to(tg::kInt64).cpu().to_vector<int64_t>(), (std::vector<int64_t>{-1, 0, 2, 1000000}));
  EXPECT_EQ(host(f.to(tg::kBool)), (std::vector<double>{1, 0, 1, 1}));
  EXPECT_EQ(host(f.to(tg::kFloat16)), (std::vector<double>{-1.5, 0, 2.69921875, INFINITY}));
  auto nan = tg::tensor(std::vector<float>{NAN, 1.f}, tg::Shape{2}).cuda();
  auto m = tg::maximum(nan, tg::tensor(std::vector<float>{0.f, NAN}, tg::Shape{2}).cuda());
  auto hm = host(m);
  EXPECT_TRUE(std::isnan(hm[0]) && std::isnan(hm[1]));
}

// Reference reduction of a host array of `shape` over `dims` (keepdim layout, row-major).
std::vector<double> ref_reduce(const std::vector<double>& x, const tg::Shape& shape, const std::vector<int64_t>& dims,
                               const std::function<double(const std::vector<double>&)>& f) {
  tg::Shape out_shape = shape;
  for (int64_t d : dims) out_shape[d] = 1;
  std::vector<std::vector<double>> groups(static_cast<size_t>(out_shape.numel()));
  for (int64_t i = 0; i < static_cast<int64_t>(x.size()); ++i) {
    auto c = coords(i, shape);
    for (int64_t d : dims) c[d] = 0;
    int64_t o = 0;
    for (size_t d = 0; d < shape.size(); ++d) o = o * out_shape[d] + c[d];
    groups[o].push_back(x[i]);
  }
  std::vector<double> r;
  for (auto& g : groups) r.push_back(f(g));
  return r;
}

double mean_of(const std::vector<double>& g) { return std::accumulate(g.begin(), g.end(), 0.0) / g.size(); }
double var_of(const std::vector<double>& g) {
  double m = mean_of(g), s = 0;
  for (double v : g) s += (v - m) * (v - m);
  return s / (g.size() - 1);
}

TEST(CudaKernels, ReductionsInnerOuterMiddleAll) {
  TG_REQUIRE_CUDA();
  tg::manual_seed(4);
  tg::Shape shape{6, 500, 7};
  auto x = tg::randn(shape, tg::kCUDA);
  auto hx = host(x);
  std::vector<std::vector<int64_t>> cases = {{2}, {0}, {1}, {0, 1, 2}, {0, 2}, {1, 2}};
  for (const auto& dims : cases) {
    std::string what = "dims";
    for (auto d : dims) what += " " + std::to_string(d);
    tg::DimList dl(dims);
    expect_close(host(x.sum(dl, true)), ref_reduce(hx, shape, dims, [](auto& g) { return std::accumulate(g.begin(), g.end(), 0.0); }),
                 1e-5, 1e-4, (what + " sum").c_str());
    expect_close(host(x.mean(dl, true)), ref_reduce(hx, shape, dims, mean_of), 1e-5, 1e-5, (what + " mean").c_str());
    expect_close(host(x.var(dl, true)), ref_reduce(hx, shape, dims, var_of), 1e-5, 1e-5, (what + " var").c_str());
    expect_close(host(x.std(dl, true)), ref_reduce(hx, shape, dims, [](auto& g) { return std::sqrt(var_of(g)); }), 1e-5,
                 1e-5, (what + " std").c_str());
    expect_close(host(x.max(dl, true)), ref_reduce(hx, shape, dims, [](auto& g) { return *std::max_element(g.begin(), g.end()); }),
                 0, 0, (what + " max").c_str());
    expect_close(host(x.min(dl, true)), ref_reduce(hx, shape, dims, [](auto& g) { return *std::min_element(g.begin(), g.end()); }),
                 0, 0, (what + " min").c_str());
  }
  // Non-contiguous input (permuted) and float64 / half.
  auto xp = x.permute({2, 0, 1});
  expect_close(host(xp.sum(1, true)), ref_reduce(host(xp), xp.sizes(), {1}, [](auto& g) { return std::accumulate(g.begin(), g.end(), 0.0); }),
               1e-5, 1e-4, "permuted sum");
  auto xd = x.to(tg::kFloat64);
  expect_close(host(xd.var(0, true)), ref_reduce(hx, shape, {0}, var_of), 1e-12, 1e-12, "float64 var");
  auto xh = x.to(tg::kFloat16);
  expect_close(host(xh.mean(1, true)), ref_reduce(host(xh), shape, {1}, mean_of), 2e-3, 2e-3, "half mean");
}

TEST(CudaKernels, LargeOuterReductionLikeNormalisation) {
  TG_REQUIRE_CUDA();
  tg::manual_seed(5);
  auto x = tg::rand({100000, 64}, tg::kCUDA);
  auto hx = host(x);
  tg::Shape shape{100000, 64};
  expect_close(host(x.mean(0, true)), ref_reduce(hx, shape, {0}, mean_of), 1e-5, 1e-6, "mean(0)");
  expect_close(host(x.std(0, true)), ref_reduce(hx, shape, {0}, [](auto& g) { return std::sqrt(var_of(g)); }), 1e-4,
               1e-6, "std(0)");
  auto s = x.sum();
  EXPECT_NEAR(s.item<double>(), std::accumulate(hx.begin(), hx.end(), 0.0), 1e-5 * hx.size());
}

// Reductions long enough to split K over many blocks (partials, then a finalize launch). x holds [A, K, B] (row-major) reduced over K; the
// float64 reference per (a, b): the sum, and the variance by two passes.
struct SplitRef {
  std::vector<double> sum, mean, var, max;
};
SplitRef split_ref(const std::vector<double>& x, int64_t A, int64_t K, int64_t B) {
  SplitRef r;
  r.sum.assign(static_cast<size_t>(A * B), 0.0);
  r.var.assign(r.sum.size(), 0.0);
  r.max.assign(r.sum.size(), -INFINITY);
  for (int64_t a = 0; a < A; ++a)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t b = 0; b < B; ++b) {
        const double v = x[static_cast<size_t>((a * K + k) * B + b)];
        r.sum[a * B + b] += v;
        r.max[a * B + b] = std::max(r.max[a * B + b], v);
      }
  for (double s : r.sum) r.mean.push_back(s / static_cast<double>(K));
  for (int64_t a = 0; a < A; ++a)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t b = 0; b < B; ++b) {
        const double d = x[static_cast<size_t>((a * K + k) * B + b)] - r.mean[a * B + b];
        r.var[a * B + b] += d * d;
      }
  for (double& v : r.var) v /= static_cast<double>(K - 1);
  return r;
}

// fn() five times: every result bit for bit the first one; returns it as float64.
std::vector<double> same_bits_each_call(const std::function<tg::Tensor()>& fn, const std::string& what) {
  const std::vector<double> first = host(fn());
  for (int i = 1; i < 5; ++i) {
    const std::vector<double> again = host(fn());
    EXPECT_TRUE(again.size() == first.size() &&
                std::memcmp(again.data(), first.data(), first.size() * sizeof(double)) == 0)
        << what << ": call " << i << " differs from the first";
  }
  return first;
}

// sum / mean / var / std (and max) of x viewed as [A, K, B] over K, each checked against the
// float64 reference and for identical bits across calls.
void check_split_reduction(const tg::Tensor& x, int64_t dim, int64_t A, int64_t K, int64_t B, double rtol, double atol,
                           double var_rtol, const std::string& what) {
  const SplitRef ref = split_ref(host(x), A, K, B);
  std::vector<double> sd;
  for (double v : ref.var) sd.push_back(std::sqrt(v));
  expect_close(same_bits_each_call([&] { return x.sum(dim); }, what + " sum"), ref.sum, rtol, atol,
               (what + " sum").c_str());
  // A float16 mean near 0 is subnormal: its spacing (6e-8) bounds the error, not rtol.
  const double mean_atol = atol / K + (x.dtype() == tg::kFloat16 ? 1e-7 : 0.0);
  expect_close(same_bits_each_call([&] { return x.mean(dim); }, what + " mean"), ref.mean, rtol, mean_atol,
               (what + " mean").c_str());
  expect_close(same_bits_each_call([&] { return x.var(dim); }, what + " var"), ref.var, var_rtol, var_rtol,
               (what + " var").c_str());
  expect_close(same_bits_each_call([&] { return x.std(dim); }, what + " std"), sd, var_rtol, var_rtol,
               (what + " std").c_str());
  expect_close(same_bits_each_call([&] { return x.max(dim); }, what + " max"), ref.max, 0, 0, (what + " max").c_str());
}

TEST(CudaKernels, SplitOuterReductionsFloat32AndHalf) {
  TG_REQUIRE_CUDA();
  tg::manual_seed(11);
  // [1M, 64] over dim 0: 16-byte loads, ~1000 chunks of one column tile (the standardize
  // workload), and smaller splits below.
  const int64_t n = int64_t{1} << 20;
  auto x = tg::randn({n, 64}, tg::kCUDA) * 2 + 0.5;
  check_split_reduction(x, 0, 1, n, 64, 1e-5, 1e-2, 1e-4, "f32 [1M, 64] dim 0");
  // float16 in and out (sums stay far below 65504 around mean 0): the output's rounding dominates.
  auto xh = tg::randn({n, 64}, tg::kCUDA).to(tg::kFloat16);
  check_split_reduction(xh, 0, 1, n, 64, 2e-3, 5e-2, 2e-3, "f16 [1M, 64] dim 0");
  // float64 (no 16-byte path) and float32 with 7 columns (4-byte loads).
  auto xd = tg::randn({200000, 64}, tg::kCUDA).to(tg::kFloat64) + 3;
  check_split_reduction(xd, 0, 1, 200000, 64, 1e-12, 1e-9, 1e-10, "f64 [200k, 64] dim 0");
  auto x7 = tg::randn({300000, 7}, tg::kCUDA) - 1;
  check_split_reduction(x7, 0, 1, 300000, 7, 1e-5, 1e-2, 1e-4, "f32 [300k, 7] dim 0");
}

TEST(CudaKernels, SplitMiddleReductionsManyTiles) {
  TG_REQUIRE_CUDA();
  tg::manual_seed(12);
  // Many column tiles, with 4-byte and 16-byte loads.
  auto x = tg::randn({300, 20000, 2}, tg::kCUDA) + 1;
  check_split_reduction(x, 1, 300, 20000, 2, 1e-5, 1e-3, 1e-4, "f32 [300, 20000, 2] dim 1");
  auto x8 = tg::randn({200, 10000, 8}, tg::kCUDA);
  check_split_reduction(x8, 1, 200, 10000, 8, 1e-5, 1e-3, 1e-4, "f32 [200, 10000, 8] dim 1");
  auto xh = tg::randn({200, 10000, 8}, tg::kCUDA).to(tg::kFloat16);
  check_split_reduction(xh, 1, 200, 10000, 8, 2e-3, 2e-2, 2e-3, "f16 [200, 10000, 8] dim 1");
}

TEST(CudaKernels, SplitInnerReductions) {
  TG_REQUIRE_CUDA();
  tg::manual_seed(13);
  // One long row (~4000 chunks), float32 and float16.
  const int64_t k = int64_t{1} << 22;
  auto row = tg::randn({1, k}, tg::kCUDA) * 3 + 2;
  check_split_reduction(row, 1, 1, k, 1, 1e-5, 1e-1, 1e-4, "f32 [1, 4M] dim 1");
  auto rowh = tg::randn({1, k}, tg::kCUDA).to(tg::kFloat16);
  check_split_reduction(rowh, 1, 1, k, 1, 2e-3, 1e-1, 2e-3, "f16 [1, 4M] dim 1");
  // Many rows, each split.
  auto rows = tg::randn({1000, 10000}, tg::kCUDA) - 0.25;
  check_split_reduction(rows, 1, 1000, 10000, 1, 1e-5, 1e-2, 1e-4, "f32 [1000, 10000] dim 1");
  auto rows100 = tg::randn({100, 20000}, tg::kCUDA);
  check_split_reduction(rows100, 1, 100, 20000, 1, 1e-5, 1e-2, 1e-4, "f32 [100, 20000] dim 1");
  // The whole tensor, and argmax over a long row (the first of equal maxima, as max_element).
  const std::vector<float> hr = row.cpu().to_vector<float>();
  double total = 0;
  for (float v : hr) total += v;
  const std::vector<double> all = same_bits_each_call([&] { return row.sum(); }, "sum of all");
  EXPECT_NEAR(all[0], total, 1e-5 * std::fabs(total) + 1e-1);
  const int64_t want = std::max_element(hr.begin(), hr.end()) - hr.begin();
  EXPECT_EQ(row.argmax(1).cpu().to_vector<int64_t>(), (std::vector<int64_t>{want}));
}

TEST(CudaKernels, ArgMaxAndEdgeCases) {
  TG_REQUIRE_CUDA();
  auto x = tg::tensor(std::vector<float>{1, 5, 5, 2, 7, 7, NAN, 3, 0}, tg::Shape{3, 3}).cuda();
  EXPECT_EQ(x.argmax(1).cpu().to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 0}));  // first max; NaN wins
  EXPECT_EQ(x.argmax(0).cpu().to_vector<int64_t>(), (std::vector<int64_t>{2, 1, 1}));
  EXPECT_EQ(x.argmax().item<int64_t>(), 6);
  auto one = tg::ones({1, 4}, tg::kCUDA);
  auto v = host(one.var(0));
  for (double e : v) EXPECT_TRUE(std::isnan(e));
  auto empty = tg::zeros({0, 3}, tg::kCUDA);
  EXPECT_EQ(host(empty.sum(0)), (std::vector<double>{0, 0, 0}));
  EXPECT_TRUE(std::isnan(host(empty.mean(0))[0]));
  EXPECT_THROW(empty.max(0), tg::Error);
}

TEST(CudaKernels, RandMatchesCpuBitwise) {
  TG_REQUIRE_CUDA();
  for (auto dt : {tg::kFloat32, tg::kFloat64}) {
    tg::manual_seed(42);
    auto c = tg::rand({1003}, tg::TensorOptions().dtype(dt));
    tg::manual_seed(42);
    auto g = tg::rand({1003}, tg::TensorOptions().dtype(dt).device(tg::kCUDA));
    if (dt == tg::kFloat32) EXPECT_EQ(c.to_vector<float>(), g.cpu().to_vector<float>());
    else EXPECT_EQ(c.to_vector<double>(), g.cpu().to_vector<double>());
  }
  tg::manual_seed(7);
  auto n = tg::randn({200000}, tg::kCUDA);
  double m = n.mean().item<double>(), s = n.std().item<double>();
  EXPECT_NEAR(m, 0.0, 0.01);
  EXPECT_NEAR(s, 1.0, 0.01);
}

TEST(CudaKernels, RandpermArangeIndexSelect) {
  TG_REQUIRE_CUDA();
  tg::manual_seed(8);
  for (auto dt : {tg::kInt64, tg::kInt32}) {
    auto p = host(tg::randperm(10007, tg::TensorOptions().dtype(dt).device(tg::kCUDA)));
    std::sort(p.begin(), p.end());
    for (size_t i = 0; i < p.size(); ++i) ASSERT_EQ(p[i], static_cast<double>(i));
  }
  auto ar = host(tg::arange(0.5, 5.5, 1.0, tg::TensorOptions().dtype(tg::kFloat32).device(tg::kCUDA)));
  EXPECT_EQ(ar, (std::vector<double>{0.5, 1.5, 2.5, 3.5, 4.5}));
  auto x = tg::randn({50, 64}, tg::kCUDA);
  auto idx = tg::tensor(std::vector<int64_t>{49, 0, 7, 7, 3}, tg::Shape{5}).cuda();
  auto hx = host(x), hs = host(x.index_select(0, idx));
  std::vector<int64_t> id = {49, 0, 7, 7, 3};
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 64; ++c) ASSERT_EQ(hs[r * 64 + c], hx[id[r] * 64 + c]);
  auto hs1 = host(x.t().index_select(1, idx.to(tg::kInt32)));  // strided input, dim 1
  for (int c = 0; c < 64; ++c)
    for (int r = 0; r < 5; ++r) ASSERT_EQ(hs1[c * 5 + r], hx[id[r] * 64 + c]);
}

}  // namespace
