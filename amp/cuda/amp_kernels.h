// The CUDA kernels of the grad scaler (amp/cuda/grad_scaler.cu). Internal: called
// by amp/grad_scaler.cpp only when tapegrad is built with CUDA.
#pragma once
#include <cstdint>
#include <vector>

#include <tapegrad/core/tensor.h>

namespace tg::amp::cuda {

// For every gradient (contiguous, floating, all on found_inf's device): found_inf = 1
// where any element is inf or NaN; with a defined `scale`, also grad *= 1 / scale in
// place. One multi-tensor launch sequence per dtype, on the current stream, no sync.
void non_finite_check_and_unscale(const std::vector<Tensor>& grads, const Tensor& found_inf, const Tensor& scale);

// Found-inf flags one update_scale launch reads (and clears) at most.
inline constexpr int kMaxFoundInfs = 16;

// PyTorch's _amp_update_scale_ in a one-thread kernel: overflow if any of the
// found_infs (float32 scalars, at most kMaxFoundInfs) is non-zero; updates the
// float32 scale and the int32 growth tracker in place, then sets every found_inf
// back to zero (they are the scaler's persistent per-optimizer flags, so the next
// iteration's check needs no zero-fill launch).
void update_scale(const Tensor& scale, const Tensor& growth_tracker, const std::vector<Tensor>& found_infs,
                  double growth_factor, double backoff_factor, int64_t growth_interval);

}  // namespace tg::amp::cuda
