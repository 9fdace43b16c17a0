// View front-ends: new sizes/strides/offset over the same storage, no copy.
// index_select and cat copy.
#include <algorithm>
#include <optional>

#include <tapegrad/core/native.h>
#include <tapegrad/core/cuda_graph.h>

namespace tg::native {

namespace {

Shape infer_size(const Shape& shape, int64_t numel, const char* op, const Shape& from) {
  Shape out = shape;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      TG_CHECK(infer < 0, op, ": only one dimension can be -1 in shape ", shape);
      infer = static_cast<int>(i);
    } else {
      TG_CHECK(shape[i] >= 0, op, ": invalid size ", shape[i], " in shape ", shape);
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    TG_CHECK(known != 0 && numel % known == 0, op, ": shape ", shape, " is invalid for input of shape ", from, " (",
             numel, " elements)");
    out[infer] = numel / known;
  } else {
    TG_CHECK(known == numel, op, ": shape ", shape, " is invalid for input of shape ", from, " (", numel,
             " elements)");
  }
  return out;
}

// Strides that let `newshape` view memory laid out as (oldshape, oldstride), if any exist.
std::optional<Shape> view_strides(const Shape& oldshape, const Shape& oldstride, const Shape& newshape) {
  Shape newstride(newshape.size());
  if (oldshape.empty()) {
    std::fill(newstride.begin(), newstride.end(), 1);
    return newstride;
  }
  if (oldshape.numel() == 0) return detail::contiguous_strides(newshape);
  int64_t view_d = static_cast<int64_t>(newshape.size()) - 1;
  int64_t chunk_base = oldstride.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(oldshape.size()) - 1; d >= 0; --d) {
    tensor_numel *= oldshape[d];
    // A chunk ends where the next-outer dim is not laid out contiguously after this one.
    if (d == 0 || (oldshape[d - 1] != 1 && oldstride[d - 1] != tensor_numel * chunk_base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || newshape[view_d] == 1)) {
        newstride[view_d] = view_numel * chunk_base;
        view_numel *= newshape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base = oldstride[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return newstride;
}

}  // namespace

Tensor view(const Tensor& a, Shape shape) {
  Shape sizes = infer_size(shape, a.numel(), "view", a.sizes());
  auto st = view_strides(a.sizes(), a.strides(), sizes);
  TG_CHECK(st.has_value(), "view: shape ", sizes, " is not compatible with the input's sizes ", a.sizes(),
           " and strides ", a.strides(), " (the tensor is not contiguous); use reshape(), which copies");
  return make_view(a, sizes, *st, a.storage_offset());
}

Tensor reshape(const Tensor& a, Shape shape) {
  Shape sizes = infer_size(shape, a.numel(), "reshape", a.sizes());
  if (auto st = view_strides(a.sizes(), a.strides(), sizes)) return make_view(a, sizes, *st, a.storage_offset());
  Tensor c = clone(a);
  return make_view(c, sizes, detail::contiguous_strides(sizes), 0);
}

Tensor transpose(const Tensor& a, int64_t d0, int64_t d1) {
  d0 = detail::wrap_dim(d0, a.dim(), "transpose");
  d1 = detail::wrap_dim(d1, a.dim(), "transpose");
  if (a.dim() == 0) return make_view(a, a.sizes(), a.strides(), a.storage_offset());
  Shape sz = a.sizes(), st = a.strides();
  std::swap(sz[d0], sz[d1]);
  std::swap(st[d0], st[d1]);
  return make_view(a, sz, st, a.storage_offset());
}

Tensor permute(const Tensor& a, const Shape& dims) {
  TG_CHECK(static_cast<int64_t>(dims.size()) == a.dim(), "permute: got ", dims.size(), " dims ", dims,
           " for a tensor of shape ", a.sizes());
  Shape sz(dims.size()), st(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = detail::wrap_dim(dims[i], a.dim(), "permute");
    TG_CHECK(!seen[d], "permute: dim ", dims[i], " repeats in ", dims);
    seen[d] = true;
    sz[i] = a.sizes()[d];
    st[i] = a.strides()[d];
  }
  return make_view(a, sz, st, a.storage_offset());
}

Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end, int64_t step) {
  TG_CHECK(a.dim() > 0, "slice: cannot slice a 0-d tensor");
  dim = detail::wrap_dim(dim, a.dim(), "slice");
  TG_CHECK(step > 0, "slice: step must be positive, got ", step);
  const int64_t n = a.sizes()[dim];
  // Bounds are clamped like Python slicing.
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape sz = a.sizes(), st = a.strides();
  sz[dim] = (end - start + step - 1) / step;
  st[dim] *= step;
  return make_view(a, sz, st, a.storage_offset() + start * a.strides()[dim]);
}

Tensor select(const Tensor& a, int64_t dim, int64_t index) {
  TG_CHECK(a.dim() > 0, "select: cannot select from a 0-d tensor");
  dim = detail::wrap_dim(dim, a.dim(), "select");
  const int64_t n = a.sizes()[dim];
  TG_CHECK(index >= -n && index < n, "select: index ", index, " is out of range for dim ", dim, " of size ", n,
           " (shape ", a.sizes(), ")");
  if (index < 0) index += n;
  Shape sz = a.sizes(), st = a.strides();
  int64_t off = a.storage_offset() + index * st[dim];
  sz.erase(sz.begin() + dim);
  st.erase(st.begin() + dim);
  return make_view(a, sz, st, off);
}

Tensor unsqueeze(const Tensor& a, int64_t dim) {
  dim = detail::wrap_dim(dim, a.dim() + 1, "unsqueeze");
  Shape sz = a.sizes(), st = a.strides();
  int64_t s = dim < a.dim() ? sz[dim] * st[dim] : 1;
  sz.insert(sz.begin() + dim, 1);
  st.insert(st.begin() + dim, s);
  return make_view(a, sz, st, a.storage_offset());
}

Tensor squeeze(const Tensor& a, std::optional<int64_t> dim) {
  Shape sz, st;
  int64_t only = dim ? detail::wrap_dim(*dim, a.dim(), "squeeze") : -1;
  for (int64_t d = 0; d < a.dim(); ++d) {
    bool drop = a.sizes()[d] == 1 && (only < 0 || only == d);
    if (!drop) {
      sz.push_back(a.sizes()[d]);
      st.push_back(a.strides()[d]);
    }
  }
  return make_view(a, sz, st, a.storage_offset());
}

Tensor expand(const Tensor& a, const Shape& sizes) {
  TG_CHECK(static_cast<int64_t>(sizes.size()) >= a.dim(), "expand: the number of sizes (", sizes.size(),
           ") must be at least the tensor's dims (shape ", a.sizes(), ")");
  const int64_t lead = static_cast<int64_t>(sizes.size()) - a.dim();
  Shape sz(sizes.size()), st(sizes.size());
  for (int64_t i = 0; i < static_cast<int64_t>(sizes.size()); ++i) {
    if (i < lead) {
      TG_CHECK(sizes[i] >= 0, "expand: invalid size ", sizes[i], " in ", sizes, " for a new leading dim");
      sz[i] = sizes[i];
      st[i] = 0;
      continue;
    }
    int64_t cur = a.sizes()[i - lead];
    int64_t want = sizes[i] == -1 ? cur : sizes[i];
    TG_CHECK(cur == want || cur == 1, "expand: tensor of shape ", a.sizes(), " cannot be expanded to ", sizes,
             " (dim ", i, ": ", cur, " vs ", want, ")");
    sz[i] = want;
    st[i] = cur == want ? a.strides()[i - lead] : 0;
  }
  return make_view(a, sz, st, a.storage_offset());
}

Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index, bool check_bounds) {
  TG_CHECK(index.dtype() == kInt64 || index.dtype() == kInt32, "index_select: index must be int64 or int32, got ",
           index.dtype());
  TG_CHECK(index.dim() <= 1, "index_select: index must be 0-d or 1-d, got shape ", index.sizes());
  TG_CHECK(index.device() == a.device(), "index_select: input on ", a.device(), " but index on ", index.device());
  const int64_t nd = std::max<int64_t>(a.dim(), 1);
  dim = detail::wrap_dim(dim, nd, "index_select");
  Tensor src = a.dim() == 0 ? make_view(a, {1}, {1}, a.storage_offset()) : a;
  Tensor idx = contiguous(index.dim() == 0 ? make_view(index, {1}, {1}, index.storage_offset()) : index);
  const int64_t n = src.sizes()[dim];
  // Inside CUDA-graph capture nothing may wait for the device: the bounds check (a read-back)
  // is skipped there, as documented in core/cuda_graph.h.
  if (check_bounds && a.is_cuda() && cuda::detail::stream_capturing(a.device().index())) check_bounds = false;
  if (check_bounds && idx.numel() > 0) {
    int64_t lo = reduce(backend::ReduceOp::Min, idx, DimList(), false).item<int64_t>();
    int64_t hi = reduce(backend::ReduceOp::Max, idx, DimList(), false).item<int64_t>();
    TG_CHECK(lo >= 0 && hi < n, "index_select: index out of range: values in [", lo, ", ", hi, "] for dim ", dim,
             " of size ", n, " (input shape ", a.sizes(), ")");
  }
  Shape sz = src.sizes();
  sz[dim] = idx.numel();
  Tensor out = empty(sz, a.dtype(), a.device());
  if (out.numel() > 0) backend::get(a.device().type()).index_select(out, contiguous(src), dim, idx);
  if (a.dim() == 0) return make_view(out, {}, {}, 0);  // a 0-d input gives a 0-d result, as PyTorch
  return out;
}

Tensor index_add_zeros(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src) {
  TG_CHECK(is_floating(src.dtype()), "index_add: src must be floating point, got ", src.dtype());
  TG_CHECK(index.device() == src.device(), "index_add: src on ", src.device(), " but index on ", index.device());
  Tensor out = full(shape, 0, src.dtype(), src.device());
  if (src.numel() == 0) return out;
  Tensor idx = contiguous(index.dim() == 0 ? make_view(index, {1}, {1}, index.storage_offset()) : index);
  backend::get(src.device().type()).index_add(out, dim, idx, contiguous(src));
  return out;
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  TG_CHECK(!tensors.empty(), "cat: expected a non-empty list of tensors");
  const Tensor& first = tensors[0];
  TG_CHECK(first.dim() > 0, "cat: zero-dimensional tensors cannot be concatenated");
  dim = detail::wrap_dim(dim, first.dim(), "cat");
  DType dtype = first.dtype();
  Shape sz = first.sizes();
  sz[dim] = 0;
  for (const Tensor& t : tensors) {
    TG_CHECK(t.dim() == first.dim(), "cat: tensors must have the same number of dims, got ", first.sizes(), " and ",
             t.sizes());
    TG_CHECK(t.device() == first.device(), "cat: tensors on ", first.device(), " and ", t.device());
    for (int64_t d = 0; d < t.dim(); ++d)
      TG_CHECK(d == dim || t.sizes()[d] == first.sizes()[d], "cat: sizes ", first.sizes(), " and ", t.sizes(),
               " differ outside dim ", dim);
    sz[dim] += t.sizes()[dim];
    dtype = promote_types(dtype, t.dtype());
  }
  Tensor out = empty(sz, dtype, first.device());
  int64_t at = 0;
  for (const Tensor& t : tensors) {
    int64_t len = t.sizes()[dim];
    copy_(slice(out, dim, at, at + len, 1), t);
    at += len;
  }
  return out;
}

}  // namespace tg::native
