// RMSprop's instance of the one fused CUDA step (fused_step.cuh): square_avg (then grad_avg when
// centered, momentum_buffer with momentum) and a step count.
#include <tapegrad/optim/cuda/fused_step.cuh>

namespace tg::optim::cuda {

void fused_rule_step(std::unique_ptr<FusedCache>& cache, const char* op, const StepLists& lists,
                     const detail::RmspropHyper& hyper, const float* grad_scale, const float* found_inf) {
  fused_step<detail::RmspropRule>(cache, op, lists, hyper, grad_scale, found_inf);
}

}  // namespace tg::optim::cuda
