// Views, gathers, cat and copies (Tensor methods and free spellings), each with
// its backward right below. expand's gradient is left in the output shape: the
// engine's central sum_to reduces it to the input's shape.
#include <algorithm>
#include <limits>
#include <vector>

#include "autograd/function.h"

namespace tg {

using autograd::FunctionNode;
using autograd::record;
using autograd::SavedTensor;
using autograd::should_record;
using Grads = std::vector<Tensor>;

namespace {
// Shape-only views whose backward is a reshape back to the input's shape.
Tensor reshape_back(const char* name, const Tensor& a, Tensor out) {
  if (!should_record(a)) return out;
  Shape in_shape = a.sizes();
  return record(name, {a}, std::move(out),
                [in_shape](const Tensor& g, const FunctionNode&) -> Grads { return {native::reshape(g, in_shape)}; });
}
// Normalizes a slice bound as Python does: negative counts from the end, then clamped.
int64_t slice_bound(int64_t v, int64_t size) {
  if (v < 0) v += size;
  return std::clamp<int64_t>(v, 0, size);
}
}  // namespace

Tensor Tensor::view(Shape shape) const { return reshape_back("view", *this, native::view(*this, std::move(shape))); }
Tensor Tensor::reshape(Shape shape) const {
  return reshape_back("reshape", *this, native::reshape(*this, std::move(shape)));
}
Tensor Tensor::unsqueeze(int64_t dim) const { return reshape_back("unsqueeze", *this, native::unsqueeze(*this, dim)); }
Tensor Tensor::squeeze() const { return reshape_back("squeeze", *this, native::squeeze(*this, std::nullopt)); }
Tensor Tensor::squeeze(int64_t dim) const { return reshape_back("squeeze", *this, native::squeeze(*this, dim)); }

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  Tensor out = native::transpose(*this, d0, d1);
  if (!should_record(*this)) return out;
  return record("transpose", {*this}, std::move(out),
                [d0, d1](const Tensor& g, const FunctionNode&) -> Grads { return {native::transpose(g, d0, d1)}; });
}

Tensor Tensor::t() const {
  TG_CHECK(dim() <= 2, "t: expects a tensor with <= 2 dims, got shape ", sizes());
  if (dim() < 2)
    return reshape_back("t", *this,
                        native::make_view(*this, sizes(), strides(), storage_offset()));  // itself, as torch
  return transpose(0, 1);
}

Tensor Tensor::permute(Shape dims) const {
  const int64_t nd = dim();
  TG_CHECK(static_cast<int64_t>(dims.size()) == nd, "permute: ", dims.size(), " dims given for a tensor of shape ",
           sizes());
  Tensor out = native::permute(*this, dims);
  if (!should_record(*this)) return out;
  Shape inverse(static_cast<size_t>(nd));
  for (int64_t i = 0; i < nd; ++i) inverse[detail::wrap_dim(dims[i], nd, "permute")] = i;
  return record("permute", {*this}, std::move(out),
                [inverse](const Tensor& g, const FunctionNode&) -> Grads { return {native::permute(g, inverse)}; });
}

Tensor Tensor::slice(int64_t dim, int64_t start, int64_t end, int64_t step) const {
  Tensor out = native::slice(*this, dim, start, end, step);
  if (!should_record(*this)) return out;
  const int64_t d = detail::wrap_dim(dim, this->dim(), "slice");
  const int64_t s = slice_bound(start, size(d));
  const int64_t e = std::max(s, slice_bound(end, size(d)));
  Shape in_shape = sizes();
  return record("slice", {*this}, std::move(out),
                [in_shape, d, s, e, step](const Tensor& g, const FunctionNode&) -> Grads {
                  Tensor gin = native::full(in_shape, 0, g.dtype(), g.device());
                  native::copy_(native::slice(gin, d, s, e, step), g);
                  return {gin};
                });
}

Tensor Tensor::select(int64_t dim, int64_t index) const {
  Tensor out = native::select(*this, dim, index);
  if (!should_record(*this)) return out;
  const int64_t d = detail::wrap_dim(dim, this->dim(), "select");
  const int64_t i = index < 0 ? index + size(d) : index;
  Shape in_shape = sizes();
  return record("select", {*this}, std::move(out), [in_shape, d, i](const Tensor& g, const FunctionNode&) -> Grads {
    Tensor gin = native::full(in_shape, 0, g.dtype(), g.device());
    native::copy_(native::select(gin, d, i), g);
    return {gin};
  });
}

Tensor Tensor::expand(Shape sizes) const {
  Tensor out = native::expand(*this, sizes);
  if (!should_record(*this)) return out;
  // The engine sums the output-shaped gradient down to this input's shape.
  return record("expand", {*this}, std::move(out), [](const Tensor& g, const FunctionNode&) -> Grads { return {g}; });
}

namespace {
// Scatter-add of g's slices into zeros of in_shape along dim at `index` (the
// backward of index_select). Built from gathers, which both backends have: the
// positions are split into rounds in which every target occurs at most once,
// and each round is one index_select from g plus an appended zero slice.
Tensor index_add_from_gathers(const Tensor& g, const Shape& in_shape, int64_t dim, const Tensor& index) {
  std::vector<int64_t> idx =
      native::to(native::contiguous(index.dim() == 0 ? native::unsqueeze(index, 0) : index), Device(kCPU), kInt64)
          .to_vector<int64_t>();
  const int64_t n = static_cast<int64_t>(idx.size());
  const int64_t target = in_shape[dim];
  std::vector<int64_t> rank(idx.size()), seen(static_cast<size_t>(target), 0);
  int64_t rounds = 0;
  for (size_t i = 0; i < idx.size(); ++i) {
    rank[i] = seen[idx[i]]++;
    rounds = std::max(rounds, rank[i] + 1);
  }
  if (rounds == 0) return native::full(in_shape, 0, g.dtype(), g.device());
  Shape slab = g.sizes();
  slab[dim] = 1;
  Tensor gext = native::cat({g, native::full(slab, 0, g.dtype(), g.device())}, dim);  // row n is zeros
  Tensor result;
  std::vector<int64_t> inv(static_cast<size_t>(target));
  for (int64_t r = 0; r < rounds; ++r) {
    std::fill(inv.begin(), inv.end(), n);
    for (int64_t i = 0; i < n; ++i)
      if (rank[i] == r) inv[idx[i]] = i;
    Tensor inv_t = tensor_from_host(inv.data(), kInt64, Shape{target}, TensorOptions(kInt64).device(g.device()));
    Tensor part = native::index_select(gext, dim, inv_t, false);
    result = result.defined() ? native::add(result, part) : part;
  }
  return result;
}
}  // namespace

Tensor Tensor::index_select(int64_t dim, const Tensor& index) const {
  Tensor out = native::index_select(*this, dim, index);
  if (!should_record(*this)) return out;
  const int64_t d = detail::wrap_dim(dim, std::max<int64_t>(this->dim(), 1), "index_select");
  Shape in_shape = sizes();
  SavedTensor si(index, "index_select");
  return record("index_select", {*this}, std::move(out),
                [in_shape, d, si](const Tensor& g, const FunctionNode&) -> Grads {
                  if (in_shape.empty()) return {native::reshape(g, in_shape)};  // 0-D input: a copy
                  return {index_add_from_gathers(g, in_shape, d, si.unpack())};
                });
}

// ---- free spellings
Tensor transpose(const Tensor& a, int64_t d0, int64_t d1) { return a.transpose(d0, d1); }
Tensor permute(const Tensor& a, Shape dims) { return a.permute(std::move(dims)); }
Tensor reshape(const Tensor& a, Shape shape) { return a.reshape(std::move(shape)); }
Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index) { return a.index_select(dim, index); }

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  Tensor out = native::cat(tensors, dim);
  if (!autograd::should_record_list(tensors)) return out;
  const int64_t d = detail::wrap_dim(dim, out.dim(), "cat");
  std::vector<int64_t> lengths;  // -1: an input that took no part (legacy empty 1-D)
  for (const Tensor& t : tensors) lengths.push_back(t.dim() == out.dim() ? t.size(d) : -1);
  return record("cat", tensors, std::move(out), [lengths, d](const Tensor& g, const FunctionNode& n) -> Grads {
    Grads grads(lengths.size());
    int64_t offset = 0;
    for (size_t i = 0; i < lengths.size(); ++i) {
      if (lengths[i] < 0) continue;
      if (n.needs_input_grad(i)) grads[i] = native::slice(g, d, offset, offset + lengths[i], 1);
      offset += lengths[i];
    }
    return grads;
  });
}

// ---- moves and copies
Tensor Tensor::to(Device device, bool non_blocking) const {
  Tensor out = native::to(*this, device, dtype(), non_blocking);
  if (out.is_same(*this) || !should_record(*this)) return out;
  const Device in_device = this->device();
  return record("to", {*this}, std::move(out), [in_device](const Tensor& g, const FunctionNode&) -> Grads {
    return {native::to(g, in_device, g.dtype())};  // copied back to where the input lives
  });
}

Tensor Tensor::to(DType dtype) const { return to(device(), dtype); }

Tensor Tensor::to(Device device, DType dtype) const {
  Tensor out = native::to(*this, device, dtype);
  if (out.is_same(*this) || !should_record(*this)) return out;
  const Device in_device = this->device();
  const DType in_dtype = this->dtype();
  return record("to", {*this}, std::move(out), [in_device, in_dtype](const Tensor& g, const FunctionNode&) -> Grads {
    return {native::to(g, in_device, in_dtype)};  // cast back to the input's dtype and device
  });
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  Tensor out = native::contiguous(*this);
  if (!should_record(*this)) return out;
  return record("contiguous", {*this}, std::move(out),
                [](const Tensor& g, const FunctionNode&) -> Grads { return {g}; });
}

Tensor Tensor::clone() const {
  Tensor out = native::clone(*this);
  if (!should_record(*this)) return out;
  return record("clone", {*this}, std::move(out), [](const Tensor& g, const FunctionNode&) -> Grads { return {g}; });
}

Tensor Tensor::detach() const { return autograd::alias(*this); }

}  // namespace tg
