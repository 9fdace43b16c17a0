// Binary elementwise ops (arithmetic and the fused backward helpers) on CUDA.
#include "core/backend/cuda/elementwise_ops.cuh"

namespace tg::cuda::kern {

using backend::ElemOp;

bool elementwise_binary(ElemOp op, const ElementwiseIter& it) {
  const char* name = backend::elem_op_name(op);
  DType dt = it.dtypes[0];
  switch (op) {
#define TG_BINARY(OP, SET, ...)                             \
  case ElemOp::OP:                                          \
    dispatch<SET>(dt, name, [&](auto tag) {                 \
      using S = typename decltype(tag)::type;               \
      using T = opmath_t<S>;                                \
      launch<S, S, S>(it, __VA_ARGS__);                     \
    });                                                     \
    return true;
    TG_BINARY(Add, kFloats | kInts, AddF<T>{param<T>(it, 0)})
    TG_BINARY(Sub, kFloats | kInts, SubF<T>{param<T>(it, 0)})
    TG_BINARY(Mul, kFloats | kInts, MulF<T>{})
    TG_BINARY(Maximum, kFloats | kInts, MaximumF<T>{})
    TG_BINARY(Minimum, kFloats | kInts, MinimumF<T>{})
    TG_BINARY(Div, kFloats, DivF<T>{})
    TG_BINARY(Pow, kFloats, PowF<T>{})
    TG_BINARY(ReluBackward, kFloats, ReluBackwardF<T>{})
    TG_BINARY(GeluBackward, kFloats, GeluBackwardF<T>{})
    TG_BINARY(SigmoidBackward, kFloats, SigmoidBackwardF<T>{})
    TG_BINARY(TanhBackward, kFloats, TanhBackwardF<T>{})
    TG_BINARY(ClampBackward, kFloats, ClampBackwardF<T>{param<T>(it, 0), param<T>(it, 1)})
    TG_BINARY(AbsBackward, kFloats, AbsBackwardF<T>{})
    TG_BINARY(PowScalarBackward, kFloats, PowScalarBackwardF<T>{param<T>(it, 0)})
#undef TG_BINARY
    default:
      return false;
  }
}

}  // namespace tg::cuda::kern
