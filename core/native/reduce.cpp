// Reduction front-ends: dim wrapping, output dtype and shape, keepdim; and
// sum_to, the one place a broadcast gradient is summed back to its input shape.
#include <tapegrad/core/native.h>

namespace tg::native {
using backend::ReduceOp;

namespace {
DType reduce_dtype(ReduceOp op, DType in) {
  switch (op) {
    case ReduceOp::Sum: return is_floating(in) ? in : kInt64;
    case ReduceOp::Mean:
    case ReduceOp::Var:
    case ReduceOp::Std:
      TG_CHECK(is_floating(in), backend::reduce_op_name(op), ": input dtype must be floating point, got ", in);
      return in;
    case ReduceOp::ArgMax: return kInt64;
    default: return in;
  }
}
}  // namespace

Tensor reduce(ReduceOp op, const Tensor& a, const DimList& dims, bool keepdim, int64_t correction) {
  const char* name = backend::reduce_op_name(op);
  DType out_dtype = reduce_dtype(op, a.dtype());
  if (a.dim() == 0) {  // one element: reduce it as a 1-element vector
    for (int64_t d : dims.dims()) detail::wrap_dim(d, 0, name);
    Tensor r = reduce(op, make_view(a, {1}, {1}, a.storage_offset()), DimList(0), false, correction);
    return make_view(r, {}, {}, r.storage_offset());
  }
  std::vector<int64_t> rd = detail::reduce_dims(dims, a.dim(), name);
  Shape keep_shape = a.sizes();
  Shape reduced_sizes;  // its numel() cannot overflow when a dim is 0 and the rest are huge
  for (int64_t d : rd) {
    reduced_sizes.push_back(keep_shape[d]);
    keep_shape[d] = 1;
  }
  const int64_t reduced = reduced_sizes.numel();
  if (op == ReduceOp::Max || op == ReduceOp::Min || op == ReduceOp::ArgMax) {
    TG_CHECK(reduced > 0 || keep_shape.numel() == 0, name, ": cannot reduce over a zero-size dimension of shape ",
             a.sizes());
  }
  TG_CHECK(correction >= 0, name, ": correction must be non-negative, got ", correction);
  Tensor out = empty(keep_shape, out_dtype, a.device());
  if (out.numel() > 0) {
    backend::ReduceArgs args{op, a, out, rd, correction};
    backend::get(a.device().type()).reduce(args);
  }
  if (keepdim) return out;
  Shape final_shape;
  for (int64_t d = 0, j = 0; d < a.dim(); ++d) {
    if (j < static_cast<int64_t>(rd.size()) && rd[j] == d) {
      ++j;
      continue;
    }
    final_shape.push_back(a.sizes()[d]);
  }
  return make_view(out, final_shape, detail::contiguous_strides(final_shape), 0);
}

Tensor argmax(const Tensor& a, std::optional<int64_t> dim, bool keepdim) {
  if (dim) return reduce(ReduceOp::ArgMax, a, DimList(*dim), keepdim);
  Tensor flat = native::reshape(a, {-1});
  Tensor r = reduce(ReduceOp::ArgMax, flat, DimList(0), false);
  if (!keepdim) return r;
  Shape ones(a.dim(), 1);
  return make_view(r, ones, detail::contiguous_strides(ones), 0);
}

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.sizes() == shape) return grad;
  const int64_t lead = grad.dim() - static_cast<int64_t>(shape.size());
  TG_CHECK(lead >= 0, "sum_to: gradient of shape ", grad.sizes(), " cannot be reduced to shape ", shape);
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < grad.dim(); ++d) {
    if (d < lead) {
      dims.push_back(d);
    } else {
      int64_t want = shape[d - lead];
      if (want == 1 && grad.sizes()[d] != 1) dims.push_back(d);
      else TG_CHECK(want == grad.sizes()[d], "sum_to: gradient of shape ", grad.sizes(), " cannot be reduced to shape ", shape);
    }
  }
  Tensor r = dims.empty() ? grad : reduce(ReduceOp::Sum, grad, DimList(dims), true);
  return native::reshape(r, shape);
}

}  // namespace tg::native
