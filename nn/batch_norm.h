// Batch normalization and group normalization (issue 17): the functional ops and the modules
// nn::BatchNorm1d, nn::BatchNorm2d, nn::GroupNorm. batch_norm in training: its own per-channel
// kernels (native::batch_norm_*); in eval: broadcast ops. group_norm: layer_norm's fused kernels on
// one row per (sample, group).
#pragma once
#include <cstdint>
#include <optional>

#include <tapegrad/nn/module.h>

namespace tg::nn {

namespace functional {
// torch.nn.functional.batch_norm on x [N, C, *]: statistics per channel over every other dim.
// training (or no running stats): normalizes with the batch mean and biased variance and, when
// running_mean / running_var are defined, updates them in place as
// running = (1 - momentum) * running + momentum * stat (variance: unbiased). Otherwise it uses the
// running statistics. weight, bias, running_mean, running_var: undefined or [C] (running stats both
// or neither). float16 / bfloat16 inputs are computed in float32 and returned in their dtype.
// Differentiable in x, weight and bias (training mode: through the batch statistics).
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight = Tensor(), const Tensor& bias = Tensor(), bool training = false,
                  double momentum = 0.1, double eps = 1e-5);
// relu(batch_norm(x, ...)) with batch_norm's arguments and defaults. In training mode the two are
// one pass each way (the normalization's elementwise pass clamps at 0; backward masks the
// gradient by the output > 0 inside batch_norm's own passes): what cuDNN's BN + ReLU graphs fuse,
// in batch_norm's kernels. Same values and gradients as the two ops; a tracer records both.
Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight = Tensor(), const Tensor& bias = Tensor(), bool training = false,
                       double momentum = 0.1, double eps = 1e-5);
// torch.nn.functional.group_norm on x [N, C, *]: the C channels in `groups` groups of
// consecutive channels, each (sample, group) normalized (biased variance), then * weight + bias
// per channel (each undefined or [C]). float16 / bfloat16 computed in float32.
Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                  double eps = 1e-5);
}  // namespace functional

struct BatchNormOptions {
  double eps = 1e-5;
  std::optional<double> momentum = 0.1;  // nullopt: cumulative average (1 / num_batches_tracked)
  bool affine = true;
  bool track_running_stats = true;
};

// PyTorch's _BatchNorm: weight (ones) and bias (zeros) [num_features] when affine; buffers
// running_mean (zeros), running_var (ones) of the parameter dtype and num_batches_tracked (int64
// 0-d) when track_running_stats. train(): batch statistics, running stats updated and
// num_batches_tracked incremented; eval(): the running statistics.
class BatchNormBase : public Module {
 public:
  BatchNormBase(int64_t num_features, BatchNormOptions options, TensorOptions tensor_options);
  Tensor forward(const Tensor& x) override;
  void reset_running_stats();
  void reset_parameters();

  int64_t num_features;
  BatchNormOptions options;
  Tensor weight;               // undefined without affine
  Tensor bias;                 // undefined without affine
  Tensor running_mean;         // undefined without track_running_stats
  Tensor running_var;          // undefined without track_running_stats
  Tensor num_batches_tracked;  // undefined without track_running_stats

 protected:
  virtual void check_input_dim(const Tensor& x) const = 0;
  // forward's batch_norm, followed by ReLU when relu (functional::batch_norm_relu).
  Tensor normalize(const Tensor& x, bool relu);
};

// Input [N, C] or [N, C, L].
class BatchNorm1d : public BatchNormBase {
 public:
  explicit BatchNorm1d(int64_t num_features, BatchNormOptions options = {}, TensorOptions tensor_options = {})
      : BatchNormBase(num_features, options, tensor_options) {}
  std::string name() const override { return "BatchNorm1d"; }

 protected:
  void check_input_dim(const Tensor& x) const override;
};

// Input [N, C, H, W].
class BatchNorm2d : public BatchNormBase {
 public:
  explicit BatchNorm2d(int64_t num_features, BatchNormOptions options = {}, TensorOptions tensor_options = {})
      : BatchNormBase(num_features, options, tensor_options) {}
  std::string name() const override { return "BatchNorm2d"; }

 protected:
  void check_input_dim(const Tensor& x) const override;
};

// BatchNorm2d followed by ReLU as one module (torch.ao.nn.intrinsic.BNReLU2d): the same
// parameters, buffers and state_dict names as BatchNorm2d (so a model swaps `bn` for it and loads
// the same checkpoints); forward is functional::batch_norm_relu.
class BatchNormReLU2d : public BatchNorm2d {
 public:
  using BatchNorm2d::BatchNorm2d;
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "BatchNormReLU2d"; }
};

struct GroupNormOptions {
  double eps = 1e-5;
  bool affine = true;
};

// weight (ones) and bias (zeros) [num_channels] when affine: state_dict names "weight", "bias".
class GroupNorm : public Module {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, GroupNormOptions options = {},
            TensorOptions tensor_options = {});
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "GroupNorm"; }
  void reset_parameters();

  int64_t num_groups;
  int64_t num_channels;
  GroupNormOptions options;
  Tensor weight;  // undefined without affine
  Tensor bias;    // undefined without affine
};

}  // namespace tg::nn
