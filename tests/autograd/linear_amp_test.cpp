// Mixed-precision gradients written directly in float32: under autocast (CUDA float16,
// CPU bfloat16) a float32 weight is cast to half by a differentiable `to`; the gemm of
// linear's / matmul's backward stores that weight's gradient in float32 and the cast's
// backward passes it through (no half rounding, no cast launch). Checked against a
// float64 reference of the half-rounded forward, with the dtype, a gemm counter and
// launch counts; plus the engine's handling of such gradients (retain_grad,
// autograd::grad, several consumers, view chains).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <tapegrad/core/native.h>
#include "core/reference.h"
#include "tests/autograd/common.h"

namespace tg::testing {
namespace {

class WideGrad : public ::testing::TestWithParam<Dev> {
 protected:
  Device dev() const { return to_device(GetParam()); }
  DType low() const { return GetParam() == Dev::CUDA ? kFloat16 : kBFloat16; }
};

// The reference of linear's weight and bias gradients from the values the half forward
// used: gw[o, i] = sum_r g[r, o] xh[r, i], gb[o] = sum_r g[r, o]; with the sums of |terms|.
struct WB {
  RefTensor gw, sgw, gb, sgb;
};
WB ref_grads(const Tensor& g, const Tensor& xh) {
  RefTensor G = RefTensor::from(g), X = RefTensor::from(xh);
  const int64_t rows = g.size(0), out = g.size(1), in = xh.size(1);
  WB r{RefTensor({out, in}), RefTensor({out, in}), RefTensor({out}), RefTensor({out})};
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t o = 0; o < out; ++o) {
      const double gv = G.v[i * out + o];
      r.gb.v[o] += gv;
      r.sgb.v[o] += std::abs(gv);
      for (int64_t k = 0; k < in; ++k) {
        r.gw.v[o * in + k] += gv * X.v[i * in + k];
        r.sgw.v[o * in + k] += std::abs(gv * X.v[i * in + k]);
      }
    }
  return r;
}

// max |got - want| / scale over the elements.
double max_rel(const Tensor& got, const RefTensor& want, const RefTensor& scale) {
  RefTensor G = RefTensor::from(got);
  double m = 0;
  for (int64_t i = 0; i < G.numel(); ++i) m = std::max(m, std::abs(G.v[i] - want.v[i]) / (scale.v[i] + 1e-300));
  return m;
}

// Tolerance of a float32 result: float accumulation over 64 rows (64 * 2^-24 ~ 4e-6 of the sum
// of |terms|). A gradient rounded to half on the way would be off by up to 2^-9 (float16) or
// 2^-8 (bfloat16) of its value: far outside this.
constexpr double kFloat32Tol = 1e-5;

TEST_P(WideGrad, LinearUnderAutocastWritesFloat32WeightAndBiasGradients) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  for (bool fuse : {true, false}) {
    SCOPED_TRACE(fuse ? "bias gradient fused where possible" : "bias gradient unfused");
    const bool was = native::fuse_bias_grad();
    native::set_fuse_bias_grad(fuse);
    manual_seed(7);
    auto opts = TensorOptions().device(dev());
    Tensor x = tg::randn({64, 48}, opts);
    Tensor w = (tg::randn({32, 48}, opts) * 0.1).requires_grad_();
    Tensor b = tg::randn({32}, opts).requires_grad_();
    Tensor y;
    {
      amp::autocast guard(dev().type());
      y = tg::linear(x, w, b);
    }
    ASSERT_EQ(y.dtype(), low());
    Tensor g = tg::randn({64, 32}, opts).to(low());
    const uint64_t wide0 = native::wide_gemm_count();
    y.backward(g);
    native::set_fuse_bias_grad(was);
    EXPECT_EQ(native::wide_gemm_count() - wide0, 1u);  // the weight gemm stored float32
    ASSERT_EQ(w.grad().dtype(), kFloat32);
    ASSERT_EQ(b.grad().dtype(), kFloat32);
    WB r = ref_grads(g, x.to(low()));
    EXPECT_LT(max_rel(w.grad(), r.gw, r.sgw), kFloat32Tol);
    EXPECT_LT(max_rel(b.grad(), r.gb, r.sgb), kFloat32Tol);
  }
}

// The same through nn::Linear with a float32 loss after it, as the AMP example does.
TEST_P(WideGrad, LinearModuleWithLossMatchesReference) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  manual_seed(8);
  nn::Linear model(40, 24);
  model.to(dev());
  Tensor x = tg::randn({64, 40}, TensorOptions().device(dev()));
  Tensor loss, y;
  {
    amp::autocast guard(dev().type());
    y = model(x);
    loss = y.pow(2).mean();
  }
  EXPECT_EQ(loss.dtype(), kFloat32);
  y.retain_grad();  // the half gradient that reaches the linear: the reference's input
  loss.backward();
  ASSERT_EQ(model.weight.grad().dtype(), kFloat32);
  ASSERT_EQ(y.grad().dtype(), low());
  WB r = ref_grads(y.grad(), x.to(low()));
  EXPECT_LT(max_rel(model.weight.grad(), r.gw, r.sgw), kFloat32Tol);
  EXPECT_LT(max_rel(model.bias.grad(), r.gb, r.sgb), kFloat32Tol);
}

// Launches of the half linear's backward with float32 master weights: the weight gemm (bias
// gradient fused on CUDA where cuBLASLt has it, else one more reduction). The casts' backward
// and the accumulation into .grad() add none.
TEST_P(WideGrad, CastBackwardAddsNoLaunch) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  auto opts = TensorOptions().device(dev());
  Tensor x = tg::randn({64, 32}, opts).to(low());
  Tensor w = tg::randn({16, 32}, opts).requires_grad_(), b = tg::randn({16}, opts).requires_grad_();
  Tensor wh = w.to(low()), bh = b.to(low());
  Tensor y = tg::linear(x, wh, bh);
  Tensor g = tg::randn({64, 16}, opts).to(low());
  native::set_fuse_bias_grad(false);
  uint64_t c0 = backend::dispatch_count();
  y.backward(g, {.retain_graph = true});
  EXPECT_EQ(backend::dispatch_count() - c0, 2u);  // gemm + bias reduction
  native::set_fuse_bias_grad(true);
  w.mutable_grad() = Tensor();
  b.mutable_grad() = Tensor();
  c0 = backend::dispatch_count();
  y.backward(g);
  const uint64_t n = backend::dispatch_count() - c0;
  if (dev().is_cuda())
    EXPECT_LE(n, 2u);
  else
    EXPECT_EQ(n, 2u);  // the CPU backend fuses no epilogue
  EXPECT_EQ(w.grad().dtype(), kFloat32);
  EXPECT_EQ(b.grad().dtype(), kFloat32);
}

// matmul does the same for each operand whose gradient goes to a cast from float32, including
// through the permute views autocast puts around a transposed weight (x @ w.t()).
TEST_P(WideGrad, MatmulOperandsAndTransposedWeights) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  manual_seed(9);
  auto opts = TensorOptions().device(dev());
  Tensor x = tg::randn({64, 24}, opts).requires_grad_();
  Tensor w = tg::randn({16, 24}, opts).requires_grad_();
  Tensor y;
  {
    amp::autocast guard(dev().type());
    y = tg::matmul(x, w.t());  // both operands cast; w.t() through permutes
  }
  ASSERT_EQ(y.dtype(), low());
  Tensor g = tg::randn({64, 16}, opts).to(low());
  const uint64_t wide0 = native::wide_gemm_count();
  y.backward(g);
  EXPECT_EQ(native::wide_gemm_count() - wide0, 2u);
  ASSERT_EQ(w.grad().dtype(), kFloat32);
  ASSERT_EQ(x.grad().dtype(), kFloat32);
  EXPECT_TRUE(w.grad().is_contiguous());
  WB r = ref_grads(g, x.detach().to(low()));
  EXPECT_LT(max_rel(w.grad(), r.gw, r.sgw), kFloat32Tol);
  // dx = g wh: reference from the half weight.
  RefTensor G = RefTensor::from(g), W = RefTensor::from(w.detach().to(low()));
  RefTensor dx({64, 24}), sdx({64, 24});
  for (int i = 0; i < 64; ++i)
    for (int o = 0; o < 16; ++o)
      for (int k = 0; k < 24; ++k) {
        dx.v[i * 24 + k] += G.v[i * 16 + o] * W.v[o * 24 + k];
        sdx.v[i * 24 + k] += std::abs(G.v[i * 16 + o] * W.v[o * 24 + k]);
      }
  EXPECT_LT(max_rel(x.grad(), dx, sdx), kFloat32Tol);
}

// The engine: a half tensor's own gradient (retain_grad, autograd::grad) stays in its dtype
// even when a float32 one flowed into its node; gradients from several consumers, one float32
// and one half, are summed (in float32).
TEST_P(WideGrad, EngineKeepsTensorsOwnGradientDtype) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  auto opts = TensorOptions().device(dev());
  Tensor x = tg::randn({8, 6}, opts).to(low());
  Tensor w = tg::randn({4, 6}, opts).requires_grad_();
  Tensor wh = w.to(low());
  wh.retain_grad();
  Tensor y = tg::linear(x, wh) + (wh * 2).sum();  // linear: float32 gradient; mul: half
  Tensor g = tg::randn({8, 4}, opts).to(low());
  std::vector<Tensor> gwh = tg::autograd::grad({y}, {wh}, {g}, /*retain_graph=*/true);
  EXPECT_EQ(gwh[0].dtype(), low());
  y.backward(g);
  EXPECT_EQ(wh.grad().dtype(), low());
  EXPECT_EQ(w.grad().dtype(), kFloat32);
  // Reference: gw = g^T x + 2 * sum(g) (every element of wh feeds the sum through each row of y).
  WB r = ref_grads(g, x);
  double gs = 0;
  for (double v : RefTensor::from(g).v) gs += v;
  RefTensor want = r.gw, scale = r.sgw;
  for (size_t i = 0; i < want.v.size(); ++i) {
    want.v[i] += 2 * gs;
    scale.v[i] += 2 * std::abs(gs) + 1e-3;
  }
  // The half mul's gradient (2 * sum g, rounded to half twice) bounds the error; wh's own
  // gradient is rounded to half once more.
  EXPECT_LT(max_rel(w.grad(), want, scale), low() == kFloat16 ? 2e-3 : 1.6e-2);
  EXPECT_LT(max_rel(wh.grad(), want, scale), low() == kFloat16 ? 3e-3 : 2.4e-2);
  EXPECT_LT(max_rel(gwh[0], want, scale), low() == kFloat16 ? 3e-3 : 2.4e-2);
}

// Only a cast from float32 on one device takes float32: a half leaf's gradient stays half and a
// float64 -> float32 cast gets float32.
TEST_P(WideGrad, OtherCastsAreUnchanged) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  auto opts = TensorOptions().device(dev());
  Tensor x = tg::randn({8, 6}, opts).to(low());
  Tensor wl = tg::randn({4, 6}, opts).to(low()).requires_grad_();
  const uint64_t wide0 = native::wide_gemm_count();
  tg::linear(x, wl).sum().backward();
  EXPECT_EQ(wl.grad().dtype(), low());
  Tensor w64 = tg::randn({4, 6}, TensorOptions().dtype(kFloat64).device(dev())).requires_grad_();
  tg::linear(x.to(kFloat32), w64.to(kFloat32)).sum().backward();
  EXPECT_EQ(w64.grad().dtype(), kFloat64);
  EXPECT_EQ(native::wide_gemm_count(), wide0);
}

INSTANTIATE_TEST_SUITE_P(Devices, WideGrad, ::testing::Values(Dev::CPU, Dev::CUDA), dev_name);

}  // namespace
}  // namespace tg::testing
