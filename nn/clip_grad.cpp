// torch.nn.utils' gradient clipping over the native multi-tensor ops (core/native/clip_grad.cpp).
#include <tapegrad/nn/clip_grad.h>

#include <cmath>
#include <limits>
#include <vector>

#include <tapegrad/core/native.h>

namespace tg::nn::utils {

namespace {

// The gradients of the parameters that have one, in order.
std::vector<Tensor> grads_of(const char* op, const std::vector<Tensor>& parameters) {
  std::vector<Tensor> grads;
  grads.reserve(parameters.size());
  for (size_t i = 0; i < parameters.size(); ++i) {
    TG_CHECK(parameters[i].defined(), op, ": parameter ", i, " is undefined");
    Tensor g = parameters[i].grad();
    if (g.defined()) grads.push_back(std::move(g));
  }
  return grads;
}

void check_finite(const char* op, const Tensor& total, double norm_type) {
  const double v = total.item<double>();  // the one host read: only with error_if_nonfinite
  TG_CHECK(std::isfinite(v), op, ": the total norm of order ", norm_type,
           " for gradients from `parameters` is non-finite, so it cannot be clipped. To disable this error and "
           "scale the gradients by the non-finite norm anyway, set `error_if_nonfinite=false`");
}

}  // namespace

Tensor get_total_norm(const std::vector<Tensor>& tensors, double norm_type, bool error_if_nonfinite) {
  Tensor total = native::total_norm("get_total_norm", tensors, norm_type).total;
  if (error_if_nonfinite) check_finite("get_total_norm", total, norm_type);
  return total;
}

void clip_grads_with_norm_(const std::vector<Tensor>& parameters, double max_norm, const Tensor& total_norm) {
  constexpr const char* op = "clip_grads_with_norm_";
  const std::vector<Tensor> grads = grads_of(op, parameters);
  TG_CHECK(total_norm.defined() && total_norm.numel() == 1 && is_floating(total_norm.dtype()), op,
           ": total_norm must be a floating tensor of one element, got ",
           total_norm.defined() ? total_norm.sizes() : Shape{}, total_norm.defined() ? "" : " (undefined)");
  if (grads.empty()) return;
  // clamp(max_norm / (total_norm + 1e-6), max = 1) in total_norm's dtype as PyTorch (float32 at
  // least), on its device; NaN stays NaN.
  const DType dt = total_norm.dtype() == kFloat64 ? kFloat64 : kFloat32;
  Tensor t = native::to(total_norm.detach(), total_norm.device(), dt);
  Tensor coef = native::scalar_op(backend::ElemOp::RDivScalar, native::add(t, 1e-6), max_norm);
  coef = native::unary(backend::ElemOp::Clamp, coef, -std::numeric_limits<double>::infinity(), 1.0);
  native::multi_tensor_scale_(op, grads, native::to(coef, grads.front().device(), coef.dtype()));
}

Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  constexpr const char* op = "clip_grad_norm_";
  const std::vector<Tensor> grads = grads_of(op, parameters);
  native::TotalNorm r = native::total_norm(op, grads, norm_type, /*want_coef=*/true, max_norm);
  if (grads.empty()) return r.total;
  if (error_if_nonfinite) check_finite(op, r.total, norm_type);
  native::multi_tensor_scale_(op, grads, r.coef);
  return r.total;
}

void clip_grad_value_(const std::vector<Tensor>& parameters, double clip_value) {
  constexpr const char* op = "clip_grad_value_";
  native::multi_tensor_clamp_(op, grads_of(op, parameters), -clip_value, clip_value);
}

}  // namespace tg::nn::utils
