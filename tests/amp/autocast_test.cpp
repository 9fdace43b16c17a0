// Autocast: the guard's thread-local, nesting state; the policy table; the dtypes
// ops produce under autocast (CPU bfloat16 here, CUDA float16 when a GPU is
// present); float64 and other device types untouched; gradients reaching float32
// leaves in float32; and the weight-cast cache.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <vector>

#include <tapegrad/tapegrad.h>
#include <tapegrad/core/backend/backend.h>

namespace tg::testing {
namespace {

// Float64 host matmul of row-major [m, k] x [k, n].
std::vector<double> ref_matmul(const std::vector<double>& a, const std::vector<double>& b, int64_t m, int64_t k,
                               int64_t n) {
  std::vector<double> c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j) c[i * n + j] += a[i * k + p] * b[p * n + j];
  return c;
}
std::vector<double> as_double(const Tensor& t) {
  std::vector<float> v = t.to(kFloat32).cpu().to_vector<float>();
  return {v.begin(), v.end()};
}

TEST(Autocast, DefaultsAndGuardState) {
  EXPECT_FALSE(amp::is_enabled(kCPU));
  EXPECT_FALSE(amp::is_enabled(kCUDA));
  EXPECT_EQ(amp::get_dtype(kCPU), kBFloat16);
  EXPECT_EQ(amp::get_dtype(kCUDA), kFloat16);
  {
    amp::autocast guard(kCPU);
    EXPECT_TRUE(amp::is_enabled(kCPU));
    EXPECT_FALSE(amp::is_enabled(kCUDA));  // per device type
    EXPECT_EQ(amp::get_dtype(kCPU), kBFloat16);
    {
      amp::autocast inner(kCPU, kFloat16);
      EXPECT_TRUE(amp::is_enabled(kCPU));
      EXPECT_EQ(amp::get_dtype(kCPU), kFloat16);
      {
        amp::autocast off(kCPU, std::nullopt, /*enabled=*/false);
        EXPECT_FALSE(amp::is_enabled(kCPU));
        EXPECT_EQ(amp::get_dtype(kCPU), kFloat16);  // no dtype given: kept
      }
      EXPECT_TRUE(amp::is_enabled(kCPU));
    }
    EXPECT_EQ(amp::get_dtype(kCPU), kBFloat16);
    {
      amp::autocast cuda_guard(kCUDA, kBFloat16);
      EXPECT_TRUE(amp::is_enabled(kCUDA));
      EXPECT_EQ(amp::get_dtype(kCUDA), kBFloat16);
    }
    EXPECT_FALSE(amp::is_enabled(kCUDA));
    EXPECT_EQ(amp::get_dtype(kCUDA), kFloat16);
  }
  EXPECT_FALSE(amp::is_enabled(kCPU));
}

TEST(Autocast, StateIsThreadLocal) {
  amp::autocast guard(kCPU);
  bool other_thread_enabled = true;
  std::thread t([&] { other_thread_enabled = amp::is_enabled(kCPU); });
  t.join();
  EXPECT_FALSE(other_thread_enabled);
  EXPECT_TRUE(amp::is_enabled(kCPU));
}

TEST(Autocast, RejectsNonReducedDtype) {
  EXPECT_THROW(amp::autocast(kCPU, kFloat32), Error);
  EXPECT_THROW(amp::autocast(kCUDA, kFloat64), Error);
  EXPECT_FALSE(amp::is_enabled(kCPU));
}

TEST(Autocast, PolicyTable) {
  using P = amp::CastPolicy;
  EXPECT_EQ(amp::policy(OpKind::Matmul), P::Lower);
  for (OpKind op : {OpKind::Pow, OpKind::PowScalar, OpKind::Exp, OpKind::Log, OpKind::Sum, OpKind::Mean, OpKind::Var,
                    OpKind::Std})
    EXPECT_EQ(amp::policy(op), P::Fp32) << op_name(op);
  for (OpKind op : {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div, OpKind::Where, OpKind::Cat, OpKind::Maximum,
                    OpKind::Minimum})
    EXPECT_EQ(amp::policy(op), P::Promote) << op_name(op);
  for (OpKind op : {OpKind::Relu, OpKind::Neg, OpKind::View, OpKind::To, OpKind::AddScalar})
    EXPECT_EQ(amp::policy(op), P::None) << op_name(op);
  EXPECT_EQ(amp::policy("matmul"), P::Lower);
  EXPECT_EQ(amp::policy("mse_loss"), P::Fp32);
  EXPECT_EQ(amp::policy("linear"), P::Lower);
  EXPECT_FALSE(amp::policy("no_such_op").has_value());
  EXPECT_STREQ(amp::policy_name(P::Promote), "promote");
}

// The dtypes under autocast on one device, lowering to `low`.
void check_policy_dtypes(Device dev, DType low) {
  manual_seed(1);
  const int64_t m = 8, k = 16, n = 4;
  Tensor a = randn({m, k}, dev), b = randn({k, n}, dev);
  Tensor bf = randn({m, n}, TensorOptions().dtype(low).device(dev));
  Tensor c;
  {
    amp::autocast guard(dev.type());
    c = matmul(a, b);
    EXPECT_EQ(c.dtype(), low);
    EXPECT_EQ(a.matmul(b).dtype(), low);
    EXPECT_EQ(bf.pow(2).dtype(), kFloat32);
    EXPECT_EQ(pow(bf, bf).dtype(), kFloat32);
    EXPECT_EQ(bf.mean().dtype(), kFloat32);
    EXPECT_EQ(bf.sum(0).dtype(), kFloat32);
    EXPECT_EQ(bf.exp().dtype(), kFloat32);
    EXPECT_EQ(bf.var(0).dtype(), kFloat32);
    EXPECT_EQ(nn::functional::mse_loss(bf, bf).dtype(), kFloat32);
    EXPECT_EQ(nn::functional::mse_loss(bf, bf, "none").dtype(), kFloat32);
    // Promote: the widest floating input.
    EXPECT_EQ((bf + c.to(kFloat32)).dtype(), kFloat32);
    EXPECT_EQ((bf * bf).dtype(), low);
    EXPECT_EQ(cat({bf, bf.to(kFloat32)}, 0).dtype(), kFloat32);
    EXPECT_EQ(where(bf > 0, bf, bf.to(kFloat32)).dtype(), kFloat32);
    // None: the input dtype.
    EXPECT_EQ(bf.relu().dtype(), low);
    EXPECT_EQ(a.relu().dtype(), kFloat32);
    // float64 is never cast.
    Tensor d = randn({m, k}, TensorOptions().dtype(kFloat64).device(dev));
    Tensor e = randn({k, n}, TensorOptions().dtype(kFloat64).device(dev));
    EXPECT_EQ(matmul(d, e).dtype(), kFloat64);
    EXPECT_EQ(d.pow(2).dtype(), kFloat64);
    EXPECT_EQ(d.mean().dtype(), kFloat64);
    // Integer tensors are not cast either.
    EXPECT_EQ(arange(4, TensorOptions().dtype(kInt64).device(dev)).sum().dtype(), kInt64);
    // Nested: disabled inside, back on after.
    {
      amp::autocast off(dev.type(), std::nullopt, false);
      EXPECT_EQ(matmul(a, b).dtype(), kFloat32);
      EXPECT_EQ(bf.pow(2).dtype(), low);
    }
    EXPECT_EQ(matmul(a, b).dtype(), low);
    // Nested with another dtype.
    {
      const DType other = low == kFloat16 ? kBFloat16 : kFloat16;
      amp::autocast inner(dev.type(), other);
      EXPECT_EQ(matmul(a, b).dtype(), other);
    }
    EXPECT_EQ(matmul(a, b).dtype(), low);
  }
  // Outside: nothing changes.
  EXPECT_EQ(matmul(a, b).dtype(), kFloat32);
  EXPECT_EQ(bf.pow(2).dtype(), low);
  EXPECT_EQ(bf.mean().dtype(), low);

  // The lowered product is the product of the rounded inputs (float64 reference).
  std::vector<double> ra = as_double(a.to(low)), rb = as_double(b.to(low));
  std::vector<double> ref = ref_matmul(ra, rb, m, k, n), got = as_double(c);
  const double tol = low == kBFloat16 ? 1e-2 : 2e-3;
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], tol * (1 + std::abs(ref[i]))) << i;
}

TEST(Autocast, PolicyDtypesCpuBFloat16) { check_policy_dtypes(Device(kCPU), kBFloat16); }

TEST(Autocast, PolicyDtypesCuda) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  check_policy_dtypes(Device(kCUDA), kFloat16);
}

TEST(Autocast, OtherDeviceTypeUntouched) {
  Tensor a = randn({4, 4}), b = randn({4, 4});
  amp::autocast guard(kCUDA);  // CUDA autocast leaves CPU tensors alone
  EXPECT_EQ(matmul(a, b).dtype(), kFloat32);
  EXPECT_EQ(a.to(kBFloat16).pow(2).dtype(), kBFloat16);
}

// Gradients flow through the casts back to float32 leaves, in float32.
TEST(Autocast, GradientsReachFloat32Leaves) {
  manual_seed(3);
  const int64_t m = 6, k = 5, n = 3;
  Tensor x = randn({m, k});
  Tensor w = randn({k, n}).requires_grad_();
  Tensor loss;
  {
    amp::autocast guard(kCPU);
    Tensor y = matmul(x, w);
    EXPECT_EQ(y.dtype(), kBFloat16);
    loss = y.pow(2).mean();
    EXPECT_EQ(loss.dtype(), kFloat32);
  }
  loss.backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), kFloat32);
  // Reference: d/dw mean((x w)^2) = 2 x^T (x w) / (m n), in float64 from the float32 values.
  std::vector<double> xd = as_double(x), wd = as_double(w);
  std::vector<double> y = ref_matmul(xd, wd, m, k, n);
  std::vector<double> g(static_cast<size_t>(k * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j) g[p * n + j] += 2.0 * xd[i * k + p] * y[i * n + j] / double(m * n);
  std::vector<double> got = as_double(w.grad());
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(got[i], g[i], 3e-2 * (1 + std::abs(g[i]))) << i;
}

// Linear's matmul(x, weight.t()): the transposed view is cast in memory order and
// viewed back; values and gradients equal those of the contiguous copy.
TEST(Autocast, TransposedOperandCastKeepsValuesAndGrads) {
  manual_seed(4);
  Tensor x = randn({6, 5});
  Tensor w1 = randn({3, 5}).requires_grad_();
  Tensor w2 = w1.detach().clone().requires_grad_();
  Tensor y1, y2;
  {
    amp::autocast guard(kCPU);
    y1 = matmul(x, w1.t());
    y2 = matmul(x, w2.t().contiguous());
  }
  EXPECT_EQ(y1.dtype(), kBFloat16);
  EXPECT_EQ(as_double(y1), as_double(y2));
  y1.to(kFloat32).pow(2).sum().backward();
  y2.to(kFloat32).pow(2).sum().backward();
  EXPECT_EQ(w1.grad().dtype(), kFloat32);
  EXPECT_EQ(w1.grad().sizes(), w1.sizes());
  EXPECT_EQ(as_double(w1.grad()), as_double(w2.grad()));
}

TEST(Autocast, WeightCastCache) {
  amp::detail::reset_cast_cache_counters();
  Tensor w = randn({8, 8}).requires_grad_();
  Tensor x = randn({4, 8});
  {
    amp::autocast guard(kCPU);
    Tensor y1 = matmul(x, w);
    Tensor y2 = matmul(y1.to(kFloat32), w);  // the same weight again: reused
    EXPECT_EQ(amp::detail::cast_cache_misses(), 1);
    EXPECT_EQ(amp::detail::cast_cache_hits(), 1);
    EXPECT_EQ(amp::detail::cast_cache_size(), 1);
    {
      amp::autocast inner(kCPU);  // a nested region shares the outermost cache
      matmul(x, w);
      EXPECT_EQ(amp::detail::cast_cache_misses(), 1);
    }
    EXPECT_EQ(amp::detail::cast_cache_size(), 1);  // only the outermost exit clears it
    // Non-leaves and tensors that do not require grad are not cached.
    Tensor plain = randn({8, 8});
    matmul(x, plain);
    matmul(x, plain);
    EXPECT_EQ(amp::detail::cast_cache_misses(), 1);
    // An in-place update makes a new version: cast again.
    {
      NoGradGuard ng;
      w.mul_(2.0);
    }
    Tensor y3 = matmul(x, w);
    EXPECT_EQ(amp::detail::cast_cache_misses(), 2);
    // Gradients through cached casts still accumulate into w.
    (y1.to(kFloat32).sum() + y2.to(kFloat32).sum() + y3.to(kFloat32).sum()).backward();
    EXPECT_EQ(w.grad().dtype(), kFloat32);
  }
  EXPECT_EQ(amp::detail::cast_cache_size(), 0);
  {
    amp::autocast guard(kCPU);
    matmul(x, w);
    EXPECT_EQ(amp::detail::cast_cache_misses(), 3);  // a new region casts again
  }
}

}  // namespace
}  // namespace tg::testing

namespace tg {
namespace {
// add / sub of a float32 and a float16 / bfloat16 tensor under autocast (the residual stream of an
// autocast model): one kernel that reads the half operand as it is, the float32 result autocast's
// promote gives, the same values, and gradients in each operand's dtype.
TEST(Autocast, MixedAddReadsTheHalfOperandInOneLaunch) {
  std::vector<Device> devs{Device(kCPU)};
  if (cuda::is_available()) devs.emplace_back(kCUDA);
  for (Device dev : devs)
    for (DType low : {kBFloat16, kFloat16}) {
      SCOPED_TRACE(dev.str() + " " + dtype_name(low));
      manual_seed(3);
      Tensor x = randn({4, 8}, dev).requires_grad_();
      Tensor h = randn({4, 8}, TensorOptions().dtype(low).device(dev)).requires_grad_();
      Tensor w = randn({4, 8}, dev);
      Tensor y, z;
      {
        amp::autocast guard(dev.type(), low);
        const uint64_t c0 = backend::dispatch_count();
        y = x + h;
        EXPECT_EQ(backend::dispatch_count() - c0, 1u) << "a cast pass before the add";
        z = h - x;
      }
      ASSERT_EQ(y.dtype(), kFloat32);
      ASSERT_EQ(z.dtype(), kFloat32);
      const Tensor hw = h.detach().to(kFloat32), xd = x.detach();
      EXPECT_EQ(y.detach().cpu().to_vector<float>(), (xd + hw).cpu().to_vector<float>());
      EXPECT_EQ(z.detach().cpu().to_vector<float>(), (hw - xd).cpu().to_vector<float>());
      ((y + z * 2.0) * w).sum().backward();
      ASSERT_EQ(h.grad().dtype(), low);
      EXPECT_EQ(h.grad().to(kFloat32).cpu().to_vector<float>(), (w.to(low).to(kFloat32) * 3.0).to(low).to(kFloat32).cpu().to_vector<float>());
      EXPECT_EQ(x.grad().cpu().to_vector<float>(), (w * -1.0).cpu().to_vector<float>());
      // a 0-d float32 operand beside a dimmed half one: autocast's promote still gives float32
      {
        amp::autocast guard(dev.type(), low);
        EXPECT_EQ((h + full({}, 1.0, TensorOptions().device(dev))).dtype(), kFloat32);
      }
    }
}
}  // namespace
}  // namespace tg

