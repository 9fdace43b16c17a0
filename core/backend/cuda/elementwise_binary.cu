// Binary elementwise ops (arithmetic and the fused backward helpers) on CUDA.
#include <tapegrad/core/backend/cuda/elementwise_ops.cuh>
#include <tapegrad/core/backend/cuda/kernels.cuh>

namespace tg::cuda::kern {

using backend::ElemOp;

namespace {
// The mixed forms of the gradients of autocast's float32 ops (backend::has_mixed_form): out
// float16 / bfloat16 R, the gradient float32, the saved tensor float32 (kSavedFloat) or R; f
// computes in float as the float32 op does, and the store rounds once.
template <bool kSavedFloat, class F>
void launch_narrowing(const ElementwiseIter& it, const char* name, const F& f) {
  if (it.dtypes[1] == DType::Float32 && it.dtypes[2] == (kSavedFloat ? DType::Float32 : it.dtypes[0])) {
    if (it.dtypes[0] == DType::Float16)
      return launch<__half, float, std::conditional_t<kSavedFloat, float, __half>>(it, f);
    if (it.dtypes[0] == DType::BFloat16)
      return launch<__nv_bfloat16, float, std::conditional_t<kSavedFloat, float, __nv_bfloat16>>(it, f);
  }
  TG_ERROR(name, ": no CUDA kernel from ", dtype_name(it.dtypes[1]), " and ", dtype_name(it.dtypes[2]), " to ",
           dtype_name(it.dtypes[0]));
}
// The widening mixed forms (backend::has_mixed_form): out float32, one input float32 and the
// other float16 / bfloat16, read as it is (Add / Sub: the residual stream of an autocast model).
template <class F>
void launch_widening(const ElementwiseIter& it, const char* name, const F& f) {
  const DType a = it.dtypes[1], b = it.dtypes[2];
  if (it.dtypes[0] == DType::Float32) {
    if (a == DType::Float32 && b == DType::BFloat16) return launch<float, float, __nv_bfloat16>(it, f);
    if (a == DType::Float32 && b == DType::Float16) return launch<float, float, __half>(it, f);
    if (a == DType::BFloat16 && b == DType::Float32) return launch<float, __nv_bfloat16, float>(it, f);
    if (a == DType::Float16 && b == DType::Float32) return launch<float, __half, float>(it, f);
  }
  TG_ERROR(name, ": no CUDA kernel from ", dtype_name(a), " and ", dtype_name(b), " to ", dtype_name(it.dtypes[0]));
}
}  // namespace

bool elementwise_binary(ElemOp op, const ElementwiseIter& it) {
  // A residual add may wait for the norm after it (normalization.cu, kernels.cuh).
  if (op == ElemOp::Add && defer_residual_add(it)) return true;
  const char* name = backend::elem_op_name(op);
  DType dt = it.dtypes[0];
  switch (op) {
#define TG_BINARY_SAME_(SET, ...)             \
  dispatch<SET>(dt, name, [&](auto tag) {     \
    using S = typename decltype(tag)::type;   \
    using T = opmath_t<S>;                    \
    launch<S, S, S>(it, __VA_ARGS__);         \
  });                                         \
  return true;
#define TG_BINARY(OP, SET, ...) \
  case ElemOp::OP:              \
    TG_BINARY_SAME_(SET, __VA_ARGS__)
// An op that also has a narrowing mixed form (the gradients of autocast's float32 ops).
#define TG_BINARY_NARROWING(OP, SAVED_FLOAT, SET, ...)        \
  case ElemOp::OP:                                            \
    if (it.dtypes[1] != dt) {                                 \
      using T = float;                                        \
      launch_narrowing<SAVED_FLOAT>(it, name, __VA_ARGS__);   \
      return true;                                            \
    }                                                         \
    TG_BINARY_SAME_(SET, __VA_ARGS__)
// An op that also has a widening mixed form (float32 out, one half input).
#define TG_BINARY_WIDENING(OP, SET, ...)                     \
  case ElemOp::OP:                                           \
    if (it.dtypes[1] != dt || it.dtypes[2] != dt) {          \
      using T = float;                                       \
      launch_widening(it, name, __VA_ARGS__);                \
      return true;                                           \
    }                                                        \
    TG_BINARY_SAME_(SET, __VA_ARGS__)
    TG_BINARY_WIDENING(Add, kFloats | kInts, AddF<T>{param<T>(it, 0)})
    TG_BINARY_WIDENING(Sub, kFloats | kInts, SubF<T>{param<T>(it, 0)})
    TG_BINARY_NARROWING(Mul, true, kFloats | kInts, MulF<T>{})
    TG_BINARY(Maximum, kFloats | kInts, MaximumF<T>{})
    TG_BINARY(Minimum, kFloats | kInts, MinimumF<T>{})
    TG_BINARY_NARROWING(Div, false, kFloats, DivF<T>{})
    TG_BINARY(Pow, kFloats, PowF<T>{})
    TG_BINARY(ReluBackward, kFloats, ReluBackwardF<T>{})
    TG_BINARY(GeluBackward, kFloats, GeluBackwardF<T>{})
    TG_BINARY(SigmoidBackward, kFloats, SigmoidBackwardF<T>{})
    TG_BINARY(TanhBackward, kFloats, TanhBackwardF<T>{})
    TG_BINARY(ClampBackward, kFloats, ClampBackwardF<T>{param<T>(it, 0), param<T>(it, 1)})
    TG_BINARY(AbsBackward, kFloats, AbsBackwardF<T>{})
    TG_BINARY_NARROWING(PowScalarBackward, false, kFloats, PowScalarBackwardF<T>{param<T>(it, 0)})
    TG_BINARY_NARROWING(SqrtBackward, true, kFloats, SqrtBackwardF<T>{})
    // ---- issue 15: general ops
    TG_BINARY(RsqrtBackward, kFloats, RsqrtBackwardF<T>{})
    TG_BINARY(SiluBackward, kFloats, SiluBackwardF<T>{})
    TG_BINARY(GeluTanhBackward, kFloats, GeluTanhBackwardF<T, sizeof(S) == 2>{})
    TG_BINARY(SoftplusBackward, kFloats, SoftplusBackwardF<T>{param<T>(it, 0), param<T>(it, 1)})
    TG_BINARY(LeakyReluBackward, kFloats, LeakyReluBackwardF<T>{param<T>(it, 0)})
    TG_BINARY(EluBackward, kFloats, EluBackwardF<T>{param<T>(it, 0)})
#undef TG_BINARY_NARROWING
#undef TG_BINARY
#undef TG_BINARY_SAME_
    default:
      return false;
  }
}

}  // namespace tg::cuda::kern
