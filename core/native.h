// Native ops: validated, device-dispatched, no autograd. The public ops in
// core/ops.h (defined in autograd/functions/) call these and record the graph
// around them; autograd's backward functions call them too. Not installed.
#pragma once
#include <array>
#include <optional>
#include <utility>
#include <vector>

#include <tapegrad/core/backend/backend.h>
#include <tapegrad/core/ops.h>
#include <tapegrad/core/tensor.h>

namespace tg::native {

// ---- construction
Tensor empty(const Shape& sizes, DType dtype, Device device);  // device index resolved
Tensor empty_strided(const Shape& sizes, const Shape& strides, DType dtype, Device device);
Tensor make_view(const Tensor& base, Shape sizes, Shape strides, int64_t offset);  // shares storage
// t's first element's address for a backend call, without Tensor::data_ptr(), which flushes the
// CUDA launch queue: a backend call orders itself on the queue or the stream, and a flush here
// would send a waiting call before this one could join or amend it.
void* address(const Tensor& t);
Device resolve(Device d);  // cuda without index -> current device; checks the device exists

// ---- elementwise engine front-end
// Builds the iter (broadcast, coalesce, promote) and runs op on the inputs' device.
// Output dtype: the promoted input dtype, or Bool for comparisons. Inputs of
// another dtype are converted first. Mixed devices are an error naming `op`.
Tensor unary(backend::ElemOp op, const Tensor& a, double p0 = 0, double p1 = 0);
Tensor binary(backend::ElemOp op, const Tensor& a, const Tensor& b, double p0 = 1, double p1 = 0);
Tensor scalar_op(backend::ElemOp op, const Tensor& a, Scalar s);  // AddScalar, MulScalar, EqScalar, ...
// With an explicit result dtype (floating operands): op computed in the promoted dtype of the
// inputs and `result`, stored as `result`, i.e. to(op(to(inputs, promoted)), result). One pass
// where the backend has that mixed form (backend::has_mixed_form), else through those casts.
Tensor unary_to(backend::ElemOp op, const Tensor& a, DType result, double p0 = 0, double p1 = 0);
Tensor binary_to(backend::ElemOp op, const Tensor& a, const Tensor& b, DType result, double p0 = 1, double p1 = 0);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// In place: writes the result into `self` (no broadcasting of self; result cast to self's dtype).
void unary_out(backend::ElemOp op, const Tensor& self, const Tensor& a, double p0 = 0, double p1 = 0);
void binary_out(backend::ElemOp op, const Tensor& self, const Tensor& a, const Tensor& b, double p0 = 1);
void scalar_op_out(backend::ElemOp op, const Tensor& self, const Tensor& a, Scalar s);
void fill_(const Tensor& self, Scalar v);
void copy_(const Tensor& dst, const Tensor& src, bool non_blocking = false);  // any devices, dtypes, strides
Tensor to(const Tensor& a, Device device, DType dtype, bool non_blocking = false);  // a itself when nothing changes
Tensor contiguous(const Tensor& a);
// Channels-last (issue 17): whether a is 4-d, NHWC-dense and not also row-major (as [N, 1, 1, 1]
// or [N, C, 1, 1] are): the layout the CNN ops keep. contiguous_channels_last: a 4-d tensor with
// NHWC strides, a copy unless it has them.
bool is_nhwc(const Tensor& a);
Tensor contiguous_channels_last(const Tensor& a);
Tensor clone(const Tensor& a);
// The dtype an op computes in, PyTorch's rules (result_type) for tensor/scalar operands.
DType result_type(const Tensor& a, const Tensor& b);
DType result_type(const Tensor& a, const Scalar& s);

// ---- named elementwise helpers
inline Tensor add(const Tensor& a, const Tensor& b, double alpha = 1) { return binary(backend::ElemOp::Add, a, b, alpha); }
inline Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1) { return binary(backend::ElemOp::Sub, a, b, alpha); }
inline Tensor mul(const Tensor& a, const Tensor& b) { return binary(backend::ElemOp::Mul, a, b); }
inline Tensor div(const Tensor& a, const Tensor& b) { return binary(backend::ElemOp::Div, a, b); }
inline Tensor mul(const Tensor& a, Scalar s) { return scalar_op(backend::ElemOp::MulScalar, a, s); }
inline Tensor add(const Tensor& a, Scalar s) { return scalar_op(backend::ElemOp::AddScalar, a, s); }
// The sum of several tensors of one shape, dtype and device in as few launches as possible
// (autograd's gradient accumulation: one kernel per kMaxAddN inputs instead of one per input).
Tensor add_n(const std::vector<Tensor>& ts);

// ---- reductions (dims wrapped by the callee; empty = all)
Tensor reduce(backend::ReduceOp op, const Tensor& a, const DimList& dims, bool keepdim, int64_t correction = 1);
Tensor argmax(const Tensor& a, std::optional<int64_t> dim, bool keepdim);
// Sums `grad` down to `shape` (the inverse of broadcasting): the one place
// autograd reduces a broadcast gradient.
Tensor sum_to(const Tensor& grad, const Shape& shape);

// ---- linear algebra: 1-D, 2-D and batched with broadcasting batch dims
Tensor matmul(const Tensor& a, const Tensor& b);
// The same with the result in out_dtype: a's dtype, or float32 for float16 / bfloat16 operands
// (accumulated in float and stored without rounding to half: mixed-precision gradients).
Tensor matmul(const Tensor& a, const Tensor& b, DType out_dtype);
// How many gemms this thread stored in float32 from float16 / bfloat16 operands (for tests).
uint64_t wide_gemm_count();
// linear: x (..., in) @ weight[out, in]^T + bias[out] (bias may be undefined). Validates (errors
// name "linear"). One gemm with the bias fused where the backend can (CUDA: cuBLASLt) and x folds to
// 2-D rows, else matmul + add.
void check_linear(const Tensor& x, const Tensor& weight, const Tensor& bias);
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);
// linear's backward, g (..., out). Input gradient: g @ weight (x's shape) in out_dtype.
Tensor linear_grad_input(const Tensor& g, const Tensor& weight, DType out_dtype);
// elementwise(bwd, g @ weight, x) in one GEMM whose epilogue applies bwd (an activation's backward
// with x its saved input, of x's shape and g's dtype, contiguous), where the backend fuses it
// (GeluTanhBackward, float16 / bfloat16); undefined (nothing done) where it does not.
Tensor linear_grad_input_pointwise(const Tensor& g, const Tensor& weight, backend::ElemOp bwd, const Tensor& x);
// Weight gradient g^T x summed over the leading dims, in w_dtype and in the weight's layout
// (w_col_major: the transpose of a row-major [in, out]); bias gradient, g summed over the leading
// dims, in b_dtype. Each only when asked (x is unused without the weight's). On CUDA with out <= 8
// (float32 / float16 / bfloat16, x and g folding to rows, x's inner stride 1), weight and bias
// gradient are one launch (backend linear_grad_weight_bias). Otherwise a gemm, and when both are
// wanted in one dtype the bias gradient is fused into it where the backend can.
std::pair<Tensor, Tensor> linear_grad_weight_bias(const Tensor& g, const Tensor& x, bool need_w, bool w_col_major,
                                                  DType w_dtype, bool need_b, DType b_dtype);
// Whether linear's backward may fuse the bias gradient into the weight gemm (cuBLASLt's BGRAD
// epilogues; taken for gradients of up to 2^20 elements). On by default; TG_FUSE_BIAS_GRAD=0 in
// the environment starts it off (A/B timing).
void set_fuse_bias_grad(bool on);
bool fuse_bias_grad();
// Whether linear's backward may take that one-launch path for few outputs. On by default;
// TG_LINEAR_SMALL_OUT_GRAD=0 in the environment starts it off (A/B timing).
void set_linear_small_out_grad(bool on);
bool linear_small_out_grad();

// ---- views (share storage)
Tensor view(const Tensor& a, Shape shape);      // error if strides are incompatible
Tensor reshape(const Tensor& a, Shape shape);   // view when possible, else a copy
Tensor transpose(const Tensor& a, int64_t d0, int64_t d1);
Tensor permute(const Tensor& a, const Shape& dims);
Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end, int64_t step);
Tensor select(const Tensor& a, int64_t dim, int64_t index);
Tensor unsqueeze(const Tensor& a, int64_t dim);
Tensor squeeze(const Tensor& a, std::optional<int64_t> dim);
Tensor expand(const Tensor& a, const Shape& sizes);
Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index, bool check_bounds = true);
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim);
// zeros(shape) with src's slices added at `index` along dim (index_select's backward).
Tensor index_add_zeros(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src);
// index_select(t, 0, index) for every t (one device, each at least 1-d), as few launches as
// possible: contiguous tensors go kMaxGatherRows at a time in one launch on CUDA, others one
// index_select each. With check_bounds the index is checked once against every size(0).
std::vector<Tensor> index_select_rows(const std::vector<Tensor>& ts, const Tensor& index, bool check_bounds = true);

// ---- losses (core/native/loss.cpp)
// True when mse_loss / mse_loss_backward take input and target as they are: one floating dtype,
// one device, equal shapes, both contiguous. The caller uses a composite otherwise.
bool mse_loss_fusable(const Tensor& input, const Tensor& target);
// (input - target)^2 reduced by r, one launch on CUDA; requires mse_loss_fusable.
Tensor mse_loss(const Tensor& input, const Tensor& target, backend::LossReduction r);
// Its gradients {grad_input, grad_target} in one launch; each only when asked for (else undefined).
std::pair<Tensor, Tensor> mse_loss_backward(const Tensor& grad, const Tensor& input, const Tensor& target,
                                            backend::LossReduction r, bool need_input, bool need_target);

// ---- issue 15: softmax and cross_entropy (core/native/softmax.cpp)
// softmax / log_softmax of a floating x over `dim` (any layout; one backend pass over contiguous
// rows of the moved dim). Errors name the op, the shape and the dtype.
Tensor softmax(const Tensor& x, int64_t dim, bool log);
// Their backward from the forward's output y and the incoming gradient g (y's shape).
Tensor softmax_backward(const Tensor& g, const Tensor& y, int64_t dim, bool log);
// The accumulation dtype of the fused cross_entropy (float64 for float64 logits, else float32).
DType cross_entropy_acc_dtype(DType logits);
// The fused cross_entropy over class indices: logits [N, C] contiguous, target [N] contiguous int64,
// weight ([C], accumulation dtype, contiguous) and weight_sum (0-d) or undefined. Returns per-row
// {loss, lse, wt} (see backend::Backend::cross_entropy).
// With want_grad, also the gradient of sum(loss) / denom (denom undefined: 1) for an upstream
// gradient of 1, written in the same pass (backend::Backend::cross_entropy).
struct CrossEntropyRows {
  Tensor loss, lse, wt, grad;
};
CrossEntropyRows cross_entropy_rows(const backend::Backend::CrossEntropyArgs& args, bool want_grad = false,
                                    const Tensor& denom = Tensor());
// The reduced loss in one launch where the backend has that path for this size (else false, nothing
// done): out (0-d accumulation dtype), per-row lse, denom (mean only), grad (want_grad).
struct CrossEntropyReduced {
  Tensor out, lse, denom, grad;
};
bool cross_entropy_reduced(const backend::Backend::CrossEntropyArgs& args, bool mean, bool want_grad,
                           CrossEntropyReduced& result);
// The weighted mean's denominator, sum over rows of w[t] for targets other than ignore_index
// (0-d, accumulation dtype), from the targets alone (a few small launches).
Tensor cross_entropy_denominator(const backend::Backend::CrossEntropyArgs& args);
// The gradient of sum_i s_i loss_i (s_i = grad[i or 0] / denom) with respect to the logits.
Tensor cross_entropy_rows_backward(const backend::Backend::CrossEntropyArgs& args, const Tensor& lse,
                                   const Tensor& grad, const Tensor& denom);

// ---- factories and random (a global Philox generator per device)
Tensor full(const Shape& sizes, Scalar v, DType dtype, Device device);
Tensor rand(const Shape& sizes, DType dtype, Device device);
Tensor randn(const Shape& sizes, DType dtype, Device device);
// In place into self (any layout; a non-dense self is filled through a dense temporary).
void uniform_(const Tensor& self, double from, double to);
void normal_(const Tensor& self, double mean, double std);
Tensor randperm(int64_t n, DType dtype, Device device);
// The same with an explicit Philox (seed, offset) instead of the device's generator:
// reproducible streams of permutations (DataLoader's seeded shuffle). Uses counters
// [offset, offset + 2n); offset must be a multiple of 4.
Tensor randperm(int64_t n, DType dtype, Device device, uint64_t seed, uint64_t offset);
Tensor arange(double start, double end, double step, DType dtype, Device device);
// Reserves `count` Philox counters of the device's generator; returns (seed, offset).
std::pair<uint64_t, uint64_t> philox_reserve(Device device, uint64_t count);
// Every Philox generator's (seed, offset): [0] the CPU's, [1 + i] CUDA device i's; a device
// missing from a state had (the CPU seed, 0). For utils::checkpoint, which replays a forward's
// random numbers in its recompute.
using RngState = std::vector<std::pair<uint64_t, uint64_t>>;
RngState get_rng_state();
void set_rng_state(const RngState& state);

// ---- issue 15: normalization, embedding, dropout (core/native/normalization.cpp)
// layer_norm (rms = false) / rms_norm over the trailing dims `normalized_shape` of x. weight and
// bias: undefined or of shape normalized_shape, x's dtype and device (rms: bias undefined).
// Returns {y, mean, rstd}: y of x's shape and dtype; mean (undefined for rms) and rstd [rows],
// float32 (float64 for float64 x). Errors name `op` and the shapes / dtypes.
struct NormResult {
  Tensor y, mean, rstd;
};
// twin: float16 / bfloat16 when the caller knows y's cast to it is wanted next (autocast will lower
// it); the kernel then also writes that cast and leaves it as y's twin (core/cast_copies.h), where
// the device can. Values are the same either way.
NormResult norm_forward(const char* op, const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                        const Tensor& bias, double eps, bool rms, std::optional<DType> twin = std::nullopt);
// {grad_x, grad_weight, grad_bias}, each only when asked (else undefined). grad_x_addend
// (optional, x's shape and dtype): added into grad_x in the same pass. grad_x_twin: as
// norm_forward's twin, for grad_x.
std::vector<Tensor> norm_backward(const Tensor& grad, const Tensor& x, const Shape& normalized_shape,
                                  const Tensor& weight, const Tensor& mean, const Tensor& rstd, bool rms, bool need_x,
                                  bool need_weight, bool need_bias, const Tensor& grad_x_addend = Tensor(),
                                  std::optional<DType> grad_x_twin = std::nullopt);
// weight[index] of shape index.shape + [dim]; index int64 / int32 checked in [0, num) (not
// during CUDA-graph capture).
Tensor embedding(const Tensor& index, const Tensor& weight);
// The weight gradient [num, dim] (weight's dtype) of embedding; rows at padding_idx stay 0.
Tensor embedding_backward(const Tensor& grad, const Tensor& index, int64_t num, int64_t padding_idx);
// x * mask / (1 - p), mask from Philox counters [offset, offset + numel) of `seed` (backend dropout).
Tensor dropout_mask_apply(const Tensor& x, double p, uint64_t seed, uint64_t offset);
// ---- issue 18: fused attention (core/native/attention.cpp). q, k, v, bias as backend::SdpaArgs,
// validated by the front-end (nn/attention.cpp). nullopt when the device has no fused kernel for
// these shapes (nothing is computed; the caller takes the math path). with_grad: keep the softmax
// statistics and require the backward to be supported too. The backward returns {dq, dk, dv}.
struct SdpaFused {
  backend::SdpaArgs args;
  Tensor out, stats;
};
std::optional<SdpaFused> sdpa_fused_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                                            double scale, bool causal, double dropout_p, bool with_grad);
std::vector<Tensor> sdpa_fused_backward(const SdpaFused& f, const Tensor& grad_out);
// ---- issue 15: general ops (core/native/general.cpp): validated here, errors naming the op
Tensor masked_fill(const Tensor& a, const Tensor& mask, Scalar value);
// The keep-mask of tril (upper = false) or triu for a's last two dims: bool [rows, cols].
Tensor tri_mask(const Tensor& a, int64_t diagonal, bool upper);
Tensor one_hot(const Tensor& index, int64_t num_classes);  // num_classes resolved (>= 0)
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim);
Tensor gather(const Tensor& a, int64_t dim, const Tensor& index);
// A copy of a with src scattered (accumulate: added) at index along dim; `op` names errors.
Tensor scatter(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate, const char* op);
Tensor scatter_value(const Tensor& a, int64_t dim, const Tensor& index, Scalar value);
Tensor index_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& source, Scalar alpha);
Tensor cumsum(const Tensor& a, int64_t dim);
// (values, int64 indices), stable; topk: the first k of the sort (largest: descending).
std::pair<Tensor, Tensor> sort(const Tensor& a, int64_t dim, bool descending);
std::pair<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim, bool largest);

// ---- issue 16: gradient clipping (core/native/clip_grad.cpp); `op` names errors
// The norm_type-norm of all elements of `tensors` together (backend total_norm): a 0-d tensor on
// their device, of their promoted dtype (PyTorch's); with want_coef, also the 0-d float64 clip
// coefficient min(max_norm / (total + 1e-6), 1). No tensors: a float32 0 on the CPU (coef 1).
// Tensors must be floating and on one device (tg::Error naming the devices and shapes otherwise);
// norm_type > 0 (inf included). Non-contiguous tensors are read through a contiguous copy.
struct TotalNorm {
  Tensor total, coef;
};
TotalNorm total_norm(const char* op, const std::vector<Tensor>& tensors, double norm_type, bool want_coef = false,
                     double max_norm = 0);
// t *= factor (0-d, on the tensors' device, read there: no host sync) / t = clamp(t, lo, hi) for
// every t, in place, in as few launches as the backend can; bumps each t's version.
void multi_tensor_scale_(const char* op, const std::vector<Tensor>& tensors, const Tensor& factor);
void multi_tensor_clamp_(const char* op, const std::vector<Tensor>& tensors, double lo, double hi);

// ---- issue 17: pooling (core/native/pooling.cpp)
// 2-d pooling of x ([C, H, W] or [N, C, H, W], any strides, floating). a: kind and window as the
// caller sets them (AdaptiveAvg: OH, OW); ceil_mode: PyTorch's output-size rounding. Validates as
// PyTorch (tg::Error naming op and shapes), fills a's planes, H, W, OH, OW, and returns out (x's
// shape with OH, OW last; channels-last when x is_nhwc) and, for Max, its int64 indices (h * W + w
// within the plane; row-major).
std::pair<Tensor, Tensor> pool2d(const char* op, const Tensor& x, backend::Pool2dArgs& a, bool ceil_mode);
// The gradient (in_shape, grad's dtype; channels-last when asked and 4-d) of pool2d's input from
// grad (out's shape, any layout) and, for Max, the saved indices.
Tensor pool2d_backward(const backend::Pool2dArgs& a, const Tensor& grad, const Tensor& indices, const Shape& in_shape,
                       bool channels_last = false);

// ---- issue 17: batch_norm (core/native/batch_norm.cpp). x, dy: [N, C, *] of one floating dtype,
// any layout, N * prod(*) >= 1 and C >= 1 (checked by the caller, nn/batch_norm.cpp); per-channel
// vectors [C] in the accumulation dtype (float64 for float64 x, else float32) on x's device.
// Layout: a 4-d x that is channels-last (NHWC-dense, not also row-major) keeps it: the results
// (y, dx) are channels-last; every other x is computed, and its results returned, row-major.
struct BatchNormStats {
  Tensor mean, var;  // var: biased
};
BatchNormStats batch_norm_stats(const Tensor& x);
// (x - mean[c]) * scale[c] + shift[c] (shift may be undefined), in x's layout, x's dtype; relu:
// max(that, 0) in the same pass (batch_norm + ReLU fused; NaN stays NaN).
Tensor batch_norm_elemt(const Tensor& x, const Tensor& mean, const Tensor& scale, const Tensor& shift,
                        bool relu = false);
// {sum dy, sum dy * (x - mean) * invstd} per channel. relu_out: the fused ReLU's output (x's
// shape) or undefined; when defined, dy counts only where relu_out > 0 (ReLU's backward, fused).
std::pair<Tensor, Tensor> batch_norm_reduce(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                            const Tensor& invstd, const Tensor& relu_out = Tensor());
// (dy - mean_dy[c] - (x - mean[c]) * invstd[c] * mean_dy_xhat[c]) * scale[c], in x's layout, x's dtype;
// dy masked by relu_out > 0 as in batch_norm_reduce.
Tensor batch_norm_backward_elemt(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                                 const Tensor& scale, const Tensor& mean_dy, const Tensor& mean_dy_xhat,
                                 const Tensor& relu_out = Tensor());
// t (x's shape) in the layout and dtype the kernels above use for x (t itself when it already is):
// a caller passing one operand to several of them converts it once.
Tensor batch_norm_operand(const Tensor& t, const Tensor& x);

// ---- issue 17: convolution (core/native/conv.cpp); `op` names errors
// Resolved conv options in 2-d terms ([H, W]; a 1-d conv uses index 1, index 0 being 1 / 0 / 1).
struct ConvParams {
  std::array<int64_t, 2> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
  bool same = false;  // padding "same" (stride 1): from the kernel and dilation, extra at the end
};
// PyTorch's conv1d (spatial 1: x [N, C, L] or [C, L], weight [Co, C / groups, K]) and conv2d
// (spatial 2: x [N, C, H, W] or [C, H, W], weight [Co, C / groups, KH, KW]); bias [Co] or
// undefined. Output [N, Co, ...] (unbatched in, unbatched out) of x's dtype. Validated here.
// relu: max(output, 0) fused into the convolution (backend ConvArgs::relu).
Tensor conv(const char* op, int spatial, const Tensor& x, const Tensor& weight, const Tensor& bias,
            const ConvParams& p, bool relu = false);
// {grad_x, grad_weight, grad_bias} (each only when asked, else undefined) in the operands' shapes.
std::vector<Tensor> conv_backward(const char* op, int spatial, const Tensor& grad, const Tensor& x,
                                  const Tensor& weight, const ConvParams& p, bool need_x, bool need_weight,
                                  bool need_bias);

// ---- issue 17: conv_transpose, interpolate (core/native/conv.cpp, core/native/interpolate.cpp)
// PyTorch's conv_transpose1d / 2d (spatial as conv): x [N, C_in, ...] or unbatched, weight
// [C_in, C_out / groups, K...], bias [C_out] or undefined; output_padding in p's 2-d terms.
// No backend entry of its own: the forward is the backend's conv2d input gradient (grad_out = x),
// the input gradient is conv2d, the weight gradient conv2d's with the roles of x and grad swapped.
struct ConvTransposeParams {
  ConvParams conv;  // same is unused
  std::array<int64_t, 2> output_padding{0, 0};
};
Tensor conv_transpose(const char* op, int spatial, const Tensor& x, const Tensor& weight, const Tensor& bias,
                      const ConvTransposeParams& p);
// {grad_x, grad_weight, grad_bias} (each only when asked, else undefined) in the operands' shapes.
std::vector<Tensor> conv_transpose_backward(const char* op, int spatial, const Tensor& grad, const Tensor& x,
                                            const Tensor& weight, const ConvTransposeParams& p, bool need_x,
                                            bool need_weight, bool need_bias);
// interpolate's resolved problem: x [N, C, H, W] or [N, C, W] (then H = OH = 1), any strides.
// a: mode, OH, OW, align_corners and the scales as the caller resolved them (0: none).
// Returns out [N, C, (OH,) OW] of x's dtype; fills a's planes, H, W.
Tensor upsample2d(const char* op, const Tensor& x, backend::Upsample2dArgs& a);
// The gradient (in_shape, grad's dtype) of upsample2d's input from grad (out's shape).
Tensor upsample2d_backward(const backend::Upsample2dArgs& a, const Tensor& grad, const Shape& in_shape);

}  // namespace tg::native
