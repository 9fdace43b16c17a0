// Loss functions.
#include "nn/loss.h"

#include "amp/hook.h"

namespace tg::nn {

namespace {
void check_reduction(std::string_view r, const char* op) {
  TG_CHECK(r == "mean" || r == "sum" || r == "none", op, ": reduction must be 'mean', 'sum' or 'none', got '", r, "'");
}
}  // namespace

namespace functional {
Tensor mse_loss(const Tensor& input, const Tensor& target, std::string_view reduction) {
  check_reduction(reduction, "mse_loss");
  TG_AUTOCAST_AS(AutocastCategory::Fp32, mse_loss(input, target, reduction), input, target);
  TG_CHECK(input.defined() && target.defined(), "mse_loss: input and target must be defined");
  TG_CHECK(is_floating(input.dtype()) || is_floating(target.dtype()), "mse_loss: expected floating tensors, got ",
           input.dtype(), " and ", target.dtype());
  TG_CHECK(input.device() == target.device(), "mse_loss: input on ", input.device(), " but target on ",
           target.device());
  tg::detail::broadcast_shapes(input.sizes(), target.sizes(), "mse_loss");  // names both shapes when incompatible
  Tensor d = input - target;
  Tensor sq = d * d;
  if (reduction == "mean") return sq.mean();
  if (reduction == "sum") return sq.sum();
  return sq;
}
}  // namespace functional

MSELoss::MSELoss(std::string reduction) : reduction_(std::move(reduction)) { check_reduction(reduction_, "MSELoss"); }

Tensor MSELoss::forward(const Tensor& input, const Tensor& target) const {
  return functional::mse_loss(input, target, reduction_);
}

Tensor MSELoss::forward(const Tensor&) { TG_ERROR("MSELoss: forward needs (input, target); call loss(input, target)"); }

}  // namespace tg::nn
