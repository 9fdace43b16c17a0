// Adam's and AdamW's instance of the one fused CUDA step (fused_step.cuh): exp_avg, exp_avg_sq
// (and max_exp_avg_sq with amsgrad) and a step count.
#include <tapegrad/optim/cuda/fused_step.cuh>

namespace tg::optim::cuda {

void fused_rule_step(std::unique_ptr<FusedCache>& cache, const char* op, const StepLists& lists,
                     const detail::AdamHyper& hyper, const float* grad_scale, const float* found_inf) {
  fused_step<detail::AdamRule>(cache, op, lists, hyper, grad_scale, found_inf);
}

}  // namespace tg::optim::cuda
