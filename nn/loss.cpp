// Loss functions.
#include <tapegrad/nn/loss.h>

#include <algorithm>
#include <vector>

#include <tapegrad/core/autocast_hook.h>
#include <tapegrad/autograd/function.h>
#include <tapegrad/core/native.h>
#include <tapegrad/core/trace.h>

namespace tg::nn {

namespace {
void check_reduction(std::string_view r, const char* op) {
  TG_CHECK(r == "mean" || r == "sum" || r == "none", op, ": reduction must be 'mean', 'sum' or 'none', got '", r, "'");
}

// One kernel forward and one backward (both gradients), for inputs native::mse_loss_fusable
// accepts; the node saves input and target (version-checked) and reads the gradient on the device.
Tensor fused_mse_loss(const Tensor& input, const Tensor& target, backend::LossReduction r) {
  Tensor out = native::mse_loss(input, target, r);
  if (!autograd::should_record(input, target)) return out;
  autograd::SavedTensor si(input, "mse_loss"), st(target, "mse_loss");
  return autograd::record("mse_loss", {input, target}, std::move(out),
                          [si, st, r](const Tensor& g, const autograd::FunctionNode& n) -> std::vector<Tensor> {
                            if (autograd::creating_graph()) {  // 2 (x - t) g [/ N], recorded
                              Tensor x = si.unpack();
                              const double k = r == backend::LossReduction::Mean
                                                   ? 2.0 / static_cast<double>(std::max<int64_t>(x.numel(), 1))
                                                   : 2.0;
                              Tensor gi = tg::mul(tg::mul(tg::sub(x, st.unpack()), g), Scalar(k));
                              return {n.needs_input_grad(0) ? gi : Tensor(),
                                      n.needs_input_grad(1) ? tg::neg(gi) : Tensor()};
                            }
                            auto [gi, gt] = native::mse_loss_backward(g, si.unpack(), st.unpack(), r,
                                                                      n.needs_input_grad(0), n.needs_input_grad(1));
                            return {std::move(gi), std::move(gt)};
                          },
                          autograd::kDifferentiable);
}
}  // namespace

namespace functional {
Tensor mse_loss(const Tensor& input, const Tensor& target, std::string_view reduction) {
  check_reduction(reduction, "mse_loss");
  TG_AUTOCAST(MseLoss, mse_loss(input, target, reduction), input, target);
  TG_CHECK(input.defined() && target.defined(), "mse_loss: input and target must be defined");
  TG_CHECK(is_floating(input.dtype()) || is_floating(target.dtype()), "mse_loss: expected floating tensors, got ",
           input.dtype(), " and ", target.dtype());
  TG_CHECK(input.device() == target.device(), "mse_loss: input on ", input.device(), " but target on ",
           target.device());
  tg::detail::broadcast_shapes(input.sizes(), target.sizes(), "mse_loss");  // names both shapes when incompatible
  const auto r = reduction == "mean"  ? backend::LossReduction::Mean
                 : reduction == "sum" ? backend::LossReduction::Sum
                                      : backend::LossReduction::None;
  Tensor out;
  if (native::mse_loss_fusable(input, target)) {
    out = fused_mse_loss(input, target, r);
  } else {
    // Broadcasting, type promotion and strided inputs: a composite of differentiable ops, which
    // the trace does not see (it records the public op, mse_loss, below).
    tg::detail::TracerGuard untraced(nullptr);
    Tensor d = input - target;
    Tensor sq = d * d;
    out = r == backend::LossReduction::Mean ? sq.mean() : r == backend::LossReduction::Sum ? sq.sum() : sq;
  }
  TG_TRACE(MseLoss, out, {input, target}, {{"reduction", static_cast<int64_t>(r)}});
  return out;
}
}  // namespace functional

MSELoss::MSELoss(std::string reduction) : reduction_(std::move(reduction)) { check_reduction(reduction_, "MSELoss"); }

Tensor MSELoss::forward(const Tensor& input, const Tensor& target) const {
  return functional::mse_loss(input, target, reduction_);
}

Tensor MSELoss::forward(const Tensor&) { TG_ERROR("MSELoss: forward needs (input, target); call loss(input, target)"); }

}  // namespace tg::nn
