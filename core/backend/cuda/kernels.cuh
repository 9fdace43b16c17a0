// Entry points of the CUDA kernel translation units, called by CudaBackend
// (backend.cu). The caller has made the operands' device current.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

#include <tapegrad/core/backend/backend.h>

namespace tg::cuda::kern {

void elementwise(backend::ElemOp op, const backend::ElementwiseIter& it);  // elementwise.cu
void reduce(const backend::ReduceArgs& args);                               // reduce.cu
void uniform(const Tensor& out, uint64_t seed, uint64_t offset, double lo, double hi);  // random.cu
void normal(const Tensor& out, uint64_t seed, uint64_t offset, double mean, double std);
void randperm(const Tensor& out, uint64_t seed, uint64_t offset);
void arange(const Tensor& out, double start, double step);  // index.cu
void index_select(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index);
void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src);
void add_n(const Tensor& out, const std::vector<Tensor>& inputs);
void gather_rows(const std::vector<Tensor>& outs, const std::vector<Tensor>& ins, const Tensor& index);  // gather_rows.cu
void mse_loss(const Tensor& out, const Tensor& input, const Tensor& target, backend::LossReduction r);  // loss.cu
void mse_loss_backward(const Tensor& grad_input, const Tensor& grad_target, const Tensor& grad, const Tensor& input,
                       const Tensor& target, backend::LossReduction r);
void linear_grad_weight_bias(const Tensor& gw, const Tensor& gb, const Tensor& g, const Tensor& x);  // linear_grad.cu
// float32 gemms of few output tiles, split over K (small_gemm.cu): whether g fits, and the launch.
bool small_sgemm_fits(const backend::GemmArgs& g);
void small_sgemm(const backend::GemmArgs& g, int device, cudaStream_t stream);
// 2 to kSmallSgemmMaxGroup independent such problems (none writes memory another reads or
// writes) in one launch: whether they fit one, and the launch.
inline constexpr int kSmallSgemmMaxGroup = 4;
bool small_sgemm_group_fits(const backend::GemmArgs* gs, int count);
void small_sgemm_group(const backend::GemmArgs* gs, int count, int device, cudaStream_t stream);
// ---- issue 15: softmax and cross_entropy (softmax.cu)
void softmax(const Tensor& out, const Tensor& in, bool log);
void softmax_backward(const Tensor& grad_in, const Tensor& grad, const Tensor& out, bool log);
void cross_entropy(const backend::Backend::CrossEntropyArgs& args, const Tensor& loss, const Tensor& lse,
                   const Tensor& wt, const Tensor& grad_logits, const Tensor& denom);
void cross_entropy_backward(const backend::Backend::CrossEntropyArgs& args, const Tensor& grad_logits,
                            const Tensor& lse, const Tensor& grad, const Tensor& denom);
bool cross_entropy_reduced(const backend::Backend::CrossEntropyArgs& args, bool mean, const Tensor& out,
                           const Tensor& lse, const Tensor& denom, const Tensor& grad_logits);
// ---- issue 15: normalization, embedding, dropout
// Both return whether they wrote the twin (y_low / grad_x_low) too.
bool norm_forward(const backend::NormArgs& a);  // normalization.cu
bool norm_backward(const backend::NormBackwardArgs& a);
// A residual add (float32 out, one float32 operand and one float16 / bfloat16, alpha 1, dense,
// larger than the launch queue's own launches) called from outside every CUDA op waits in the
// launch queue as a deferred call, so that a layer_norm / rms_norm of its result called next
// computes the sum as it reads its rows and writes it beside its own outputs: one pass instead of
// the add's and the norm's reads of the sum (a pre-norm transformer's ln(x + f(x))). Returns false
// (nothing done: the caller adds) where it does not apply. set_norm_residual_fusion(false) turns
// it off (A/B; default on, TG_NORM_RESIDUAL_FUSION=0); norm_residual_fusions() counts fused pairs.
bool defer_residual_add(const backend::ElementwiseIter& it);
void set_norm_residual_fusion(bool on);
int64_t norm_residual_fusions();
void dropout(const Tensor& out, const Tensor& x, double p, double scale, uint64_t seed, uint64_t offset);
void embedding_backward(const Tensor& grad_weight, const Tensor& grad, const Tensor& index, int64_t padding_idx,
                        bool deterministic);  // embedding.cu
// ---- issue 18: fused attention through cuDNN (attention_cudnn.cpp; false / tg::Error without cuDNN)
bool sdpa_fused_forward(const backend::SdpaArgs& a, const Tensor& out, const Tensor& stats, bool check_backward);
void sdpa_fused_backward(const backend::SdpaArgs& a, const Tensor& out, const Tensor& stats, const Tensor& grad_out,
                         const Tensor& dq, const Tensor& dk, const Tensor& dv);

// ---- issue 15: general ops
void gather(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index);  // scatter_gather.cu
void scatter(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate);
void cumsum(const Tensor& out, const Tensor& in);  // scan_sort.cu
void sort(const Tensor& values, const Tensor& indices, const Tensor& in, bool descending);

// ---- issue 17: pooling (pooling.cu)
void pool2d(const backend::Pool2dArgs& a, const Tensor& out, const Tensor& indices, const Tensor& x);
void pool2d_backward(const backend::Pool2dArgs& a, const Tensor& grad_in, const Tensor& grad_out,
                     const Tensor& indices);

// ---- issue 16: gradient clipping (clip_grad.cu)
void total_norm(const std::vector<Tensor>& tensors, double norm_type, const Tensor& total, const Tensor& coef,
                double max_norm);
void multi_tensor_scale(const std::vector<Tensor>& tensors, const Tensor& factor);
void multi_tensor_clamp(const std::vector<Tensor>& tensors, double lo, double hi);

// ---- issue 17: batch_norm (batch_norm.cu)
void batch_norm_stats(const Tensor& x, int64_t n, int64_t c, int64_t s, const Tensor& mean, const Tensor& var);
void batch_norm_elemt(const Tensor& y, const Tensor& x, int64_t n, int64_t c, int64_t s, const Tensor& mean,
                      const Tensor& scale, const Tensor& shift, bool relu);
void batch_norm_reduce(const Tensor& dy, const Tensor& x, int64_t n, int64_t c, int64_t s, const Tensor& mean,
                       const Tensor& invstd, const Tensor& sum_dy, const Tensor& sum_dy_xhat, const Tensor& relu_out);
void batch_norm_backward_elemt(const Tensor& dx, const Tensor& dy, const Tensor& x, int64_t n, int64_t c, int64_t s,
                               const Tensor& mean, const Tensor& invstd, const Tensor& scale, const Tensor& mean_dy,
                               const Tensor& mean_dy_xhat, const Tensor& relu_out);

// ---- issue 17: convolution through cuDNN (conv_cudnn.cpp; tg::Error when built without it)
void conv2d(const backend::ConvArgs& a);
void conv2d_backward(const backend::ConvBackwardArgs& a);

// ---- issue 17: interpolate (upsample.cu)
void upsample2d(const backend::Upsample2dArgs& a, const Tensor& out, const Tensor& x);
void upsample2d_backward(const backend::Upsample2dArgs& a, const Tensor& grad_in, const Tensor& grad_out);

}  // namespace tg::cuda::kern
