// The in-place Tensor methods (add_, mul_, copy_, relu_, clamp_, ...), each with its backward
// right below. Every one bumps the storage's version counter. With grad mode off, or when
// nothing involved takes part in autograd, that and the write are all they do
// (autograd::check_inplace is one thread-local read under tg::NoGradGuard). Otherwise the op is
// recorded as in PyTorch (autograd::rebase_history): self's history, or for a view its base's
// (CopySlices), goes through the op's backward. A backward that reads the result saves it after
// the bump; one that reads self's old value saves a copy taken before the write (PyTorch's
// original_self: mul_, div_, clamp_), so a later in-place op does not invalidate it. Every
// backward here computes with autograd::bw, so create_graph differentiates it again.
#include <limits>
#include <vector>

#include <tapegrad/autograd/function.h>
#include <tapegrad/core/trace.h>

namespace tg {

using autograd::FunctionNode;
using autograd::rebase_history;
using autograd::SavedTensor;
using backend::ElemOp;
using Grads = std::vector<Tensor>;

namespace {
void bump(const Tensor& t) { t.impl().storage->bump_version(); }
Tensor zeros_as(const Tensor& g) { return native::full(g.sizes(), 0, g.dtype(), g.device()); }
Scalar negate(const Scalar& s) {
  // Integral negation wraps (-INT64_MIN is INT64_MIN), as the integer kernels do.
  return s.is_integral() ? Scalar(static_cast<long long>(0ULL - static_cast<uint64_t>(s.to_int())))
                         : Scalar(-s.to_double());
}
// A copy of self's value before an in-place write, for a backward that reads it (PyTorch's
// original_self). Taken with tg::clone, so it keeps self's old history: the gradient computed from
// it under create_graph reaches what self was computed from (its double backward is exact).
Tensor original_self(const Tensor& self) {
  detail::TracerGuard untraced(nullptr);  // bookkeeping, not part of a traced program
  return self.clone();
}
// The gradient of self for ops whose result does not depend on self's old value (fill_, copy_).
Tensor no_grad_of_old_value(const Tensor& g, const FunctionNode& n) {
  return n.needs_input_grad(0) ? zeros_as(g) : Tensor();
}
}  // namespace

// ---- add_ / sub_
const Tensor& Tensor::add_(const Tensor& o, Scalar alpha) const {
  const bool rec = autograd::check_inplace(*this, "add_", o);
  native::binary_out(ElemOp::Add, *this, *this, o, alpha.to_double());
  bump(*this);
  if (rec)
    rebase_history("add_", *this, {o}, [al = alpha.to_double()](const Tensor& g, const FunctionNode& n) -> Grads {
      Tensor go;
      if (n.needs_input_grad(1)) go = al == 1 ? g : autograd::bw::mul(g, Scalar(al));
      return {n.needs_input_grad(0) ? g : Tensor(), go};
    }, autograd::kDifferentiable);
  return *this;
}
const Tensor& Tensor::add_(Scalar o) const {
  const bool rec = autograd::check_inplace(*this, "add_");
  native::scalar_op_out(ElemOp::AddScalar, *this, *this, o);
  bump(*this);
  if (rec)
    rebase_history("add_", *this, {}, [](const Tensor& g, const FunctionNode&) -> Grads { return {g}; },
                   autograd::kDifferentiable);
  return *this;
}
const Tensor& Tensor::sub_(const Tensor& o, Scalar alpha) const {
  const bool rec = autograd::check_inplace(*this, "sub_", o);
  native::binary_out(ElemOp::Sub, *this, *this, o, alpha.to_double());
  bump(*this);
  if (rec)
    rebase_history("sub_", *this, {o}, [al = alpha.to_double()](const Tensor& g, const FunctionNode& n) -> Grads {
      Tensor go;
      if (n.needs_input_grad(1)) go = al == 1 ? autograd::bw::neg(g) : autograd::bw::mul(g, Scalar(-al));
      return {n.needs_input_grad(0) ? g : Tensor(), go};
    }, autograd::kDifferentiable);
  return *this;
}
const Tensor& Tensor::sub_(Scalar o) const {
  const bool rec = autograd::check_inplace(*this, "sub_");
  native::scalar_op_out(ElemOp::AddScalar, *this, *this, negate(o));
  bump(*this);
  if (rec)
    rebase_history("sub_", *this, {}, [](const Tensor& g, const FunctionNode&) -> Grads { return {g}; },
                   autograd::kDifferentiable);
  return *this;
}

// ---- mul_ / div_
const Tensor& Tensor::mul_(const Tensor& o) const {
  const bool rec = autograd::check_inplace(*this, "mul_", o);
  SavedTensor so, old_self;
  if (rec) {
    so = SavedTensor(o, "mul_");
    if (autograd::requires_grad(o)) old_self = SavedTensor(original_self(*this), "mul_");  // o's gradient reads it
  }
  native::binary_out(ElemOp::Mul, *this, *this, o);
  bump(*this);
  if (rec)
    rebase_history("mul_", *this, {o}, [so, old_self](const Tensor& g, const FunctionNode& n) -> Grads {
      return {n.needs_input_grad(0) ? autograd::bw::mul(g, so.unpack()) : Tensor(),
              n.needs_input_grad(1) ? autograd::bw::mul(g, old_self.unpack()) : Tensor()};
    }, autograd::kDifferentiable);
  return *this;
}
const Tensor& Tensor::mul_(Scalar o) const {
  const bool rec = autograd::check_inplace(*this, "mul_");
  native::scalar_op_out(ElemOp::MulScalar, *this, *this, o);
  bump(*this);
  if (rec)
    rebase_history("mul_", *this, {}, [o](const Tensor& g, const FunctionNode&) -> Grads {
      return {autograd::bw::mul(g, o)};
    }, autograd::kDifferentiable);
  return *this;
}
const Tensor& Tensor::div_(const Tensor& o) const {
  const bool rec = autograd::check_inplace(*this, "div_", o);
  TG_CHECK(is_floating(dtype()), "div_: true division cannot write into a tensor of dtype ", dtype());
  SavedTensor so, old_self;
  if (rec) {
    so = SavedTensor(o, "div_");
    if (autograd::requires_grad(o)) old_self = SavedTensor(original_self(*this), "div_");  // o's gradient reads it
  }
  native::binary_out(ElemOp::Div, *this, *this, o);
  bump(*this);
  if (rec)
    rebase_history("div_", *this, {o}, [so, old_self](const Tensor& g, const FunctionNode& n) -> Grads {
      namespace bw = autograd::bw;
      Tensor ov = so.unpack();
      Tensor gs, go;
      if (n.needs_input_grad(0)) gs = bw::div(g, ov);
      if (n.needs_input_grad(1))  // -g x / o^2
        go = bw::mul(bw::div(bw::mul(g, old_self.unpack()), bw::mul(ov, ov)), Scalar(-1.0));
      return {gs, go};
    }, autograd::kDifferentiable);
  return *this;
}
const Tensor& Tensor::div_(Scalar o) const {
  const bool rec = autograd::check_inplace(*this, "div_");
  TG_CHECK(is_floating(dtype()), "div_: true division cannot write into a tensor of dtype ", dtype());
  native::scalar_op_out(ElemOp::DivScalar, *this, *this, o);
  bump(*this);
  if (rec)
    rebase_history("div_", *this, {}, [o](const Tensor& g, const FunctionNode&) -> Grads {
      if (autograd::creating_graph()) return {tg::div(g, o)};
      return {native::scalar_op(ElemOp::DivScalar, g, o)};
    }, autograd::kDifferentiable);
  return *this;
}

// ---- fills, random fills, copy_: the old value gets no gradient
const Tensor& Tensor::zero_() const { return fill_(0); }
const Tensor& Tensor::fill_(Scalar v) const {
  const bool rec = autograd::check_inplace(*this, "fill_");
  native::fill_(*this, v);
  bump(*this);
  if (rec)
    rebase_history("fill_", *this, {},
                   [](const Tensor& g, const FunctionNode& n) -> Grads { return {no_grad_of_old_value(g, n)}; },
                   autograd::kDifferentiable);
  return *this;
}
const Tensor& Tensor::uniform_(double from, double to) const {
  const bool rec = autograd::check_inplace(*this, "uniform_");
  native::uniform_(*this, from, to);
  bump(*this);
  if (rec)
    rebase_history("uniform_", *this, {},
                   [](const Tensor& g, const FunctionNode& n) -> Grads { return {no_grad_of_old_value(g, n)}; },
                   autograd::kDifferentiable);
  return *this;
}
const Tensor& Tensor::normal_(double mean, double std) const {
  const bool rec = autograd::check_inplace(*this, "normal_");
  native::normal_(*this, mean, std);
  bump(*this);
  if (rec)
    rebase_history("normal_", *this, {},
                   [](const Tensor& g, const FunctionNode& n) -> Grads { return {no_grad_of_old_value(g, n)}; },
                   autograd::kDifferentiable);
  return *this;
}
const Tensor& Tensor::copy_(const Tensor& src, bool non_blocking) const {
  const bool rec = autograd::check_inplace(*this, "copy_", src);
  native::copy_(*this, src, non_blocking);
  bump(*this);
  // src's gradient is g; the engine reduces a broadcast src and casts to its dtype and device.
  if (rec)
    rebase_history("copy_", *this, {src}, [](const Tensor& g, const FunctionNode& n) -> Grads {
      return {no_grad_of_old_value(g, n), n.needs_input_grad(1) ? g : Tensor()};
    }, autograd::kDifferentiable);
  return *this;
}

// ---- activations and exp: the backward reads the result, saved after the bump
namespace {
// `bwd_name`: the backward's own node under create_graph (autograd::bw::elementwise_backward).
const Tensor& unary_inplace(const char* name, const char* bwd_name, ElemOp op, ElemOp bwd, const Tensor& self) {
  const bool rec = autograd::check_inplace(self, name);
  native::unary_out(op, self, self);
  bump(self);
  if (rec) {
    SavedTensor sy(self, name, autograd::Saved::kOutput);
    rebase_history(name, self, {}, [sy, bwd_name, bwd](const Tensor& g, const FunctionNode&) -> Grads {
      return {autograd::bw::elementwise_backward(bwd_name, bwd, g, sy.unpack())};
    }, autograd::kDifferentiable);
  }
  return self;
}
}  // namespace
const Tensor& Tensor::relu_() const { return unary_inplace("relu_", "relu_backward", ElemOp::Relu, ElemOp::ReluBackward, *this); }
const Tensor& Tensor::sigmoid_() const {
  return unary_inplace("sigmoid_", "sigmoid_backward", ElemOp::Sigmoid, ElemOp::SigmoidBackward, *this);
}
const Tensor& Tensor::tanh_() const { return unary_inplace("tanh_", "tanh_backward", ElemOp::Tanh, ElemOp::TanhBackward, *this); }
const Tensor& Tensor::exp_() const { return unary_inplace("exp_", "exp_backward", ElemOp::Exp, ElemOp::Mul, *this); }

// ---- clamp_: the gradient passes where lo <= x <= hi, x being self's old value (a copy)
const Tensor& Tensor::clamp_(Scalar lo, Scalar hi) const {
  const bool rec = autograd::check_inplace(*this, "clamp_");
  SavedTensor old_self = rec ? SavedTensor(original_self(*this), "clamp_") : SavedTensor();
  const double l = lo.to_double(), h = hi.to_double();
  native::unary_out(ElemOp::Clamp, *this, *this, l, h);
  bump(*this);
  if (rec)
    rebase_history("clamp_", *this, {}, [old_self, l, h](const Tensor& g, const FunctionNode&) -> Grads {
      return {autograd::bw::elementwise_backward("clamp_backward", ElemOp::ClampBackward, g, old_self.unpack(), l, h)};
    }, autograd::kDifferentiable);
  return *this;
}
const Tensor& Tensor::clamp_min_(Scalar lo) const { return clamp_(lo, std::numeric_limits<double>::infinity()); }
const Tensor& Tensor::clamp_max_(Scalar hi) const { return clamp_(-std::numeric_limits<double>::infinity(), hi); }

}  // namespace tg
