// softmax / log_softmax and the fused cross_entropy rows: validation and layout (the kernels run
// over contiguous rows of the last dim; any other dim or layout is moved there by a transpose and
// one copy), then the backend kernel table.
#include <tapegrad/core/native.h>

namespace tg::native {

namespace {
// x with the softmax dim last, contiguous; `moved` says whether a transpose was needed.
Tensor rows_of(const Tensor& x, int64_t d, bool& moved) {
  const int64_t last = x.dim() - 1;
  moved = x.dim() > 0 && d != last;
  return contiguous(moved ? native::transpose(x, d, last) : x);
}
}  // namespace

Tensor softmax(const Tensor& x, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  TG_CHECK(x.defined(), op, ": the input is undefined");
  TG_CHECK(is_floating(x.dtype()), op, ": expected a floating tensor, got ", x.dtype(), " of shape ", x.sizes());
  const int64_t d = detail::wrap_dim(dim, x.dim(), op);
  if (x.numel() == 0) return empty(x.sizes(), x.dtype(), x.device());
  bool moved = false;
  Tensor xc = rows_of(x, d, moved);
  Tensor y = empty(xc.sizes(), xc.dtype(), xc.device());
  backend::get(x.device().type()).softmax(y, xc, log);
  return moved ? native::transpose(y, d, x.dim() - 1) : y;
}

Tensor softmax_backward(const Tensor& g, const Tensor& y, int64_t dim, bool log) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  TG_CHECK(g.sizes() == y.sizes(), op, ": grad of shape ", g.sizes(), " for an output of shape ", y.sizes());
  const int64_t d = detail::wrap_dim(dim, y.dim(), op);
  if (y.numel() == 0) return empty(y.sizes(), y.dtype(), y.device());
  Tensor gg = g.dtype() != y.dtype() || g.device() != y.device() ? to(g, y.device(), y.dtype()) : g;
  bool moved = false;
  Tensor yc = rows_of(y, d, moved);
  Tensor gc = rows_of(gg, d, moved);
  Tensor gi = empty(yc.sizes(), yc.dtype(), yc.device());
  backend::get(y.device().type()).softmax_backward(gi, gc, yc, log);
  return moved ? native::transpose(gi, d, y.dim() - 1) : gi;
}

DType cross_entropy_acc_dtype(DType logits) { return logits == kFloat64 ? kFloat64 : kFloat32; }

Tensor cross_entropy_denominator(const backend::Backend::CrossEntropyArgs& a) {
  const DType acc = cross_entropy_acc_dtype(a.logits.dtype());
  Tensor valid = scalar_op(backend::ElemOp::NeScalar, a.target, Scalar(a.ignore_index));
  if (!a.weight.defined()) return reduce(backend::ReduceOp::Sum, to(valid, valid.device(), acc), {}, false);
  const int64_t c = a.logits.size(1);
  Tensor idx = unary(backend::ElemOp::Clamp, a.target, 0, static_cast<double>(std::max<int64_t>(c - 1, 0)));
  Tensor w_t = native::index_select(a.weight, 0, idx, /*check_bounds=*/false);
  return reduce(backend::ReduceOp::Sum, native::where(valid, w_t, native::full({}, Scalar(0.0), acc, w_t.device())), {}, false);
}

CrossEntropyRows cross_entropy_rows(const backend::Backend::CrossEntropyArgs& a, bool want_grad, const Tensor& denom) {
  TG_CHECK(a.logits.dim() == 2 && a.logits.is_contiguous() && a.target.dim() == 1 && a.target.is_contiguous() &&
               a.target.dtype() == kInt64 && a.target.size(0) == a.logits.size(0) &&
               a.target.device() == a.logits.device(),
           "cross_entropy: the fused kernel needs contiguous [N, C] logits and [N] int64 targets on one device; got ",
           a.logits.sizes(), " ", a.logits.dtype(), " on ", a.logits.device(), " and ", a.target.sizes(), " ",
           a.target.dtype(), " on ", a.target.device());
  const DType acc = cross_entropy_acc_dtype(a.logits.dtype());
  const int64_t n = a.logits.size(0);
  CrossEntropyRows r{empty({n}, acc, a.logits.device()), empty({n}, acc, a.logits.device()),
                     empty({n}, acc, a.logits.device()), Tensor()};
  if (want_grad) r.grad = empty(a.logits.sizes(), a.logits.dtype(), a.logits.device());
  if (n > 0) backend::get(a.logits.device().type()).cross_entropy(a, r.loss, r.lse, r.wt, r.grad, denom);
  return r;
}

bool cross_entropy_reduced(const backend::Backend::CrossEntropyArgs& a, bool mean, bool want_grad,
                           CrossEntropyReduced& r) {
  const DType acc = cross_entropy_acc_dtype(a.logits.dtype());
  const Device dev = a.logits.device();
  if (a.logits.numel() == 0) return false;
  r.out = empty({}, acc, dev);
  r.lse = empty({a.logits.size(0)}, acc, dev);
  r.denom = mean ? empty({}, acc, dev) : Tensor();
  r.grad = want_grad ? empty(a.logits.sizes(), a.logits.dtype(), dev) : Tensor();
  if (backend::get(dev.type()).cross_entropy_reduced(a, mean, r.out, r.lse, r.denom, r.grad)) return true;
  r = CrossEntropyReduced{};
  return false;
}

Tensor cross_entropy_rows_backward(const backend::Backend::CrossEntropyArgs& a, const Tensor& lse,
                                   const Tensor& grad, const Tensor& denom) {
  Tensor gx = empty(a.logits.sizes(), a.logits.dtype(), a.logits.device());
  if (a.logits.numel() > 0) backend::get(a.logits.device().type()).cross_entropy_backward(a, gx, lse, grad, denom);
  return gx;
}

}  // namespace tg::native

namespace tg::backend {
void Backend::softmax(const Tensor&, const Tensor& in, bool log) {
  TG_ERROR(log ? "log_softmax" : "softmax", ": no kernel on ", in.device());
}
void Backend::softmax_backward(const Tensor&, const Tensor&, const Tensor& out, bool log) {
  TG_ERROR(log ? "log_softmax" : "softmax", " backward: no kernel on ", out.device());
}
void Backend::cross_entropy(const CrossEntropyArgs& a, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&) {
  TG_ERROR("cross_entropy: no fused kernel on ", a.logits.device());
}
bool Backend::cross_entropy_reduced(const CrossEntropyArgs&, bool, const Tensor&, const Tensor&, const Tensor&,
                                    const Tensor&) {
  return false;
}
void Backend::cross_entropy_backward(const CrossEntropyArgs& a, const Tensor&, const Tensor&, const Tensor&,
                                     const Tensor&) {
  TG_ERROR("cross_entropy backward: no fused kernel on ", a.logits.device());
}
}  // namespace tg::backend
