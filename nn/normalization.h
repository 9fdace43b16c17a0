// Layer normalization and RMS normalization: the functional ops (one fused kernel each way,
// saving only the per-row mean and 1/std) and the modules nn::LayerNorm, nn::RMSNorm.
#pragma once
#include <optional>

#include <tapegrad/nn/module.h>

namespace tg::nn {

namespace functional {
// torch.nn.functional.layer_norm: normalizes over the trailing dims `normalized_shape` of x
// (biased variance), then * weight + bias (each optional, of shape normalized_shape, x's dtype).
// float16 / bfloat16 compute in float. Differentiable in x, weight and bias.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
// torch.nn.functional.rms_norm: x / sqrt(mean(x^2) + eps) * weight over the trailing dims.
// eps defaults (nullopt) to the machine epsilon of x's dtype, as PyTorch.
Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                std::optional<double> eps = std::nullopt);
}  // namespace functional

struct LayerNormOptions {
  double eps = 1e-5;
  bool elementwise_affine = true;
  bool bias = true;
};

// weight (ones) and bias (zeros) of shape normalized_shape when elementwise_affine (bias only
// with .bias = true): state_dict names "weight", "bias".
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, LayerNormOptions options = {}, TensorOptions tensor_options = {});
  explicit LayerNorm(int64_t normalized_shape, LayerNormOptions options = {}, TensorOptions tensor_options = {})
      : LayerNorm(Shape{normalized_shape}, options, tensor_options) {}
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "LayerNorm"; }
  void reset_parameters();

  Shape normalized_shape;
  LayerNormOptions options;
  Tensor weight;  // undefined without elementwise_affine
  Tensor bias;    // undefined without elementwise_affine or bias
};

struct RMSNormOptions {
  std::optional<double> eps = std::nullopt;  // machine epsilon of the input's dtype
  bool elementwise_affine = true;
};

// weight (ones) of shape normalized_shape when elementwise_affine: state_dict name "weight".
class RMSNorm : public Module {
 public:
  explicit RMSNorm(Shape normalized_shape, RMSNormOptions options = {}, TensorOptions tensor_options = {});
  explicit RMSNorm(int64_t normalized_shape, RMSNormOptions options = {}, TensorOptions tensor_options = {})
      : RMSNorm(Shape{normalized_shape}, options, tensor_options) {}
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "RMSNorm"; }
  void reset_parameters();

  Shape normalized_shape;
  RMSNormOptions options;
  Tensor weight;  // undefined without elementwise_affine
};

}  // namespace tg::nn
