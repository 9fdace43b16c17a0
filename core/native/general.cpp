// Issue 15's general ops, native layer: validation with errors that name the op, shapes and
// dtypes, then the backend kernels (gather / scatter / cumsum / sort) or compositions of the
// elementwise engine (masked_fill, tril / triu, one_hot, stack).
#include <algorithm>
#include <utility>
#include <vector>

#include <tapegrad/core/cuda_graph.h>
#include <tapegrad/core/native.h>

namespace tg {

namespace backend {
void Backend::gather(const Tensor&, const Tensor& in, int64_t, const Tensor&) {
  TG_ERROR("gather: no kernel on ", in.device());
}
void Backend::scatter(const Tensor& out, int64_t, const Tensor&, const Tensor&, bool) {
  TG_ERROR("scatter: no kernel on ", out.device());
}
void Backend::cumsum(const Tensor&, const Tensor& in) { TG_ERROR("cumsum: no kernel on ", in.device()); }
void Backend::sort(const Tensor&, const Tensor&, const Tensor& in, bool) {
  TG_ERROR("sort: no kernel on ", in.device());
}
}  // namespace backend

namespace native {
using backend::ElemOp;

namespace {

// 0-d tensors as 1-d of one element (gather / scatter / sort / cumsum treat them so, as PyTorch).
Tensor as_1d(const Tensor& t) { return t.dim() == 0 ? native::make_view(t, {1}, {1}, t.storage_offset()) : t; }

// Reads min and max of an int64 / int32 index on the host and checks [0, n). Skipped while a
// CUDA graph is being captured (nothing may wait for the device then), as index_select.
void check_range(const char* op, const Tensor& index, int64_t dim, int64_t n, const Tensor& a) {
  if (index.numel() == 0) return;
  if (index.is_cuda() && cuda::detail::stream_capturing(index.device().index())) return;
  const int64_t lo = native::reduce(backend::ReduceOp::Min, index, DimList(), false).item<int64_t>();
  const int64_t hi = native::reduce(backend::ReduceOp::Max, index, DimList(), false).item<int64_t>();
  TG_CHECK(lo >= 0 && hi < n, op, ": index out of range: values in [", lo, ", ", hi, "] for dim ", dim, " of size ", n,
           " (input shape ", a.sizes(), ")");
}

// gather / scatter's shape rules (PyTorch's): index int64 with the input's rank, no larger than
// the input outside dim (and no larger than src anywhere).
int64_t check_gather_scatter(const char* op, const Tensor& a, int64_t dim, const Tensor& index, const Tensor* src) {
  TG_CHECK(index.dtype() == kInt64, op, ": index must be int64, got ", index.dtype(), " of shape ", index.sizes());
  TG_CHECK(index.device() == a.device(), op, ": input on ", a.device(), " but index on ", index.device());
  const int64_t nd = std::max<int64_t>(a.dim(), 1);
  dim = detail::wrap_dim(dim, nd, op);
  const int64_t ind = std::max<int64_t>(index.dim(), 1);
  TG_CHECK(ind == nd, op, ": index of shape ", index.sizes(), " must have as many dims as the input of shape ",
           a.sizes());
  const Tensor a1 = as_1d(a), i1 = as_1d(index);
  for (int64_t d = 0; d < nd; ++d)
    TG_CHECK(d == dim || i1.sizes()[d] <= a1.sizes()[d], op, ": index of shape ", index.sizes(),
             " is larger than the input of shape ", a.sizes(), " outside dim ", dim);
  if (src) {
    TG_CHECK(src->device() == a.device(), op, ": input on ", a.device(), " but src on ", src->device());
    TG_CHECK(src->dtype() == a.dtype(), op, ": src dtype ", src->dtype(), " differs from the input's ", a.dtype());
    TG_CHECK(std::max<int64_t>(src->dim(), 1) == nd, op, ": src of shape ", src->sizes(),
             " must have as many dims as the input of shape ", a.sizes());
    const Tensor s1 = as_1d(*src);
    for (int64_t d = 0; d < nd; ++d)
      TG_CHECK(i1.sizes()[d] <= s1.sizes()[d], op, ": index of shape ", index.sizes(), " is larger than src of shape ",
               src->sizes());
  }
  check_range(op, index, dim, a1.sizes()[dim], a);
  return dim;
}

// a moved so that dim is last, contiguous, viewed as [rows, n].
Tensor rows_of(const Tensor& a, int64_t dim) {
  const int64_t last = a.dim() - 1;
  Tensor moved = native::contiguous(dim == last ? a : native::transpose(a, dim, last));
  const int64_t n = moved.sizes()[last];
  return native::view(moved, {n == 0 ? 0 : moved.numel() / n, n});
}
// The inverse of rows_of for a result with `moved_shape` (a's shape with dim and last swapped).
Tensor unrows(const Tensor& r, const Shape& moved_shape, int64_t dim) {
  Tensor m = native::view(r, moved_shape);
  const int64_t last = static_cast<int64_t>(moved_shape.size()) - 1;
  return dim == last ? m : native::contiguous(native::transpose(m, dim, last));
}
Shape moved_shape_of(const Tensor& a, int64_t dim) {
  Shape s = a.sizes();
  std::swap(s[dim], s[s.size() - 1]);
  return s;
}

}  // namespace

Tensor masked_fill(const Tensor& a, const Tensor& mask, Scalar value) {
  TG_CHECK(mask.dtype() == kBool, "masked_fill: mask must be bool, got ", mask.dtype(), " of shape ", mask.sizes(),
           " (input shape ", a.sizes(), ")");
  TG_CHECK(mask.device() == a.device(), "masked_fill: input on ", a.device(), " but mask on ", mask.device());
  detail::broadcast_shapes(a.sizes(), mask.sizes(), "masked_fill");
  return native::where(mask, native::full({}, value, a.dtype(), a.device()), a);
}

Tensor tri_mask(const Tensor& a, int64_t diagonal, bool upper) {
  const char* op = upper ? "triu" : "tril";
  TG_CHECK(a.dim() >= 2, op, ": expected a tensor with at least 2 dims, got shape ", a.sizes());
  const int64_t rows = a.sizes()[a.dim() - 2], cols = a.sizes()[a.dim() - 1];
  Tensor r = native::view(native::arange(0, static_cast<double>(rows), 1, kInt64, a.device()), {rows, 1});
  Tensor c = native::arange(0, static_cast<double>(cols), 1, kInt64, a.device());
  Tensor diff = native::binary(ElemOp::Sub, c, r);  // col - row, [rows, cols]
  return native::scalar_op(upper ? ElemOp::GeScalar : ElemOp::LeScalar, diff, Scalar(static_cast<long long>(diagonal)));
}

Tensor one_hot(const Tensor& index, int64_t num_classes) {
  TG_CHECK(index.dtype() == kInt64, "one_hot: index must be int64, got ", index.dtype(), " of shape ", index.sizes());
  TG_CHECK(num_classes >= -1, "one_hot: num_classes must be -1 or non-negative, got ", num_classes);
  const bool capturing = index.is_cuda() && cuda::detail::stream_capturing(index.device().index());
  if (index.numel() == 0 || (capturing && num_classes >= 0)) {  // no host read inside CUDA graph capture
    TG_CHECK(num_classes >= 0, "one_hot: cannot infer num_classes from an empty index of shape ", index.sizes());
  } else {
    const int64_t lo = native::reduce(backend::ReduceOp::Min, index, DimList(), false).item<int64_t>();
    const int64_t hi = native::reduce(backend::ReduceOp::Max, index, DimList(), false).item<int64_t>();
    if (num_classes < 0) num_classes = hi + 1;
    TG_CHECK(lo >= 0 && hi < num_classes, "one_hot: class values must be in [0, ", num_classes, "), got values in [",
             lo, ", ", hi, "] (index shape ", index.sizes(), ")");
  }
  Tensor classes = native::arange(0, static_cast<double>(num_classes), 1, kInt64, index.device());
  Tensor hit = native::binary(ElemOp::Eq, native::unsqueeze(index, -1), classes);
  return native::to(hit, index.device(), kInt64);
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  TG_CHECK(!tensors.empty(), "stack: expected a non-empty list of tensors");
  const Tensor& first = tensors[0];
  for (size_t i = 1; i < tensors.size(); ++i)
    TG_CHECK(tensors[i].sizes() == first.sizes(), "stack: expects tensors of one shape, got ", first.sizes(),
             " at entry 0 and ", tensors[i].sizes(), " at entry ", i);
  dim = detail::wrap_dim(dim, first.dim() + 1, "stack");
  std::vector<Tensor> parts;
  parts.reserve(tensors.size());
  for (const Tensor& t : tensors) parts.push_back(native::unsqueeze(t, dim));
  return native::cat(parts, dim);
}

Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) {
  dim = check_gather_scatter("gather", a, dim, index, nullptr);
  Tensor i1 = as_1d(index);
  Tensor out = native::empty(i1.sizes(), a.dtype(), a.device());
  if (out.numel() > 0) backend::get(a.device().type()).gather(out, as_1d(a), dim, i1);
  return index.dim() == 0 ? native::view(out, {}) : out;
}

Tensor scatter(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate, const char* op) {
  dim = check_gather_scatter(op, a, dim, index, &src);
  TG_CHECK(!accumulate || a.dtype() != kBool, op, ": dtype bool is not supported");
  Tensor out = native::clone(a);
  if (index.numel() > 0) backend::get(a.device().type()).scatter(as_1d(out), dim, as_1d(index), as_1d(src), accumulate);
  return out;
}

Tensor scatter_value(const Tensor& a, int64_t dim, const Tensor& index, Scalar value) {
  Tensor v = native::full({}, value, a.dtype(), a.device());
  Tensor src = index.dim() == 0 ? v : native::expand(v, index.sizes());  // strides 0: one value for every position
  return scatter(a, dim, index, src, false, "scatter");
}

Tensor index_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& source, Scalar alpha) {
  TG_CHECK(index.dtype() == kInt64 || index.dtype() == kInt32, "index_add: index must be int64 or int32, got ",
           index.dtype());
  TG_CHECK(index.dim() <= 1, "index_add: index must be 0-d or 1-d, got shape ", index.sizes());
  TG_CHECK(index.device() == a.device() && source.device() == a.device(), "index_add: input on ", a.device(),
           ", index on ", index.device(), ", source on ", source.device());
  TG_CHECK(source.dtype() == a.dtype(), "index_add: source dtype ", source.dtype(), " differs from the input's ",
           a.dtype());
  TG_CHECK(a.dtype() != kBool, "index_add: dtype bool is not supported");
  const int64_t nd = std::max<int64_t>(a.dim(), 1);
  dim = detail::wrap_dim(dim, nd, "index_add");
  const Tensor a1 = as_1d(a), s1 = as_1d(source);
  bool ok = s1.dim() == a1.dim() && s1.sizes()[dim] == index.numel();
  for (int64_t d = 0; ok && d < nd; ++d) ok = d == dim || s1.sizes()[d] == a1.sizes()[d];
  TG_CHECK(ok, "index_add: source of shape ", source.sizes(), " does not fit the input of shape ", a.sizes(), " with ",
           index.numel(), " indices along dim ", dim);
  check_range("index_add", index, dim, a1.sizes()[dim], a);
  Tensor out = native::clone(a);
  if (source.numel() == 0) return out;
  Tensor src = alpha.to_double() == 1 ? source : native::scalar_op(ElemOp::MulScalar, source, alpha);
  if (src.dtype() != a.dtype()) src = native::to(src, a.device(), a.dtype());
  if (is_floating(a.dtype())) {
    backend::get(a.device().type())
        .index_add(as_1d(out), dim, native::contiguous(as_1d(index)), native::contiguous(as_1d(src)));
  } else {  // integers: scatter_add with the index broadcast over source's other dims
    Shape ishape(static_cast<size_t>(nd), 1);
    ishape[dim] = index.numel();
    Tensor idx =
        native::expand(native::view(native::contiguous(native::to(index, index.device(), kInt64)), ishape), s1.sizes());
    backend::get(a.device().type()).scatter(as_1d(out), dim, idx, as_1d(src), true);
  }
  return out;
}

Tensor cumsum(const Tensor& a, int64_t dim) {
  const int64_t nd = std::max<int64_t>(a.dim(), 1);
  dim = detail::wrap_dim(dim, nd, "cumsum");
  const DType out_dtype = is_floating(a.dtype()) ? a.dtype() : kInt64;
  if (a.dim() == 0 || a.numel() == 0) return native::clone(native::to(a, a.device(), out_dtype));
  Tensor rows = rows_of(a, dim);
  Tensor out = native::empty(rows.sizes(), out_dtype, a.device());
  backend::get(a.device().type()).cumsum(out, rows);
  return unrows(out, moved_shape_of(a, dim), dim);
}

std::pair<Tensor, Tensor> sort(const Tensor& a, int64_t dim, bool descending) {
  const int64_t nd = std::max<int64_t>(a.dim(), 1);
  dim = detail::wrap_dim(dim, nd, "sort");
  if (a.dim() == 0) return {native::clone(a), native::full({}, 0, kInt64, a.device())};
  if (a.numel() == 0) return {native::clone(a), native::empty(a.sizes(), kInt64, a.device())};
  Tensor rows = rows_of(a, dim);
  Tensor values = native::empty(rows.sizes(), a.dtype(), a.device());
  Tensor indices = native::empty(rows.sizes(), kInt64, a.device());
  backend::get(a.device().type()).sort(values, indices, rows, descending);
  const Shape ms = moved_shape_of(a, dim);
  return {unrows(values, ms, dim), unrows(indices, ms, dim)};
}

std::pair<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim, bool largest) {
  const int64_t nd = std::max<int64_t>(a.dim(), 1);
  dim = detail::wrap_dim(dim, nd, "topk");
  const int64_t n = a.dim() == 0 ? 1 : a.sizes()[dim];
  TG_CHECK(k >= 0 && k <= n, "topk: k = ", k, " is out of range for dim ", dim, " of size ", n, " (input shape ",
           a.sizes(), ", dtype ", a.dtype(), ")");
  auto [values, indices] = native::sort(a, dim, largest);
  if (a.dim() == 0 || k == n) return {values, indices};
  return {native::contiguous(native::slice(values, dim, 0, k, 1)),
          native::contiguous(native::slice(indices, dim, 0, k, 1))};
}

}  // namespace native
}  // namespace tg
