// Gradient clipping, as torch.nn.utils: clip_grad_norm_ (and its two halves, get_total_norm and
// clip_grads_with_norm_) and clip_grad_value_. Every call works on the gradients in place on their
// device without waiting for it (the norm and the clip coefficient stay on the device), so it can
// run inside a captured tg::cuda::Graph step; on CUDA each is a few multi-tensor launches for all
// the tensors, whatever their number.
#pragma once
#include <vector>

#include <tapegrad/core/tensor.h>

namespace tg::nn::utils {

// The norm_type-norm of all the tensors' elements taken together, as a 0-d tensor on their
// device, of their (promoted) dtype as PyTorch's: (sum |x|^p)^(1/p) for finite p > 0, max |x| for
// p = inf; a NaN anywhere gives NaN, an inf (and no NaN) inf. Accumulated in float32 at least.
// No tensors: a float32 0 on the CPU. Tensors on more than one device, non-floating tensors and
// norm_type <= 0 (or NaN) are a tg::Error. error_if_nonfinite: a NaN or inf norm is a tg::Error;
// checking it reads the norm on the host (a synchronisation, so not inside a CUDA graph capture).
Tensor get_total_norm(const std::vector<Tensor>& tensors, double norm_type = 2.0, bool error_if_nonfinite = false);

// Scales the gradient of every parameter that has one by min(max_norm / (total_norm + 1e-6), 1)
// (PyTorch's clip_coef_clamped: computed on the device, never read by the host; a NaN norm gives
// NaN gradients, an inf norm zeros them, as in PyTorch). total_norm: one element on the gradients'
// device (or on the CPU when they are).
void clip_grads_with_norm_(const std::vector<Tensor>& parameters, double max_norm, const Tensor& total_norm);

// torch.nn.utils.clip_grad_norm_: the total norm of the gradients of `parameters` (those without
// one skipped) as get_total_norm computes it, then every gradient multiplied in place by
// min(max_norm / (total + 1e-6), 1). Returns the total norm (before clipping). max_norm is not
// checked (as in PyTorch: a negative one flips the gradients). On CUDA: one pass reading every
// gradient for the norm, a one-block kernel for the norm and the coefficient, one pass scaling,
// each a multi-tensor launch per dtype; no host synchronisation unless error_if_nonfinite.
// Gradients of float32 / float16 / bfloat16 (accumulated in float32) and float64 (in float64).
Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

// torch.nn.utils.clip_grad_value_: clamps every gradient in place to [-clip_value, clip_value]
// (clamp_min(-clip_value) then clamp_max(clip_value), as PyTorch: NaN stays NaN, a negative
// clip_value sets every element to clip_value). One multi-tensor launch per dtype on CUDA.
void clip_grad_value_(const std::vector<Tensor>& parameters, double clip_value);

}  // namespace tg::nn::utils
