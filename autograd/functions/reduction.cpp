// Reductions with their backward right below the forward. The incoming gradient
// has the reduced shape; `keepdim_view` re-inserts the reduced dims (size 1) so it
// broadcasts against the input again.
#include <vector>

#include <tapegrad/core/autocast_hook.h>
#include <tapegrad/autograd/function.h>
#include <tapegrad/core/trace.h>

namespace tg {

using autograd::FunctionNode;
using autograd::kDifferentiable;
using autograd::record;
namespace bw = autograd::bw;
using autograd::SavedTensor;
using autograd::should_record;
using backend::ElemOp;
using backend::ReduceOp;
using Grads = std::vector<Tensor>;

namespace {
// The gradient in keepdim form (a view): size-1 dims where the input was reduced.
Tensor keepdim_view(const Tensor& g, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor t = g;
  if (!keepdim)
    for (int64_t d : dims) t = bw::unsqueeze(t, d);  // ascending, so positions line up
  return t;
}
// Sorted reduced dims; none for a 0-D input (its one element is the whole reduction).
std::vector<int64_t> reduced_dims(const DimList& dims, const Tensor& a, const char* name) {
  if (a.dim() == 0) return {};
  return detail::reduce_dims(dims, a.dim(), name);
}
int64_t reduced_count(const Shape& shape, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= shape[d];
  return n;
}
}  // namespace

Tensor sum(const Tensor& a, DimList dims, bool keepdim) {
  TG_AUTOCAST(Sum, tg::sum(a, dims, keepdim), a);
  Tensor out = native::reduce(ReduceOp::Sum, a, dims, keepdim);
  TG_TRACE(Sum, out, {a}, {{"dims", dims.dims()}, {"keepdim", keepdim}});
  if (!should_record(a)) return out;
  auto rd = reduced_dims(dims, a, "sum");
  Shape in_shape = a.sizes();
  return record("sum", {a}, std::move(out), [rd, in_shape, keepdim](const Tensor& g, const FunctionNode&) -> Grads {
    return {bw::expand(keepdim_view(g, rd, keepdim), in_shape)};
  }, kDifferentiable);
}

Tensor mean(const Tensor& a, DimList dims, bool keepdim) {
  TG_AUTOCAST(Mean, tg::mean(a, dims, keepdim), a);
  Tensor out = native::reduce(ReduceOp::Mean, a, dims, keepdim);
  TG_TRACE(Mean, out, {a}, {{"dims", dims.dims()}, {"keepdim", keepdim}});
  if (!should_record(a)) return out;
  auto rd = reduced_dims(dims, a, "mean");
  Shape in_shape = a.sizes();
  const double scale = 1.0 / static_cast<double>(reduced_count(in_shape, rd));
  return record("mean", {a}, std::move(out),
                [rd, in_shape, keepdim, scale](const Tensor& g, const FunctionNode&) -> Grads {
                  return {bw::expand(keepdim_view(bw::mul(g, Scalar(scale)), rd, keepdim), in_shape)};
                }, kDifferentiable);
}

Tensor var(const Tensor& a, DimList dims, bool keepdim, int64_t correction) {
  TG_AUTOCAST(Var, tg::var(a, dims, keepdim, correction), a);
  Tensor out = native::reduce(ReduceOp::Var, a, dims, keepdim, correction);
  TG_TRACE(Var, out, {a}, {{"dims", dims.dims()}, {"keepdim", keepdim}, {"correction", correction}});
  if (!should_record(a)) return out;
  auto rd = reduced_dims(dims, a, "var");
  SavedTensor sx(a, "var");
  const double denom = static_cast<double>(reduced_count(a.sizes(), rd) - correction);
  return record("var", {a}, std::move(out), [sx, rd, keepdim, denom](const Tensor& g, const FunctionNode&) -> Grads {
    // d var / dx = 2 (x - mean) / (N - correction)
    Tensor x = sx.unpack();
    if (autograd::creating_graph())
      return {tg::mul(tg::sub(x, x.mean(DimList(rd), true)), tg::mul(keepdim_view(g, rd, keepdim), Scalar(2.0 / denom)))};
    Tensor diff = native::sub(x, native::reduce(ReduceOp::Mean, x, rd, true));
    return {native::mul(diff, native::mul(keepdim_view(g, rd, keepdim), Scalar(2.0 / denom)))};
  }, kDifferentiable);
}

Tensor std(const Tensor& a, DimList dims, bool keepdim, int64_t correction) {
  TG_AUTOCAST(Std, tg::std(a, dims, keepdim, correction), a);
  Tensor out = native::reduce(ReduceOp::Std, a, dims, keepdim, correction);
  TG_TRACE(Std, out, {a}, {{"dims", dims.dims()}, {"keepdim", keepdim}, {"correction", correction}});
  if (!should_record(a)) return out;
  auto rd = reduced_dims(dims, a, "std");
  SavedTensor sx(a, "std"), sy(out, "std", autograd::Saved::kOutput);
  const double denom = static_cast<double>(reduced_count(a.sizes(), rd) - correction);
  return record("std", {a}, std::move(out),
                [sx, sy, rd, keepdim, denom](const Tensor& g, const FunctionNode&) -> Grads {
                  // d std / dx = (x - mean) / ((N - correction) * std)
                  Tensor x = sx.unpack();
                  if (autograd::creating_graph())
                    return {tg::mul(tg::sub(x, x.mean(DimList(rd), true)),
                                    tg::div(keepdim_view(g, rd, keepdim),
                                            tg::mul(keepdim_view(sy.unpack(), rd, keepdim), Scalar(denom))))};
                  Tensor diff = native::sub(x, native::reduce(ReduceOp::Mean, x, rd, true));
                  Tensor coef = native::div(keepdim_view(g, rd, keepdim),
                                            native::mul(keepdim_view(sy.unpack(), rd, keepdim), Scalar(denom)));
                  return {native::mul(diff, coef)};
                }, kDifferentiable);
}

namespace {
// amax / amin: the gradient is split evenly among the elements equal to the result.
Tensor extreme(const char* name, OpKind kind, ReduceOp op, const Tensor& a, const DimList& dims, bool keepdim) {
  Tensor out = native::reduce(op, a, dims, keepdim);
  if (detail::Tracer* tracer = detail::tls_tracer) [[unlikely]]
    tracer->record(kind, out, {a}, {{"dims", dims.dims()}, {"keepdim", keepdim}});
  if (!should_record(a)) return out;
  auto rd = reduced_dims(dims, a, name);
  SavedTensor sx(a, name), sy(out, name);
  return record(name, {a}, std::move(out), [sx, sy, rd, keepdim](const Tensor& g, const FunctionNode&) -> Grads {
    Tensor x = sx.unpack();
    Tensor hit = native::binary(ElemOp::Eq, x, keepdim_view(sy.unpack(), rd, keepdim));
    Tensor mask = native::to(hit, g.device(), g.dtype());
    Tensor count = native::reduce(ReduceOp::Sum, mask, rd, true);
    return {bw::mul(mask, bw::div(keepdim_view(g, rd, keepdim), count))};  // mask, count: constants
  }, kDifferentiable);
}
}  // namespace

Tensor amax(const Tensor& a, DimList dims, bool keepdim) { return extreme("amax", OpKind::Amax, ReduceOp::Max, a, dims, keepdim); }
Tensor amin(const Tensor& a, DimList dims, bool keepdim) { return extreme("amin", OpKind::Amin, ReduceOp::Min, a, dims, keepdim); }

Tensor argmax(const Tensor& a, std::optional<int64_t> dim, bool keepdim) {
  Tensor out = native::argmax(a, dim, keepdim);
  if (detail::Tracer* tracer = detail::tls_tracer) [[unlikely]] {
    std::vector<detail::TraceAttr> attrs{{"keepdim", keepdim}};
    if (dim) attrs.push_back({"dim", *dim});
    tracer->record(OpKind::Argmax, out, {a}, std::move(attrs));
  }
  return out;
}

}  // namespace tg
