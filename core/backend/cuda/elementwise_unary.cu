// Unary elementwise ops (math and tensor-scalar arithmetic) on CUDA.
#include <tapegrad/core/backend/cuda/elementwise_ops.cuh>

namespace tg::cuda::kern {

using backend::ElemOp;

namespace {
// The mixed form of autocast's float32 ops (backend::has_mixed_form): a float16 / bfloat16 input
// read as is, float32 out; f computes in float as the float32 op does.
template <class F>
void launch_widening(const ElementwiseIter& it, const char* name, const F& f) {
  if (it.dtypes[0] == DType::Float32 && it.dtypes[1] == DType::Float16) return launch<float, __half>(it, f);
  if (it.dtypes[0] == DType::Float32 && it.dtypes[1] == DType::BFloat16) return launch<float, __nv_bfloat16>(it, f);
  TG_ERROR(name, ": no CUDA kernel from ", dtype_name(it.dtypes[1]), " to ", dtype_name(it.dtypes[0]));
}
}  // namespace

bool elementwise_unary(ElemOp op, const ElementwiseIter& it) {
  const char* name = backend::elem_op_name(op);
  DType dt = it.dtypes[0];
  switch (op) {
#define TG_UNARY_SAME_(SET, ...)              \
  dispatch<SET>(dt, name, [&](auto tag) {     \
    using S = typename decltype(tag)::type;   \
    using T = opmath_t<S>;                    \
    launch<S, S>(it, __VA_ARGS__);            \
  });                                         \
  return true;
#define TG_UNARY(OP, SET, ...) \
  case ElemOp::OP:             \
    TG_UNARY_SAME_(SET, __VA_ARGS__)
// An op that also has the widening mixed form (autocast's float32 ops).
#define TG_UNARY_WIDENING(OP, SET, ...)           \
  case ElemOp::OP:                                \
    if (it.dtypes[1] != dt) {                     \
      using T = float;                            \
      launch_widening(it, name, __VA_ARGS__);     \
      return true;                                \
    }                                             \
    TG_UNARY_SAME_(SET, __VA_ARGS__)
    TG_UNARY(Neg, kFloats | kInts, NegF<T>{})
    TG_UNARY(Abs, kFloats | kInts, AbsF<T>{})
    TG_UNARY(Relu, kFloats | kInts, ReluF<T>{})
    TG_UNARY(Clamp, kFloats | kInts, ClampF<T>{param<T>(it, 0), param<T>(it, 1)})
    TG_UNARY(AddScalar, kFloats | kInts, AddScalarF<T>{param<T>(it, 0)})
    TG_UNARY(RSubScalar, kFloats | kInts, RSubScalarF<T>{param<T>(it, 0)})
    TG_UNARY(MulScalar, kFloats | kInts, MulScalarF<T>{param<T>(it, 0)})
    TG_UNARY_WIDENING(Exp, kFloats, ExpF<T>{})
    TG_UNARY_WIDENING(Log, kFloats, LogF<T>{})
    TG_UNARY_WIDENING(Sqrt, kFloats, SqrtF<T>{})
    TG_UNARY(Sigmoid, kFloats, SigmoidF<T>{})
    TG_UNARY(Tanh, kFloats, TanhF<T>{})
    TG_UNARY(Gelu, kFloats, GeluF<T>{})
    TG_UNARY_WIDENING(PowScalar, kFloats, PowScalarF<T>{param<T>(it, 0)})
    TG_UNARY(DivScalar, kFloats, DivScalarF<T>{param<T>(it, 0)})
    TG_UNARY(RDivScalar, kFloats, RDivScalarF<T>{param<T>(it, 0)})
    // ---- issue 15: general ops
    TG_UNARY(Sin, kFloats, SinF<T>{})
    TG_UNARY(Cos, kFloats, CosF<T>{})
    TG_UNARY(Rsqrt, kFloats, RsqrtF<T>{})
    TG_UNARY(Silu, kFloats, SiluF<T>{})
    TG_UNARY(GeluTanh, kFloats, GeluTanhF<T, sizeof(S) == 2>{})
    TG_UNARY(Softplus, kFloats, SoftplusF<T>{param<T>(it, 0), param<T>(it, 1)})
    TG_UNARY(LeakyRelu, kFloats, LeakyReluF<T>{param<T>(it, 0)})
    TG_UNARY(Elu, kFloats, EluF<T>{param<T>(it, 0)})
#undef TG_UNARY_WIDENING
#undef TG_UNARY
#undef TG_UNARY_SAME_
    default:
      return false;
  }
}

}  // namespace tg::cuda::kern
