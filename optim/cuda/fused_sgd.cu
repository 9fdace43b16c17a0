// SGD's instance of the one fused CUDA step (fused_step.cuh): with momentum, the momentum buffer
// and a step count (old + 1 tells whether the buffer is new); without, no state.
#include <tapegrad/optim/cuda/fused_step.cuh>

namespace tg::optim::cuda {

void fused_rule_step(std::unique_ptr<FusedCache>& cache, const char* op, const StepLists& lists,
                     const detail::SgdHyper& hyper, const float* grad_scale, const float* found_inf) {
  fused_step<detail::SgdRule>(cache, op, lists, hyper, grad_scale, found_inf);
}

}  // namespace tg::optim::cuda
