// CpuBackend: the CPU row of the kernel table (core/backend/backend.h). Each
// entry forwards to the kernels in this folder.
#include <tapegrad/core/backend/cpu/cpu.h>

namespace tg::cpu {

namespace {
constexpr int kArity[] = {
#define TG_ELEM_ARITY(name, n) n,
    TG_ELEMENTWISE_OPS(TG_ELEM_ARITY)
#undef TG_ELEM_ARITY
};
int arity(backend::ElemOp op) { return kArity[static_cast<int>(op)]; }
}  // namespace

const char* op_name(backend::ElemOp op) {
  switch (op) {
#define TG_ELEM_NAME(name, n) \
  case backend::ElemOp::name: \
    return #name;
    TG_ELEMENTWISE_OPS(TG_ELEM_NAME)
#undef TG_ELEM_NAME
  }
  return "?";
}

void elementwise(backend::ElemOp op, const backend::ElementwiseIter& it) {
  if (op == backend::ElemOp::Copy) return copy_kernel(it);
  if (arity(op) <= 1) return unary_kernel(op, it);
  binary_kernel(op, it);
}

namespace {

class CpuBackend final : public backend::Backend {
 public:
  CpuBackend() { register_host_allocator(); }  // tensors on the CPU allocate from it (core/storage.h)
  void elementwise(backend::ElemOp op, const backend::ElementwiseIter& it) override { cpu::elementwise(op, it); }
  void reduce(const backend::ReduceArgs& args) override { cpu::reduce(args); }
  void gemm(const backend::GemmArgs& args) override { cpu::gemm(args); }
  // No fused epilogues: the front-ends add the bias / sum the rows themselves.
  bool gemm_fuses(const backend::GemmArgs& args) override { return args.epilogue == backend::GemmEpilogue::None; }
  void uniform(const Tensor& out, uint64_t seed, uint64_t offset, double lo, double hi) override {
    cpu::uniform(out, seed, offset, lo, hi);
  }
  void normal(const Tensor& out, uint64_t seed, uint64_t offset, double mean, double std) override {
    cpu::normal(out, seed, offset, mean, std);
  }
  void randperm(const Tensor& out, uint64_t seed, uint64_t offset) override { cpu::randperm(out, seed, offset); }
  void arange(const Tensor& out, double start, double step) override { cpu::arange(out, start, step); }
  void add_n(const Tensor& out, const std::vector<Tensor>& inputs) override { cpu::add_n(out, inputs); }
  void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) override {
    cpu::index_add(out, dim, index, src);
  }
  void index_select(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index) override {
    cpu::index_select(out, in, dim, index);
  }
  // One memcpy gather per tensor: on the CPU a launch costs nothing.
  void gather_rows(const std::vector<Tensor>& outs, const std::vector<Tensor>& ins, const Tensor& index) override {
    for (size_t k = 0; k < ins.size(); ++k) cpu::index_select(outs[k], ins[k], 0, index);
  }
  void mse_loss(const Tensor& out, const Tensor& input, const Tensor& target, backend::LossReduction r) override {
    cpu::mse_loss(out, input, target, r);
  }
  void mse_loss_backward(const Tensor& grad_input, const Tensor& grad_target, const Tensor& grad, const Tensor& input,
                         const Tensor& target, backend::LossReduction r) override {
    cpu::mse_loss_backward(grad_input, grad_target, grad, input, target, r);
  }
  // ---- issue 15: softmax and cross_entropy
  void softmax(const Tensor& out, const Tensor& in, bool log) override { cpu::softmax(out, in, log); }
  void softmax_backward(const Tensor& grad_in, const Tensor& grad, const Tensor& out, bool log) override {
    cpu::softmax_backward(grad_in, grad, out, log);
  }
  void cross_entropy(const CrossEntropyArgs& args, const Tensor& loss, const Tensor& lse, const Tensor& wt,
                     const Tensor& grad_logits, const Tensor& denom) override {
    cpu::cross_entropy(args, loss, lse, wt, grad_logits, denom);
  }
  void cross_entropy_backward(const CrossEntropyArgs& args, const Tensor& grad_logits, const Tensor& lse,
                              const Tensor& grad, const Tensor& denom) override {
    cpu::cross_entropy_backward(args, grad_logits, lse, grad, denom);
  }
  // ---- issue 15: normalization, embedding, dropout
  bool norm_forward(const backend::NormArgs& a) override {
    cpu::norm_forward(a);
    return false;  // no twin on the CPU
  }
  bool norm_backward(const backend::NormBackwardArgs& a) override {
    cpu::norm_backward(a);
    return false;
  }
  void embedding_backward(const Tensor& grad_weight, const Tensor& grad, const Tensor& index, int64_t padding_idx,
                          bool) override {
    cpu::embedding_backward(grad_weight, grad, index, padding_idx);  // always in a fixed order
  }
  void dropout(const Tensor& out, const Tensor& x, double p, double scale, uint64_t seed, uint64_t offset) override {
    cpu::dropout(out, x, p, scale, seed, offset);
  }
  // ---- issue 15: general ops
  void gather(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index) override {
    cpu::gather(out, in, dim, index);
  }
  void scatter(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate) override {
    cpu::scatter(out, dim, index, src, accumulate);
  }
  void cumsum(const Tensor& out, const Tensor& in) override { cpu::cumsum(out, in); }
  void sort(const Tensor& values, const Tensor& indices, const Tensor& in, bool descending) override {
    cpu::sort(values, indices, in, descending);
  }
  // ---- issue 17: pooling
  void pool2d(const backend::Pool2dArgs& a, const Tensor& out, const Tensor& indices, const Tensor& x) override {
    cpu::pool2d(a, out, indices, x);
  }
  void pool2d_backward(const backend::Pool2dArgs& a, const Tensor& grad_in, const Tensor& grad_out,
                       const Tensor& indices) override {
    cpu::pool2d_backward(a, grad_in, grad_out, indices);
  }
  // ---- issue 16: gradient clipping
  void total_norm(const std::vector<Tensor>& tensors, double norm_type, const Tensor& total, const Tensor& coef,
                  double max_norm) override {
    cpu::total_norm(tensors, norm_type, total, coef, max_norm);
  }
  void multi_tensor_scale(const std::vector<Tensor>& tensors, const Tensor& factor) override {
    cpu::multi_tensor_scale(tensors, factor);
  }
  void multi_tensor_clamp(const std::vector<Tensor>& tensors, double lo, double hi) override {
    cpu::multi_tensor_clamp(tensors, lo, hi);
  }
  // ---- issue 17: batch_norm
  void batch_norm_stats(const Tensor& x, int64_t n, int64_t c, int64_t s, const Tensor& mean,
                        const Tensor& var) override {
    cpu::batch_norm_stats(x, n, c, s, mean, var);
  }
  void batch_norm_elemt(const Tensor& y, const Tensor& x, int64_t n, int64_t c, int64_t s, const Tensor& mean,
                        const Tensor& scale, const Tensor& shift, bool relu) override {
    cpu::batch_norm_elemt(y, x, n, c, s, mean, scale, shift, relu);
  }
  void batch_norm_reduce(const Tensor& dy, const Tensor& x, int64_t n, int64_t c, int64_t s, const Tensor& mean,
                         const Tensor& invstd, const Tensor& sum_dy, const Tensor& sum_dy_xhat,
                         const Tensor& relu_out) override {
    cpu::batch_norm_reduce(dy, x, n, c, s, mean, invstd, sum_dy, sum_dy_xhat, relu_out);
  }
  void batch_norm_backward_elemt(const Tensor& dx, const Tensor& dy, const Tensor& x, int64_t n, int64_t c, int64_t s,
                                 const Tensor& mean, const Tensor& invstd, const Tensor& scale, const Tensor& mean_dy,
                                 const Tensor& mean_dy_xhat, const Tensor& relu_out) override {
    cpu::batch_norm_backward_elemt(dx, dy, x, n, c, s, mean, invstd, scale, mean_dy, mean_dy_xhat,
                                   relu_out);
  }

  // ---- issue 17: convolution
  void conv2d(const backend::ConvArgs& a) override { cpu::conv2d(a); }
  void conv2d_backward(const backend::ConvBackwardArgs& a) override { cpu::conv2d_backward(a); }
  // ---- issue 17: interpolate
  void upsample2d(const backend::Upsample2dArgs& a, const Tensor& out, const Tensor& x) override {
    cpu::upsample2d(a, out, x);
  }
  void upsample2d_backward(const backend::Upsample2dArgs& a, const Tensor& grad_in, const Tensor& grad_out) override {
    cpu::upsample2d_backward(a, grad_in, grad_out);
  }
};

}  // namespace
}  // namespace tg::cpu

namespace tg::backend {

Backend& cpu() {
  static tg::cpu::CpuBackend backend;
  return backend;
}

}  // namespace tg::backend
