// tg::nn::Linear: y = x Wᵀ + b with PyTorch's initialisation.
#pragma once
#include <tapegrad/nn/module.h>

namespace tg::nn {

namespace functional {
// x (..., in) @ weight[out, in]^T + bias[out], bias optional: tg::linear (one fused gemm on CUDA).
inline Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor()) {
  return tg::linear(x, weight, bias);
}
}  // namespace functional

class Linear : public Module {
 public:
  // weight [out, in] and bias [out] drawn as PyTorch does: kaiming_uniform(a = √5),
  // i.e. U(±1/√in) for both. Names "weight", "bias" (no bias entry when bias = false).
  Linear(int64_t in_features, int64_t out_features, bool bias = true, TensorOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Linear"; }
  void reset_parameters();

  int64_t in_features = 0;
  int64_t out_features = 0;
  Tensor weight;
  Tensor bias;  // undefined when built without bias
};

}  // namespace tg::nn
