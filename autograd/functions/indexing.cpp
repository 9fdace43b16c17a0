// Issue 15's masking, indexing, scan and sort ops (masked_fill, tril / triu, one_hot, stack,
// gather, scatter, scatter_add, index_add, cumsum, sort, argsort, topk), each with its backward
// right below. sort and topk record their values; the int64 indices are never differentiable
// (and trace as argsort / topk_indices: an exported node has one output).
#include <tuple>
#include <vector>

#include <tapegrad/autograd/function.h>
#include <tapegrad/core/autocast_hook.h>
#include <tapegrad/core/trace.h>

namespace tg {

using autograd::creating_graph;
using autograd::FunctionNode;
using autograd::kDifferentiable;
using autograd::record;
namespace bw = autograd::bw;
using autograd::SavedTensor;
using autograd::should_record;
using backend::ElemOp;
using Grads = std::vector<Tensor>;

namespace {
Tensor zero_of(const Tensor& g) { return native::full(Shape{}, 0, g.dtype(), g.device()); }
int64_t wrap(int64_t dim, const Tensor& a, const char* op) {
  return detail::wrap_dim(dim, std::max<int64_t>(a.dim(), 1), op);
}
// zeros(shape) with g added at index along dim: the backward of gather, sort and topk.
Tensor scatter_add_zeros(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& g) {
  return native::scatter(native::full(shape, 0, g.dtype(), g.device()), dim, index, g, true, "scatter_add");
}
}  // namespace

// ---- masked_fill
Tensor masked_fill(const Tensor& a, const Tensor& mask, Scalar value) {
  Tensor out = native::masked_fill(a, mask, value);
  TG_TRACE(MaskedFill, out, {a, mask}, {{"value", detail::trace_scalar(value)}});
  if (!should_record(a)) return out;
  SavedTensor sm(mask, "masked_fill");
  return record("masked_fill", {a}, std::move(out), [sm](const Tensor& g, const FunctionNode&) -> Grads {
    return {bw::where(sm.unpack(), zero_of(g), g)};  // the engine sums a broadcast a back down
  }, kDifferentiable);
}

// In place (see autograd/functions/inplace.cpp): the mask must broadcast to self's shape.
const Tensor& Tensor::masked_fill_(const Tensor& mask, Scalar value) const {
  const bool rec = autograd::check_inplace(*this, "masked_fill_");
  Tensor filled = native::masked_fill(*this, mask, value);
  TG_CHECK(filled.sizes() == sizes(), "masked_fill_: the mask of shape ", mask.sizes(),
           " does not broadcast to the input's shape ", sizes());
  native::copy_(*this, filled);
  impl().storage->bump_version();
  if (rec) {
    SavedTensor sm(mask, "masked_fill_");
    autograd::rebase_history("masked_fill_", *this, {}, [sm](const Tensor& g, const FunctionNode&) -> Grads {
      return {bw::where(sm.unpack(), zero_of(g), g)};
    }, kDifferentiable);
  }
  return *this;
}

// ---- tril / triu
namespace {
Tensor tri(OpKind kind, const char* name, bool upper, const Tensor& a, int64_t diagonal) {
  Tensor keep = native::tri_mask(a, diagonal, upper);
  Tensor out = native::where(keep, a, native::full(Shape{}, 0, a.dtype(), a.device()));
  if (detail::Tracer* tracer = detail::tls_tracer) [[unlikely]]
    tracer->record(kind, out, {a}, {{"diagonal", diagonal}});
  if (!should_record(a)) return out;
  return record(name, {a}, std::move(out),
                [keep](const Tensor& g, const FunctionNode&) -> Grads { return {bw::where(keep, g, zero_of(g))}; },
                kDifferentiable);
}
}  // namespace
Tensor tril(const Tensor& a, int64_t diagonal) { return tri(OpKind::Tril, "tril", false, a, diagonal); }
Tensor triu(const Tensor& a, int64_t diagonal) { return tri(OpKind::Triu, "triu", true, a, diagonal); }

// ---- one_hot (int64, never differentiable)
Tensor one_hot(const Tensor& index, int64_t num_classes) {
  Tensor out = native::one_hot(index, num_classes);
  TG_TRACE(OneHot, out, {index}, {{"num_classes", out.sizes()[out.dim() - 1]}});  // resolved
  return out;
}

// ---- stack
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  TG_AUTOCAST_LIST(Stack, tg::stack(tensors, dim), tensors);
  Tensor out = native::stack(tensors, dim);
  TG_TRACE(Stack, out, tensors, {{"dim", dim}});
  if (!autograd::should_record_list(tensors)) return out;
  const int64_t d = detail::wrap_dim(dim, out.dim(), "stack");
  return record("stack", tensors, std::move(out), [d](const Tensor& g, const FunctionNode& n) -> Grads {
    Grads grads(n.next_edges.size());
    for (size_t i = 0; i < grads.size(); ++i)
      if (n.needs_input_grad(i))
        grads[i] = creating_graph() ? g.select(d, static_cast<int64_t>(i)) : native::select(g, d, static_cast<int64_t>(i));
    return grads;
  }, kDifferentiable);
}

// ---- gather / scatter / scatter_add / index_add
Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) {
  Tensor out = native::gather(a, dim, index);
  TG_TRACE(Gather, out, {a, index}, {{"dim", dim}});
  if (!should_record(a)) return out;
  const int64_t d = wrap(dim, a, "gather");
  SavedTensor si(index, "gather");
  Shape shape = a.sizes();
  return record("gather", {a}, std::move(out), [si, d, shape](const Tensor& g, const FunctionNode&) -> Grads {
    Tensor idx = si.unpack();
    return {bw::linear_map(
        "gather_backward", g, [&](const Tensor& gs) { return scatter_add_zeros(shape, d, idx, gs); },
        [d, idx](const Tensor& gg) { return gg.gather(d, idx); })};
  }, kDifferentiable);
}

Tensor scatter(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  TG_AUTOCAST(Scatter, tg::scatter(a, dim, index, src), a, src);
  Tensor out = native::scatter(a, dim, index, src, false, "scatter");
  TG_TRACE(Scatter, out, {a, index, src}, {{"dim", dim}});
  if (!should_record(a, src)) return out;
  const int64_t d = wrap(dim, a, "scatter");
  SavedTensor si(index, "scatter");
  return record("scatter", {a, src}, std::move(out), [si, d](const Tensor& g, const FunctionNode& n) -> Grads {
    Tensor idx = si.unpack();
    if (creating_graph())
      return {n.needs_input_grad(0) ? g.scatter(d, idx, Scalar(0)) : Tensor(),
              n.needs_input_grad(1) ? g.gather(d, idx) : Tensor()};
    return {n.needs_input_grad(0) ? native::scatter_value(g, d, idx, 0) : Tensor(),  // overwritten: no gradient
            n.needs_input_grad(1) ? native::gather(g, d, idx) : Tensor()};
  }, kDifferentiable);
}

Tensor scatter(const Tensor& a, int64_t dim, const Tensor& index, Scalar value) {
  Tensor out = native::scatter_value(a, dim, index, value);
  TG_TRACE(ScatterValue, out, {a, index}, {{"dim", dim}, {"value", detail::trace_scalar(value)}});
  if (!should_record(a)) return out;
  const int64_t d = wrap(dim, a, "scatter");
  SavedTensor si(index, "scatter");
  return record("scatter", {a}, std::move(out), [si, d](const Tensor& g, const FunctionNode&) -> Grads {
    if (creating_graph()) return {g.scatter(d, si.unpack(), Scalar(0))};
    return {native::scatter_value(g, d, si.unpack(), 0)};
  }, kDifferentiable);
}

Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  TG_AUTOCAST(ScatterAdd, tg::scatter_add(a, dim, index, src), a, src);
  Tensor out = native::scatter(a, dim, index, src, true, "scatter_add");
  TG_TRACE(ScatterAdd, out, {a, index, src}, {{"dim", dim}});
  if (!should_record(a, src)) return out;
  const int64_t d = wrap(dim, a, "scatter_add");
  SavedTensor si(index, "scatter_add");
  return record("scatter_add", {a, src}, std::move(out), [si, d](const Tensor& g, const FunctionNode& n) -> Grads {
    Tensor gs;
    if (n.needs_input_grad(1)) gs = creating_graph() ? g.gather(d, si.unpack()) : native::gather(g, d, si.unpack());
    return {n.needs_input_grad(0) ? g : Tensor(), gs};
  }, kDifferentiable);
}

namespace {
// index_add's backward: g for the input, g's rows at index (times alpha) for the source.
autograd::BackwardFn index_add_backward(SavedTensor si, int64_t d, Scalar alpha, bool scalar_source) {
  return [si, d, alpha, scalar_source](const Tensor& g, const FunctionNode& n) -> Grads {
    Tensor gs;
    if (n.needs_input_grad(1) && creating_graph()) {
      gs = g.index_select(d, si.unpack());
      if (alpha.to_double() != 1) gs = gs * alpha;
      if (scalar_source) gs = gs.reshape({});
    } else if (n.needs_input_grad(1)) {
      gs = native::index_select(g, d, si.unpack(), false);
      if (alpha.to_double() != 1) gs = native::scalar_op(ElemOp::MulScalar, gs, alpha);
      if (scalar_source) gs = native::reshape(gs, {});
    }
    return {n.needs_input_grad(0) ? g : Tensor(), gs};
  };
}
}  // namespace

Tensor index_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& source, Scalar alpha) {
  TG_AUTOCAST(IndexAdd, tg::index_add(a, dim, index, source, alpha), a, source);
  Tensor out = native::index_add(a, dim, index, source, alpha);
  TG_TRACE(IndexAdd, out, {a, index, source}, {{"dim", dim}, {"alpha", detail::trace_scalar(alpha)}});
  if (!should_record(a, source)) return out;
  const int64_t d = wrap(dim, a, "index_add");
  SavedTensor si(index, "index_add");
  return record("index_add", {a, source}, std::move(out), index_add_backward(si, d, alpha, source.dim() == 0),
                kDifferentiable);
}

// In place (see autograd/functions/inplace.cpp): the same op written into self.
const Tensor& Tensor::index_add_(int64_t dim, const Tensor& index, const Tensor& source, Scalar alpha) const {
  const bool rec = autograd::check_inplace(*this, "index_add_", source);
  native::copy_(*this, native::index_add(*this, dim, index, source, alpha));
  impl().storage->bump_version();
  if (rec)
    autograd::rebase_history("index_add_", *this, {source},
                             index_add_backward(SavedTensor(index, "index_add_"), wrap(dim, *this, "index_add_"),
                                                alpha, source.dim() == 0),
                             kDifferentiable);
  return *this;
}

// ---- cumsum
Tensor cumsum(const Tensor& a, int64_t dim) {
  TG_AUTOCAST(Cumsum, tg::cumsum(a, dim), a);
  Tensor out = native::cumsum(a, dim);
  TG_TRACE(Cumsum, out, {a}, {{"dim", dim}});
  if (!should_record(a)) return out;
  const int64_t d = wrap(dim, a, "cumsum");
  return record("cumsum", {a}, std::move(out), [d](const Tensor& g, const FunctionNode&) -> Grads {
    if (g.dim() == 0) return {g};
    // The reversed prefix sum: grad_in[j] = sum_{i >= j} g[i] = total - cumsum(g)[j] + g[j].
    if (creating_graph()) return {g.sum(DimList({d}), true) - g.cumsum(d) + g};
    Tensor total = native::reduce(backend::ReduceOp::Sum, g, DimList({d}), true);
    return {native::add(native::sub(total, native::cumsum(g, d)), g)};
  }, kDifferentiable);
}

// ---- sort / argsort / topk
namespace {
// The values' backward: the gradient scattered back to where each value came from.
Tensor record_values(const char* name, const Tensor& a, Tensor values, const Tensor& indices, int64_t dim) {
  if (!should_record(a)) return values;
  const int64_t d = wrap(dim, a, name);
  SavedTensor si(indices, name);
  Shape shape = a.sizes();
  return record(name, {a}, std::move(values), [si, d, shape](const Tensor& g, const FunctionNode&) -> Grads {
    if (shape.empty()) return {bw::reshape(g, shape)};
    Tensor idx = si.unpack();
    return {bw::linear_map(
        "sort_backward", g, [&](const Tensor& gs) { return scatter_add_zeros(shape, d, idx, gs); },
        [d, idx](const Tensor& gg) { return gg.gather(d, idx); })};
  }, kDifferentiable);
}
}  // namespace

std::tuple<Tensor, Tensor> sort(const Tensor& a, int64_t dim, bool descending) {
  auto [values, indices] = native::sort(a, dim, descending);
  TG_TRACE(Sort, values, {a}, {{"dim", dim}, {"descending", descending}});
  TG_TRACE(Argsort, indices, {a}, {{"dim", dim}, {"descending", descending}});
  return {record_values("sort", a, std::move(values), indices, dim), indices};
}

Tensor argsort(const Tensor& a, int64_t dim, bool descending) {
  Tensor indices = native::sort(a, dim, descending).second;
  TG_TRACE(Argsort, indices, {a}, {{"dim", dim}, {"descending", descending}});
  return indices;
}

std::tuple<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim, bool largest, bool sorted) {
  (void)sorted;  // the k values always come out sorted (allowed for sorted = false too, as PyTorch)
  auto [values, indices] = native::topk(a, k, dim, largest);
  TG_TRACE(Topk, values, {a}, {{"k", k}, {"dim", dim}, {"largest", largest}});
  TG_TRACE(TopkIndices, indices, {a}, {{"k", k}, {"dim", dim}, {"largest", largest}});
  return {record_values("topk", a, std::move(values), indices, dim), indices};
}

// ---- Tensor methods
Tensor Tensor::masked_fill(const Tensor& mask, Scalar value) const { return tg::masked_fill(*this, mask, value); }
Tensor Tensor::tril(int64_t diagonal) const { return tg::tril(*this, diagonal); }
Tensor Tensor::triu(int64_t diagonal) const { return tg::triu(*this, diagonal); }
Tensor Tensor::gather(int64_t dim, const Tensor& index) const { return tg::gather(*this, dim, index); }
Tensor Tensor::scatter(int64_t dim, const Tensor& index, const Tensor& src) const {
  return tg::scatter(*this, dim, index, src);
}
Tensor Tensor::scatter(int64_t dim, const Tensor& index, Scalar value) const {
  return tg::scatter(*this, dim, index, value);
}
Tensor Tensor::scatter_add(int64_t dim, const Tensor& index, const Tensor& src) const {
  return tg::scatter_add(*this, dim, index, src);
}
Tensor Tensor::index_add(int64_t dim, const Tensor& index, const Tensor& source, Scalar alpha) const {
  return tg::index_add(*this, dim, index, source, alpha);
}
Tensor Tensor::cumsum(int64_t dim) const { return tg::cumsum(*this, dim); }
std::tuple<Tensor, Tensor> Tensor::sort(int64_t dim, bool descending) const { return tg::sort(*this, dim, descending); }
Tensor Tensor::argsort(int64_t dim, bool descending) const { return tg::argsort(*this, dim, descending); }
std::tuple<Tensor, Tensor> Tensor::topk(int64_t k, int64_t dim, bool largest, bool sorted) const {
  return tg::topk(*this, k, dim, largest, sorted);
}

}  // namespace tg
