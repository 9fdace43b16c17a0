// Loss functions. mse_loss runs as one fused kernel each way when it can, else as tg ops.
#pragma once
#include <string>
#include <string_view>

#include <tapegrad/nn/module.h>

namespace tg::nn {

namespace functional {
// mean((input - target)^2) with reduction "mean", "sum" or "none". Shapes
// broadcast as in PyTorch (which also warns when they differ); incompatible
// shapes or an unknown reduction are a tg::Error.
Tensor mse_loss(const Tensor& input, const Tensor& target, std::string_view reduction = "mean");
}  // namespace functional

class MSELoss : public Module {
 public:
  explicit MSELoss(std::string reduction = "mean");
  Tensor forward(const Tensor& input, const Tensor& target) const;
  Tensor operator()(const Tensor& input, const Tensor& target) const { return forward(input, target); }
  // A loss needs a target: the one-argument forward is an error.
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "MSELoss"; }
  const std::string& reduction() const { return reduction_; }

 private:
  std::string reduction_;
};

}  // namespace tg::nn
