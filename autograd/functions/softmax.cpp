// softmax, log_softmax and logsumexp with their backward right below the forward. softmax and
// log_softmax save only their output (the backward is y * (g - sum(g y)) / g - exp(y) sum(g), one
// kernel); logsumexp saves its input and output (grad = g * exp(x - out)).
#include <limits>
#include <vector>

#include <tapegrad/core/autocast_hook.h>
#include <tapegrad/autograd/function.h>
#include <tapegrad/core/trace.h>

namespace tg {

using autograd::FunctionNode;
using autograd::kDifferentiable;
using autograd::record;
using autograd::Saved;
using autograd::SavedTensor;
using autograd::should_record;
using backend::ElemOp;
using backend::ReduceOp;
using Grads = std::vector<Tensor>;

namespace {
Tensor softmax_impl(const Tensor& a, int64_t dim, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  Tensor out = native::softmax(a, dim, log);
  if (detail::Tracer* tracer = detail::tls_tracer) [[unlikely]]
    tracer->record(log ? OpKind::LogSoftmax : OpKind::Softmax, out, {a}, {{"dim", dim}});
  if (!should_record(a)) return out;
  SavedTensor sy(out, name, Saved::kOutput);
  return record(name, {a}, std::move(out), [sy, dim, log](const Tensor& g, const FunctionNode&) -> Grads {
    if (autograd::creating_graph()) {  // the kernel's formulas, recorded
      Tensor y = sy.unpack();
      if (log) return {tg::sub(g, tg::mul(tg::exp(y), g.sum(DimList{dim}, true)))};
      return {tg::mul(y, tg::sub(g, tg::mul(g, y).sum(DimList{dim}, true)))};
    }
    return {native::softmax_backward(g, sy.unpack(), dim, log)};
  }, kDifferentiable);
}

// The keepdim form of a reduced tensor (size-1 dims re-inserted where dims were reduced).
Tensor keepdim_view(const Tensor& g, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor t = g;
  if (!keepdim)
    for (int64_t d : dims) t = autograd::bw::unsqueeze(t, d);
  return t;
}
}  // namespace

Tensor softmax(const Tensor& a, int64_t dim) {
  TG_AUTOCAST(Softmax, tg::softmax(a, dim), a);
  return softmax_impl(a, dim, false);
}

Tensor log_softmax(const Tensor& a, int64_t dim) {
  TG_AUTOCAST(LogSoftmax, tg::log_softmax(a, dim), a);
  return softmax_impl(a, dim, true);
}

Tensor logsumexp(const Tensor& a, DimList dims, bool keepdim) {
  TG_AUTOCAST(LogSumExp, tg::logsumexp(a, dims, keepdim), a);
  TG_CHECK(a.defined(), "logsumexp: the input is undefined");
  TG_CHECK(a.dtype() != kBool, "logsumexp: expected a numeric tensor, got ", a.dtype(), " of shape ", a.sizes());
  // Integers compute in float32 (PyTorch's default dtype); float16 / bfloat16 in float32, rounded once.
  const DType out_dtype = is_floating(a.dtype()) ? a.dtype() : kFloat32;
  const DType work = is_reduced_float(out_dtype) ? kFloat32 : out_dtype;
  std::vector<int64_t> rd;
  if (a.dim() > 0) rd = detail::reduce_dims(dims, a.dim(), "logsumexp");
  Tensor x = native::to(a, a.device(), work);
  Tensor lse;  // keepdim form, work dtype
  if (x.numel() == 0) {
    lse = native::unary(ElemOp::Log, native::reduce(ReduceOp::Sum, native::unary(ElemOp::Exp, x), rd, true));
  } else {
    // max subtracted for stability; an infinite max (a row of -inf, or a +inf) is replaced by 0
    // so that -inf rows give -inf and +inf gives +inf, as PyTorch.
    Tensor m = native::reduce(ReduceOp::Max, x, rd, true);
    Tensor inf = native::scalar_op(ElemOp::EqScalar, native::unary(ElemOp::Abs, m),
                                   Scalar(std::numeric_limits<double>::infinity()));
    m = native::where(inf, native::full({}, Scalar(0.0), work, x.device()), m);
    Tensor s = native::reduce(ReduceOp::Sum, native::unary(ElemOp::Exp, native::sub(x, m)), rd, true);
    lse = native::add(native::unary(ElemOp::Log, s), m);
  }
  Tensor out = lse;
  if (!keepdim && a.dim() > 0)
    for (auto it = rd.rbegin(); it != rd.rend(); ++it) out = native::squeeze(out, *it);
  out = native::contiguous(native::to(out, a.device(), out_dtype));
  TG_TRACE(LogSumExp, out, {a}, {{"dims", dims.dims()}, {"keepdim", keepdim}});
  if (!should_record(a)) return out;
  SavedTensor sx(x, "logsumexp"), sl(lse, "logsumexp");
  const DType in_dtype = a.dtype();
  return record("logsumexp", {a}, std::move(out),
                [sx, sl, rd, keepdim, in_dtype](const Tensor& g, const FunctionNode&) -> Grads {
                  if (autograd::creating_graph()) {  // p = exp(x - logsumexp(x)) recomputed with recorded ops
                    Tensor x = sx.unpack();
                    // x is the input itself unless it was widened (a copy without history).
                    TG_CHECK(x.dtype() == in_dtype, "logsumexp: double backward not implemented for ", in_dtype,
                             " inputs");
                    Tensor p = tg::exp(tg::sub(x, x.logsumexp(DimList(rd), true)));
                    return {tg::mul(p, keepdim_view(g, rd, keepdim).to(p.dtype())).to(in_dtype)};
                  }
                  Tensor p = native::unary(ElemOp::Exp, native::sub(sx.unpack(), sl.unpack()));
                  Tensor gk = native::to(keepdim_view(g, rd, keepdim), p.device(), p.dtype());
                  Tensor gi = native::mul(p, gk);
                  return {native::to(gi, gi.device(), in_dtype)};
                }, kDifferentiable);
}

Tensor Tensor::softmax(int64_t dim) const { return tg::softmax(*this, dim); }
Tensor Tensor::log_softmax(int64_t dim) const { return tg::log_softmax(*this, dim); }
Tensor Tensor::logsumexp(DimList dims, bool keepdim) const { return tg::logsumexp(*this, std::move(dims), keepdim); }

}  // namespace tg
