// The CUDA kernels of the grad scaler (amp/cuda/grad_scaler.cu). Internal: called
// by amp/grad_scaler.cpp only when tapegrad is built with CUDA.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace tg::amp::cuda {

// For every gradient (contiguous, floating, all on found_inf's device): found_inf = 1
// where any element is inf or NaN; with a defined `scale`, also grad *= 1 / scale in
// place. One multi-tensor launch sequence per dtype, on the current stream, no sync.
void non_finite_check_and_unscale(const std::vector<Tensor>& grads, const Tensor& found_inf, const Tensor& scale);

// PyTorch's _amp_update_scale_ in a one-thread kernel: reads found_inf, updates the
// float32 scale and the int32 growth tracker in place.
void update_scale(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf, double growth_factor,
                  double backoff_factor, int64_t growth_interval);

}  // namespace tg::amp::cuda
