// Fused loss front-ends: mse_loss and its backward as one kernel each. The
// public op (nn/loss.cpp) takes this path only for inputs it accepts as they
// are (mse_loss_fusable) and keeps a composite of tg ops for the rest.
#include <tapegrad/core/native.h>

namespace tg::native {

using backend::LossReduction;

bool mse_loss_fusable(const Tensor& input, const Tensor& target) {
  return input.defined() && target.defined() && is_floating(input.dtype()) && input.dtype() == target.dtype() &&
         input.device() == target.device() && input.sizes() == target.sizes() && input.is_contiguous() &&
         target.is_contiguous();
}

namespace {
void check_fusable(const Tensor& input, const Tensor& target, const char* op) {
  TG_CHECK(mse_loss_fusable(input, target), op,
           ": the fused kernel needs contiguous input and target of one floating dtype, shape and device; got ",
           input.sizes(), " ", input.dtype(), " on ", input.device(), " and ", target.sizes(), " ", target.dtype(),
           " on ", target.device());
}
}  // namespace

Tensor mse_loss(const Tensor& input, const Tensor& target, LossReduction r) {
  check_fusable(input, target, "mse_loss");
  Tensor out = empty(r == LossReduction::None ? input.sizes() : Shape{}, input.dtype(), input.device());
  // An empty input still reduces (sum 0, mean NaN); an empty elementwise result has nothing to write.
  if (r != LossReduction::None || input.numel() > 0)
    backend::get(input.device().type()).mse_loss(out, input, target, r);
  return out;
}

std::pair<Tensor, Tensor> mse_loss_backward(const Tensor& grad, const Tensor& input, const Tensor& target,
                                            LossReduction r, bool need_input, bool need_target) {
  check_fusable(input, target, "mse_loss_backward");
  if (!need_input && !need_target) return {};
  Tensor g = grad;
  if (g.dtype() != input.dtype() || g.device() != input.device()) g = to(g, input.device(), input.dtype());
  if (r == LossReduction::None) {
    TG_CHECK(g.sizes() == input.sizes(), "mse_loss_backward: grad of shape ", g.sizes(), " for input of shape ",
             input.sizes());
    bool scalar = true;  // an expanded scalar (every stride 0) is read as its one element
    for (int64_t s : g.strides()) scalar = scalar && s == 0;
    g = scalar && g.numel() > 0 ? make_view(g, Shape{}, Shape{}, g.storage_offset()) : contiguous(g);
  } else {
    TG_CHECK(g.numel() == 1, "mse_loss_backward: expected a one-element grad for reduction ",
             r == LossReduction::Mean ? "'mean'" : "'sum'", ", got shape ", g.sizes());
  }
  Tensor gi = need_input ? empty(input.sizes(), input.dtype(), input.device()) : Tensor();
  Tensor gt = need_target ? empty(input.sizes(), input.dtype(), input.device()) : Tensor();
  if (input.numel() > 0) backend::get(input.device().type()).mse_loss_backward(gi, gt, g, input, target, r);
  return {gi, gt};
}

}  // namespace tg::native
