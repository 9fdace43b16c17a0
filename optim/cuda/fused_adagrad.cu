// Adagrad's instance of the one fused CUDA step (fused_step.cuh): sum and a step count (which
// decays the learning rate).
#include <tapegrad/optim/cuda/fused_step.cuh>

namespace tg::optim::cuda {

void fused_rule_step(std::unique_ptr<FusedCache>& cache, const char* op, const StepLists& lists,
                     const detail::AdagradHyper& hyper, const float* grad_scale, const float* found_inf) {
  fused_step<detail::AdagradRule>(cache, op, lists, hyper, grad_scale, found_inf);
}

}  // namespace tg::optim::cuda
