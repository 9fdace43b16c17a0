// CudaBackend: the CUDA row of the backend kernel table. Each call makes the
// operands' device current and forwards to the kernel units (kernels.cuh), which
// launch on that device's current stream and never synchronise the host.
#include <tapegrad/core/backend/backend.h>
#include <tapegrad/core/backend/cuda/blas.h>
#include <tapegrad/core/backend/cuda/elementwise_ops.cuh>
#include <tapegrad/core/backend/cuda/kernels.cuh>
#include <tapegrad/core/backend/cuda/launch_queue.h>
#include <tapegrad/core/backend/cuda/runtime.h>

namespace tg::cuda::kern {

void elementwise(backend::ElemOp op, const backend::ElementwiseIter& it) {
  if (elementwise_copy(op, it) || elementwise_binary(op, it) || elementwise_unary(op, it) ||
      elementwise_compare(op, it))
    return;
  TG_ERROR(backend::elem_op_name(op), ": no CUDA kernel for this op");
}

}  // namespace tg::cuda::kern

namespace tg::backend {
namespace {

int device_of(const Tensor& t) { return t.device().index() < 0 ? 0 : t.device().index(); }

// Each op's DeviceGuard also marks the thread as inside a CUDA op, so that the elementwise
// steps an op runs itself are launched at once (launch_queue.h); only an elementwise op
// called from outside every other op may be deferred.
class CudaBackend final : public Backend {
 public:
  CudaBackend() { cuda::detail::register_device_allocator(); }  // CUDA tensors allocate from it
  void elementwise(ElemOp op, const ElementwiseIter& it) override {
    if (it.numel == 0) return;
    cuda::detail::DeferScope defer;  // before the guard: is this op the outermost?
    cuda::detail::DeviceGuard guard(it.device.index() < 0 ? 0 : it.device.index());
    cuda::kern::elementwise(op, it);
  }
  void reduce(const ReduceArgs& args) override {
    cuda::detail::DeviceGuard guard(device_of(args.in));
    cuda::kern::reduce(args);
  }
  void gemm(const GemmArgs& args) override {
    cuda::detail::DeferScope defer(args.deferrable);  // before blas.cpp's guard: the outermost op?
    cuda::detail::gemm(args);
  }
  bool gemm_fuses(const GemmArgs& args) override { return cuda::detail::gemm_fuses(args); }
  Tensor fuse_into_deferred_gemm(ElemOp op, const Tensor& a) override { return cuda::detail::fuse_into_deferred_gemm(op, a); }
  void uniform(const Tensor& out, uint64_t seed, uint64_t offset, double lo, double hi) override {
    if (out.numel() == 0) return;
    cuda::detail::DeviceGuard guard(device_of(out));
    cuda::kern::uniform(out, seed, offset, lo, hi);
  }
  void normal(const Tensor& out, uint64_t seed, uint64_t offset, double mean, double std) override {
    if (out.numel() == 0) return;
    cuda::detail::DeviceGuard guard(device_of(out));
    cuda::kern::normal(out, seed, offset, mean, std);
  }
  void randperm(const Tensor& out, uint64_t seed, uint64_t offset) override {
    if (out.numel() == 0) return;
    cuda::detail::DeviceGuard guard(device_of(out));
    cuda::kern::randperm(out, seed, offset);
  }
  void arange(const Tensor& out, double start, double step) override {
    if (out.numel() == 0) return;
    cuda::detail::DeviceGuard guard(device_of(out));
    cuda::kern::arange(out, start, step);
  }
  void add_n(const Tensor& out, const std::vector<Tensor>& inputs) override {
    cuda::detail::DeviceGuard g(out.device().index());
    cuda::kern::add_n(out, inputs);
  }
  void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) override {
    cuda::detail::DeviceGuard g(out.device().index());
    cuda::kern::index_add(out, dim, index, src);
  }
  void index_select(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index) override {
    if (out.numel() == 0) return;
    cuda::detail::DeviceGuard guard(device_of(out));
    cuda::kern::index_select(out, in, dim, index);
  }
  void gather_rows(const std::vector<Tensor>& outs, const std::vector<Tensor>& ins, const Tensor& index) override {
    if (ins.empty() || index.numel() == 0) return;
    cuda::detail::DeviceGuard guard(device_of(index));
    cuda::kern::gather_rows(outs, ins, index);
  }
  void mse_loss(const Tensor& out, const Tensor& input, const Tensor& target, LossReduction r) override {
    cuda::detail::DeviceGuard guard(device_of(input));
    cuda::kern::mse_loss(out, input, target, r);
  }
  void mse_loss_backward(const Tensor& grad_input, const Tensor& grad_target, const Tensor& grad, const Tensor& input,
                         const Tensor& target, LossReduction r) override {
    if (input.numel() == 0) return;
    cuda::detail::DeviceGuard guard(device_of(input));
    cuda::kern::mse_loss_backward(grad_input, grad_target, grad, input, target, r);
  }
  void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes,
                  bool non_blocking) override {
    if (src_device.is_cpu())
      cuda::detail::copy_h2d(dst, src, nbytes, dst_device.index(), non_blocking);
    else if (dst_device.is_cpu())
      cuda::detail::copy_d2h(dst, src, nbytes, src_device.index(), non_blocking);
    else
      cuda::detail::copy_d2d(dst, dst_device.index(), src, src_device.index(), nbytes);
  }
  DataPtr host_staging(size_t nbytes) override { return cuda::detail::host_allocate(nbytes); }
  void linear_grad_weight_bias(const Tensor& gw, const Tensor& gb, const Tensor& g, const Tensor& x) override {
    cuda::detail::DeviceGuard guard(device_of(x));
    cuda::kern::linear_grad_weight_bias(gw, gb, g, x);
  }
  // ---- issue 15: softmax and cross_entropy
  void softmax(const Tensor& out, const Tensor& in, bool log) override {
    if (in.numel() == 0) return;
    cuda::detail::DeviceGuard guard(device_of(in));
    cuda::kern::softmax(out, in, log);
  }
  void softmax_backward(const Tensor& grad_in, const Tensor& grad, const Tensor& out, bool log) override {
    if (out.numel() == 0) return;
    cuda::detail::DeviceGuard guard(device_of(out));
    cuda::kern::softmax_backward(grad_in, grad, out, log);
  }
  void cross_entropy(const CrossEntropyArgs& args, const Tensor& loss, const Tensor& lse, const Tensor& wt,
                     const Tensor& grad_logits, const Tensor& denom) override {
    if (args.logits.numel() == 0) return;
    cuda::detail::DeviceGuard guard(device_of(args.logits));
    cuda::kern::cross_entropy(args, loss, lse, wt, grad_logits, denom);
  }
  void cross_entropy_backward(const CrossEntropyArgs& args, const Tensor& grad_logits, const Tensor& lse,
                              const Tensor& grad, const Tensor& denom) override {
    if (args.logits.numel() == 0) return;
    cuda::detail::DeviceGuard guard(device_of(args.logits));
    cuda::kern::cross_entropy_backward(args, grad_logits, lse, grad, denom);
  }
  bool cross_entropy_reduced(const CrossEntropyArgs& args, bool mean, const Tensor& out, const Tensor& lse,
                             const Tensor& denom, const Tensor& grad_logits) override {
    if (args.logits.numel() == 0) return false;
    cuda::detail::DeviceGuard guard(device_of(args.logits));
    return cuda::kern::cross_entropy_reduced(args, mean, out, lse, denom, grad_logits);
  }
  // ---- issue 15: normalization, embedding, dropout
  bool norm_forward(const NormArgs& a) override {
    if (a.rows == 0 || a.cols == 0) return false;
    cuda::detail::DeviceGuard guard(device_of(a.x));
    return cuda::kern::norm_forward(a);
  }
  bool norm_backward(const NormBackwardArgs& a) override {
    if (a.rows == 0 || a.cols == 0) return false;
    cuda::detail::DeviceGuard guard(device_of(a.x));
    return cuda::kern::norm_backward(a);
  }
  void embedding_backward(const Tensor& grad_weight, const Tensor& grad, const Tensor& index, int64_t padding_idx,
                          bool deterministic) override {
    if (index.numel() == 0) return;
    cuda::detail::DeviceGuard guard(device_of(grad_weight));
    cuda::kern::embedding_backward(grad_weight, grad, index, padding_idx, deterministic);
  }
  void dropout(const Tensor& out, const Tensor& x, double p, double scale, uint64_t seed, uint64_t offset) override {
    if (x.numel() == 0) return;
    cuda::detail::DeviceGuard guard(device_of(x));
    cuda::kern::dropout(out, x, p, scale, seed, offset);
  }
  // ---- issue 18: fused attention (cuDNN, attention_cudnn.cpp); its guard is there
  bool sdpa_fused_forward(const SdpaArgs& a, const Tensor& out, const Tensor& stats, bool check_backward) override {
    return cuda::kern::sdpa_fused_forward(a, out, stats, check_backward);
  }
  void sdpa_fused_backward(const SdpaArgs& a, const Tensor& out, const Tensor& stats, const Tensor& grad_out,
                           const Tensor& dq, const Tensor& dk, const Tensor& dv) override {
    cuda::kern::sdpa_fused_backward(a, out, stats, grad_out, dq, dk, dv);
  }
  // ---- issue 15: general ops
  void gather(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index) override {
    if (out.numel() == 0) return;
    cuda::detail::DeviceGuard guard(device_of(out));
    cuda::kern::gather(out, in, dim, index);
  }
  void scatter(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate) override {
    if (index.numel() == 0) return;
    cuda::detail::DeviceGuard guard(device_of(out));
    cuda::kern::scatter(out, dim, index, src, accumulate);
  }
  void cumsum(const Tensor& out, const Tensor& in) override {
    if (out.numel() == 0) return;
    cuda::detail::DeviceGuard guard(device_of(out));
    cuda::kern::cumsum(out, in);
  }
  void sort(const Tensor& values, const Tensor& indices, const Tensor& in, bool descending) override {
    if (in.numel() == 0) return;
    cuda::detail::DeviceGuard guard(device_of(in));
    cuda::kern::sort(values, indices, in, descending);
  }
  // ---- issue 17: pooling
  void pool2d(const backend::Pool2dArgs& a, const Tensor& out, const Tensor& indices, const Tensor& x) override {
    if (out.numel() == 0) return;
    cuda::detail::DeviceGuard guard(device_of(x));
    cuda::kern::pool2d(a, out, indices, x);
  }
  void pool2d_backward(const backend::Pool2dArgs& a, const Tensor& grad_in, const Tensor& grad_out,
                       const Tensor& indices) override {
    if (grad_in.numel() == 0) return;
    cuda::detail::DeviceGuard guard(device_of(grad_in));
    cuda::kern::pool2d_backward(a, grad_in, grad_out, indices);
  }
  // ---- issue 16: gradient clipping
  void total_norm(const std::vector<Tensor>& tensors, double norm_type, const Tensor& total, const Tensor& coef,
                  double max_norm) override {
    cuda::detail::DeviceGuard guard(device_of(total));
    cuda::kern::total_norm(tensors, norm_type, total, coef, max_norm);
  }
  void multi_tensor_scale(const std::vector<Tensor>& tensors, const Tensor& factor) override {
    if (tensors.empty()) return;
    cuda::detail::DeviceGuard guard(device_of(factor));
    cuda::kern::multi_tensor_scale(tensors, factor);
  }
  void multi_tensor_clamp(const std::vector<Tensor>& tensors, double lo, double hi) override {
    if (tensors.empty()) return;
    cuda::detail::DeviceGuard guard(device_of(tensors.front()));
    cuda::kern::multi_tensor_clamp(tensors, lo, hi);
  }
  // ---- issue 17: convolution (cuDNN, conv_cudnn.cpp); its guard is there
  void conv2d(const ConvArgs& a) override { cuda::kern::conv2d(a); }
  void conv2d_backward(const ConvBackwardArgs& a) override { cuda::kern::conv2d_backward(a); }
  bool conv_takes_channels_last() const override { return true; }
  // ---- issue 17: batch_norm
  void batch_norm_stats(const Tensor& x, int64_t n, int64_t c, int64_t s, const Tensor& mean,
                        const Tensor& var) override {
    cuda::detail::DeviceGuard guard(device_of(x));
    cuda::kern::batch_norm_stats(x, n, c, s, mean, var);
  }
  void batch_norm_elemt(const Tensor& y, const Tensor& x, int64_t n, int64_t c, int64_t s, const Tensor& mean,
                        const Tensor& scale, const Tensor& shift, bool relu) override {
    cuda::detail::DeviceGuard guard(device_of(x));
    cuda::kern::batch_norm_elemt(y, x, n, c, s, mean, scale, shift, relu);
  }
  void batch_norm_reduce(const Tensor& dy, const Tensor& x, int64_t n, int64_t c, int64_t s, const Tensor& mean,
                         const Tensor& invstd, const Tensor& sum_dy, const Tensor& sum_dy_xhat,
                         const Tensor& relu_out) override {
    cuda::detail::DeviceGuard guard(device_of(x));
    cuda::kern::batch_norm_reduce(dy, x, n, c, s, mean, invstd, sum_dy, sum_dy_xhat, relu_out);
  }
  void batch_norm_backward_elemt(const Tensor& dx, const Tensor& dy, const Tensor& x, int64_t n, int64_t c, int64_t s,
                                 const Tensor& mean, const Tensor& invstd, const Tensor& scale, const Tensor& mean_dy,
                                 const Tensor& mean_dy_xhat, const Tensor& relu_out) override {
    cuda::detail::DeviceGuard guard(device_of(x));
    cuda::kern::batch_norm_backward_elemt(dx, dy, x, n, c, s, mean, invstd, scale, mean_dy, mean_dy_xhat,
                                          relu_out);
  }
  // ---- issue 17: interpolate
  void upsample2d(const backend::Upsample2dArgs& a, const Tensor& out, const Tensor& x) override {
    if (out.numel() == 0) return;
    cuda::detail::DeviceGuard guard(device_of(x));
    cuda::kern::upsample2d(a, out, x);
  }
  void upsample2d_backward(const backend::Upsample2dArgs& a, const Tensor& grad_in, const Tensor& grad_out) override {
    if (grad_in.numel() == 0) return;
    cuda::detail::DeviceGuard guard(device_of(grad_in));
    cuda::kern::upsample2d_backward(a, grad_in, grad_out);
  }
};

}  // namespace

Backend* cuda() {
  static CudaBackend backend;
  return &backend;
}

}  // namespace tg::backend
