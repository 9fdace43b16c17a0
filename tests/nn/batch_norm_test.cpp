// batch_norm / group_norm and BatchNorm1d / BatchNorm2d / GroupNorm (issue 17), on the CPU and on
// CUDA when present, against float64 references computed here on the host.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tests/autograd/common.h"

namespace tg::testing {
namespace {

namespace F = tg::nn::functional;

class BN : public ::testing::TestWithParam<Dev> {};
INSTANTIATE_TEST_SUITE_P(Devices, BN, ::testing::Values(Dev::CPU, Dev::CUDA), dev_name);

// x viewed as [n, c, s] (row-major): channel ch of sample i is x[(i * c + ch) * s + k].
struct Layout {
  int64_t n, c, s;
  size_t at(int64_t i, int64_t ch, int64_t k) const { return static_cast<size_t>((i * c + ch) * s + k); }
};

struct RefBN {
  std::vector<double> y, gx, gw, gb, rm, rv;
};

// batch_norm in float64. training: batch stats (biased for y, unbiased for the running update) and
// the backward through them for upstream gradient g; eval: the running stats, dx = g * w * rstd.
RefBN ref_batch_norm(const std::vector<double>& x, Layout L, const std::vector<double>& w, const std::vector<double>& b,
                     std::vector<double> rm, std::vector<double> rv, const std::vector<double>& g, bool training,
                     double momentum, double eps) {
  RefBN r;
  r.y.resize(x.size());
  r.gx.resize(x.size());
  r.gw.assign(L.c, 0);
  r.gb.assign(L.c, 0);
  const double m = static_cast<double>(L.n * L.s);
  for (int64_t ch = 0; ch < L.c; ++ch) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < L.n; ++i)
      for (int64_t k = 0; k < L.s; ++k) mean += x[L.at(i, ch, k)];
    mean /= m;
    for (int64_t i = 0; i < L.n; ++i)
      for (int64_t k = 0; k < L.s; ++k) var += (x[L.at(i, ch, k)] - mean) * (x[L.at(i, ch, k)] - mean);
    const double var_b = var / m, var_u = var / (m - 1);
    const double use_mean = training ? mean : rm[ch], use_var = training ? var_b : rv[ch];
    if (training && !rm.empty()) {
      rm[ch] = (1 - momentum) * rm[ch] + momentum * mean;
      rv[ch] = (1 - momentum) * rv[ch] + momentum * var_u;
    }
    const double rstd = 1 / std::sqrt(use_var + eps), wc = w.empty() ? 1 : w[ch], bc = b.empty() ? 0 : b[ch];
    double s1 = 0, s2 = 0;  // sum(g), sum(g * xhat)
    for (int64_t i = 0; i < L.n; ++i)
      for (int64_t k = 0; k < L.s; ++k) {
        const size_t j = L.at(i, ch, k);
        const double xh = (x[j] - use_mean) * rstd;
        r.y[j] = xh * wc + bc;
        s1 += g[j];
        s2 += g[j] * xh;
      }
    r.gw[ch] = s2;
    r.gb[ch] = s1;
    for (int64_t i = 0; i < L.n; ++i)
      for (int64_t k = 0; k < L.s; ++k) {
        const size_t j = L.at(i, ch, k);
        const double xh = (x[j] - use_mean) * rstd;
        r.gx[j] = training ? wc * rstd * (g[j] - s1 / m - xh * s2 / m) : wc * rstd * g[j];
      }
  }
  r.rm = std::move(rm);
  r.rv = std::move(rv);
  return r;
}

// group_norm forward in float64.
std::vector<double> ref_group_norm(const std::vector<double>& x, Layout L, int64_t groups, const std::vector<double>& w,
                                   const std::vector<double>& b, double eps) {
  std::vector<double> y(x.size());
  const int64_t cg = L.c / groups;
  for (int64_t i = 0; i < L.n; ++i)
    for (int64_t gi = 0; gi < groups; ++gi) {
      double mean = 0, var = 0;
      const double m = static_cast<double>(cg * L.s);
      for (int64_t ch = gi * cg; ch < (gi + 1) * cg; ++ch)
        for (int64_t k = 0; k < L.s; ++k) mean += x[L.at(i, ch, k)];
      mean /= m;
      for (int64_t ch = gi * cg; ch < (gi + 1) * cg; ++ch)
        for (int64_t k = 0; k < L.s; ++k) var += (x[L.at(i, ch, k)] - mean) * (x[L.at(i, ch, k)] - mean);
      const double rstd = 1 / std::sqrt(var / m + eps);
      for (int64_t ch = gi * cg; ch < (gi + 1) * cg; ++ch)
        for (int64_t k = 0; k < L.s; ++k) {
          const size_t j = L.at(i, ch, k);
          y[j] = (x[j] - mean) * rstd * (w.empty() ? 1 : w[ch]) + (b.empty() ? 0 : b[ch]);
        }
    }
  return y;
}

TensorOptions f64(Device d) { return TensorOptions(kFloat64).device(d); }

void check_batch_norm(Dev dev, bool training, const Shape& shape) {
  const Device d = to_device(dev);
  tg::manual_seed(11);
  const int64_t c = shape[1];
  int64_t s = 1;
  for (size_t i = 2; i < shape.size(); ++i) s *= shape[i];
  const Layout L{shape[0], c, s};
  Tensor x = (tg::randn(shape, f64(d)) * 3 + 1.5).detach().requires_grad_(true);
  Tensor w = tg::randn({c}, f64(d)).detach().requires_grad_(true);
  Tensor b = tg::randn({c}, f64(d)).detach().requires_grad_(true);
  Tensor rm = tg::randn({c}, f64(d)), rv = tg::rand({c}, f64(d)) + 0.5;
  Tensor g = tg::randn(shape, f64(d));
  RefBN ref = ref_batch_norm(host(x), L, host(w), host(b), host(rm), host(rv), host(g), training, 0.3, 1e-5);
  Tensor y = F::batch_norm(x, rm, rv, w, b, training, 0.3, 1e-5);
  ASSERT_EQ(y.sizes(), shape);
  y.backward(g);
  const std::string what = std::string("batch_norm ") + (training ? "train " : "eval ");
  expect_near_vec(host(y), ref.y, 1e-10, 1e-10, what + "y");
  expect_near_vec(host(rm), ref.rm, 1e-12, 1e-12, what + "running_mean");
  expect_near_vec(host(rv), ref.rv, 1e-12, 1e-12, what + "running_var");
  expect_near_vec(host(x.grad()), ref.gx, 1e-10, 1e-9, what + "grad x");
  expect_near_vec(host(w.grad()), ref.gw, 1e-10, 1e-10, what + "grad weight");
  expect_near_vec(host(b.grad()), ref.gb, 1e-10, 1e-10, what + "grad bias");
}

TEST_P(BN, TrainingMatchesReference) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  check_batch_norm(GetParam(), true, {4, 3, 2, 5});
  check_batch_norm(GetParam(), true, {6, 5});
  check_batch_norm(GetParam(), true, {2, 4, 7});
}

TEST_P(BN, EvalUsesRunningStats) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  check_batch_norm(GetParam(), false, {4, 3, 2, 5});
  check_batch_norm(GetParam(), false, {6, 5});
}

TEST_P(BN, NoRunningStatsUsesBatchStatsEvenInEval) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device d = to_device(GetParam());
  Tensor x = tg::randn({5, 3, 4}, f64(d));
  RefBN ref = ref_batch_norm(host(x), {5, 3, 4}, {}, {}, {}, {}, std::vector<double>(60, 0.0), true, 0.1, 1e-5);
  expect_near_vec(host(F::batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), false)), ref.y, 1e-10, 1e-10,
                  "batch_norm without running stats");
}

TEST_P(BN, GradcheckTrainAndEval) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device d = to_device(GetParam());
  tg::manual_seed(5);
  Tensor x = tg::randn({3, 2, 2, 3}, f64(d)).requires_grad_(true);
  Tensor w = tg::randn({2}, f64(d)).requires_grad_(true), b = tg::randn({2}, f64(d)).requires_grad_(true);
  Tensor rm = tg::randn({2}, f64(d)), rv = tg::rand({2}, f64(d)) + 0.5;
  for (bool training : {true, false}) {
    auto rep = tg::autograd::gradcheck(
        [&](const std::vector<Tensor>& in) {
          Tensor m = rm.clone(), v = rv.clone();  // each call starts from the same running stats
          return F::batch_norm(in[0], m, v, in[1], in[2], training, 0.1, 1e-3);
        },
        {x, w, b});
    EXPECT_TRUE(rep.ok) << (training ? "train: " : "eval: ") << rep;
  }
  // Without affine, and a 2-d input; through a non-contiguous view made inside fn.
  Tensor x2 = tg::randn({3, 6}, f64(d)).requires_grad_(true);
  auto rep = tg::autograd::gradcheck(
      [&](const std::vector<Tensor>& in) {
        return F::batch_norm(in[0].t(), Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-3);
      },
      {x2});
  EXPECT_TRUE(rep.ok) << rep;
}

TEST_P(BN, NonContiguousInput) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device d = to_device(GetParam());
  Tensor base = tg::randn({5, 4, 3}, f64(d));
  Tensor x = base.permute({2, 1, 0});  // [3, 4, 5], not contiguous
  ASSERT_FALSE(x.is_contiguous());
  Tensor w = tg::randn({4}, f64(d)), b = tg::randn({4}, f64(d));
  Tensor rm = tg::zeros({4}, f64(d)), rv = tg::ones({4}, f64(d));
  const auto xs = host(x);
  RefBN ref = ref_batch_norm(xs, {3, 4, 5}, host(w), host(b), host(rm), host(rv), std::vector<double>(60, 0.0), true,
                             0.1, 1e-5);
  Tensor y = F::batch_norm(x, rm, rv, w, b, true);
  EXPECT_TRUE(y.is_contiguous());
  expect_near_vec(host(y), ref.y, 1e-10, 1e-10, "batch_norm of a permuted input");
  expect_near_vec(host(rm), ref.rm, 1e-12, 1e-12, "running_mean from a permuted input");
  // Running stats that are themselves strided views are updated in place.
  Tensor stats = tg::zeros({4, 2}, f64(d));
  Tensor m = stats.select(1, 0), v = stats.select(1, 1);
  v.fill_(1);
  F::batch_norm(x, m, v, w, b, true);
  expect_near_vec(host(m), ref.rm, 1e-12, 1e-12, "strided running_mean");
  expect_near_vec(host(v), ref.rv, 1e-12, 1e-12, "strided running_var");
}

TEST_P(BN, HalfPrecisionWithinTolerance) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device d = to_device(GetParam());
  tg::manual_seed(9);
  for (DType dt : {kFloat16, kBFloat16}) {
    Tensor x = (tg::randn({8, 3, 4, 4}, f64(d)) * 2 + 1).to(dt).detach().requires_grad_(true);
    // Float32 parameters and running stats with a reduced input, as a BatchNorm2d under autocast.
    Tensor w = tg::randn({3}, TensorOptions(kFloat32).device(d)).requires_grad_(true);
    Tensor b = tg::randn({3}, TensorOptions(kFloat32).device(d)).requires_grad_(true);
    Tensor rm = tg::zeros({3}, TensorOptions(kFloat32).device(d)),
           rv = tg::ones({3}, TensorOptions(kFloat32).device(d));
    Tensor g = tg::randn({8, 3, 4, 4}, f64(d)).to(dt);
    RefBN ref = ref_batch_norm(host(x), {8, 3, 16}, host(w), host(b), host(rm), host(rv), host(g), true, 0.1, 1e-5);
    Tensor y = F::batch_norm(x, rm, rv, w, b, true);
    ASSERT_EQ(y.dtype(), dt);
    EXPECT_EQ(rm.dtype(), kFloat32);
    y.backward(g);
    ASSERT_EQ(x.grad().dtype(), dt);
    const double tol = dt == kFloat16 ? 4e-3 : 3e-2;  // one rounding of the output / grad
    const std::string what = std::string("batch_norm ") + dtype_name(dt);
    expect_near_vec(host(y), ref.y, tol, tol, what + " y");
    expect_near_vec(host(rm), ref.rm, 1e-5, 1e-5, what + " running_mean");
    expect_near_vec(host(rv), ref.rv, 1e-5, 1e-5, what + " running_var");
    expect_near_vec(host(x.grad()), ref.gx, tol * 2, tol * 2, what + " grad x");
    expect_near_vec(host(w.grad()), ref.gw, 1e-3 * 128, 1e-3, what + " grad weight");
    expect_near_vec(host(b.grad()), ref.gb, 1e-3 * 128, 1e-3, what + " grad bias");
  }
}

// Many elements per channel (the CUDA block loops several times) and many channels, float32.
TEST_P(BN, LargerShapesFloat32) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device d = to_device(GetParam());
  tg::manual_seed(17);
  for (const Shape& shape : {Shape{16, 5, 33, 17}, Shape{4, 300, 3}}) {
    const int64_t c = shape[1], s = shape.numel() / (shape[0] * c);
    Tensor x = (tg::randn(shape, f64(d)) * 2 + 3).to(kFloat32).detach().requires_grad_(true);
    Tensor w = tg::randn({c}, TensorOptions(kFloat32).device(d)).requires_grad_(true);
    Tensor b = tg::randn({c}, TensorOptions(kFloat32).device(d)).requires_grad_(true);
    Tensor rm = tg::zeros({c}, TensorOptions(kFloat32).device(d)),
           rv = tg::ones({c}, TensorOptions(kFloat32).device(d));
    Tensor g = tg::randn(shape, f64(d)).to(kFloat32);
    RefBN ref =
        ref_batch_norm(host(x), {shape[0], c, s}, host(w), host(b), host(rm), host(rv), host(g), true, 0.1, 1e-5);
    Tensor y = F::batch_norm(x, rm, rv, w, b, true);
    y.backward(g);
    const double sum_tol = 1e-5 * std::sqrt(static_cast<double>(shape[0] * s)) * 4;
    expect_near_vec(host(y), ref.y, 1e-4, 1e-4, "float32 y");
    expect_near_vec(host(rm), ref.rm, 1e-5, 1e-5, "float32 running_mean");
    expect_near_vec(host(rv), ref.rv, 1e-5, 1e-5, "float32 running_var");
    expect_near_vec(host(x.grad()), ref.gx, 1e-4, 1e-4, "float32 grad x");
    expect_near_vec(host(w.grad()), ref.gw, sum_tol, 1e-4, "float32 grad weight");
    expect_near_vec(host(b.grad()), ref.gb, sum_tol, 1e-4, "float32 grad bias");
  }
}

TEST_P(BN, GroupNormMatchesReferenceAndGradcheck) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device d = to_device(GetParam());
  tg::manual_seed(13);
  Tensor x = tg::randn({3, 6, 2, 3}, f64(d)) * 2 + 1, w = tg::randn({6}, f64(d)), b = tg::randn({6}, f64(d));
  for (int64_t groups : {1, 2, 3, 6}) {
    auto ref = ref_group_norm(host(x), {3, 6, 6}, groups, host(w), host(b), 1e-5);
    expect_near_vec(host(F::group_norm(x, groups, w, b)), ref, 1e-10, 1e-10,
                    "group_norm groups=" + std::to_string(groups));
  }
  Tensor xt = x.transpose(2, 3);  // non-contiguous
  auto ref = ref_group_norm(host(xt), {3, 6, 6}, 3, {}, {}, 1e-5);
  expect_near_vec(host(F::group_norm(xt, 3)), ref, 1e-10, 1e-10, "group_norm of a transposed input");
  auto rep = tg::autograd::gradcheck(
      [&](const std::vector<Tensor>& in) { return F::group_norm(in[0], 2, in[1], in[2], 1e-3); },
      {tg::randn({2, 4, 3}, f64(d)).requires_grad_(true), w.slice(0, 0, 4).clone().requires_grad_(true),
       b.slice(0, 0, 4).clone().requires_grad_(true)});
  EXPECT_TRUE(rep.ok) << rep;
  // float16: computed in float32, returned in float16.
  Tensor xh = x.to(kFloat16);
  Tensor yh = F::group_norm(xh, 3, w.to(kFloat32), b.to(kFloat32));
  ASSERT_EQ(yh.dtype(), kFloat16);
  expect_near_vec(host(yh), ref_group_norm(host(xh), {3, 6, 6}, 3, host(w), host(b), 1e-5), 1e-2, 4e-3,
                  "group_norm float16");
}

// ---- channels-last (NHWC) inputs keep their layout and give the row-major values.

Shape nhwc_strides(const Shape& s) { return {s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]}; }

struct BNRun {
  Tensor y, rm, rv, gx, gw, gb;
};

// batch_norm forward + backward of x (any layout) with upstream g, fresh copies of the parameters
// and running stats.
// relu: then ReLU, fused (batch_norm_relu) or as the separate op.
enum class Relu { None, Fused, Separate };
BNRun run_batch_norm(const Tensor& x_in, const Tensor& g, const Tensor& w, const Tensor& b, const Tensor& rm,
                     const Tensor& rv, bool training, Relu relu = Relu::None) {
  BNRun r;
  Tensor x = x_in.detach().requires_grad_(true);
  Tensor wc = w.clone().requires_grad_(true), bc = b.clone().requires_grad_(true);
  r.rm = rm.clone();
  r.rv = rv.clone();
  if (relu == Relu::Fused)
    r.y = F::batch_norm_relu(x, r.rm, r.rv, wc, bc, training, 0.3, 1e-5);
  else if (relu == Relu::Separate)
    r.y = tg::relu(F::batch_norm(x, r.rm, r.rv, wc, bc, training, 0.3, 1e-5));
  else
    r.y = F::batch_norm(x, r.rm, r.rv, wc, bc, training, 0.3, 1e-5);
  // autograd::grad: the gradients as the node returns them (a leaf's .grad() is made row-major).
  std::vector<Tensor> gs = tg::autograd::grad({r.y}, {x, wc, bc}, {g});
  r.gx = gs[0];
  r.gw = gs[1];
  r.gb = gs[2];
  return r;
}

// Every output and gradient equal (each element widened to double exactly: equal values are equal bits
// but for the sign of zero).
void expect_same_values(const BNRun& a, const BNRun& b) {
  EXPECT_EQ(host(a.y), host(b.y));
  EXPECT_EQ(host(a.rm), host(b.rm));
  EXPECT_EQ(host(a.rv), host(b.rv));
  EXPECT_EQ(host(a.gx), host(b.gx));
  EXPECT_EQ(host(a.gw), host(b.gw));
  EXPECT_EQ(host(a.gb), host(b.gb));
}

void expect_same_run(const BNRun& got, const BNRun& want, double tol, const std::string& what) {
  expect_near_vec(host(got.y), host(want.y), tol, tol, what + " y");
  expect_near_vec(host(got.rm), host(want.rm), tol, tol, what + " running_mean");
  expect_near_vec(host(got.rv), host(want.rv), tol, tol, what + " running_var");
  expect_near_vec(host(got.gx), host(want.gx), tol, tol, what + " grad x");
  expect_near_vec(host(got.gw), host(want.gw), tol, tol, what + " grad weight");
  expect_near_vec(host(got.gb), host(want.gb), tol, tol, what + " grad bias");
}

// x as channels-last (and g in either layout) against the row-major x, float64, train and eval:
// the same values to 1e-12; y (and the training dx) channels-last, and not row-major unless NHWC
// is also row-major ([N, C, 1, 1]).
TEST_P(BN, ChannelsLastMatchesRowMajorAndKeepsLayout) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device d = to_device(GetParam());
  tg::manual_seed(31);
  for (const Shape& shape :
       {Shape{4, 3, 5, 6}, Shape{8, 40, 3, 2}, Shape{6, 3, 1, 1}, Shape{5, 7, 1, 4}, Shape{3, 33, 2, 9}}) {
    const int64_t c = shape[1];
    Tensor x = tg::randn(shape, f64(d)) * 3 + 1.5, g = tg::randn(shape, f64(d));
    Tensor w = tg::randn({c}, f64(d)), b = tg::randn({c}, f64(d));
    Tensor rm = tg::randn({c}, f64(d)), rv = tg::rand({c}, f64(d)) + 0.5;
    Tensor xcl = x.contiguous(MemoryFormat::ChannelsLast);
    ASSERT_TRUE(xcl.is_contiguous(MemoryFormat::ChannelsLast));
    const bool also_row_major = xcl.is_contiguous();  // [N, C, 1, 1]
    for (bool training : {true, false})
      for (bool g_cl : {true, false}) {
        const std::string what = "shape " + ::testing::PrintToString(shape) + (training ? " train" : " eval") +
                                 (g_cl ? " g channels-last" : " g row-major");
        BNRun want = run_batch_norm(x, g, w, b, rm, rv, training);
        BNRun got = run_batch_norm(xcl, g_cl ? g.contiguous(MemoryFormat::ChannelsLast) : g, w, b, rm, rv, training);
        EXPECT_TRUE(want.y.is_contiguous()) << what;
        EXPECT_TRUE(got.y.is_contiguous(MemoryFormat::ChannelsLast)) << what << " " << got.y.strides();
        // eval's dx is g * scale (broadcast ops): g's layout.
        if (training || g_cl)
          EXPECT_TRUE(got.gx.is_contiguous(MemoryFormat::ChannelsLast)) << what << " " << got.gx.strides();
        if (!also_row_major) {
          EXPECT_FALSE(got.y.is_contiguous()) << what;
          EXPECT_EQ(got.y.strides(), nhwc_strides(shape)) << what;
        }
        expect_same_run(got, want, 1e-12, what);
      }
  }
}

TEST_P(BN, ChannelsLastModuleTrainThenEval) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device d = to_device(GetParam());
  tg::manual_seed(32);
  tg::nn::BatchNorm2d a(40, {}, f64(d)), bcl(40, {}, f64(d));
  for (int step = 0; step < 2; ++step) {
    Tensor x = tg::randn({4, 40, 3, 5}, f64(d)) + step;
    Tensor ya = a(x), yb = bcl(x.contiguous(MemoryFormat::ChannelsLast));
    EXPECT_TRUE(yb.is_contiguous(MemoryFormat::ChannelsLast) && !yb.is_contiguous());
    expect_near_vec(host(yb), host(ya), 1e-12, 1e-12, "BatchNorm2d channels-last train y");
  }
  expect_near_vec(host(bcl.running_mean), host(a.running_mean), 1e-12, 1e-12, "running_mean");
  expect_near_vec(host(bcl.running_var), host(a.running_var), 1e-12, 1e-12, "running_var");
  a.eval();
  bcl.eval();
  Tensor x = tg::randn({2, 40, 3, 5}, f64(d));
  Tensor ya = a(x), yb = bcl(x.contiguous(MemoryFormat::ChannelsLast));
  EXPECT_TRUE(yb.is_contiguous(MemoryFormat::ChannelsLast) && !yb.is_contiguous());
  expect_near_vec(host(yb), host(ya), 1e-12, 1e-12, "BatchNorm2d channels-last eval y");
  // float32 eval (a cast back to the input's dtype) keeps the layout too.
  tg::nn::BatchNorm2d h(40, {}, TensorOptions(kFloat32).device(d));
  h.eval();
  Tensor yh = h(x.to(kFloat16).contiguous(MemoryFormat::ChannelsLast));
  EXPECT_EQ(yh.dtype(), kFloat16);
  EXPECT_TRUE(yh.is_contiguous(MemoryFormat::ChannelsLast) && !yh.is_contiguous());
}

TEST_P(BN, GradcheckChannelsLast) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device d = to_device(GetParam());
  tg::manual_seed(33);
  Tensor x = tg::randn({3, 5, 2, 3}, f64(d)).requires_grad_(true);
  Tensor w = tg::randn({5}, f64(d)).requires_grad_(true), b = tg::randn({5}, f64(d)).requires_grad_(true);
  Tensor rm = tg::randn({5}, f64(d)), rv = tg::rand({5}, f64(d)) + 0.5;
  for (bool training : {true, false}) {
    auto rep = tg::autograd::gradcheck(
        [&](const std::vector<Tensor>& in) {
          Tensor m = rm.clone(), v = rv.clone();
          Tensor xcl = in[0].contiguous(MemoryFormat::ChannelsLast);
          Tensor y = F::batch_norm(xcl, m, v, in[1], in[2], training, 0.1, 1e-3);
          TG_CHECK(y.is_contiguous(MemoryFormat::ChannelsLast) && !y.is_contiguous(), "layout lost");
          return y * y;  // a non-uniform upstream gradient, in y's layout
        },
        {x, w, b});
    EXPECT_TRUE(rep.ok) << (training ? "train: " : "eval: ") << rep;
  }
}

// ---- batch_norm + ReLU fused (batch_norm_relu, BatchNormReLU2d)

// The fused op gives the same bits as batch_norm then relu (the clamp commutes with the rounding
// to the output dtype; backward masks the same values before the same sums), in every dtype and
// layout, training and eval; in float64 both match the host reference with the gradient masked
// by y > 0.
TEST_P(BN, ReluFusedEqualsBatchNormThenRelu) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device d = to_device(GetParam());
  const std::vector<DType> dtypes = GetParam() == Dev::CUDA
                                        ? std::vector<DType>{kFloat64, kFloat32, kFloat16, kBFloat16}
                                        : std::vector<DType>{kFloat64, kFloat32, kBFloat16};
  for (const Shape& shape : {Shape{6, 8, 5, 3}, Shape{16, 32, 4, 4}, Shape{5, 3}})
    for (bool channels_last : {false, true}) {
      if (channels_last && shape.size() != 4) continue;
      for (DType dt : dtypes) {
        const int64_t c = shape[1];
        tg::manual_seed(61);
        Tensor x = (tg::randn(shape, f64(kCPU)) * 2 + 0.3).to(dt), g = tg::randn(shape, f64(kCPU)).to(dt);
        const TensorOptions po = TensorOptions(dt == kFloat64 ? kFloat64 : kFloat32);
        Tensor w = tg::randn({c}, po), b = tg::randn({c}, po);
        Tensor rm = tg::randn({c}, po), rv = tg::rand({c}, po) + 0.5;
        auto on = [&](const Tensor& t) {
          Tensor v = t.to(d);
          return channels_last ? v.contiguous(MemoryFormat::ChannelsLast) : v;
        };
        for (bool training : {true, false}) {
          SCOPED_TRACE(::testing::PrintToString(shape) + (channels_last ? " NHWC " : " NCHW ") +
                       std::string(dtype_name(dt)) + (training ? " train" : " eval"));
          BNRun fused = run_batch_norm(on(x), on(g), w.to(d), b.to(d), rm.to(d), rv.to(d), training, Relu::Fused);
          BNRun sep = run_batch_norm(on(x), on(g), w.to(d), b.to(d), rm.to(d), rv.to(d), training, Relu::Separate);
          if (channels_last) EXPECT_TRUE(fused.y.is_contiguous(MemoryFormat::ChannelsLast));
          expect_same_values(fused, sep);
          if (dt != kFloat64) continue;
          int64_t s = 1;
          for (size_t i = 2; i < shape.size(); ++i) s *= shape[i];
          const Layout L{shape[0], c, s};
          RefBN ref = ref_batch_norm(host(x), L, host(w), host(b), host(rm), host(rv), host(g), training, 0.3, 1e-5);
          std::vector<double> y = ref.y, gm = host(g);
          for (size_t i = 0; i < y.size(); ++i) {
            if (y[i] <= 0) gm[i] = 0;
            y[i] = std::max(y[i], 0.0);
          }
          RefBN refg = ref_batch_norm(host(x), L, host(w), host(b), host(rm), host(rv), gm, training, 0.3, 1e-5);
          expect_near_vec(host(fused.y), y, 1e-10, 1e-10, "relu y");
          expect_near_vec(host(fused.gx), refg.gx, 1e-10, 1e-9, "relu grad x");
          expect_near_vec(host(fused.gw), refg.gw, 1e-10, 1e-10, "relu grad weight");
          expect_near_vec(host(fused.gb), refg.gb, 1e-10, 1e-10, "relu grad bias");
        }
      }
    }
}

TEST_P(BN, ReluFusedGradcheckAndGradgradcheck) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device d = to_device(GetParam());
  tg::manual_seed(62);
  Tensor x = (tg::randn({3, 4, 2, 3}, f64(d)) + 0.2).requires_grad_(true);
  Tensor w = tg::randn({4}, f64(d)).requires_grad_(true), b = tg::randn({4}, f64(d)).requires_grad_(true);
  for (bool channels_last : {false, true}) {
    auto fn = [&](const std::vector<Tensor>& in) {
      Tensor xi = channels_last ? in[0].contiguous(MemoryFormat::ChannelsLast) : in[0];
      Tensor y = F::batch_norm_relu(xi, Tensor(), Tensor(), in[1], in[2], true, 0.1, 1e-3);
      return y * y;  // a non-uniform upstream gradient
    };
    auto rep = tg::autograd::gradcheck(fn, {x, w, b});
    EXPECT_TRUE(rep.ok) << (channels_last ? "NHWC: " : "NCHW: ") << rep;
    auto rep2 = tg::autograd::gradgradcheck(fn, {x, w, b});
    EXPECT_TRUE(rep2.ok) << (channels_last ? "NHWC gradgrad: " : "NCHW gradgrad: ") << rep2;
  }
}

TEST_P(BN, BatchNormReLU2dModuleIsBatchNorm2dThenRelu) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device d = to_device(GetParam());
  tg::nn::BatchNorm2d bn(5, {.momentum = 0.2}, f64(d));
  tg::nn::BatchNormReLU2d bnr(5, {.momentum = 0.2}, f64(d));
  EXPECT_EQ(bnr.state_dict().keys(), bn.state_dict().keys());
  EXPECT_EQ(bnr.name(), "BatchNormReLU2d");
  tg::manual_seed(63);
  for (int step = 0; step < 2; ++step) {
    Tensor x = tg::randn({4, 5, 3, 3}, f64(d)) + step;
    EXPECT_EQ(host(bnr(x)), host(tg::relu(bn(x))));
    EXPECT_EQ(host(bnr.running_mean), host(bn.running_mean));
    EXPECT_EQ(host(bnr.running_var), host(bn.running_var));
  }
  EXPECT_EQ(bnr.num_batches_tracked.item<int64_t>(), 2);
  bn.eval();
  bnr.eval();
  Tensor x = tg::randn({2, 5, 3, 3}, f64(d));
  EXPECT_EQ(host(bnr(x)), host(tg::relu(bn(x))));
  EXPECT_THROW(bnr(tg::randn({2, 5}, f64(d))), Error);  // BatchNorm2d's 4-d check
}

// ---- CUDA kernels against the CPU float64 reference; run-to-run bits; graph capture.

struct CudaCase {
  Shape shape;
  bool channels_last;
};

// The CUDA result for x in dtype dt against the CPU float64 result from the same (rounded) input.
void check_cuda_against_cpu(const CudaCase& k, DType dt, double tol, double sum_rtol) {
  const Shape& shape = k.shape;
  const int64_t c = shape[1];
  const std::string what =
      ::testing::PrintToString(shape) + (k.channels_last ? " NHWC " : " NCHW ") + std::string(dtype_name(dt));
  tg::manual_seed(41);
  Tensor x = (tg::randn(shape, f64(kCPU)) * 2 + 1).to(dt), g = tg::randn(shape, f64(kCPU)).to(dt);
  const TensorOptions po = TensorOptions(dt == kFloat64 ? kFloat64 : kFloat32);
  Tensor w = tg::randn({c}, po), b = tg::randn({c}, po);
  Tensor rm = tg::randn({c}, po), rv = tg::rand({c}, po) + 0.5;
  auto layout = [&](const Tensor& t) { return k.channels_last ? t.contiguous(MemoryFormat::ChannelsLast) : t; };
  for (bool training : {true, false}) {
    SCOPED_TRACE(what + (training ? " train" : " eval"));
    BNRun want = run_batch_norm(x.to(kFloat64), g.to(kFloat64), w.to(kFloat64), b.to(kFloat64), rm.to(kFloat64),
                                rv.to(kFloat64), training);
    BNRun got = run_batch_norm(layout(x.to(kCUDA)), layout(g.to(kCUDA)), w.to(kCUDA), b.to(kCUDA), rm.to(kCUDA),
                               rv.to(kCUDA), training);
    ASSERT_EQ(got.y.dtype(), dt);
    if (k.channels_last) {
      EXPECT_TRUE(got.y.is_contiguous(MemoryFormat::ChannelsLast));
      EXPECT_TRUE(got.gx.is_contiguous(MemoryFormat::ChannelsLast));
    }
    const double count = static_cast<double>(shape.numel() / c);
    expect_near_vec(host(got.y), host(want.y), tol, tol, "y");
    expect_near_vec(host(got.rm), host(want.rm), sum_rtol, sum_rtol, "running_mean");
    expect_near_vec(host(got.rv), host(want.rv), sum_rtol, sum_rtol, "running_var");
    expect_near_vec(host(got.gx), host(want.gx), 2 * tol, 2 * tol, "grad x");
    // Sums of `count` terms of magnitude ~1: absolute error grows like sqrt(count).
    expect_near_vec(host(got.gw), host(want.gw), sum_rtol * std::sqrt(count) * 4, sum_rtol, "grad weight");
    expect_near_vec(host(got.gb), host(want.gb), sum_rtol * std::sqrt(count) * 4, sum_rtol, "grad bias");
  }
}

const std::vector<CudaCase>& cuda_cases() {
  static const std::vector<CudaCase> cases{
      {{64, 40, 33, 17}, false}, {{64, 40, 33, 17}, true}, {{512, 64, 16, 16}, true}, {{2, 3, 1, 1}, false},
      {{2, 3, 1, 1}, true},      {{3, 5, 1, 7}, true},     {{257, 70}, false},        {{4, 300, 3}, false}};
  return cases;
}

// float64: both layouts agree with the CPU to rounding; float32: 1e-4 (outputs of magnitude ~3);
// float16 / bfloat16: one rounding of the output (2^-11, 2^-8 relative, values up to ~4).
TEST(BatchNormCuda, MatchesCpuFloat64BothLayouts) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const CudaCase& k : cuda_cases()) check_cuda_against_cpu(k, kFloat64, 1e-10, 1e-12);
}

TEST(BatchNormCuda, MatchesCpuReducedPrecisions) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const CudaCase& k : cuda_cases()) {
    check_cuda_against_cpu(k, kFloat32, 1e-4, 1e-5);
    check_cuda_against_cpu(k, kFloat16, 4e-3, 1e-5);
    check_cuda_against_cpu(k, kBFloat16, 3e-2, 1e-5);
  }
}

// Fixed partition and combination order: two runs give the same bits (several splits per channel).
TEST(BatchNormCuda, RunToRunBitIdentical) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const CudaCase& k : {CudaCase{{512, 64, 16, 16}, true}, CudaCase{{64, 40, 33, 17}, false}})
    for (DType dt : {kFloat32, kFloat16}) {
      SCOPED_TRACE(::testing::PrintToString(k.shape) + " " + dtype_name(dt));
      const int64_t c = k.shape[1];
      tg::manual_seed(43);
      Tensor x = tg::randn(k.shape, kCUDA).to(dt), g = tg::randn(k.shape, kCUDA).to(dt);
      if (k.channels_last) x = x.contiguous(MemoryFormat::ChannelsLast), g = g.contiguous(MemoryFormat::ChannelsLast);
      Tensor w = tg::randn({c}, kCUDA), b = tg::randn({c}, kCUDA), rm = tg::zeros({c}, kCUDA),
             rv = tg::ones({c}, kCUDA);
      BNRun r1 = run_batch_norm(x, g, w, b, rm, rv, true), r2 = run_batch_norm(x, g, w, b, rm, rv, true);
      expect_same_values(r1, r2);
    }
}

// Captured into a CUDA graph (scratch from the caching allocator, no host sync): replays give
// the eager bits.
TEST(BatchNormCuda, GraphReplayMatchesEager) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  tg::cuda::Stream side;
  tg::cuda::StreamGuard guard(side);
  for (const CudaCase& k : {CudaCase{{128, 64, 8, 8}, true}, CudaCase{{32, 24, 9, 11}, false}}) {
    SCOPED_TRACE(::testing::PrintToString(k.shape));
    const int64_t c = k.shape[1];
    Tensor x = tg::randn(k.shape, kCUDA);
    if (k.channels_last) x = x.contiguous(MemoryFormat::ChannelsLast);
    x.requires_grad_(true);
    Tensor w = tg::randn({c}, kCUDA).requires_grad_(true), b = tg::randn({c}, kCUDA).requires_grad_(true);
    Tensor rm = tg::zeros({c}, kCUDA), rv = tg::ones({c}, kCUDA);
    Tensor y;
    auto step = [&] {
      x.mutable_grad() = Tensor();
      w.mutable_grad() = Tensor();
      b.mutable_grad() = Tensor();
      rm.fill_(0);
      rv.fill_(1);
      y = F::batch_norm(x, rm, rv, w, b, true, 0.1, 1e-5);
      (y * y).sum().backward();
    };
    step();
    auto bits = [](const Tensor& t) { return t.cpu().contiguous().to_vector<float>(); };
    const auto ey = bits(y), erm = bits(rm), egx = bits(x.grad()), egw = bits(w.grad());
    tg::cuda::Graph graph;
    graph.capture(step);
    for (int rep = 0; rep < 2; ++rep) {
      graph.replay();
      EXPECT_EQ(bits(y), ey) << "rep " << rep;
      EXPECT_EQ(bits(rm), erm) << "rep " << rep;
      EXPECT_EQ(bits(x.grad()), egx) << "rep " << rep;
      EXPECT_EQ(bits(w.grad()), egw) << "rep " << rep;
    }
  }
}

TEST(BatchNormErrors, BadInputsNameTheOpAndShapes) {
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Tensor x = tg::randn({4, 3, 5});
  std::string m = message([&] { F::batch_norm(x, tg::zeros({4}), tg::ones({4})); });
  EXPECT_NE(m.find("batch_norm"), std::string::npos) << m;
  EXPECT_NE(m.find("[4, 3, 5]"), std::string::npos) << m;
  m = message([&] { F::batch_norm(tg::randn({1, 3}), Tensor(), Tensor(), Tensor(), Tensor(), true); });
  EXPECT_NE(m.find("Expected more than 1 value per channel when training"), std::string::npos) << m;
  EXPECT_NE(m.find("[1, 3]"), std::string::npos) << m;
  EXPECT_NO_THROW(F::batch_norm(tg::randn({1, 3}), tg::zeros({3}), tg::ones({3})));  // eval is fine
  EXPECT_THROW(F::batch_norm(x, tg::zeros({3}), Tensor()), Error);                   // one running stat
  EXPECT_THROW(F::batch_norm(x, Tensor(), Tensor(), tg::ones({2})), Error);          // weight
  EXPECT_THROW(F::batch_norm(tg::randn({3}), Tensor(), Tensor()), Error);            // 1-d
  EXPECT_THROW(F::batch_norm(tg::ones({2, 3}, TensorOptions(kInt64)), Tensor(), Tensor()), Error);
  EXPECT_THROW(F::batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, -1.0), Error);
  m = message([&] { F::batch_norm_relu(x, tg::zeros({4}), tg::ones({4}), Tensor(), Tensor(), true); });
  EXPECT_NE(m.find("batch_norm_relu"), std::string::npos) << m;
  EXPECT_NE(m.find("[4, 3, 5]"), std::string::npos) << m;
  m = message([&] { F::batch_norm_relu(tg::randn({1, 3}), Tensor(), Tensor(), Tensor(), Tensor(), true); });
  EXPECT_NE(m.find("batch_norm_relu"), std::string::npos) << m;
  EXPECT_NE(m.find("[1, 3]"), std::string::npos) << m;
  m = message([&] { F::group_norm(tg::randn({2, 6, 3}), 4); });
  EXPECT_NE(m.find("group_norm"), std::string::npos) << m;
  EXPECT_NE(m.find("[2, 6, 3]"), std::string::npos) << m;
  EXPECT_NE(m.find("groups = 4"), std::string::npos) << m;
  EXPECT_THROW(F::group_norm(tg::randn({2, 6, 3}), 0), Error);
  EXPECT_THROW(F::group_norm(tg::randn({2, 6, 3}), 2, tg::ones({3})), Error);
  EXPECT_THROW(tg::nn::GroupNorm(4, 6), Error);
  tg::nn::BatchNorm2d bn2(3);
  m = message([&] { bn2(x); });
  EXPECT_NE(m.find("BatchNorm2d"), std::string::npos) << m;
  EXPECT_NE(m.find("[4, 3, 5]"), std::string::npos) << m;
  tg::nn::BatchNorm1d bn1(3);
  EXPECT_THROW(bn1(tg::randn({2, 3, 4, 4})), Error);
  EXPECT_THROW(bn1(tg::randn({2, 4})), Error);  // channel mismatch
}

TEST(BatchNormModules, StateDictNamesAndDefaults) {
  tg::nn::BatchNorm2d bn(4);
  EXPECT_EQ(bn.state_dict().keys(),
            (std::vector<std::string>{"weight", "bias", "running_mean", "running_var", "num_batches_tracked"}));
  EXPECT_EQ(bn.parameters().size(), 2u);
  expect_near_vec(host(bn.weight), std::vector<double>(4, 1), 0, 0, "weight ones");
  expect_near_vec(host(bn.bias), std::vector<double>(4, 0), 0, 0, "bias zeros");
  expect_near_vec(host(bn.running_mean), std::vector<double>(4, 0), 0, 0, "running_mean zeros");
  expect_near_vec(host(bn.running_var), std::vector<double>(4, 1), 0, 0, "running_var ones");
  EXPECT_EQ(bn.num_batches_tracked.dtype(), kInt64);
  EXPECT_EQ(bn.num_batches_tracked.dim(), 0);
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 0);
  tg::nn::BatchNorm1d plain(3, {.affine = false, .track_running_stats = false});
  EXPECT_TRUE(plain.state_dict().empty());
  tg::nn::BatchNorm1d no_affine(3, {.affine = false});
  EXPECT_EQ(no_affine.state_dict().keys(),
            (std::vector<std::string>{"running_mean", "running_var", "num_batches_tracked"}));
  tg::nn::GroupNorm gn(2, 6);
  EXPECT_EQ(gn.state_dict().keys(), (std::vector<std::string>{"weight", "bias"}));
  expect_near_vec(host(gn.weight), std::vector<double>(6, 1), 0, 0, "GroupNorm weight ones");
  tg::nn::GroupNorm gn_plain(2, 6, {.eps = 1e-3, .affine = false});
  EXPECT_TRUE(gn_plain.state_dict().empty());
  Tensor x = tg::randn({2, 6, 5});
  expect_near_vec(host(gn(x)), ref_group_norm(host(x), {2, 6, 5}, 2, {}, {}, 1e-5), 1e-5, 1e-5, "GroupNorm forward");
}

TEST(BatchNormModules, TrainUpdatesStatsEvalUsesThem) {
  tg::manual_seed(21);
  tg::nn::BatchNorm2d bn(3, {.momentum = 0.2}, TensorOptions(kFloat64));
  std::vector<double> rm(3, 0), rv(3, 1);
  for (int step = 0; step < 3; ++step) {
    Tensor x = tg::randn({4, 3, 2, 2}, TensorOptions(kFloat64)) + step;
    RefBN ref = ref_batch_norm(host(x), {4, 3, 4}, {}, {}, rm, rv, std::vector<double>(48, 0.0), true, 0.2, 1e-5);
    expect_near_vec(host(bn(x)), ref.y, 1e-10, 1e-10, "BatchNorm2d train y");
    rm = ref.rm;
    rv = ref.rv;
    expect_near_vec(host(bn.running_mean), rm, 1e-12, 1e-12, "BatchNorm2d running_mean");
    expect_near_vec(host(bn.running_var), rv, 1e-12, 1e-12, "BatchNorm2d running_var");
    EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), step + 1);
  }
  bn.eval();
  const std::vector<double> before = host(bn.running_mean);
  Tensor x = tg::randn({2, 3, 2, 2}, TensorOptions(kFloat64));
  RefBN ref = ref_batch_norm(host(x), {2, 3, 4}, {}, {}, rm, rv, std::vector<double>(24, 0.0), false, 0.2, 1e-5);
  expect_near_vec(host(bn(x)), ref.y, 1e-10, 1e-10, "BatchNorm2d eval y");
  expect_near_vec(host(bn.running_mean), before, 0, 0, "eval leaves running_mean");
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 3);
  // Eval accepts one value per channel; train refuses it.
  EXPECT_NO_THROW(bn(tg::randn({1, 3, 1, 1}, TensorOptions(kFloat64))));
  bn.train();
  EXPECT_THROW(bn(tg::randn({1, 3, 1, 1}, TensorOptions(kFloat64))), Error);
}

TEST(BatchNormModules, MomentumNoneIsCumulativeAverage) {
  tg::manual_seed(22);
  tg::nn::BatchNorm1d bn(2, {.momentum = std::nullopt}, TensorOptions(kFloat64));
  std::vector<std::vector<double>> means, vars;
  for (int step = 0; step < 4; ++step) {
    Tensor x = tg::randn({5, 2}, TensorOptions(kFloat64)) * (step + 1);
    bn(x);
    RefBN ref =
        ref_batch_norm(host(x), {5, 2, 1}, {}, {}, {0, 0}, {0, 0}, std::vector<double>(10, 0.0), true, 1.0, 1e-5);
    means.push_back(ref.rm);  // momentum 1 from zeros: the batch's own statistics
    vars.push_back(ref.rv);
  }
  for (int ch = 0; ch < 2; ++ch) {
    double m = 0, v = 0;
    for (int s = 0; s < 4; ++s) m += means[s][ch] / 4, v += vars[s][ch] / 4;
    EXPECT_NEAR(host(bn.running_mean)[ch], m, 1e-12);
    EXPECT_NEAR(host(bn.running_var)[ch], v, 1e-12);
  }
}

TEST(BatchNormModules, NoTrackingUsesBatchStatsInEvalAndGradientsFlow) {
  tg::nn::BatchNorm1d bn(3, {.track_running_stats = false}, TensorOptions(kFloat64));
  bn.eval();
  Tensor x = tg::randn({4, 3, 2}, TensorOptions(kFloat64)).requires_grad_(true);
  RefBN ref = ref_batch_norm(host(x), {4, 3, 2}, {}, {}, {}, {}, std::vector<double>(24, 1.0), true, 0.1, 1e-5);
  Tensor y = bn(x);
  expect_near_vec(host(y), ref.y, 1e-10, 1e-10, "BatchNorm1d untracked eval y");
  (y * y).sum().backward();
  ASSERT_TRUE(bn.weight.grad().defined());
  ASSERT_TRUE(x.grad().defined());
  // d/dw sum(y^2) with y = xhat * 1 + 0 is 2 * sum(xhat^2) = 2 * count per channel (biased var, eps small).
  expect_near_vec(host(bn.weight.grad()), std::vector<double>(3, 16.0), 1e-3, 1e-4, "weight grad");
}

TEST(BatchNormAutocast, ReducedInReducedOut) {
  Tensor x = tg::randn({4, 3, 2}).to(kBFloat16);
  tg::nn::BatchNorm1d bn(3);
  tg::amp::autocast guard(kCPU);
  Tensor y = bn(x);
  EXPECT_EQ(y.dtype(), kBFloat16);
  EXPECT_EQ(bn.running_mean.dtype(), kFloat32);
  tg::nn::GroupNorm gn(1, 3);
  EXPECT_EQ(gn(x).dtype(), kBFloat16);  // autocast category None: float32 statistics, input dtype out
}

}  // namespace
}  // namespace tg::testing
