// Unary elementwise ops (math and tensor-scalar arithmetic) on CUDA.
#include "core/backend/cuda/elementwise_ops.cuh"

namespace tg::cuda::kern {

using backend::ElemOp;

bool elementwise_unary(ElemOp op, const ElementwiseIter& it) {
  const char* name = backend::elem_op_name(op);
  DType dt = it.dtypes[0];
  switch (op) {
#define TG_UNARY(OP, SET, ...)                              \
  case ElemOp::OP:                                          \
    dispatch<SET>(dt, name, [&](auto tag) {                 \
      using S = typename decltype(tag)::type;               \
      using T = opmath_t<S>;                                \
      launch<S, S>(it, __VA_ARGS__);                        \
    });                                                     \
    return true;
    TG_UNARY(Neg, kFloats | kInts, NegF<T>{})
    TG_UNARY(Abs, kFloats | kInts, AbsF<T>{})
    TG_UNARY(Relu, kFloats | kInts, ReluF<T>{})
    TG_UNARY(Clamp, kFloats | kInts, ClampF<T>{param<T>(it, 0), param<T>(it, 1)})
    TG_UNARY(AddScalar, kFloats | kInts, AddScalarF<T>{param<T>(it, 0)})
    TG_UNARY(RSubScalar, kFloats | kInts, RSubScalarF<T>{param<T>(it, 0)})
    TG_UNARY(MulScalar, kFloats | kInts, MulScalarF<T>{param<T>(it, 0)})
    TG_UNARY(Exp, kFloats, ExpF<T>{})
    TG_UNARY(Log, kFloats, LogF<T>{})
    TG_UNARY(Sqrt, kFloats, SqrtF<T>{})
    TG_UNARY(Sigmoid, kFloats, SigmoidF<T>{})
    TG_UNARY(Tanh, kFloats, TanhF<T>{})
    TG_UNARY(Gelu, kFloats, GeluF<T>{})
    TG_UNARY(PowScalar, kFloats, PowScalarF<T>{param<T>(it, 0)})
    TG_UNARY(DivScalar, kFloats, DivScalarF<T>{param<T>(it, 0)})
    TG_UNARY(RDivScalar, kFloats, RDivScalarF<T>{param<T>(it, 0)})
#undef TG_UNARY
    default:
      return false;
  }
}

}  // namespace tg::cuda::kern
