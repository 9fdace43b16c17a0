// Native front-ends of gradient clipping (issue 16): validation, contiguous working copies, the
// outputs, then one backend call (backend total_norm / multi_tensor_scale / multi_tensor_clamp).
// The public functions are in nn/clip_grad.cpp.
#include <cmath>
#include <utility>
#include <vector>

#include <tapegrad/core/native.h>

namespace tg {

namespace backend {
void Backend::total_norm(const std::vector<Tensor>&, double, const Tensor& total, const Tensor&, double) {
  TG_ERROR("total_norm: no kernel on ", total.device());
}
void Backend::multi_tensor_scale(const std::vector<Tensor>&, const Tensor& factor) {
  TG_ERROR("multi_tensor_scale: no kernel on ", factor.device());
}
void Backend::multi_tensor_clamp(const std::vector<Tensor>& tensors, double, double) {
  TG_ERROR("multi_tensor_clamp: no kernel on ", tensors.empty() ? Device() : tensors.front().device());
}
}  // namespace backend

namespace native {

namespace {

// Checks every tensor is defined, floating and on the first one's device; returns that device.
Device common_device(const char* op, const std::vector<Tensor>& ts) {
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor& t = ts[i];
    TG_CHECK(t.defined(), op, ": tensor ", i, " is undefined");
    TG_CHECK(is_floating(t.dtype()), op, ": expected floating tensors, got ", t.dtype(), " (tensor ", i,
             " of shape ", t.sizes(), ")");
    TG_CHECK(t.device() == ts.front().device(), op, ": tensors on more than one device: ", ts.front().device(),
             " (tensor 0 of shape ", ts.front().sizes(), ") and ", t.device(), " (tensor ", i, " of shape ", t.sizes(),
             ")");
  }
  return ts.front().device();
}

// Runs `fn` on the tensors as contiguous tensors, writing the copies of non-contiguous ones back
// afterwards; bumps every tensor's version.
template <class Fn>
void in_place(const std::vector<Tensor>& tensors, Fn&& fn) {
  std::vector<Tensor> work;
  std::vector<std::pair<Tensor, Tensor>> write_back;
  work.reserve(tensors.size());
  for (const Tensor& t : tensors) {
    if (t.is_contiguous()) {
      work.push_back(t);
    } else {
      work.push_back(contiguous(t));
      write_back.emplace_back(t, work.back());
    }
  }
  fn(work);
  for (auto& [dst, src] : write_back) copy_(dst, src);
  for (const Tensor& t : tensors) t.impl().storage->bump_version();
}

}  // namespace

TotalNorm total_norm(const char* op, const std::vector<Tensor>& tensors, double norm_type, bool want_coef,
                     double max_norm) {
  TG_CHECK(norm_type > 0, op, ": norm_type must be > 0 (or inf), got ", norm_type);
  TotalNorm r;
  if (tensors.empty()) {  // PyTorch: torch.tensor(0.0)
    r.total = full({}, 0.0, kFloat32, Device(kCPU));
    if (want_coef) r.coef = full({}, 1.0, kFloat64, Device(kCPU));
    return r;
  }
  const Device device = common_device(op, tensors);
  DType dtype = tensors.front().dtype();
  std::vector<Tensor> dense;
  dense.reserve(tensors.size());
  for (const Tensor& t : tensors) {
    dtype = promote_types(dtype, t.dtype());
    dense.push_back(contiguous(t));
  }
  r.total = empty({}, dtype, device);
  if (want_coef) r.coef = empty({}, kFloat64, device);
  backend::get(device.type()).total_norm(dense, norm_type, r.total, r.coef, max_norm);
  return r;
}

void multi_tensor_scale_(const char* op, const std::vector<Tensor>& tensors, const Tensor& factor) {
  if (tensors.empty()) return;
  const Device device = common_device(op, tensors);
  TG_CHECK(factor.defined() && factor.numel() == 1 && is_floating(factor.dtype()), op,
           ": the scale factor must be a floating tensor of one element, got ",
           factor.defined() ? factor.sizes() : Shape{}, factor.defined() ? "" : " (undefined)");
  TG_CHECK(factor.device() == device, op, ": the tensors are on ", device, " but the scale factor on ",
           factor.device());
  const Tensor f = to(factor.reshape({}), device, kFloat64);
  in_place(tensors, [&](const std::vector<Tensor>& ts) { backend::get(device.type()).multi_tensor_scale(ts, f); });
}

void multi_tensor_clamp_(const char* op, const std::vector<Tensor>& tensors, double lo, double hi) {
  if (tensors.empty()) return;
  const Device device = common_device(op, tensors);
  in_place(tensors, [&](const std::vector<Tensor>& ts) { backend::get(device.type()).multi_tensor_clamp(ts, lo, hi); });
}

}  // namespace native
}  // namespace tg
