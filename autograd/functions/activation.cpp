// Issue 15's unary math and activations (sin, cos, rsqrt, silu, gelu "tanh", softplus,
// leaky_relu, elu), each with its backward right below: one fused elementwise kernel per
// direction (backend::ElemOp), the saved tensor being the input or the output.
#include <string>
#include <string_view>
#include <vector>

#include <tapegrad/autograd/function.h>
#include <tapegrad/core/autocast_hook.h>
#include <tapegrad/core/trace.h>

namespace tg {

using autograd::FunctionNode;
using autograd::kDifferentiable;
using autograd::record;
using autograd::Saved;
using autograd::SavedTensor;
using autograd::should_record;
using backend::ElemOp;
using Grads = std::vector<Tensor>;

namespace {
// PyTorch's activations have no integer kernels ("not implemented for 'Long'").
void check_floating(const char* op, const Tensor& a) {
  TG_CHECK(is_floating(a.dtype()), op, ": expected a floating tensor, got ", a.dtype(), " of shape ", a.sizes());
}

// y = op(x) with the gradient g -> bwd(g, saved) where saved is x (or y when save_output).
// `bwd_name`: the backward's own node under create_graph (autograd::bw::elementwise_backward).
Tensor unary_act(const char* name, const char* bwd_name, ElemOp bwd, const Tensor& a, Tensor out, bool save_output,
                 double p0 = 0, double p1 = 0) {
  if (!should_record(a)) return out;
  SavedTensor s = save_output ? SavedTensor(out, name, Saved::kOutput) : SavedTensor(a, name);
  Tensor res = record(name, {a}, std::move(out), [s, bwd_name, bwd, p0, p1](const Tensor& g, const FunctionNode&) -> Grads {
    return {autograd::bw::elementwise_backward(bwd_name, bwd, g, s.unpack(), p0, p1)};
  }, kDifferentiable);
  // The same backward, described, for a producer of the gradient that applies it itself
  // (a linear's GEMM epilogue: autograd::pointwise_next).
  if (auto* node = dynamic_cast<FunctionNode*>(res.grad_fn().get()))
    node->pointwise = autograd::PointwiseGrad{bwd_name, bwd, s, p0, p1};
  return res;
}
}  // namespace

Tensor sin(const Tensor& a) {
  TG_AUTOCAST(Sin, tg::sin(a), a);
  Tensor out = native::unary(ElemOp::Sin, a);
  TG_TRACE(Sin, out, {a}, {});
  if (!should_record(a)) return out;
  SavedTensor sx(a, "sin");
  return record("sin", {a}, std::move(out), [sx](const Tensor& g, const FunctionNode&) -> Grads {
    if (autograd::creating_graph()) return {tg::mul(g, tg::cos(sx.unpack()))};
    return {native::mul(g, native::unary(ElemOp::Cos, sx.unpack()))};
  }, kDifferentiable);
}

Tensor cos(const Tensor& a) {
  TG_AUTOCAST(Cos, tg::cos(a), a);
  Tensor out = native::unary(ElemOp::Cos, a);
  TG_TRACE(Cos, out, {a}, {});
  if (!should_record(a)) return out;
  SavedTensor sx(a, "cos");
  return record("cos", {a}, std::move(out), [sx](const Tensor& g, const FunctionNode&) -> Grads {
    if (autograd::creating_graph()) return {tg::mul(g, tg::neg(tg::sin(sx.unpack())))};
    return {native::mul(g, native::scalar_op(ElemOp::MulScalar, native::unary(ElemOp::Sin, sx.unpack()), -1.0))};
  }, kDifferentiable);
}

Tensor rsqrt(const Tensor& a) {
  TG_AUTOCAST(Rsqrt, tg::rsqrt(a), a);
  Tensor out = native::unary(ElemOp::Rsqrt, a);
  TG_TRACE(Rsqrt, out, {a}, {});
  return unary_act("rsqrt", "rsqrt_backward", ElemOp::RsqrtBackward, a, std::move(out), true);
}

Tensor silu(const Tensor& a) {
  TG_AUTOCAST(Silu, tg::silu(a), a);
  check_floating("silu", a);
  Tensor out = native::unary(ElemOp::Silu, a);
  TG_TRACE(Silu, out, {a}, {});
  return unary_act("silu", "silu_backward", ElemOp::SiluBackward, a, std::move(out), false);
}

Tensor gelu(const Tensor& a, std::string_view approximate) {
  if (approximate == "none") return gelu(a);
  TG_CHECK(approximate == "tanh", "gelu: approximate must be \"none\" or \"tanh\", got \"", std::string(approximate),
           "\"");
  TG_AUTOCAST(GeluTanh, tg::gelu(a, "tanh"), a);
  check_floating("gelu", a);
  Tensor out = native::unary(ElemOp::GeluTanh, a);
  TG_TRACE(GeluTanh, out, {a}, {});
  return unary_act("gelu", "gelu_tanh_backward", ElemOp::GeluTanhBackward, a, std::move(out), false);
}

Tensor softplus(const Tensor& a, Scalar beta, Scalar threshold) {
  TG_AUTOCAST(Softplus, tg::softplus(a, beta, threshold), a);
  check_floating("softplus", a);
  const double b = beta.to_double(), t = threshold.to_double();
  TG_CHECK(b != 0, "softplus: beta must be non-zero");
  Tensor out = native::unary(ElemOp::Softplus, a, b, t);
  TG_TRACE(Softplus, out, {a}, {{"beta", detail::trace_scalar(beta)}, {"threshold", detail::trace_scalar(threshold)}});
  return unary_act("softplus", "softplus_backward", ElemOp::SoftplusBackward, a, std::move(out), false, b, t);
}

Tensor leaky_relu(const Tensor& a, Scalar negative_slope) {
  TG_AUTOCAST(LeakyRelu, tg::leaky_relu(a, negative_slope), a);
  check_floating("leaky_relu", a);
  const double s = negative_slope.to_double();
  Tensor out = native::unary(ElemOp::LeakyRelu, a, s);
  TG_TRACE(LeakyRelu, out, {a}, {{"negative_slope", detail::trace_scalar(negative_slope)}});
  return unary_act("leaky_relu", "leaky_relu_backward", ElemOp::LeakyReluBackward, a, std::move(out), false, s);
}

Tensor elu(const Tensor& a, Scalar alpha) {
  TG_AUTOCAST(Elu, tg::elu(a, alpha), a);
  check_floating("elu", a);
  const double al = alpha.to_double();
  Tensor out = native::unary(ElemOp::Elu, a, al);
  TG_TRACE(Elu, out, {a}, {{"alpha", detail::trace_scalar(alpha)}});
  return unary_act("elu", "elu_backward", ElemOp::EluBackward, a, std::move(out), false, al);
}

Tensor Tensor::sin() const { return tg::sin(*this); }
Tensor Tensor::cos() const { return tg::cos(*this); }
Tensor Tensor::rsqrt() const { return tg::rsqrt(*this); }
Tensor Tensor::gelu(std::string_view approximate) const { return tg::gelu(*this, approximate); }

}  // namespace tg
