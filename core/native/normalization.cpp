// Native front-ends of layer_norm / rms_norm, embedding and dropout (issue 15): validation,
// output allocation, then one backend call each way. The public ops with their backward are in
// nn/normalization.cpp, nn/embedding.cpp and nn/dropout.cpp.
#include <atomic>
#include <cmath>
#include <vector>

#include <tapegrad/core/cast_copies.h>
#include <tapegrad/core/cuda_graph.h>
#include <tapegrad/core/native.h>

namespace tg {

namespace {
std::atomic<bool> g_deterministic{true};
}  // namespace

void use_deterministic_algorithms(bool on) { g_deterministic.store(on, std::memory_order_relaxed); }
bool are_deterministic_algorithms_enabled() { return g_deterministic.load(std::memory_order_relaxed); }

namespace backend {
bool Backend::norm_forward(const NormArgs& a) {
  TG_ERROR(a.rms ? "rms_norm" : "layer_norm", ": no kernel on ", a.x.device());
}
bool Backend::norm_backward(const NormBackwardArgs& a) {
  TG_ERROR(a.rms ? "rms_norm" : "layer_norm", " backward: no kernel on ", a.x.device());
}
void Backend::embedding_backward(const Tensor& gw, const Tensor&, const Tensor&, int64_t, bool) {
  TG_ERROR("embedding backward: no kernel on ", gw.device());
}
void Backend::dropout(const Tensor& out, const Tensor&, double, double, uint64_t, uint64_t) {
  TG_ERROR("dropout: no kernel on ", out.device());
}
}  // namespace backend

namespace native {

namespace {
DType stat_dtype(DType x) { return x == kFloat64 ? kFloat64 : kFloat32; }

// The number of rows: x's elements over the trailing normalized_shape, which must match.
int64_t norm_rows(const char* op, const Tensor& x, const Shape& ns) {
  TG_CHECK(!ns.empty(), op, ": normalized_shape must have at least one dim, got ", ns, " for input of shape ",
           x.sizes());
  const int64_t nd = static_cast<int64_t>(ns.size());
  bool ok = x.dim() >= nd;
  for (int64_t i = 0; ok && i < nd; ++i) ok = x.sizes()[x.dim() - nd + i] == ns[i];
  TG_CHECK(ok, op, ": input of shape ", x.sizes(), " does not end with normalized_shape ", ns);
  int64_t rows = 1;
  for (int64_t i = 0; i < x.dim() - nd; ++i) rows *= x.sizes()[i];
  return rows;
}

// A float16 / bfloat16 twin of a float32 CUDA result, when asked and twins are on.
bool wants_twin(const Tensor& x, std::optional<DType> twin) {
  return twin && is_reduced_float(*twin) && x.dtype() == kFloat32 && x.is_cuda() && detail::cast_twins_enabled();
}

void check_affine(const char* op, const char* what, const Tensor& t, const Tensor& x, const Shape& ns) {
  if (!t.defined()) return;
  TG_CHECK(t.sizes() == ns, op, ": ", what, " of shape ", t.sizes(), " for normalized_shape ", ns);
  TG_CHECK(t.dtype() == x.dtype(), op, ": ", what, " of dtype ", t.dtype(), " for input of dtype ", x.dtype(),
           " (expected one dtype)");
  TG_CHECK(t.device() == x.device(), op, ": input on ", x.device(), " but ", what, " on ", t.device());
}
}  // namespace

NormResult norm_forward(const char* op, const Tensor& x, const Shape& ns, const Tensor& weight, const Tensor& bias,
                        double eps, bool rms, std::optional<DType> twin) {
  TG_CHECK(x.defined(), op, ": input is undefined");
  TG_CHECK(is_floating(x.dtype()), op, ": expected a floating input, got ", x.dtype(), " of shape ", x.sizes());
  TG_CHECK(std::isfinite(eps) && eps >= 0, op, ": eps must be finite and >= 0, got ", eps);
  const int64_t rows = norm_rows(op, x, ns);
  check_affine(op, "weight", weight, x, ns);
  check_affine(op, "bias", bias, x, ns);
  const int64_t cols = x.numel() / std::max<int64_t>(rows, 1);
  NormResult r;
  r.y = empty(x.sizes(), x.dtype(), x.device());
  if (!rms) r.mean = empty({rows}, stat_dtype(x.dtype()), x.device());
  r.rstd = empty({rows}, stat_dtype(x.dtype()), x.device());
  if (x.numel() == 0) return r;
  backend::NormArgs a;
  a.x = native::contiguous(x);
  a.weight = weight.defined() ? native::contiguous(weight) : Tensor();
  a.bias = bias.defined() ? native::contiguous(bias) : Tensor();
  a.y = r.y;
  a.mean = r.mean;
  a.rstd = r.rstd;
  a.rows = rows;
  a.cols = cols;
  a.eps = eps;
  a.rms = rms;
  if (wants_twin(x, twin)) a.y_low = empty(x.sizes(), *twin, x.device());
  if (backend::get(x.device().type()).norm_forward(a) && a.y_low.defined()) detail::attach_cast_twin(r.y, a.y_low);
  return r;
}

std::vector<Tensor> norm_backward(const Tensor& grad, const Tensor& x, const Shape& ns, const Tensor& weight,
                                  const Tensor& mean, const Tensor& rstd, bool rms, bool need_x, bool need_weight,
                                  bool need_bias, const Tensor& grad_x_addend, std::optional<DType> grad_x_twin) {
  const char* op = rms ? "rms_norm backward" : "layer_norm backward";
  const int64_t rows = norm_rows(op, x, ns);
  TG_CHECK(grad.sizes() == x.sizes(), op, ": grad of shape ", grad.sizes(), " for input of shape ", x.sizes());
  const Tensor& add = grad_x_addend;
  TG_CHECK(!add.defined() || (need_x && add.sizes() == x.sizes() && add.dtype() == x.dtype() &&
                              add.device() == x.device()),
           op, ": addend of shape ", add.defined() ? add.sizes().str() : std::string("-"), " ",
           add.defined() ? add.dtype() : x.dtype(), " for input of shape ", x.sizes(), " ", x.dtype(), " on ",
           x.device());
  std::vector<Tensor> out(3);
  if (need_x) out[0] = empty(x.sizes(), x.dtype(), x.device());
  if (need_weight && weight.defined()) out[1] = empty(ns, x.dtype(), x.device());
  if (need_bias && !rms) out[2] = empty(ns, x.dtype(), x.device());
  if (x.numel() == 0 || rows == 0) {
    if (add.defined()) out[0] = add;
    if (out[1].defined()) native::fill_(out[1], 0);
    if (out[2].defined()) native::fill_(out[2], 0);
    return out;
  }
  backend::NormBackwardArgs a;
  Tensor g = grad.dtype() == x.dtype() ? grad : to(grad, x.device(), x.dtype());
  a.grad_out = native::contiguous(g);
  a.x = native::contiguous(x);
  a.weight = weight.defined() ? native::contiguous(weight) : Tensor();
  a.mean = mean;
  a.rstd = rstd;
  a.grad_x = out[0];
  a.grad_weight = out[1];
  a.grad_bias = out[2];
  if (add.defined()) a.grad_x_addend = native::contiguous(add);
  a.rows = rows;
  a.cols = x.numel() / rows;
  a.rms = rms;
  if (need_x && wants_twin(x, grad_x_twin)) a.grad_x_low = empty(x.sizes(), *grad_x_twin, x.device());
  if (backend::get(x.device().type()).norm_backward(a) && a.grad_x_low.defined())
    detail::attach_cast_twin(out[0], a.grad_x_low);
  return out;
}

Tensor embedding(const Tensor& index, const Tensor& weight) {
  TG_CHECK(index.defined() && weight.defined(), "embedding: index and weight must be defined");
  TG_CHECK(index.dtype() == kInt64 || index.dtype() == kInt32, "embedding: index must be int64 or int32, got ",
           index.dtype(), " of shape ", index.sizes());
  TG_CHECK(weight.dim() == 2, "embedding: weight must be 2-d [num_embeddings, embedding_dim], got shape ",
           weight.sizes());
  TG_CHECK(index.device() == weight.device(), "embedding: index on ", index.device(), " but weight on ",
           weight.device());
  const int64_t num = weight.sizes()[0], dim = weight.sizes()[1];
  Tensor flat = native::reshape(index, {index.numel()});
  bool check = flat.numel() > 0;
  if (check && index.is_cuda() && cuda::detail::stream_capturing(index.device().index())) check = false;
  if (check) {
    // One read-back for both bounds (a device synchronisation on CUDA).
    Tensor lo = native::reshape(reduce(backend::ReduceOp::Min, flat, DimList(), false), {1});
    Tensor hi = native::reshape(reduce(backend::ReduceOp::Max, flat, DimList(), false), {1});
    Tensor lo_hi = native::cat({lo, hi}, 0);
    const std::vector<int64_t> b = native::to(lo_hi, Device(kCPU), kInt64).to_vector<int64_t>();
    TG_CHECK(b[0] >= 0 && b[1] < num, "embedding: index out of range: values in [", b[0], ", ", b[1],
             "] for a weight of shape ", weight.sizes(), " (index shape ", index.sizes(), ")");
  }
  Tensor rows = native::index_select(weight, 0, flat, false);
  Shape out_shape = index.sizes();
  out_shape.push_back(dim);
  return native::reshape(rows, out_shape);
}

Tensor embedding_backward(const Tensor& grad, const Tensor& index, int64_t num, int64_t padding_idx) {
  const int64_t n = index.numel();
  TG_CHECK(grad.dim() >= 1 && grad.numel() == n * grad.sizes().back(), "embedding backward: grad of shape ",
           grad.sizes(), " for index of shape ", index.sizes());
  const int64_t dim = grad.sizes().back();
  Tensor gw = native::full({num, dim}, 0, grad.dtype(), grad.device());
  if (n == 0 || dim == 0) return gw;
  Tensor g = native::contiguous(native::reshape(grad, {n, dim}));
  Tensor idx = native::contiguous(native::reshape(index, {n}));
  backend::get(grad.device().type())
      .embedding_backward(gw, g, idx, padding_idx, are_deterministic_algorithms_enabled());
  return gw;
}

Tensor dropout_mask_apply(const Tensor& x, double p, uint64_t seed, uint64_t offset) {
  Tensor src = native::contiguous(x);
  Tensor out = empty(x.sizes(), x.dtype(), x.device());
  if (x.numel() == 0) return out;
  if (p >= 1) {
    native::fill_(out, 0);
    return out;
  }
  backend::get(x.device().type()).dropout(out, src, p, 1.0 / (1.0 - p), seed, offset);
  return out;
}

}  // namespace native
}  // namespace tg
