// Views, gathers, cat and copies (Tensor methods and free spellings), each with
// its backward right below. Every view method notes its base (autograd::mark_view) so
// that in-place ops on views are recorded on the base. expand's gradient is left in the
// output shape: the engine's central sum_to reduces it to the input's shape.
#include <algorithm>
#include <limits>
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
using Grads = std::vector<Tensor>;

namespace {
// Shape-only views whose backward is a reshape back to the input's shape.
Tensor reshape_back(const char* name, const Tensor& a, Tensor out) {
  if (!should_record(a)) return out;
  Shape in_shape = a.sizes();
  return autograd::record_view(
      name, a, std::move(out),
      [in_shape](const Tensor& g, const FunctionNode&) -> Grads { return {bw::reshape(g, in_shape)}; },
      kDifferentiable);
}
// Normalizes a slice bound as Python does: negative counts from the end, then clamped.
int64_t slice_bound(int64_t v, int64_t size) {
  if (v < 0) v += size;
  return std::clamp<int64_t>(v, 0, size);
}
}  // namespace

Tensor Tensor::view(Shape shape) const {
  Tensor out = autograd::mark_view(*this, native::view(*this, shape));
  TG_TRACE(View, out, {*this}, {{"shape", std::vector<int64_t>(shape)}});
  return reshape_back("view", *this, std::move(out));
}
Tensor Tensor::reshape(Shape shape) const {
  Tensor out = autograd::mark_view(*this, native::reshape(*this, shape));
  TG_TRACE(Reshape, out, {*this}, {{"shape", std::vector<int64_t>(shape)}});
  return reshape_back("reshape", *this, std::move(out));
}
Tensor Tensor::unsqueeze(int64_t dim) const {
  Tensor out = autograd::mark_view(*this, native::unsqueeze(*this, dim));
  TG_TRACE(Unsqueeze, out, {*this}, {{"dim", dim}});
  return reshape_back("unsqueeze", *this, std::move(out));
}
Tensor Tensor::squeeze() const {
  Tensor out = autograd::mark_view(*this, native::squeeze(*this, std::nullopt));
  TG_TRACE(Squeeze, out, {*this}, {});
  return reshape_back("squeeze", *this, std::move(out));
}
Tensor Tensor::squeeze(int64_t dim) const {
  Tensor out = autograd::mark_view(*this, native::squeeze(*this, dim));
  TG_TRACE(Squeeze, out, {*this}, {{"dim", dim}});
  return reshape_back("squeeze", *this, std::move(out));
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  Tensor out = autograd::mark_view(*this, native::transpose(*this, d0, d1));
  TG_TRACE(Transpose, out, {*this}, {{"dim0", d0}, {"dim1", d1}});
  if (!should_record(*this)) return out;
  return autograd::record_view(
      "transpose", *this, std::move(out),
      [d0, d1](const Tensor& g, const FunctionNode&) -> Grads { return {bw::transpose(g, d0, d1)}; },
      kDifferentiable);
}

Tensor Tensor::t() const {
  TG_CHECK(dim() <= 2, "t: expects a tensor with <= 2 dims, got shape ", sizes());
  if (dim() < 2) {
    // itself, as torch
    Tensor out = autograd::mark_view(*this, native::make_view(*this, sizes(), strides(), storage_offset()));
    TG_TRACE(Alias, out, {*this}, {});
    return reshape_back("t", *this, std::move(out));
  }
  return transpose(0, 1);
}

Tensor Tensor::permute(Shape dims) const {
  const int64_t nd = dim();
  TG_CHECK(static_cast<int64_t>(dims.size()) == nd, "permute: ", dims.size(), " dims given for a tensor of shape ",
           sizes());
  Tensor out = autograd::mark_view(*this, native::permute(*this, dims));
  TG_TRACE(Permute, out, {*this}, {{"dims", std::vector<int64_t>(dims)}});
  if (!should_record(*this)) return out;
  Shape inverse(static_cast<size_t>(nd));
  for (int64_t i = 0; i < nd; ++i) inverse[detail::wrap_dim(dims[i], nd, "permute")] = i;
  return autograd::record_view(
      "permute", *this, std::move(out),
      [inverse](const Tensor& g, const FunctionNode&) -> Grads { return {bw::permute(g, inverse)}; },
      kDifferentiable);
}

Tensor Tensor::slice(int64_t dim, int64_t start, int64_t end, int64_t step) const {
  Tensor out = autograd::mark_view(*this, native::slice(*this, dim, start, end, step));
  TG_TRACE(Slice, out, {*this}, {{"dim", dim}, {"start", start}, {"end", end}, {"step", step}});
  if (!should_record(*this)) return out;
  const int64_t d = detail::wrap_dim(dim, this->dim(), "slice");
  const int64_t s = slice_bound(start, size(d));
  const int64_t e = std::max(s, slice_bound(end, size(d)));
  Shape in_shape = sizes();
  return record("slice", {*this}, std::move(out),
                [in_shape, d, s, e, step](const Tensor& g, const FunctionNode&) -> Grads {
                  return {autograd::bw::linear_map(
                      "slice_backward", g,
                      [&](const Tensor& gs) {
                        Tensor gin = native::full(in_shape, 0, gs.dtype(), gs.device());
                        native::copy_(native::slice(gin, d, s, e, step), gs);
                        return gin;
                      },
                      [d, s, e, step](const Tensor& gg) { return gg.slice(d, s, e, step); })};
                }, kDifferentiable);
}

Tensor Tensor::select(int64_t dim, int64_t index) const {
  Tensor out = autograd::mark_view(*this, native::select(*this, dim, index));
  TG_TRACE(Select, out, {*this}, {{"dim", dim}, {"index", index}});
  if (!should_record(*this)) return out;
  const int64_t d = detail::wrap_dim(dim, this->dim(), "select");
  const int64_t i = index < 0 ? index + size(d) : index;
  Shape in_shape = sizes();
  return record("select", {*this}, std::move(out), [in_shape, d, i](const Tensor& g, const FunctionNode&) -> Grads {
    return {autograd::bw::linear_map(
        "select_backward", g,
        [&](const Tensor& gs) {
          Tensor gin = native::full(in_shape, 0, gs.dtype(), gs.device());
          native::copy_(native::select(gin, d, i), gs);
          return gin;
        },
        [d, i](const Tensor& gg) { return gg.select(d, i); })};
  }, kDifferentiable);
}

namespace {
// The pieces' gradients as one tensor without a copy where they already lie side by side along d
// in one storage, as a non-overlapping tensor (a backward that wrote them into one buffer: the
// fused attention's dq, dk, dv of a packed qkv, core/native/attention.cpp); else undefined.
Tensor joined_view(const std::vector<Tensor>& parts, int64_t d) {
  const Tensor& p0 = parts[0];
  Shape sizes = p0.sizes();
  sizes[d] = 0;
  int64_t next = p0.storage_offset();
  for (const Tensor& p : parts) {
    if (p.impl().storage != p0.impl().storage || p.dtype() != p0.dtype() || p.strides() != p0.strides() ||
        p.storage_offset() != next || p.size(d) == 0)
      return {};
    next += p.size(d) * p.stride(d);
    sizes[d] += p.size(d);
  }
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] > 1) dims.emplace_back(p0.strides()[i], sizes[i]);
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;  // elements reached by the dims of smaller stride, plus one
  for (const auto& [stride, size] : dims) {
    if (stride < span) return {};  // overlapping
    span += stride * (size - 1);
  }
  return native::make_view(p0, sizes, p0.strides(), p0.storage_offset());
}

// The pieces of split / chunk / unbind: views of self along dim d, one node for all of them whose
// backward writes the input's gradient once (a cat of the pieces' gradients, zeros for a piece that
// got none, or no copy at all where they already lie side by side: joined_view) instead of one
// zero-padded input-sized gradient per piece summed by the engine. `sizes`: the pieces' lengths; `drop`: unbind's pieces (length 1, the dim removed).
std::vector<Tensor> pieces(const Tensor& self, const std::vector<int64_t>& sizes, int64_t d, bool drop,
                           const char* op) {
  std::vector<Tensor> outs;
  outs.reserve(sizes.size());
  int64_t at = 0;
  for (int64_t len : sizes) {
    Tensor o = drop ? autograd::mark_view(self, native::select(self, d, at))
                    : autograd::mark_view(self, native::slice(self, d, at, at + len, 1));
    if (drop) TG_TRACE(Select, o, {self}, {{"dim", d}, {"index", at}});
    else TG_TRACE(Slice, o, {self}, {{"dim", d}, {"start", at}, {"end", at + len}, {"step", int64_t{1}}});
    outs.push_back(std::move(o));
    at += len;
  }
  if (!should_record(self)) return outs;
  const Device dev = self.device();
  return autograd::record_multi_view(
      op, self, std::move(outs),
      [d, drop, dev](std::vector<Tensor>& grads, const FunctionNode& n) -> Grads {
        DType dt = n.input_meta.at(0).dtype;  // the widest dtype a piece's gradient came in
        for (const Tensor& g : grads)
          if (g.defined()) dt = promote_types(dt, g.dtype());
        std::vector<Tensor> parts;
        parts.reserve(grads.size());
        for (size_t i = 0; i < grads.size(); ++i) {
          Tensor g = grads[i].defined() ? std::move(grads[i]) : native::full(n.input_meta[i].shape, 0, dt, dev);
          if (g.dtype() != dt) g = bw::to(g, dev, dt);
          parts.push_back(drop ? bw::unsqueeze(g, d) : std::move(g));
        }
        if (autograd::creating_graph()) return {tg::cat(parts, d)};
        if (Tensor joined = drop ? Tensor() : joined_view(parts, d); joined.defined()) return {joined};
        return {native::cat(parts, d)};
      },
      kDifferentiable);
}

int64_t split_dim(const Tensor& self, int64_t dim, const char* op) {
  TG_CHECK(self.dim() > 0, op, ": a zero-dimensional tensor cannot be split");
  return detail::wrap_dim(dim, self.dim(), op);
}
}  // namespace

std::vector<Tensor> Tensor::split(int64_t split_size, int64_t dim) const {
  const int64_t d = split_dim(*this, dim, "split");
  const int64_t n = size(d);
  TG_CHECK(split_size > 0 || (split_size == 0 && n == 0), "split: split_size must be positive (0 only for an empty dim), got ",
           split_size, " for dim ", d, " of shape ", sizes());
  std::vector<int64_t> lens;
  if (n == 0) lens.push_back(0);
  for (int64_t at = 0; at < n; at += split_size) lens.push_back(std::min(split_size, n - at));
  return pieces(*this, lens, d, false, "split");
}

std::vector<Tensor> Tensor::split(const std::vector<int64_t>& split_sizes, int64_t dim) const {
  const int64_t d = split_dim(*this, dim, "split");
  int64_t total = 0;
  for (int64_t s : split_sizes) {
    TG_CHECK(s >= 0, "split: split_sizes must be non-negative, got ", Shape(split_sizes), " for shape ", sizes());
    total += s;
  }
  TG_CHECK(!split_sizes.empty() && total == size(d), "split: split_sizes ", Shape(split_sizes), " must add up to ",
           size(d), " (dim ", d, " of shape ", sizes(), ")");
  return pieces(*this, split_sizes, d, false, "split");
}

std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t dim) const {
  const int64_t d = split_dim(*this, dim, "chunk");
  TG_CHECK(chunks > 0, "chunk: chunks must be positive, got ", chunks, " for shape ", sizes());
  const int64_t n = size(d);
  if (n == 0) return pieces(*this, std::vector<int64_t>(static_cast<size_t>(chunks), 0), d, false, "chunk");
  const int64_t step = (n + chunks - 1) / chunks;
  std::vector<int64_t> lens;
  for (int64_t at = 0; at < n; at += step) lens.push_back(std::min(step, n - at));
  return pieces(*this, lens, d, false, "chunk");
}

std::vector<Tensor> Tensor::unbind(int64_t dim) const {
  const int64_t d = split_dim(*this, dim, "unbind");
  return pieces(*this, std::vector<int64_t>(static_cast<size_t>(size(d)), 1), d, true, "unbind");
}

std::vector<Tensor> split(const Tensor& a, int64_t split_size, int64_t dim) { return a.split(split_size, dim); }
std::vector<Tensor> split(const Tensor& a, const std::vector<int64_t>& split_sizes, int64_t dim) {
  return a.split(split_sizes, dim);
}
std::vector<Tensor> chunk(const Tensor& a, int64_t chunks, int64_t dim) { return a.chunk(chunks, dim); }
std::vector<Tensor> unbind(const Tensor& a, int64_t dim) { return a.unbind(dim); }

Tensor Tensor::expand(Shape sizes) const {
  Tensor out = autograd::mark_view(*this, native::expand(*this, sizes));
  TG_TRACE(Expand, out, {*this}, {{"sizes", std::vector<int64_t>(sizes)}});
  if (!should_record(*this)) return out;
  // The engine sums the output-shaped gradient down to this input's shape.
  return record("expand", {*this}, std::move(out), [](const Tensor& g, const FunctionNode&) -> Grads { return {g}; },
                kDifferentiable);
}


Tensor Tensor::index_select(int64_t dim, const Tensor& index) const {
  Tensor out = native::index_select(*this, dim, index);
  TG_TRACE(IndexSelect, out, {*this, index}, {{"dim", dim}});
  if (!should_record(*this)) return out;
  const int64_t d = detail::wrap_dim(dim, std::max<int64_t>(this->dim(), 1), "index_select");
  Shape in_shape = sizes();
  SavedTensor si(index, "index_select");
  return record("index_select", {*this}, std::move(out),
                [in_shape, d, si](const Tensor& g, const FunctionNode&) -> Grads {
                  if (in_shape.empty()) return {bw::reshape(g, in_shape)};  // 0-D input: a copy
                  Tensor idx = si.unpack();
                  return {bw::linear_map(
                      "index_select_backward", g,
                      [&](const Tensor& gs) { return native::index_add_zeros(in_shape, d, idx, gs); },
                      [d, idx](const Tensor& gg) { return gg.index_select(d, idx); })};
                }, kDifferentiable);
}

// ---- free spellings
Tensor transpose(const Tensor& a, int64_t d0, int64_t d1) { return a.transpose(d0, d1); }
Tensor permute(const Tensor& a, Shape dims) { return a.permute(std::move(dims)); }
Tensor reshape(const Tensor& a, Shape shape) { return a.reshape(std::move(shape)); }
Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index) { return a.index_select(dim, index); }

// ---- issue 17: flatten (a reshape; traced as one)
Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  const int64_t d = dim() == 0 ? 1 : dim();
  const int64_t s = start_dim < 0 ? start_dim + d : start_dim, e = end_dim < 0 ? end_dim + d : end_dim;
  TG_CHECK(s >= 0 && s < d && e >= 0 && e < d && s <= e, "flatten: start_dim ", start_dim, " and end_dim ", end_dim,
           " invalid for input of shape ", sizes());
  if (dim() == 0) return reshape({1});
  Shape shape;
  for (int64_t i = 0; i < s; ++i) shape.push_back(sizes()[i]);
  int64_t m = 1;
  for (int64_t i = s; i <= e; ++i) m *= sizes()[i];
  shape.push_back(m);
  for (int64_t i = e + 1; i < dim(); ++i) shape.push_back(sizes()[i]);
  return reshape(shape);
}
Tensor flatten(const Tensor& a, int64_t start_dim, int64_t end_dim) { return a.flatten(start_dim, end_dim); }

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  TG_AUTOCAST_LIST(Cat, tg::cat(tensors, dim), tensors);
  Tensor out = native::cat(tensors, dim);
  TG_TRACE(Cat, out, tensors, {{"dim", dim}});
  if (!autograd::should_record_list(tensors)) return out;
  const int64_t d = detail::wrap_dim(dim, out.dim(), "cat");
  std::vector<int64_t> lengths;  // -1: an input that took no part (legacy empty 1-D)
  lengths.reserve(tensors.size());
  for (const Tensor& t : tensors) lengths.push_back(t.dim() == out.dim() ? t.size(d) : -1);
  return record("cat", tensors, std::move(out), [lengths, d](const Tensor& g, const FunctionNode& n) -> Grads {
    Grads grads(lengths.size());
    int64_t offset = 0;
    for (size_t i = 0; i < lengths.size(); ++i) {
      if (lengths[i] < 0) continue;
      if (n.needs_input_grad(i)) grads[i] = bw::slice(g, d, offset, offset + lengths[i], 1);
      offset += lengths[i];
    }
    return grads;
  }, kDifferentiable);
}

// ---- moves and copies
Tensor Tensor::to(Device device, bool non_blocking) const {
  Tensor out = native::to(*this, device, dtype(), non_blocking);
  TG_TRACE(To, out, {*this}, {{"dtype", out.dtype()}});  // device moves replay on the run's device
  if (out.is_same(*this) || !should_record(*this)) return out;
  const Device in_device = this->device();
  return record("to", {*this}, std::move(out), [in_device](const Tensor& g, const FunctionNode&) -> Grads {
    return {bw::to(g, in_device, g.dtype())};  // copied back to where the input lives
  }, kDifferentiable);
}

Tensor Tensor::to(DType dtype) const { return to(device(), dtype); }

Tensor Tensor::to(Device device, DType dtype) const { return autograd::finish_to(*this, native::to(*this, device, dtype)); }

Tensor autograd::finish_to(const Tensor& src, Tensor out) {
  TG_TRACE(To, out, {src}, {{"dtype", out.dtype()}});
  if (out.is_same(src) || !should_record(src)) return out;
  const Device in_device = src.device();
  const DType in_dtype = src.dtype();
  Tensor res =
      record("to", {src}, std::move(out), [in_device, in_dtype](const Tensor& g, const FunctionNode&) -> Grads {
        return {bw::to(g, in_device, in_dtype)};  // back to the input's dtype and device (g itself if it is)
      }, kDifferentiable);
  // A float32 -> float16 / bfloat16 cast on one device also takes a float32 gradient and passes it
  // through: matmul and linear then store their gradient in float32 directly (autocast's weights).
  if (in_dtype == kFloat32 && is_reduced_float(res.dtype()) && res.device() == in_device)
    res.grad_fn()->input_meta.at(res.impl().autograd->output_nr).wide_dtype = kFloat32;
  return res;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  Tensor out = native::contiguous(*this);
  TG_TRACE(Contiguous, out, {*this}, {});
  if (!should_record(*this)) return out;
  return autograd::record_view("contiguous", *this, std::move(out),
                               [](const Tensor& g, const FunctionNode&) -> Grads { return {g}; }, kDifferentiable);
}

Tensor Tensor::contiguous(MemoryFormat format) const {
  TG_CHECK(format != MemoryFormat::Preserve, "contiguous: MemoryFormat::Preserve is not a layout to copy into");
  if (format == MemoryFormat::Contiguous) return contiguous();
  TG_CHECK(dim() == 4, "contiguous(ChannelsLast): expected a 4-d [N, C, H, W] tensor, got shape ", sizes());
  if (is_contiguous(format)) return *this;
  // NHWC strides under the NCHW shape: a row-major copy of the NHWC permutation, permuted back.
  return permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
}

Tensor Tensor::clone() const {
  Tensor out = native::clone(*this);
  TG_TRACE(Clone, out, {*this}, {});
  if (!should_record(*this)) return out;
  return record("clone", {*this}, std::move(out), [](const Tensor& g, const FunctionNode&) -> Grads { return {g}; },
                kDifferentiable);
}

Tensor Tensor::detach() const {
  Tensor out = autograd::alias(*this);
  TG_TRACE(Alias, out, {*this}, {});
  return out;
}

}  // namespace tg
