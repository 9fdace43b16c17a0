// Native front-end of the fused attention (issue 18): the layouts of the output and the gradients,
// the dropout counters, one backend call each way. The public op with its node: nn/attention.cpp.
#include <algorithm>
#include <numeric>
#include <vector>

#include <tapegrad/core/native.h>

namespace tg {

namespace backend {
bool Backend::sdpa_fused_forward(const SdpaArgs&, const Tensor&, const Tensor&, bool) { return false; }
void Backend::sdpa_fused_backward(const SdpaArgs& a, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                  const Tensor&, const Tensor&) {
  TG_ERROR("scaled_dot_product_attention backward: no fused kernel on ", a.q.device());
}
}  // namespace backend

namespace native {

namespace {
// Dense strides for `sizes` in t's dim order (the dim of smallest stride innermost; ties: the later
// dim inside), so that an output or gradient is laid out as its operand ([B, H, T, D] or the
// [B, T, H, D] of a transposed view) and needs no transpose.
Shape dense_strides_like(const Tensor& t, const Shape& sizes) {
  const size_t n = sizes.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  const Shape& st = t.strides();
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return st[a] != st[b] ? st[a] < st[b] : a > b;
  });
  Shape out(n);
  int64_t cur = 1;
  for (size_t d : order) {
    out[d] = cur;
    cur *= std::max<int64_t>(sizes[d], 1);
  }
  return out;
}

// q, k, v as the three pieces of one packed projection (GPT's c_attn output [B, T, 3C] split in
// three and viewed as heads): same sizes and strides, one storage, k and v at equal steps `delta`
// after q, the three together a dense region. Their gradients then go to the same places of one
// buffer, so split's backward joins them without a copy (autograd/functions/view.cpp).
bool packed_qkv(const Tensor& q, const Tensor& k, const Tensor& v, int64_t& delta) {
  if (q.impl().storage != k.impl().storage || q.impl().storage != v.impl().storage) return false;
  if (q.sizes() != k.sizes() || q.sizes() != v.sizes() || q.strides() != k.strides() || q.strides() != v.strides())
    return false;
  delta = k.storage_offset() - q.storage_offset();
  if (delta <= 0 || v.storage_offset() - k.storage_offset() != delta) return false;
  std::vector<std::pair<int64_t, int64_t>> dims{{delta, 3}};  // (stride, size), the pieces as one more dim
  for (int64_t d = 0; d < q.dim(); ++d)
    if (q.size(d) > 1) dims.emplace_back(q.stride(d), q.size(d));
  std::sort(dims.begin(), dims.end());
  int64_t dense = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != dense) return false;
    dense *= size;
  }
  return true;
}
}  // namespace

std::optional<SdpaFused> sdpa_fused_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                                            double scale, bool causal, double dropout_p, bool with_grad) {
  const Device dev = q.device();
  backend::Backend& be = backend::get(dev.type());
  SdpaFused f;
  backend::SdpaArgs& a = f.args;
  a.q = q;
  a.k = k;
  a.v = v;
  a.bias = bias;
  a.scale = scale;
  a.causal = causal;
  a.dropout_p = dropout_p;
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2);
  const Shape osz{B, H, Tq, v.size(3)};
  f.out = empty_strided(osz, dense_strides_like(q, osz), q.dtype(), dev);
  if (with_grad) {
    f.stats = empty({B, H, Tq, 1}, kFloat32, dev);
    int64_t delta = 0;
    const bool packed = packed_qkv(q, k, v, delta);
    a.dq_strides = packed ? q.strides() : dense_strides_like(q, q.sizes());
    a.dk_strides = packed ? k.strides() : dense_strides_like(k, k.sizes());
    a.dv_strides = packed ? v.strides() : dense_strides_like(v, v.sizes());
  }
  if (dropout_p > 0) {
    // Counters reserved as one per score, so later draws of the generator do not reuse them.
    auto [seed, offset] = philox_reserve(dev, static_cast<uint64_t>(B * H * Tq * Tk));
    a.seed = full({1, 1, 1, 1}, Scalar(static_cast<long long>(seed)), kInt64, dev);
    a.offset = full({1, 1, 1, 1}, Scalar(static_cast<long long>(offset)), kInt64, dev);
  }
  if (!be.sdpa_fused_forward(a, f.out, f.stats, with_grad)) return std::nullopt;
  return f;
}

std::vector<Tensor> sdpa_fused_backward(const SdpaFused& f, const Tensor& grad_out) {
  const backend::SdpaArgs& a = f.args;
  const Device dev = a.q.device();
  Tensor g = grad_out;
  if (g.dtype() != f.out.dtype() || g.strides() != f.out.strides()) {  // cuDNN reads dO in O's layout
    g = empty_strided(f.out.sizes(), f.out.strides(), f.out.dtype(), dev);
    copy_(g, grad_out);
  }
  Tensor dq, dk, dv;
  int64_t delta = 0;
  if (a.dq_strides == a.q.strides() && packed_qkv(a.q, a.k, a.v, delta)) {  // one buffer laid out as q, k, v's
    Tensor buf = empty({3 * a.q.numel()}, a.q.dtype(), dev);
    dq = make_view(buf, a.q.sizes(), a.q.strides(), 0);
    dk = make_view(buf, a.k.sizes(), a.k.strides(), delta);
    dv = make_view(buf, a.v.sizes(), a.v.strides(), 2 * delta);
  } else {
    dq = empty_strided(a.q.sizes(), a.dq_strides, a.q.dtype(), dev);
    dk = empty_strided(a.k.sizes(), a.dk_strides, a.k.dtype(), dev);
    dv = empty_strided(a.v.sizes(), a.dv_strides, a.v.dtype(), dev);
  }
  backend::get(dev.type()).sdpa_fused_backward(a, f.out, f.stats, g, dq, dk, dv);
  return {dq, dk, dv};
}

}  // namespace native
}  // namespace tg
