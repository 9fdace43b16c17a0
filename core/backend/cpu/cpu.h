// The CPU backend's internal interface: the host caching allocator and the
// kernel entry points CpuBackend (cpu_backend.cpp) forwards to. Not installed.
#pragma once
#include <vector>
#include <cstddef>
#include <cstdint>

#include <tapegrad/core/backend/backend.h>
#include <tapegrad/core/storage.h>

namespace tg::cpu {

// The caching host allocator: 64-byte aligned blocks; freed blocks go to
// size-bucketed free lists and are reused, up to a cap on cached bytes.
Allocator* host_allocator();
// Registers it as the CPU's allocator (detail::register_allocator_factory); CpuBackend's
// constructor calls it, so it is registered before backend::cpu() first returns.
void register_host_allocator();
// Returns every cached (free) block to the system.
void release_cached();
size_t cached_bytes();     // free blocks held in the cache
size_t allocated_bytes();  // blocks currently handed out
// The most allocated_bytes() has been since reset_peak_allocated_bytes() (or the start): the host's
// max_memory_allocated, for tests that account for what a graph keeps alive (checkpointing).
size_t max_allocated_bytes();
void reset_peak_allocated_bytes();  // to allocated_bytes() now
// Cap on cached bytes (default 1 GiB, or TG_CPU_CACHE_MB); blocks freed beyond it go back to the system.
void set_cache_limit(size_t bytes);
// Cap on bytes in use (0, the default, or TG_CPU_MEMORY_LIMIT_MB: none): a request that would
// pass it is a tg::Error naming the bytes requested and held, as a full device would give.
// For tests that provoke out-of-memory on the host.
void set_memory_limit(size_t bytes);
size_t memory_limit();

// Kernels (trust their inputs: the front-ends validated them).
void elementwise(backend::ElemOp op, const backend::ElementwiseIter& it);
void copy_kernel(const backend::ElementwiseIter& it);  // ElemOp::Copy, any dtype pair
// The halves of elementwise(), split by arity to keep the translation units small.
void unary_kernel(backend::ElemOp op, const backend::ElementwiseIter& it);   // Fill and 1-input ops
void binary_kernel(backend::ElemOp op, const backend::ElementwiseIter& it);  // 2- and 3-input ops
void reduce(const backend::ReduceArgs& args);
void gemm(const backend::GemmArgs& args);
void uniform(const Tensor& out, uint64_t seed, uint64_t offset, double lo, double hi);
void normal(const Tensor& out, uint64_t seed, uint64_t offset, double mean, double std);
void randperm(const Tensor& out, uint64_t seed, uint64_t offset);
void arange(const Tensor& out, double start, double step);
void index_select(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index);
void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src);
void add_n(const Tensor& out, const std::vector<Tensor>& inputs);
void mse_loss(const Tensor& out, const Tensor& input, const Tensor& target, backend::LossReduction r);  // loss.cpp
void mse_loss_backward(const Tensor& grad_input, const Tensor& grad_target, const Tensor& grad, const Tensor& input,
                       const Tensor& target, backend::LossReduction r);
// ---- issue 15: normalization, embedding, dropout (normalization.cpp)
void norm_forward(const backend::NormArgs& a);
void norm_backward(const backend::NormBackwardArgs& a);
void embedding_backward(const Tensor& grad_weight, const Tensor& grad, const Tensor& index, int64_t padding_idx);
void dropout(const Tensor& out, const Tensor& x, double p, double scale, uint64_t seed, uint64_t offset);

// ---- issue 15: softmax and cross_entropy (softmax.cpp)
void softmax(const Tensor& out, const Tensor& in, bool log);
void softmax_backward(const Tensor& grad_in, const Tensor& grad, const Tensor& out, bool log);
void cross_entropy(const backend::Backend::CrossEntropyArgs& args, const Tensor& loss, const Tensor& lse,
                   const Tensor& wt, const Tensor& grad_logits, const Tensor& denom);
void cross_entropy_backward(const backend::Backend::CrossEntropyArgs& args, const Tensor& grad_logits,
                            const Tensor& lse, const Tensor& grad, const Tensor& denom);

// ---- issue 15: general ops (general.cpp)
void gather(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index);
void scatter(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate);
void cumsum(const Tensor& out, const Tensor& in);
void sort(const Tensor& values, const Tensor& indices, const Tensor& in, bool descending);

// ---- issue 17: pooling (pooling.cpp)
void pool2d(const backend::Pool2dArgs& a, const Tensor& out, const Tensor& indices, const Tensor& x);
void pool2d_backward(const backend::Pool2dArgs& a, const Tensor& grad_in, const Tensor& grad_out,
                     const Tensor& indices);

// ---- issue 16: gradient clipping (clip_grad.cpp)
void total_norm(const std::vector<Tensor>& tensors, double norm_type, const Tensor& total, const Tensor& coef,
                double max_norm);
void multi_tensor_scale(const std::vector<Tensor>& tensors, const Tensor& factor);
void multi_tensor_clamp(const std::vector<Tensor>& tensors, double lo, double hi);

// ---- issue 17: batch_norm (batch_norm.cpp)
void batch_norm_stats(const Tensor& x, int64_t n, int64_t c, int64_t s, const Tensor& mean, const Tensor& var);
void batch_norm_elemt(const Tensor& y, const Tensor& x, int64_t n, int64_t c, int64_t s, const Tensor& mean,
                      const Tensor& scale, const Tensor& shift, bool relu);
void batch_norm_reduce(const Tensor& dy, const Tensor& x, int64_t n, int64_t c, int64_t s, const Tensor& mean,
                       const Tensor& invstd, const Tensor& sum_dy, const Tensor& sum_dy_xhat, const Tensor& relu_out);
void batch_norm_backward_elemt(const Tensor& dx, const Tensor& dy, const Tensor& x, int64_t n, int64_t c, int64_t s,
                               const Tensor& mean, const Tensor& invstd, const Tensor& scale, const Tensor& mean_dy,
                               const Tensor& mean_dy_xhat, const Tensor& relu_out);

// ---- issue 17: convolution (conv.cpp): im2col + gemm per sample, threaded over the batch
void conv2d(const backend::ConvArgs& a);
void conv2d_backward(const backend::ConvBackwardArgs& a);

// ---- issue 17: interpolate (upsample.cpp)
void upsample2d(const backend::Upsample2dArgs& a, const Tensor& out, const Tensor& x);
void upsample2d_backward(const backend::Upsample2dArgs& a, const Tensor& grad_in, const Tensor& grad_out);

// Name of an elementwise op for error messages.
const char* op_name(backend::ElemOp op);

// Elements per parallel chunk for cheap elementwise work.
inline constexpr int64_t kGrain = 32768;

}  // namespace tg::cpu
