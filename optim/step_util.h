// Helpers shared by the optimizers' step code: StepArgs validation, the CPU
// reading of grad_scale / found_inf, the per-parameter checks, and grouping a
// group's parameters into (device, dtype) buckets for the fused CUDA kernels.
#pragma once
#include <cstddef>
#include <vector>

#include <tapegrad/core/tensor.h>
#include <tapegrad/optim/optimizer.h>

namespace tg::optim::detail {

// grad_scale / found_inf: float32, one element, and on one device when both are given.
void check_step_args(const char* op, const StepArgs& args);
// Host value of a CPU scalar; the default when `t` is undefined.
float cpu_scalar(const char* op, const Tensor& t, const char* what, Device params_device, float when_undefined);
// Device pointer of a CUDA scalar (null when undefined); it must be on `device`.
const float* device_scalar(const char* op, const Tensor& t, const char* what, Device device);

// The gradient of `param`, checked (same shape, dtype and device) and made
// contiguous; undefined when the parameter has none (the step skips it).
Tensor usable_grad(const char* op, const Tensor& param);
// A per-parameter state tensor (momentum, moments) filled with `value`, laid out as the parameter
// (row-major or channels-last), so the flat multi-tensor kernels see matching memory orders.
Tensor state_like(const Tensor& param, double value = 0.0);
// `t` (same shape as `param`) in param's layout.
Tensor in_layout_of(const Tensor& t, const Tensor& param);
// Marks in-place modification (autograd refuses stale saved tensors).
void bump_version(const Tensor& t);

// The low-precision shadows (core/cast_copies.h) a fused CUDA step should write along
// with `params`, taken before their versions are bumped: one per parameter
// (undefined where none is valid), one dtype, or empty when there are none.
std::vector<Tensor> shadows_for_update(const std::vector<Tensor>& params);
// After the launch (versions bumped): re-tags the written shadows.
void shadows_updated(const std::vector<Tensor>& params, const std::vector<Tensor>& shadows);

// The parameters of one group on one device with one dtype (positions into the group).
struct Bucket {
  Device device;
  DType dtype;
  std::vector<size_t> indices;
};
std::vector<Bucket> bucket_by_device_dtype(const std::vector<Tensor>& params, const std::vector<Tensor>& grads);

}  // namespace tg::optim::detail
