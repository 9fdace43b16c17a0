// Per-parameter step counts kept on the device: one small launch advances all the
// counts of a bucket by one unless found_inf is set, before the update kernel
// reads them (the update kernel's blocks only read them, so there is no race).
#pragma once
#include <cuda_runtime.h>

#include <vector>

#include "core/backend/cuda/runtime.h"

namespace tg::optim::cuda {

inline constexpr int kMaxStepsPerLaunch = 480;  // keeps the argument struct under 4 KB

struct StepList {
  float* steps[kMaxStepsPerLaunch];
  int n;
};

namespace {
// Each TU that includes this gets its own copy (no separate device compilation needed).
__global__ void advance_steps_kernel(StepList list, const float* found_inf) {
  if (found_inf != nullptr && *found_inf != 0.f) return;
  const int i = threadIdx.x;
  if (i < list.n) *list.steps[i] += 1.f;
}
}  // namespace

// The launches for a list of step pointers.
inline std::vector<StepList> make_step_lists(const std::vector<float*>& steps) {
  std::vector<StepList> out;
  for (size_t i = 0; i < steps.size(); i += kMaxStepsPerLaunch) {
    StepList l{};
    l.n = 0;
    for (size_t j = i; j < steps.size() && l.n < kMaxStepsPerLaunch; ++j) l.steps[l.n++] = steps[j];
    out.push_back(l);
  }
  return out;
}

inline void advance_steps(const std::vector<StepList>& lists, const float* found_inf, cudaStream_t stream) {
  for (const auto& l : lists) {
    advance_steps_kernel<<<1, kMaxStepsPerLaunch, 0, stream>>>(l, found_inf);
    TG_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace tg::optim::cuda
