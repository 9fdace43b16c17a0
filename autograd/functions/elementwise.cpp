// Elementwise ops with their backward right below the forward. Gradients come
// out in the broadcast output shape; the engine reduces them to each input's
// shape and dtype (autograd/engine.cpp, conform), so no op does it itself.
#include <vector>

#include <tapegrad/core/autocast_hook.h>
#include <tapegrad/autograd/function.h>
#include <tapegrad/core/trace.h>

namespace tg {

using autograd::FunctionNode;
using autograd::kDifferentiable;
using autograd::record;
using autograd::Saved;
namespace bw = autograd::bw;
using autograd::SavedTensor;
using autograd::should_record;
using backend::ElemOp;
using Grads = std::vector<Tensor>;

namespace {
Scalar negate(const Scalar& s) {
  return s.is_integral() ? Scalar(static_cast<long long>(-s.to_int())) : Scalar(-s.to_double());
}
Tensor zero_of(const Tensor& g) { return native::full(Shape{}, 0, g.dtype(), g.device()); }
// Autocast runs exp, log, sqrt and pow(tensor, scalar) in float32. Their kernels read a float16 /
// bfloat16 input as is and write float32, and their backward writes the gradient in the input's
// dtype, each in one launch, where a cast node would add a cast launch to either pass. The numbers
// are the cast's: widening is exact, and the cast's backward rounded the float32 gradient once,
// as the store does. The trace records the op as it ran (a float16 input, a float32 result); the
// exporter's replay and ONNX lowering widen the input first, as every lowering of a mixed op does.
bool widens_in_kernel(const Tensor& a) { return amp::detail::fp32_reads_reduced(a); }
// Autocast promotes add / sub operands to their widest dtype. For a float32 and a float16 /
// bfloat16 tensor (an autocast model's float32 residual stream plus a block's half output) that is
// exactly what the mixed kernel computes reading the half operand as it is (backend::has_mixed_form),
// so no cast node and no cast pass. Only where plain type promotion gives the same dtype: a 0-d
// operand beside a dimmed one does not promote within floating types.
bool promotes_in_kernel(ElemOp op, const Tensor& a, const Tensor& b) {
  if (a.dtype() == b.dtype() || !is_floating(a.dtype()) || !is_floating(b.dtype()) || (a.dim() == 0) != (b.dim() == 0))
    return false;
  const DType dtypes[] = {promote_types(a.dtype(), b.dtype()), a.dtype(), b.dtype()};
  return backend::has_mixed_form(op, dtypes);
}
}  // namespace

// ---- add / sub
Tensor add(const Tensor& a, const Tensor& b, Scalar alpha) {
  const bool mixed = promotes_in_kernel(ElemOp::Add, a, b);
  if (!mixed) TG_AUTOCAST(Add, tg::add(a, b, alpha), a, b);
  Tensor out = native::binary(ElemOp::Add, a, b, alpha.to_double());
  TG_TRACE(Add, out, {a, b}, {{"alpha", detail::trace_scalar(alpha)}});
  if (!should_record(a, b)) return out;
  const double al = alpha.to_double();
  Tensor res = record("add", {a, b}, std::move(out), [al](const Tensor& g, const FunctionNode& n) -> Grads {
    Tensor gb;
    if (n.needs_input_grad(1)) gb = al == 1 ? g : bw::mul(g, Scalar(al));
    return {n.needs_input_grad(0) ? g : Tensor(), gb};
  }, kDifferentiable);
  // A float32 residual stream plus a block's half output: the gradient passes to both, and the
  // engine casts it to the half operand's dtype; whoever writes that gradient may write the cast too.
  if (mixed && al == 1) {
    const Tensor& half = is_reduced_float(a.dtype()) ? a : b;
    if (is_reduced_float(half.dtype()) && autograd::requires_grad(half) && half.sizes() == res.sizes())
      autograd::expect_grad_cast(res, half.dtype());
  }
  return res;
}

Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha) {
  if (!promotes_in_kernel(ElemOp::Sub, a, b)) TG_AUTOCAST(Sub, tg::sub(a, b, alpha), a, b);
  Tensor out = native::binary(ElemOp::Sub, a, b, alpha.to_double());
  TG_TRACE(Sub, out, {a, b}, {{"alpha", detail::trace_scalar(alpha)}});
  if (!should_record(a, b)) return out;
  const double al = alpha.to_double();
  return record("sub", {a, b}, std::move(out), [al](const Tensor& g, const FunctionNode& n) -> Grads {
    Tensor gb;
    if (n.needs_input_grad(1)) gb = al == 1 ? bw::neg(g) : bw::mul(g, Scalar(-al));
    return {n.needs_input_grad(0) ? g : Tensor(), gb};
  }, kDifferentiable);
}

// ---- mul / div
Tensor mul(const Tensor& a, const Tensor& b) {
  TG_AUTOCAST(Mul, tg::mul(a, b), a, b);
  Tensor out = native::mul(a, b);
  TG_TRACE(Mul, out, {a, b}, {});
  if (!should_record(a, b)) return out;
  // Save only what backward reads: b for a's grad, a for b's.
  SavedTensor sa = autograd::requires_grad(b) ? SavedTensor(a, "mul") : SavedTensor();
  SavedTensor sb = autograd::requires_grad(a) ? SavedTensor(b, "mul") : SavedTensor();
  return record("mul", {a, b}, std::move(out), [sa, sb](const Tensor& g, const FunctionNode& n) -> Grads {
    return {n.needs_input_grad(0) ? bw::mul(g, sb.unpack()) : Tensor(),
            n.needs_input_grad(1) ? bw::mul(g, sa.unpack()) : Tensor()};
  }, kDifferentiable);
}

Tensor div(const Tensor& a, const Tensor& b) {
  TG_AUTOCAST(Div, tg::div(a, b), a, b);
  Tensor out = native::div(a, b);
  TG_TRACE(Div, out, {a, b}, {});
  if (!should_record(a, b)) return out;
  SavedTensor sa = autograd::requires_grad(b) ? SavedTensor(a, "div") : SavedTensor();
  SavedTensor sb(b, "div");
  return record("div", {a, b}, std::move(out), [sa, sb](const Tensor& g, const FunctionNode& n) -> Grads {
    Tensor bv = sb.unpack();
    Tensor ga, gb;
    if (n.needs_input_grad(0)) ga = bw::div(g, bv);
    if (n.needs_input_grad(1))  // -g * a / b^2
      gb = bw::mul(bw::div(bw::mul(g, sa.unpack()), bw::mul(bv, bv)), Scalar(-1.0));
    return {ga, gb};
  }, kDifferentiable);
}

// ---- scalar forms
Tensor add(const Tensor& a, Scalar b) {
  Tensor out = native::scalar_op(ElemOp::AddScalar, a, b);
  TG_TRACE(AddScalar, out, {a}, {{"other", detail::trace_scalar(b)}});
  if (!should_record(a)) return out;
  return record("add", {a}, std::move(out), [](const Tensor& g, const FunctionNode&) -> Grads { return {g}; },
                kDifferentiable);
}

Tensor sub(const Tensor& a, Scalar b) {
  Tensor out = native::scalar_op(ElemOp::AddScalar, a, negate(b));
  TG_TRACE(SubScalar, out, {a}, {{"other", detail::trace_scalar(b)}});
  if (!should_record(a)) return out;
  return record("sub", {a}, std::move(out), [](const Tensor& g, const FunctionNode&) -> Grads { return {g}; },
                kDifferentiable);
}

Tensor rsub(const Tensor& a, Scalar b) {
  Tensor out = native::scalar_op(ElemOp::RSubScalar, a, b);
  TG_TRACE(RSubScalar, out, {a}, {{"other", detail::trace_scalar(b)}});
  if (!should_record(a)) return out;
  return record("rsub", {a}, std::move(out),
                [](const Tensor& g, const FunctionNode&) -> Grads { return {bw::neg(g)}; }, kDifferentiable);
}

Tensor mul(const Tensor& a, Scalar b) {
  Tensor out = native::scalar_op(ElemOp::MulScalar, a, b);
  TG_TRACE(MulScalar, out, {a}, {{"other", detail::trace_scalar(b)}});
  if (!should_record(a)) return out;
  return record("mul", {a}, std::move(out), [b](const Tensor& g, const FunctionNode&) -> Grads {
    return {bw::mul(g, b)};
  }, kDifferentiable);
}

Tensor div(const Tensor& a, Scalar b) {
  Tensor out = native::scalar_op(ElemOp::DivScalar, a, b);
  TG_TRACE(DivScalar, out, {a}, {{"other", detail::trace_scalar(b)}});
  if (!should_record(a)) return out;
  return record("div", {a}, std::move(out), [b](const Tensor& g, const FunctionNode&) -> Grads {
    if (autograd::creating_graph()) return {tg::div(g, b)};
    return {native::scalar_op(ElemOp::DivScalar, g, b)};
  }, kDifferentiable);
}

Tensor rdiv(const Tensor& a, Scalar b) {
  Tensor out = native::scalar_op(ElemOp::RDivScalar, a, b);
  TG_TRACE(RDivScalar, out, {a}, {{"other", detail::trace_scalar(b)}});
  if (!should_record(a)) return out;
  SavedTensor sa(a, "rdiv"), sy(out, "rdiv", Saved::kOutput);
  return record("rdiv", {a}, std::move(out), [sa, sy](const Tensor& g, const FunctionNode&) -> Grads {
    // d(b / a)/da = -b / a^2 = -y / a
    return {bw::mul(bw::div(bw::mul(g, sy.unpack()), sa.unpack()), Scalar(-1.0))};
  }, kDifferentiable);
}

// ---- unary
Tensor neg(const Tensor& a) {
  Tensor out = native::unary(ElemOp::Neg, a);
  TG_TRACE(Neg, out, {a}, {});
  if (!should_record(a)) return out;
  return record("neg", {a}, std::move(out),
                [](const Tensor& g, const FunctionNode&) -> Grads { return {bw::neg(g)}; }, kDifferentiable);
}

// The gradients below are written in a's dtype (binary_to): the output's, except for a float16 /
// bfloat16 input that autocast widened in the kernel.
Tensor exp(const Tensor& a) {
  const bool widen = widens_in_kernel(a);
  if (!widen) TG_AUTOCAST(Exp, tg::exp(a), a);
  Tensor out = widen ? native::unary_to(ElemOp::Exp, a, kFloat32) : native::unary(ElemOp::Exp, a);
  TG_TRACE(Exp, out, {a}, {});
  if (!should_record(a)) return out;
  SavedTensor sy(out, "exp", Saved::kOutput);
  return record("exp", {a}, std::move(out), [sy, gd = a.dtype()](const Tensor& g, const FunctionNode&) -> Grads {
    if (autograd::creating_graph()) return {tg::mul(g, sy.unpack())};  // the engine casts it to gd
    return {native::binary_to(ElemOp::Mul, g, sy.unpack(), gd)};
  }, kDifferentiable);
}

Tensor log(const Tensor& a) {
  const bool widen = widens_in_kernel(a);
  if (!widen) TG_AUTOCAST(Log, tg::log(a), a);
  Tensor out = widen ? native::unary_to(ElemOp::Log, a, kFloat32) : native::unary(ElemOp::Log, a);
  TG_TRACE(Log, out, {a}, {});
  if (!should_record(a)) return out;
  SavedTensor sx(a, "log");
  return record("log", {a}, std::move(out), [sx, gd = a.dtype()](const Tensor& g, const FunctionNode&) -> Grads {
    if (autograd::creating_graph()) return {tg::div(g, sx.unpack())};
    return {native::binary_to(ElemOp::Div, g, sx.unpack(), gd)};
  }, kDifferentiable);
}

Tensor sqrt(const Tensor& a) {
  const bool widen = widens_in_kernel(a);
  if (!widen) TG_AUTOCAST(Sqrt, tg::sqrt(a), a);
  Tensor out = widen ? native::unary_to(ElemOp::Sqrt, a, kFloat32) : native::unary(ElemOp::Sqrt, a);
  TG_TRACE(Sqrt, out, {a}, {});
  if (!should_record(a)) return out;
  SavedTensor sy(out, "sqrt", Saved::kOutput);
  return record("sqrt", {a}, std::move(out), [sy, gd = a.dtype()](const Tensor& g, const FunctionNode&) -> Grads {
    if (autograd::creating_graph())
      return {bw::elementwise_backward("sqrt_backward", ElemOp::SqrtBackward, g, sy.unpack())};
    return {native::binary_to(ElemOp::SqrtBackward, g, sy.unpack(), gd)};
  }, kDifferentiable);
}

Tensor abs(const Tensor& a) {
  Tensor out = native::unary(ElemOp::Abs, a);
  TG_TRACE(Abs, out, {a}, {});
  if (!should_record(a)) return out;
  SavedTensor sx(a, "abs");
  return record("abs", {a}, std::move(out), [sx](const Tensor& g, const FunctionNode&) -> Grads {
    return {bw::elementwise_backward("abs_backward", ElemOp::AbsBackward, g, sx.unpack())};
  }, kDifferentiable);
}

Tensor relu(const Tensor& a) {
  Tensor out = native::unary(ElemOp::Relu, a);
  TG_TRACE(Relu, out, {a}, {});
  if (!should_record(a)) return out;
  SavedTensor sy(out, "relu", Saved::kOutput);  // y > 0 exactly where x > 0
  Tensor res = record("relu", {a}, std::move(out), [sy](const Tensor& g, const FunctionNode&) -> Grads {
    return {bw::elementwise_backward("relu_backward", ElemOp::ReluBackward, g, sy.unpack())};
  }, kDifferentiable);
  // The same backward, described, for a producer of the gradient that applies it itself (a
  // linear's float32 input gradient on CUDA's small-gemm kernel: autograd::pointwise_next).
  if (auto* node = dynamic_cast<FunctionNode*>(res.grad_fn().get()))
    node->pointwise = autograd::PointwiseGrad{"relu_backward", ElemOp::ReluBackward, sy};
  return res;
}

Tensor sigmoid(const Tensor& a) {
  Tensor out = native::unary(ElemOp::Sigmoid, a);
  TG_TRACE(Sigmoid, out, {a}, {});
  if (!should_record(a)) return out;
  SavedTensor sy(out, "sigmoid", Saved::kOutput);
  return record("sigmoid", {a}, std::move(out), [sy](const Tensor& g, const FunctionNode&) -> Grads {
    return {bw::elementwise_backward("sigmoid_backward", ElemOp::SigmoidBackward, g, sy.unpack())};
  }, kDifferentiable);
}

Tensor tanh(const Tensor& a) {
  Tensor out = native::unary(ElemOp::Tanh, a);
  TG_TRACE(Tanh, out, {a}, {});
  if (!should_record(a)) return out;
  SavedTensor sy(out, "tanh", Saved::kOutput);
  return record("tanh", {a}, std::move(out), [sy](const Tensor& g, const FunctionNode&) -> Grads {
    return {bw::elementwise_backward("tanh_backward", ElemOp::TanhBackward, g, sy.unpack())};
  }, kDifferentiable);
}

Tensor gelu(const Tensor& a) {
  Tensor out = native::unary(ElemOp::Gelu, a);
  TG_TRACE(Gelu, out, {a}, {});
  if (!should_record(a)) return out;
  SavedTensor sx(a, "gelu");
  return record("gelu", {a}, std::move(out), [sx](const Tensor& g, const FunctionNode&) -> Grads {
    return {bw::elementwise_backward("gelu_backward", ElemOp::GeluBackward, g, sx.unpack())};
  }, kDifferentiable);
}

Tensor pow(const Tensor& a, Scalar exponent) {
  const bool widen = widens_in_kernel(a);
  if (!widen) TG_AUTOCAST(PowScalar, tg::pow(a, exponent), a);
  const double e = exponent.to_double();
  Tensor out = widen ? native::unary_to(ElemOp::PowScalar, a, kFloat32, e) : native::unary(ElemOp::PowScalar, a, e);
  TG_TRACE(PowScalar, out, {a}, {{"exponent", detail::trace_scalar(exponent)}});
  if (!should_record(a)) return out;
  SavedTensor sx(a, "pow");
  return record("pow", {a}, std::move(out), [sx, e, gd = a.dtype()](const Tensor& g, const FunctionNode&) -> Grads {
    if (autograd::creating_graph())
      return {bw::elementwise_backward("pow_backward", ElemOp::PowScalarBackward, g, sx.unpack(), e)};
    return {native::binary_to(ElemOp::PowScalarBackward, g, sx.unpack(), gd, e)};
  }, kDifferentiable);
}

Tensor pow(const Tensor& a, const Tensor& exponent) {
  TG_AUTOCAST(Pow, tg::pow(a, exponent), a, exponent);
  Tensor out = native::binary(ElemOp::Pow, a, exponent);
  TG_TRACE(Pow, out, {a, exponent}, {});
  if (!should_record(a, exponent)) return out;
  SavedTensor sa(a, "pow"), sb(exponent, "pow");
  SavedTensor sy = autograd::requires_grad(exponent) ? SavedTensor(out, "pow", Saved::kOutput) : SavedTensor();
  return record("pow", {a, exponent}, std::move(out), [sa, sb, sy](const Tensor& g, const FunctionNode& n) -> Grads {
    Tensor x = sa.unpack(), e = sb.unpack();
    Tensor ga, gb;
    if (autograd::creating_graph()) {  // the same formulas, recorded
      if (n.needs_input_grad(0)) ga = tg::mul(g, tg::mul(e, tg::pow(x, tg::sub(e, Scalar(1.0)))));
      if (n.needs_input_grad(1)) {
        gb = tg::mul(g, tg::mul(sy.unpack(), tg::log(x)));
        gb = tg::where(x.eq(Scalar(0)), zero_of(gb), gb);
      }
      return {ga, gb};
    }
    if (n.needs_input_grad(0))  // g * e * x^(e - 1)
      ga = native::mul(g, native::mul(e, native::binary(ElemOp::Pow, x, native::add(e, Scalar(-1.0)))));
    if (n.needs_input_grad(1)) {  // g * y * log(x), taken as 0 where x == 0 (as PyTorch)
      gb = native::mul(g, native::mul(sy.unpack(), native::unary(ElemOp::Log, x)));
      gb = native::where(native::scalar_op(ElemOp::EqScalar, x, 0), zero_of(gb), gb);
    }
    return {ga, gb};
  }, kDifferentiable);
}

Tensor clamp(const Tensor& a, Scalar lo, Scalar hi) {
  Tensor out = native::unary(ElemOp::Clamp, a, lo.to_double(), hi.to_double());
  TG_TRACE(Clamp, out, {a}, {{"lo", detail::trace_scalar(lo)}, {"hi", detail::trace_scalar(hi)}});
  if (!should_record(a)) return out;
  SavedTensor sx(a, "clamp");
  return record("clamp", {a}, std::move(out), [sx, lo, hi](const Tensor& g, const FunctionNode&) -> Grads {
    // g where lo <= x <= hi, in one fused kernel.
    return {bw::elementwise_backward("clamp_backward", ElemOp::ClampBackward, g, sx.unpack(), lo.to_double(),
                                     hi.to_double())};
  }, kDifferentiable);
}

namespace {
// maximum / minimum: the gradient goes to the selected input, split in half on ties.
Tensor extremum(const char* name, OpKind kind, ElemOp op, ElemOp wins, const Tensor& a, const Tensor& b) {
  Tensor out = native::binary(op, a, b);
  if (detail::Tracer* tracer = detail::tls_tracer) [[unlikely]]
    tracer->record(kind, out, {a, b}, {});
  if (!should_record(a, b)) return out;
  SavedTensor sa(a, name), sb(b, name);
  return record(name, {a, b}, std::move(out), [sa, sb, wins](const Tensor& g, const FunctionNode& n) -> Grads {
    Tensor x = sa.unpack(), y = sb.unpack();  // the masks below are constants (bool)
    Tensor half = bw::mul(bw::where(native::binary(ElemOp::Eq, x, y), g, zero_of(g)), Scalar(0.5));
    Tensor ga, gb;
    if (n.needs_input_grad(0)) ga = bw::where(native::binary(wins, x, y), g, half);
    if (n.needs_input_grad(1)) gb = bw::where(native::binary(wins, y, x), g, half);
    // `half` is 0 where the other input wins, so the where above is exact.
    return {ga, gb};
  }, kDifferentiable);
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) {
  TG_AUTOCAST(Maximum, tg::maximum(a, b), a, b);
  return extremum("maximum", OpKind::Maximum, ElemOp::Maximum, ElemOp::Gt, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) {
  TG_AUTOCAST(Minimum, tg::minimum(a, b), a, b);
  return extremum("minimum", OpKind::Minimum, ElemOp::Minimum, ElemOp::Lt, a, b); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  TG_AUTOCAST(Where, tg::where(cond, a, b), cond, a, b);
  Tensor out = native::where(cond, a, b);
  TG_TRACE(Where, out, {cond, a, b}, {});
  if (!should_record(a, b)) return out;
  SavedTensor sc(cond, "where");
  return record("where", {a, b}, std::move(out), [sc](const Tensor& g, const FunctionNode& n) -> Grads {
    Tensor c = sc.unpack();
    return {n.needs_input_grad(0) ? bw::where(c, g, zero_of(g)) : Tensor(),
            n.needs_input_grad(1) ? bw::where(c, zero_of(g), g) : Tensor()};
  }, kDifferentiable);
}

// ---- comparisons: boolean results, never differentiable
namespace {
Tensor compare(OpKind kind, ElemOp op, const Tensor& a, const Tensor& b) {
  Tensor out = native::binary(op, a, b);
  if (detail::Tracer* tracer = detail::tls_tracer) [[unlikely]]
    tracer->record(kind, out, {a, b}, {});
  return out;
}
}  // namespace
Tensor eq(const Tensor& a, const Tensor& b) {
  TG_AUTOCAST(Eq, tg::eq(a, b), a, b);
  return compare(OpKind::Eq, ElemOp::Eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) {
  TG_AUTOCAST(Ne, tg::ne(a, b), a, b);
  return compare(OpKind::Ne, ElemOp::Ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) {
  TG_AUTOCAST(Lt, tg::lt(a, b), a, b);
  return compare(OpKind::Lt, ElemOp::Lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) {
  TG_AUTOCAST(Le, tg::le(a, b), a, b);
  return compare(OpKind::Le, ElemOp::Le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) {
  TG_AUTOCAST(Gt, tg::gt(a, b), a, b);
  return compare(OpKind::Gt, ElemOp::Gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) {
  TG_AUTOCAST(Ge, tg::ge(a, b), a, b);
  return compare(OpKind::Ge, ElemOp::Ge, a, b); }

}  // namespace tg
