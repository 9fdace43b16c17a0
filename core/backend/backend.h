// The backend kernel table: what each device (cpu/, cuda/) implements. The op
// front-ends (core/native/*.cpp) validate, pick output dtype and shape, build an
// ElementwiseIter / argument struct, and call these. Kernels trust their inputs.
// Not installed: users never see this header.
#pragma once
#include <cstdint>
#include <vector>

#include <tapegrad/core/dtype.h>
#include <tapegrad/core/tensor.h>

namespace tg::backend {

// The one list of elementwise ops. Columns: name, number of tensor inputs.
// Params (dparams / iparams of the iter) are noted per op.
#define TG_ELEMENTWISE_OPS(_)                                                          \
  /* nullary */                                                                        \
  _(Fill, 0)           /* out = p0 */                                                  \
  /* unary: out dtype == input dtype unless noted */                                   \
  _(Copy, 1)           /* out = cast<out dtype>(in); the only op with free dtypes */   \
  _(Neg, 1)                                                                            \
  _(Exp, 1)            /* float types only (front-end promotes ints) */                \
  _(Log, 1)                                                                            \
  _(Sqrt, 1)                                                                           \
  _(Abs, 1)                                                                            \
  _(Relu, 1)                                                                           \
  _(Sigmoid, 1)                                                                        \
  _(Tanh, 1)                                                                           \
  _(Gelu, 1)           /* exact: x * 0.5 * (1 + erf(x / sqrt 2)) */                    \
  _(PowScalar, 1)      /* in ^ p0 */                                                   \
  _(Clamp, 1)          /* min(max(in, p0), p1) */                                      \
  _(AddScalar, 1)      /* in + p0 */                                                   \
  _(RSubScalar, 1)     /* p0 - in */                                                   \
  _(MulScalar, 1)      /* in * p0 */                                                   \
  _(DivScalar, 1)      /* in / p0 */                                                   \
  _(RDivScalar, 1)     /* p0 / in */                                                   \
  _(EqScalar, 1)       /* bool out */                                                  \
  _(NeScalar, 1)                                                                       \
  _(LtScalar, 1)                                                                       \
  _(LeScalar, 1)                                                                       \
  _(GtScalar, 1)                                                                       \
  _(GeScalar, 1)                                                                       \
  /* binary: both inputs share one dtype (see has_mixed_form) */                       \
  _(Add, 2)            /* a + p0 * b (p0 = alpha) */                                   \
  _(Sub, 2)            /* a - p0 * b */                                                \
  _(Mul, 2)                                                                            \
  _(Div, 2)                                                                            \
  _(Pow, 2)                                                                            \
  _(Maximum, 2)                                                                        \
  _(Minimum, 2)                                                                        \
  _(Eq, 2)             /* bool out */                                                  \
  _(Ne, 2)                                                                             \
  _(Lt, 2)                                                                             \
  _(Le, 2)                                                                             \
  _(Gt, 2)                                                                             \
  _(Ge, 2)                                                                             \
  /* fused backward helpers, (grad, saved) -> grad_in */                              \
  _(ReluBackward, 2)     /* x > 0 ? g : 0 */                                           \
  _(GeluBackward, 2)     /* g * d/dx gelu(x) */                                        \
  _(SigmoidBackward, 2)  /* g * y * (1 - y), y = sigmoid output */                     \
  _(TanhBackward, 2)     /* g * (1 - y * y), y = tanh output */                        \
  _(ClampBackward, 2)    /* p0 <= x <= p1 ? g : 0 */                                   \
  _(AbsBackward, 2)      /* g * sign(x) */                                             \
  _(PowScalarBackward, 2) /* g * p0 * x^(p0 - 1); 0 where p0 == 0 */                   \
  _(SqrtBackward, 2)     /* g / (2 y), y = sqrt output */                              \
  /* ---- issue 15: general ops (unary math, activations and their backward) */       \
  _(Sin, 1)                                                                            \
  _(Cos, 1)                                                                            \
  _(Rsqrt, 1)                                                                          \
  _(Silu, 1)             /* x * sigmoid(x) */                                          \
  _(GeluTanh, 1)         /* 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) */       \
  _(Softplus, 1)         /* p0 = beta, p1 = threshold: x where beta x > threshold */   \
  _(LeakyRelu, 1)        /* x > 0 ? x : p0 x */                                        \
  _(Elu, 1)              /* x > 0 ? x : p0 (exp(x) - 1) */                             \
  _(RsqrtBackward, 2)    /* -0.5 g y^3, y = rsqrt output */                           \
  _(SiluBackward, 2)     /* g * d/dx silu(x) */                                        \
  _(GeluTanhBackward, 2) /* g * d/dx gelu_tanh(x) */                                   \
  _(SoftplusBackward, 2) /* g * sigmoid(beta x); g where beta x > threshold */         \
  _(LeakyReluBackward, 2) /* x > 0 ? g : p0 g */                                       \
  _(EluBackward, 2)      /* x > 0 ? g : g p0 exp(x) */                                 \
  /* ternary */                                                                        \
  _(Where, 3)          /* cond (bool) ? a : b */

enum class ElemOp : int8_t {
#define TG_ELEM_ENUM(name, n) name,
  TG_ELEMENTWISE_OPS(TG_ELEM_ENUM)
#undef TG_ELEM_ENUM
};
int elem_op_arity(ElemOp op);
const char* elem_op_name(ElemOp op);

// The mixed-dtype forms every backend runs in one pass, computing in float, besides Copy (any
// two dtypes) and the bool results of comparisons; the front-end composes casts for any other
// mix. dtypes: out, then the inputs; R is float16 or bfloat16, the same one in all operands.
//   Exp, Log, Sqrt, PowScalar:  (float32, R)           autocast's float32 ops reading R as is
//   Div, PowScalarBackward:     (R, float32, R)        their gradients, stored in R
//   Mul, SqrtBackward:          (R, float32, float32)
bool has_mixed_form(ElemOp op, const DType* dtypes);

inline constexpr int kMaxDims = 16;
inline constexpr int kMaxOperands = 4;  // 1 output + up to 3 inputs

// The geometry of one elementwise launch, computed once by the front-end
// (broadcast strides, adjacent dims coalesced). Operand 0 is the output.
// Dims are row-major: shape[ndim - 1] is the innermost (fastest) dim.
struct ElementwiseIter {
  int ndim = 0;
  int noperands = 0;
  int64_t numel = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxOperands][kMaxDims] = {};  // in elements; 0 on broadcast dims
  char* data[kMaxOperands] = {};                 // with storage offset applied
  DType dtypes[kMaxOperands] = {};
  bool contiguous = false;  // every operand dense with the same layout (ndim <= 1, unit strides)
  double dparams[2] = {0, 0};
  int64_t iparams[2] = {0, 0};
  Device device;
};

// The one list of reductions. Columns: enum name, the name error messages use (the public op's).
#define TG_REDUCE_OPS(_) \
  _(Sum, "sum")          \
  _(Mean, "mean")        \
  _(Var, "var")          \
  _(Std, "std")          \
  _(Max, "max")          \
  _(Min, "min")          \
  _(ArgMax, "argmax")

enum class ReduceOp : int8_t {
#define TG_REDUCE_ENUM(name, str) name,
  TG_REDUCE_OPS(TG_REDUCE_ENUM)
#undef TG_REDUCE_ENUM
};
const char* reduce_op_name(ReduceOp op);  // "sum", "mean", ...; "reduce" for a value out of range

// out has in's shape with every reduced dim of size 1 (keepdim form), contiguous,
// already allocated with the output dtype. dims are sorted, unique, in range and
// non-empty; in.numel() may be 0 (then out gets the op's identity / NaN).
// Sum / Mean / Var / Std accumulate in float (double for float64; int64 for ints).
struct ReduceArgs {
  ReduceOp op;
  Tensor in;
  Tensor out;
  std::vector<int64_t> dims;
  int64_t correction = 1;  // Var / Std
};

// How a loss reduces its elementwise values: none (same shape), mean, or sum (0-d).
enum class LossReduction : int8_t { None, Mean, Sum };

// Work a gemm can fuse into its store (cuBLASLt epilogues), in GemmArgs' row-major terms.
// The vector (or matrix) at epilogue_ptr is contiguous, of C's dtype.
enum class GemmEpilogue : int8_t {
  None,
  Bias,      // C[i, j] += v[j] (n elements, read)
  RowSumsA,  // also v[i] = sum_p op(A)(i, p) (m elements, written: a bias gradient)
  ColSumsB,  // also v[j] = sum_p op(B)(p, j) (n elements, written)
  // C[i, j] = gelu_tanh'(x[i, j]) * (A @ B)[i, j], x at epilogue_ptr m x n row-major (ld n, the
  // saved input of a GELU whose gradient this gemm computes: ElemOp::GeluTanhBackward)
  GeluTanhBackward,
  // C[i, j] = gelu_tanh(x[i, j]) with x = A @ B (+ v[j] for BiasGeluTanh, v at epilogue_ptr), and x
  // itself written at epilogue_aux (m x n row-major, ld n, C's dtype): a linear followed by a GELU
  // (Backend::fuse_into_deferred_gemm amends a deferred gemm to these; never asked for directly).
  GeluTanh,
  BiasGeluTanh,
  // C[i, j] = relu(x[i, j]) with x = A @ B (+ v[j] for BiasRelu), x written at epilogue_aux as for
  // GeluTanh (fuse_into_deferred_gemm, float32 on CUDA's small-gemm kernel only).
  Relu,
  BiasRelu,
  // C[i, j] = x[i, j] > 0 ? (A @ B)[i, j] : 0, x at epilogue_ptr m x n row-major (ld n): the
  // gradient through a ReLU whose saved output is x (ElemOp::ReluBackward).
  ReluBackward,
};

// C[b] = A[b] @ B[b] in row-major terms, all of one floating dtype.
// A is m x k: element (i, p) at a + i * lda + p when !trans_a, at a + p * lda + i when trans_a.
// Likewise B (k x n) with ldb; C (m x n) is dense row-major with ldc = n.
// Optional (zero-initialised GemmArgs have none): c_float32, C is float32 while A and B are
// float16 / bfloat16 (accumulated in float, rounded once); an epilogue, only where gemm_fuses().
struct GemmArgs {
  DType dtype;
  int64_t m, n, k, batch;
  const void* a;
  const void* b;
  void* c;
  bool trans_a, trans_b;
  int64_t lda, ldb, ldc;
  int64_t stride_a, stride_b, stride_c;  // batch strides in elements (0 = broadcast)
  Device device;
  bool c_float32 = false;
  GemmEpilogue epilogue = GemmEpilogue::None;
  void* epilogue_ptr = nullptr;
  void* epilogue_aux = nullptr;  // GeluTanh / BiasGeluTanh: where A @ B (+ bias) goes
  // The caller allows the gemm to wait for the next op (a linear's result, which an activation
  // may then fuse into: fuse_into_deferred_gemm); CUDA defers large float16 / bfloat16 ones.
  // operands: the tensors behind a, b and epilogue_ptr where the epilogue reads it (null where
  // none), which a deferred gemm holds until it runs, so that no allocation made meanwhile (the
  // activation's own output included) can take their memory. Outputs are not held (C, a bias
  // gradient written by RowSumsA / ColSumsB): their owner frees them only after a flush, and a
  // held output would look shared to whoever receives it (AccumulateGrad would copy it).
  bool deferrable = false;
  const Tensor* operands[3] = {nullptr, nullptr, nullptr};
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual void elementwise(ElemOp op, const ElementwiseIter& it) = 0;
  virtual void reduce(const ReduceArgs& args) = 0;
  virtual void gemm(const GemmArgs& args) = 0;
  // Whether gemm(args) runs args.epilogue fused (batch == 1 only); when not, the caller runs the
  // gemm without it and does that work itself. Asking is free of launches.
  virtual bool gemm_fuses(const GemmArgs& args) = 0;
  // When `a` is the whole result of a deferrable gemm that is still waiting to be enqueued (CUDA:
  // the launch queue's last entry on the current stream) and the library has op as that gemm's
  // epilogue, amends the gemm to also write op(a) into a new tensor, which it returns; `a` gets
  // the same values as before (up to the library's choice of algorithm). Otherwise an undefined
  // tensor, and nothing changed. Ops: ElemOp::GeluTanh on float16 / bfloat16 (cuBLASLt), ElemOp::Relu
  // on float32 (the small-gemm kernel's problems).
  virtual Tensor fuse_into_deferred_gemm(ElemOp /*op*/, const Tensor& /*a*/) { return Tensor(); }
  // Philox-based fills of a contiguous floating tensor: element i uses counter (offset + i).
  virtual void uniform(const Tensor& out, uint64_t seed, uint64_t offset, double lo, double hi) = 0;
  virtual void normal(const Tensor& out, uint64_t seed, uint64_t offset, double mean, double std) = 0;
  // out: contiguous int64 or int32 of size n, a uniformly random permutation.
  virtual void randperm(const Tensor& out, uint64_t seed, uint64_t offset) = 0;
  // out: contiguous; out[i] = start + i * step.
  virtual void arange(const Tensor& out, double start, double step) = 0;
  // out: contiguous, shape of in with dim replaced by index.numel(); index: contiguous
  // int64 or int32 on the same device, already validated in range.
  virtual void index_select(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index) = 0;
  // out[..., index[i], ...] += src[..., i, ...] (the backward of index_select). out and src:
  // contiguous, one floating dtype; index: contiguous int64/int32, validated; repeats add up.
  virtual void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) = 0;
  // out = sum of inputs (2 <= n <= kMaxAddN), all contiguous with out's shape and floating
  // dtype; accumulated in float (double for float64), rounded once.
  virtual void add_n(const Tensor& out, const std::vector<Tensor>& inputs) = 0;
  // out[j] = ins[k][index[j]] along dim 0 for every k, in one launch on CUDA. ins: contiguous,
  // at least 1-d, any dtypes, 1 to kMaxGatherRows of them; outs: contiguous, ins' shapes with
  // dim 0 replaced by index.numel(); index: contiguous 1-d int64 or int32, validated in range.
  virtual void gather_rows(const std::vector<Tensor>& outs, const std::vector<Tensor>& ins, const Tensor& index) = 0;
  // (input - target)^2 reduced by r into out (0-d for Mean / Sum, input's shape for None).
  // input, target, out: contiguous, one floating dtype, input.numel() == target.numel().
  // Accumulates in float (double for float64) in a fixed order: bit-reproducible.
  virtual void mse_loss(const Tensor& out, const Tensor& input, const Tensor& target, LossReduction r) = 0;
  // grad_input = norm * (input - target) * grad and grad_target = -grad_input, norm = 2 / numel
  // for Mean, else 2. Either output may be undefined (not wanted); defined ones are contiguous
  // with input's dtype and numel. grad: input's dtype, one element (Mean / Sum, or a broadcast
  // scalar) read on the device, or contiguous with input's numel (None).
  virtual void mse_loss_backward(const Tensor& grad_input, const Tensor& grad_target, const Tensor& grad,
                                 const Tensor& input, const Tensor& target, LossReduction r) = 0;
  // linear's weight and bias gradients in one launch (CUDA only; the CPU runs gemm + reduction):
  // gw(o, j) = sum_i g(i, o) x(i, j) and, when gb is defined, gb(o) = sum_i g(i, o). g: [rows, out],
  // any strides; x: [rows, in] with unit inner stride (or in == 1); rows >= 1, 1 <= out <=
  // kMaxLinearGradOut, 1 <= in <= kMaxLinearGradIn; one dtype of float32 / float16 / bfloat16.
  // gw: [out, in], any non-overlapping strides (the weight's layout); gw and gb (contiguous [out])
  // each of x's dtype or float32. Accumulates in float in a fixed order: bit-reproducible.
  virtual void linear_grad_weight_bias(const Tensor& gw, const Tensor& gb, const Tensor& g, const Tensor& x);
  // nbytes of dense memory between the host and a device of this backend, or between two of its
  // devices (dst_device / src_device say which way). Blocks the host unless non_blocking (then the
  // host side is pinned memory and the copy is ordered on the current stream). CUDA only.
  virtual void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes,
                          bool non_blocking);
  // Host memory that copies from this backend's devices land in at full speed (CUDA: pinned, from
  // the caching host allocator); the CPU's own allocator elsewhere.
  virtual DataPtr host_staging(size_t nbytes);
  // ---- issue 15: softmax and cross_entropy
  // Softmax (log_softmax when `log`) over the last dim of a contiguous [rows, cols] input into out
  // (contiguous, in's shape and dtype), cols >= 1. Float accumulation for float16 / bfloat16.
  virtual void softmax(const Tensor& out, const Tensor& in, bool log);
  // Its backward from the output y and the incoming gradient g (all contiguous, one shape and dtype):
  // grad_in = y * (g - sum(g * y)) for softmax, g - exp(y) * sum(g) for log_softmax (sums per row).
  virtual void softmax_backward(const Tensor& grad_in, const Tensor& grad, const Tensor& out, bool log);
  // cross_entropy over class indices on [N, C] logits (contiguous, floating, C >= 1); target: [N]
  // contiguous int64; weight: [C] contiguous of the accumulation dtype (float32, float64 for float64
  // logits) or undefined; weight_sum: 0-d accumulation dtype, sum(weight), defined with weight.
  // With eps = label_smoothing and w = weight (1 without one), row i's loss is
  //   (1 - eps) w[t] (lse - x[t]) + eps / C * sum_j w[j] (lse - x[j])  (0 when t == ignore_index).
  struct CrossEntropyArgs {
    Tensor logits, target, weight, weight_sum;
    int64_t ignore_index = -100;
    double label_smoothing = 0.0;
  };
  // Writes, per row, loss[i], lse[i] and wt[i] = w[t] (0 when ignored): all [N] contiguous of the
  // accumulation dtype. A target out of [0, C) and not ignore_index makes the row's loss NaN. When
  // grad_logits is defined ([N, C], logits' dtype, contiguous), the same pass also writes the
  // gradient of sum_i loss_i / denom (denom: 0-d accumulation dtype, or undefined for 1), i.e. the
  // backward for an upstream gradient of 1, reading each row from DRAM once.
  virtual void cross_entropy(const CrossEntropyArgs& args, const Tensor& loss, const Tensor& lse, const Tensor& wt,
                             const Tensor& grad_logits, const Tensor& denom);
  // grad_logits ([N, C], logits' dtype, contiguous) = s_i * d loss_i / d x_ij in one pass from the
  // logits and the saved lse, s_i = grad[i or 0] / (denom ? denom[0] : 1); grad: [N] (reduction
  // none) or 0-d; denom: 0-d or undefined; both of the accumulation dtype.
  virtual void cross_entropy_backward(const CrossEntropyArgs& args, const Tensor& grad_logits, const Tensor& lse,
                                      const Tensor& grad, const Tensor& denom);
  // The whole reduced forward in one launch where the backend has it for this size (CUDA: small
  // problems, where launches dominate): out (0-d, accumulation dtype) = sum_i loss_i / denom for
  // `mean` (denom, 0-d, written too) or the plain sum; lse per row; grad_logits when defined, as in
  // cross_entropy. Returns false, having done nothing, when it has no such path (the default).
  virtual bool cross_entropy_reduced(const CrossEntropyArgs& args, bool mean, const Tensor& out, const Tensor& lse,
                                     const Tensor& denom, const Tensor& grad_logits);
  // ---- issue 15: normalization, embedding, dropout (defaults throw: core/native/normalization.cpp)
  // layer_norm (rms = false) / rms_norm (rms = true) over rows of a.cols elements (NormArgs).
  // Each returns whether it also wrote the optional low-precision twin (y_low / grad_x_low); a
  // backend may decline (the CPU one always does) and the caller then casts as before.
  virtual bool norm_forward(const struct NormArgs& a);
  virtual bool norm_backward(const struct NormBackwardArgs& a);
  // grad_weight[index[j]] += grad[j] for every j except index[j] == padding_idx (-1: none).
  // grad_weight: zeroed, contiguous [num, dim]; grad: contiguous [n, dim] of grad_weight's dtype;
  // index: contiguous [n] int64 / int32, validated in range. Accumulated in float (double for
  // float64). deterministic: a fixed summation order (CUDA: sorted indices, segmented sums);
  // else the device may add with atomics.
  virtual void embedding_backward(const Tensor& grad_weight, const Tensor& grad, const Tensor& index,
                                  int64_t padding_idx, bool deterministic);
  // out[i] = keep(i) ? x[i] * scale : 0 with keep(i) = philox::uniform_f32(seed, offset, i) >= p
  // (one counter per element, any floating dtype). out, x: contiguous, one dtype and numel.
  // The backward is the same call on the gradient: the mask is regenerated, never stored.
  virtual void dropout(const Tensor& out, const Tensor& x, double p, double scale, uint64_t seed, uint64_t offset);

  // ---- issue 18: fused attention (cuDNN SDPA on CUDA; core/native/attention.cpp). The forward
  // writes out and (when defined) stats from SdpaArgs and returns true, or returns false having
  // written nothing when the device has no fused kernel for these shapes (the default; the caller
  // takes the math path). check_backward: also false when the backward for the same shapes (and
  // the gradient layouts of SdpaArgs) is unsupported. The backward writes dq, dk, dv.
  virtual bool sdpa_fused_forward(const struct SdpaArgs& a, const Tensor& out, const Tensor& stats,
                                  bool check_backward);
  virtual void sdpa_fused_backward(const struct SdpaArgs& a, const Tensor& out, const Tensor& stats,
                                   const Tensor& grad_out, const Tensor& dq, const Tensor& dk, const Tensor& dv);

  // ---- issue 15: general ops (the defaults throw; core/native/general.cpp)
  // Along dim, over the positions p of index's shape (index: int64, any strides, values validated
  // in [0, size of dim)); the other operands are addressed by their own sizes and strides:
  //   gather:  out[p] = in[p with p[dim] = index[p]]; out has index's shape.
  //   scatter: out[p with p[dim] = index[p]] = src[p] (accumulate: +=, repeats add up); out
  //            contiguous, src any strides (0 for a broadcast value). One dtype for out, in, src.
  virtual void gather(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index);
  virtual void scatter(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate);
  // Inclusive prefix sums of the rows of a contiguous [rows, n] `in` into contiguous `out` of the
  // same shape: one floating dtype (accumulated in float, double for float64), or int64 out of
  // any integer dtype or bool in.
  virtual void cumsum(const Tensor& out, const Tensor& in);
  // Stable sort of each row of a contiguous [rows, n] floating or integer `in`: values (in's dtype)
  // and int64 indices into the row, both contiguous [rows, n]. NaN sorts as the largest value.
  virtual void sort(const Tensor& values, const Tensor& indices, const Tensor& in, bool descending);

  // ---- issue 16: gradient clipping (core/native/clip_grad.cpp; the defaults throw)
  // The norm_type-norm of the elements of all `tensors` taken together into `total` (0-d, their
  // device, any floating dtype): (sum |x|^p)^(1/p) for finite p > 0, max |x| for p = +inf; a NaN
  // anywhere gives NaN. When `coef` (0-d float64) is defined, also coef = min(max_norm / (t + 1e-6),
  // 1) (NaN stays NaN), t being total as stored, computed in float32 (float64 when total is).
  // tensors: at least one, contiguous, floating (any mix of dtypes), numel >= 0. CUDA accumulates
  // in float32 per thread (float64 for float64 tensors), the CPU in float64; partials are combined
  // in float64 in a fixed order: bit-reproducible. No host synchronisation.
  virtual void total_norm(const std::vector<Tensor>& tensors, double norm_type, const Tensor& total,
                          const Tensor& coef, double max_norm);
  // t *= factor in place for every t (contiguous, floating, on factor's device); factor: 0-d float64
  // read on the device, applied in float32 (float64 for float64 t).
  virtual void multi_tensor_scale(const std::vector<Tensor>& tensors, const Tensor& factor);
  // t = min(max(t, lo), hi) in place for every t (contiguous, floating); NaN stays NaN, lo > hi gives hi.
  virtual void multi_tensor_clamp(const std::vector<Tensor>& tensors, double lo, double hi);

  // ---- issue 17: pooling (core/native/pooling.cpp; the defaults throw)
  // out[p, oh, ow] from the window of plane p of x (struct Pool2dArgs, core/backend/pool_window.h);
  // x, out contiguous [planes, H, W] / [planes, OH, OW] of one floating dtype; indices (Max only,
  // else undefined): contiguous int64 [planes, OH, OW], h * W + w of the first maximum in window
  // order (NaN counts as the maximum). Accumulates in float (double for float64).
  virtual void pool2d(const struct Pool2dArgs& a, const Tensor& out, const Tensor& indices, const Tensor& x);
  // grad_in [planes, H, W] (every element written) from grad_out [planes, OH, OW], both contiguous
  // of one dtype: each input element sums, in a fixed order, over the windows that contain it (Max:
  // those whose index is this element). No atomics: deterministic.
  virtual void pool2d_backward(const struct Pool2dArgs& a, const Tensor& grad_in, const Tensor& grad_out,
                               const Tensor& indices);

  // ---- issue 17: batch_norm (core/native/batch_norm.cpp; the defaults throw). x, dy, y, dx:
  // contiguous [n, c, s] of one floating dtype (channel ch of sample i at (i * c + ch) * s);
  // per-channel vectors: contiguous [c] of the accumulation dtype (float64 for float64, else
  // float32), undefined where noted (= 0). n * s >= 1, c >= 1.
  // mean and biased var of each channel (two passes: exact for a large mean).
  virtual void batch_norm_stats(const Tensor& x, int64_t n, int64_t c, int64_t s, const Tensor& mean,
                                const Tensor& var);
  // y = (x - mean[ch]) * scale[ch] + shift[ch] (shift may be undefined); relu: then max(y, 0)
  // (NaN stays NaN), batch_norm + ReLU fused.
  virtual void batch_norm_elemt(const Tensor& y, const Tensor& x, int64_t n, int64_t c, int64_t s, const Tensor& mean,
                                const Tensor& scale, const Tensor& shift, bool relu);
  // sum_dy[ch] = sum dy, sum_dy_xhat[ch] = sum dy * (x - mean[ch]) * invstd[ch]. relu_out (the
  // fused ReLU's output, or undefined): dy counts only where relu_out > 0, ReLU's backward.
  virtual void batch_norm_reduce(const Tensor& dy, const Tensor& x, int64_t n, int64_t c, int64_t s,
                                 const Tensor& mean, const Tensor& invstd, const Tensor& sum_dy,
                                 const Tensor& sum_dy_xhat, const Tensor& relu_out);
  // dx = (dy - mean_dy[ch] - (x - mean[ch]) * invstd[ch] * mean_dy_xhat[ch]) * scale[ch], dy masked
  // by relu_out > 0 as in batch_norm_reduce.
  virtual void batch_norm_backward_elemt(const Tensor& dx, const Tensor& dy, const Tensor& x, int64_t n, int64_t c,
                                         int64_t s, const Tensor& mean, const Tensor& invstd, const Tensor& scale,
                                         const Tensor& mean_dy, const Tensor& mean_dy_xhat, const Tensor& relu_out);

  // ---- issue 17: convolution (core/native/conv.cpp; the defaults throw)
  virtual void conv2d(const struct ConvArgs& a);
  virtual void conv2d_backward(const struct ConvBackwardArgs& a);
  // Whether conv2d takes channels-last operands (NHWC strides) as they are; else the front-end
  // passes row-major ones and converts the result back.
  virtual bool conv_takes_channels_last() const { return false; }

  // ---- issue 17: interpolate (core/native/interpolate.cpp; the defaults throw)
  // out [planes, OH, OW] from x [planes, H, W] (struct Upsample2dArgs, core/backend/upsample_index.h),
  // both contiguous of one floating dtype; linear interpolation accumulates in float (double for float64).
  virtual void upsample2d(const struct Upsample2dArgs& a, const Tensor& out, const Tensor& x);
  // grad_in [planes, H, W] (every element written) from grad_out [planes, OH, OW], both contiguous of
  // one dtype: each input element gathers, in a fixed order, from the outputs that read it. No atomics.
  virtual void upsample2d_backward(const struct Upsample2dArgs& a, const Tensor& grad_in, const Tensor& grad_out);
};
inline constexpr int kMaxAddN = 32;
inline constexpr int kMaxGatherRows = 8;
inline constexpr int kMaxLinearGradOut = 8;
inline constexpr int kMaxLinearGradIn = 2048;

// ---- issue 15: normalization, embedding, dropout
// layer_norm / rms_norm over the last `cols` elements: x, y contiguous [rows, cols]; weight and
// bias contiguous [cols] of x's dtype, or undefined (1 / 0). mean (layer_norm only) and rstd:
// contiguous [rows], float64 for float64 x, else float32. Statistics accumulate in float
// (double for float64); var is the biased variance; rms: rstd = 1 / sqrt(mean(x^2) + eps).
// y_low: undefined, or (float32 x) a contiguous float16 / bfloat16 tensor of y's shape that gets
// the round-to-nearest-even cast of y's values (core/cast_copies.h: twins).
struct NormArgs {
  Tensor x, weight, bias, y, mean, rstd, y_low;
  int64_t rows = 0, cols = 0;
  double eps = 0;
  bool rms = false;
};
// The gradients from the saved mean / rstd (rms: mean undefined). Each of grad_x,
// grad_weight, grad_bias may be undefined (not wanted); defined ones are contiguous of x's
// dtype. grad_out: contiguous [rows, cols] of x's dtype. rows >= 1. grad_x_addend: undefined, or a
// contiguous tensor like grad_x added into it as it is written (another consumer's gradient of x,
// autograd::take_pending_grad). grad_x_low: as NormArgs::y_low, for grad_x (addend included).
struct NormBackwardArgs {
  Tensor grad_out, x, weight, mean, rstd;
  Tensor grad_x, grad_weight, grad_bias, grad_x_addend, grad_x_low;
  int64_t rows = 0, cols = 0;
  bool rms = false;
};

// ---- issue 18: fused attention. q [B, Hq, Tq, D], k [B, Hk, Tk, D], v [B, Hk, Tk, Dv] (Hq a
// multiple of Hk), one dtype (float16 / bfloat16), any strides with the last dim contiguous; bias:
// additive [B or 1, Hq or 1, Tq, Tk] of q's dtype, finite, or undefined; causal: key j > query i
// masked (top-left). Dropout on the probabilities with probability dropout_p from the device
// tensors seed / offset (int64 [1, 1, 1, 1]; undefined when dropout_p is 0). out [B, Hq, Tq, Dv]
// has the strides the caller allocated, grad_out out's, dq / dk / dv the strides named here (the
// backward graph is checked at the forward); stats [B, Hq, Tq, 1] float32 contiguous (the softmax
// statistics the backward reads).
struct SdpaArgs {
  Tensor q, k, v, bias, seed, offset;
  Shape dq_strides, dk_strides, dv_strides;
  double scale = 1, dropout_p = 0;
  bool causal = false;
};

// ---- issue 17: pooling
// A 2-d pooling over `planes` planes of H x W into OH x OW (validated by core/native/pooling.cpp).
// Max: window rows oh * sh - ph + i * dh, i < kh (likewise columns), out-of-range cells skipped.
// Avg: rows [oh * sh - ph, + kh) cut at H + ph for the padded count, at [0, H) for the sum; divides by
// divisor when > 0, else the padded count (count_include_pad) or the in-range count.
// AdaptiveAvg: rows [floor(oh * H / OH), ceil((oh + 1) * H / OH)), the mean over the window.
enum class PoolKind : uint8_t { Max, Avg, AdaptiveAvg };
struct Pool2dArgs {
  PoolKind kind = PoolKind::Max;
  int64_t planes = 0, H = 0, W = 0, OH = 0, OW = 0;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
  bool count_include_pad = true;
  int64_t divisor = 0;
};

// ---- issue 17: convolution
// 2-d cross-correlation as PyTorch's conv2d: x contiguous [N, C, H, W]; weight contiguous
// [Co, C / groups, KH, KW]; bias contiguous [Co] or undefined; out contiguous [N, Co, OH, OW],
// all one floating dtype. Where conv_takes_channels_last(), x, weight and out (and, backward,
// grad_out, grad_x and grad_weight) may instead all be channels-last (NHWC strides). Input pixel of output (oh, ow) and tap (i, j):
// (oh * stride[0] - pad[0] + i * dilation[0], ow * stride[1] - pad[1] + j * dilation[1]), zero
// outside the input (the trailing padding is implied by OH, OW). N, Co, OH, OW >= 1.
struct ConvArgs {
  Tensor x, weight, bias, out;
  int64_t stride[2] = {1, 1}, pad[2] = {0, 0}, dilation[2] = {1, 1};
  int64_t groups = 1;
  // Forward only: out = max(conv + bias, 0) (conv + bias + ReLU fused). NaN: kept by the CPU; a
  // cuDNN fused graph follows cuDNN's RELU_FWD.
  bool relu = false;
};
// Its gradients from grad_out (contiguous, out's shape and dtype); grad_x ([N, C, H, W]) or
// grad_weight may be undefined (not wanted); defined ones are contiguous of x's dtype. (The bias
// gradient is a sum of grad_out, computed by the front-end with the reduce kernels.)
struct ConvBackwardArgs {
  ConvArgs conv;  // x, weight as in the forward; out and bias unused
  Tensor grad_out, grad_x, grad_weight;
};

// ---- issue 17: conv_transpose, interpolate
// conv_transpose uses conv2d / conv2d_backward as they are (core/native/conv.cpp): a backend must
// read ConvBackwardArgs::conv.x only for grad_weight (its sizes give the geometry; conv_transpose's
// forward passes the output being written there), and must take OH, OW from grad_out / out as given
// (conv_transpose's output_padding can make the input one larger than OH, OW would imply).
// interpolate over `planes` planes of H x W into OH x OW (PyTorch's upsample_nearest / upsample_bilinear
// index formulas, CPU flavour: equal sizes copy, nearest at exactly twice the size halves the index).
// scale_h / scale_w: the scale_factor the user gave for that dim, 0 when none (PyTorch's `scales`).
enum class UpsampleMode : uint8_t { Nearest, Linear };
struct Upsample2dArgs {
  UpsampleMode mode = UpsampleMode::Nearest;
  int64_t planes = 0, H = 0, W = 0, OH = 0, OW = 0;
  bool align_corners = false;
  double scale_h = 0, scale_w = 0;
};

Backend& get(DeviceType type);
// How many backend ops this thread has dispatched (a cheap counter for benchmarks: on CUDA
// nearly one kernel launch each, the fused optimizer and scaler kernels aside).
uint64_t dispatch_count();
Backend& cpu();
Backend* cuda();  // null when built without CUDA

}  // namespace tg::backend
