// Host entry points of the fused multi-tensor CUDA steps (optim/cuda/*.cu), called
// by the optimizers for each (group, device, dtype) bucket of parameters that have
// a gradient. Not installed; compiled only with TG_CUDA.
#pragma once
#include <memory>
#include <vector>

#include <tapegrad/core/tensor.h>
#include <tapegrad/optim/optimizer.h>
#include <tapegrad/optim/update_math.h>

namespace tg::optim::cuda {

// One bucket of a step: every list has one entry per parameter; all tensors are contiguous, on
// one CUDA device, of one floating dtype (steps: float32 0-d, or empty when the variant counts
// none). states[k] is the rule's k-th state list (SGD: momentum_buffer; Adam: exp_avg, exp_avg_sq,
// max_exp_avg_sq). grad_scale / found_inf are device pointers to float32 scalars, or null. Each
// step is one launch per multi-tensor launch of the bucket: the step counts advance in its
// epilogue. shadows: empty, or one entry per parameter: undefined, or a contiguous float16 /
// bfloat16 tensor (one dtype per bucket, float32 parameters only) that receives the
// round-to-nearest-even cast of the updated parameter in the same pass (core/cast_copies.h).
// A step skipped on the device (found_inf) leaves the shadows untouched too. lr: the group's lr as
// a float64 device scalar (Optimizer::fused_cache), which the kernels read in place of hyper.lr, so
// a captured step follows set_lr; null: hyper.lr, a kernel argument.
struct StepLists {
  std::vector<Tensor> params, grads;
  std::vector<std::vector<Tensor>> states;
  std::vector<Tensor> steps;
  std::vector<Tensor> shadows;
  const double* lr = nullptr;
};
// One entry per rule (overloaded on its hyper-parameters), each an instance of fused_step.cuh.
void fused_rule_step(std::unique_ptr<FusedCache>& cache, const char* op, const StepLists& lists,
                     const detail::SgdHyper& hyper, const float* grad_scale, const float* found_inf);
void fused_rule_step(std::unique_ptr<FusedCache>& cache, const char* op, const StepLists& lists,
                     const detail::AdamHyper& hyper, const float* grad_scale, const float* found_inf);
void fused_rule_step(std::unique_ptr<FusedCache>& cache, const char* op, const StepLists& lists,
                     const detail::RmspropHyper& hyper, const float* grad_scale, const float* found_inf);
void fused_rule_step(std::unique_ptr<FusedCache>& cache, const char* op, const StepLists& lists,
                     const detail::AdagradHyper& hyper, const float* grad_scale, const float* found_inf);

}  // namespace tg::optim::cuda
