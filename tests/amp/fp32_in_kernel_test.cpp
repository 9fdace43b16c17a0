// Autocast's float32 unary ops (exp, log, sqrt, pow with a scalar exponent) on float16 /
// bfloat16 inputs: one kernel reads the input as is and writes float32, and the backward writes
// the input's gradient in its dtype in one kernel, with no cast node on either pass. Checked bit
// for bit against the cast path (x.to(float32).op(), whose backward rounds the float32 gradient
// once), against a float64 reference, on the CPU and on CUDA when present; tracing still records
// the cast; gradcheck in float64 outside autocast; native::unary_to / binary_to with and without
// a backend mixed form.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <tapegrad/core/native.h>
#include <tapegrad/core/trace.h>
#include "tests/autograd/common.h"

namespace tg::testing {
namespace {

using backend::ElemOp;

// The bit patterns of t's values, read as float32 (float16 / bfloat16 widen exactly, so equal
// patterns here are equal patterns there).
std::vector<uint32_t> bits(const Tensor& t) {
  std::vector<float> v = t.detach().to(Device(kCPU), kFloat32).contiguous().to_vector<float>();
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

// How many elements differ in their bits (0 when the tensors are bit-equal).
int64_t bit_mismatches(const Tensor& got, const Tensor& want) {
  std::vector<uint32_t> a = bits(got), b = bits(want);
  if (a.size() != b.size()) return -1;
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

struct Case {
  const char* name;
  const char* node;  // the recorded node's name
  std::function<Tensor(const Tensor&)> op;
  double (*ref)(double);   // the op in float64
  double (*dref)(double);  // its derivative
  bool positive;           // needs x > 0
};

std::vector<Case> cases() {
  return {
      {"pow2", "pow", [](const Tensor& x) { return x.pow(2); }, [](double x) { return x * x; },
       [](double x) { return 2 * x; }, false},
      {"pow3", "pow", [](const Tensor& x) { return x.pow(3); }, [](double x) { return x * x * x; },
       [](double x) { return 3 * x * x; }, false},
      {"pow0.5", "pow", [](const Tensor& x) { return x.pow(0.5); }, [](double x) { return std::sqrt(x); },
       [](double x) { return 0.5 / std::sqrt(x); }, true},
      {"pow-1.5", "pow", [](const Tensor& x) { return x.pow(-1.5); }, [](double x) { return std::pow(x, -1.5); },
       [](double x) { return -1.5 * std::pow(x, -2.5); }, true},
      {"exp", "exp", [](const Tensor& x) { return x.exp(); }, [](double x) { return std::exp(x); },
       [](double x) { return std::exp(x); }, false},
      {"log", "log", [](const Tensor& x) { return x.log(); }, [](double x) { return std::log(x); },
       [](double x) { return 1 / x; }, true},
      {"sqrt", "sqrt", [](const Tensor& x) { return x.sqrt(); }, [](double x) { return std::sqrt(x); },
       [](double x) { return 0.5 / std::sqrt(x); }, true},
  };
}

class Fp32InKernel : public ::testing::TestWithParam<Dev> {
 protected:
  Device dev() const { return to_device(GetParam()); }
  // A [rows, cols] input in `low`: odd sizes, so the vectorised CUDA path has a tail.
  Tensor input(const Case& c, DType low, int64_t rows = 33, int64_t cols = 70) const {
    Tensor x = tg::randn({rows, cols}, TensorOptions().device(dev()));
    if (c.positive) x = x.abs() + 0.25;
    return x.to(low);
  }
};

// Forward: float32 out, one launch, bit-equal to the cast path and near the float64 reference.
// Backward of a random float32 upstream gradient: one launch, the input's dtype, bit-equal to the
// cast path and near the float64 reference rounded to that dtype.
TEST_P(Fp32InKernel, MatchesCastPathBitForBit) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  manual_seed(21);
  for (DType low : {kFloat16, kBFloat16}) {
    for (const Case& c : cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(low));
      Tensor x0 = input(c, low);
      Tensor x = x0.detach().requires_grad_();
      Tensor y;
      uint64_t d0 = backend::dispatch_count();
      {
        amp::autocast guard(dev().type(), low);
        y = c.op(x);
      }
      EXPECT_EQ(backend::dispatch_count() - d0, 1u);  // no cast launch
      ASSERT_EQ(y.dtype(), kFloat32);
      ASSERT_TRUE(y.grad_fn());
      EXPECT_STREQ(y.grad_fn()->name(), c.node);
      ASSERT_EQ(y.grad_fn()->next_edges.size(), 1u);
      EXPECT_STREQ(y.grad_fn()->next_edges[0].fn->name(), "AccumulateGrad");  // no cast node in between

      // The cast path, written out outside autocast.
      Tensor xo = x0.detach().requires_grad_();
      Tensor yo = c.op(xo.to(kFloat32));
      EXPECT_EQ(bit_mismatches(y, yo), 0);

      Tensor g = tg::randn(y.sizes(), TensorOptions().device(dev()));
      d0 = backend::dispatch_count();
      y.backward(g);
      EXPECT_EQ(backend::dispatch_count() - d0, 1u);  // the gradient kernel, storing `low`
      yo.backward(g);
      ASSERT_EQ(x.grad().dtype(), low);
      ASSERT_EQ(xo.grad().dtype(), low);
      EXPECT_EQ(bit_mismatches(x.grad(), xo.grad()), 0);

      // Independent float64 reference from the rounded input.
      std::vector<double> xv = host(x0), yv = host(y), gv = host(g), dxv = host(x.grad());
      const double grad_rtol = low == kFloat16 ? 1.5e-3 : 6e-3;  // one rounding to `low` plus float math
      for (size_t i = 0; i < xv.size(); ++i) {
        const double want = c.ref(xv[i]);
        ASSERT_NEAR(yv[i], want, 1e-6 * std::abs(want) + 1e-30) << "y element " << i;
        const double dwant = gv[i] * c.dref(xv[i]);
        ASSERT_NEAR(dxv[i], dwant, grad_rtol * std::abs(dwant) + 1e-6) << "grad element " << i;
      }
    }
  }
}

// The gradient of .sum() reaches the kernel as a broadcast scalar; a transposed input takes the
// strided path. Both bit-equal to the cast path.
TEST_P(Fp32InKernel, SumAndTransposedInputMatchCastPath) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  manual_seed(22);
  for (DType low : {kFloat16, kBFloat16}) {
    for (const Case& c : cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(low));
      Tensor x0 = input(c, low, 40, 24);
      Tensor x = x0.detach().requires_grad_(), xo = x0.detach().requires_grad_();
      Tensor s;
      {
        amp::autocast guard(dev().type(), low);
        s = c.op(x).sum();
      }
      ASSERT_EQ(s.dtype(), kFloat32);
      Tensor so = c.op(xo.to(kFloat32)).sum();
      EXPECT_EQ(bit_mismatches(s, so), 0);
      s.backward();
      so.backward();
      ASSERT_EQ(x.grad().dtype(), low);
      EXPECT_EQ(bit_mismatches(x.grad(), xo.grad()), 0);

      // x.t() through the kernels' strided path; the same random weights for both.
      Tensor w = tg::randn({40}, TensorOptions().device(dev()));
      Tensor x2 = x0.detach().requires_grad_(), xo2 = x0.detach().requires_grad_();
      Tensor yt;
      {
        amp::autocast guard(dev().type(), low);
        yt = c.op(x2.t());
      }
      ASSERT_EQ(yt.dtype(), kFloat32);
      Tensor yto = c.op(xo2.t().to(kFloat32));
      EXPECT_EQ(bit_mismatches(yt, yto), 0);
      (yt * w).sum().backward();
      (yto * w).sum().backward();
      ASSERT_EQ(x2.grad().dtype(), low);
      EXPECT_EQ(bit_mismatches(x2.grad(), xo2.grad()), 0);
    }
  }
}

// What stays on the cast path: float32 and float64 inputs, autocast off for the device, and tracing
// (export records the cast and the float32 op, as before).
TEST_P(Fp32InKernel, OtherInputsKeepTheCastAndTracingSeesTheOp) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  manual_seed(24);
  auto opts = TensorOptions().device(dev());
  Tensor h = tg::randn({8, 5}, opts).to(kFloat16).requires_grad_();
  Tensor d = tg::randn({8, 5}, opts.dtype(kFloat64)).requires_grad_();
  {
    amp::autocast guard(dev().type());
    EXPECT_EQ(d.pow(2).dtype(), kFloat64);
    EXPECT_STREQ(d.exp().grad_fn()->next_edges[0].fn->name(), "AccumulateGrad");
    {
      amp::autocast off(dev().type(), std::nullopt, false);
      EXPECT_EQ(h.pow(2).dtype(), kFloat16);
    }
    struct KindLog final : detail::Tracer {
      std::vector<OpKind> kinds;
      void record(OpKind op, const Tensor&, std::vector<Tensor>, std::vector<detail::TraceAttr>) override {
        kinds.push_back(op);
      }
    } log;
    Tensor y;
    {
      detail::TracerGuard tracing(&log);
      y = h.pow(2);
    }
    // Traced as it runs: one pow_scalar from float16 to float32, no cast (the exporter's replay
    // and ONNX lowering widen the input: tests/export).
    EXPECT_EQ(y.dtype(), kFloat32);
    ASSERT_EQ(log.kinds.size(), 1u);
    EXPECT_EQ(log.kinds[0], OpKind::PowScalar);
    EXPECT_STREQ(y.grad_fn()->next_edges[0].fn->name(), "AccumulateGrad");
  }
  // The other device type's autocast leaves these tensors alone.
  amp::autocast other(dev().is_cuda() ? kCPU : kCUDA);
  EXPECT_EQ(h.exp().dtype(), kFloat16);
}

// The ops' gradients outside autocast, in float64 (sqrt's backward is the fused SqrtBackward now).
TEST_P(Fp32InKernel, GradcheckFloat64) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  manual_seed(25);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    Tensor x = tg::randn({3, 4}, TensorOptions().device(dev()).dtype(kFloat64));
    if (c.positive) x = x.abs() + 0.5;
    auto r = autograd::gradcheck([&](const std::vector<Tensor>& v) { return c.op(v[0]); }, {x});
    EXPECT_TRUE(r) << r;
  }
}

// native::binary_to / unary_to: the mixed forms (one launch) equal the same-dtype op then a
// rounding cast, also with broadcast and transposed operands; mixes without a form take the casts.
TEST_P(Fp32InKernel, NativeExplicitResultDtype) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  manual_seed(26);
  auto opts = TensorOptions().device(dev());
  for (DType low : {kFloat16, kBFloat16}) {
    SCOPED_TRACE(dtype_name(low));
    Tensor g = tg::randn({17, 12}, opts), gt = tg::randn({12, 17}, opts).t(), grow = tg::randn({1, 12}, opts);
    Tensor y = tg::rand({17, 12}, opts) + 0.5, xl = (tg::rand({17, 12}, opts) + 0.5).to(low);
    for (const Tensor& gg : {g, gt, grow, tg::randn({}, opts).expand({17, 12})}) {
      uint64_t d0 = backend::dispatch_count();
      Tensor m = native::binary_to(ElemOp::Mul, gg, y, low);
      Tensor q = native::binary_to(ElemOp::Div, gg, xl, low);
      Tensor sb = native::binary_to(ElemOp::SqrtBackward, gg, y, low);
      Tensor pb = native::binary_to(ElemOp::PowScalarBackward, gg, xl, low, 3.0);
      EXPECT_EQ(backend::dispatch_count() - d0, 4u);
      EXPECT_EQ(m.dtype(), low);
      EXPECT_EQ(bit_mismatches(m, native::mul(gg, y).to(low)), 0);
      EXPECT_EQ(bit_mismatches(q, native::div(gg, xl.to(kFloat32)).to(low)), 0);
      EXPECT_EQ(bit_mismatches(sb, native::div(gg, native::mul(y, Scalar(2.0))).to(low)), 0);
      EXPECT_EQ(bit_mismatches(pb, native::binary(ElemOp::PowScalarBackward, gg, xl.to(kFloat32), 3.0).to(low)), 0);
    }
    // Unary widening from a transposed (strided) input.
    Tensor xt = xl.t();
    EXPECT_EQ(bit_mismatches(native::unary_to(ElemOp::Log, xt, kFloat32), native::unary(ElemOp::Log, xt.to(kFloat32))),
              0);
    // Mixes without a form: computed in the promoted dtype, then cast.
    Tensor a = native::binary_to(ElemOp::Add, xl, y, low);
    EXPECT_EQ(a.dtype(), low);
    EXPECT_EQ(bit_mismatches(a, native::add(xl.to(kFloat32), y).to(low)), 0);
    Tensor th = native::unary_to(ElemOp::Tanh, xl, kFloat32);
    EXPECT_EQ(th.dtype(), kFloat32);
    EXPECT_EQ(bit_mismatches(th, native::unary(ElemOp::Tanh, xl.to(kFloat32))), 0);
    Tensor e = native::unary_to(ElemOp::Exp, y, low);  // narrowing: no form
    EXPECT_EQ(bit_mismatches(e, native::unary(ElemOp::Exp, y).to(low)), 0);
    // SqrtBackward in one dtype equals the two-op form it replaced (2 y is exact).
    for (DType t : {kFloat32, low}) {
      Tensor gy = g.to(t), yy = y.to(t);
      EXPECT_EQ(
          bit_mismatches(native::binary(ElemOp::SqrtBackward, gy, yy), native::div(gy, native::mul(yy, Scalar(2.0)))),
          0);
    }
  }
  const DType f32 = kFloat32, f16 = kFloat16, bf = kBFloat16, f64 = kFloat64;
  const DType widen16[] = {f32, f16}, widen64[] = {f64, f16}, narrow[] = {f16, f32};
  EXPECT_TRUE(backend::has_mixed_form(ElemOp::PowScalar, widen16));
  EXPECT_FALSE(backend::has_mixed_form(ElemOp::PowScalar, widen64));
  EXPECT_FALSE(backend::has_mixed_form(ElemOp::Exp, narrow));
  EXPECT_FALSE(backend::has_mixed_form(ElemOp::Tanh, widen16));
  const DType div_ok[] = {bf, f32, bf}, div_mixed_r[] = {bf, f32, f16};
  EXPECT_TRUE(backend::has_mixed_form(ElemOp::Div, div_ok));
  EXPECT_FALSE(backend::has_mixed_form(ElemOp::Div, div_mixed_r));
  EXPECT_FALSE(backend::has_mixed_form(ElemOp::Mul, div_ok));
}

INSTANTIATE_TEST_SUITE_P(Devices, Fp32InKernel, ::testing::Values(Dev::CPU, Dev::CUDA), dev_name);

}  // namespace
}  // namespace tg::testing
