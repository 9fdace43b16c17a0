// Comparisons (tensor-tensor and tensor-scalar, bool output) and where on CUDA.
#include <tapegrad/core/backend/cuda/elementwise_ops.cuh>

namespace tg::cuda::kern {

using backend::ElemOp;

bool elementwise_compare(ElemOp op, const ElementwiseIter& it) {
  const char* name = backend::elem_op_name(op);
  // The inputs' dtype decides; the output is bool.
  DType dt = it.noperands > 1 ? it.dtypes[1] : it.dtypes[0];
  switch (op) {
#define TG_CMP_SCALAR(OP, SET, F)                 \
  case ElemOp::OP:                                \
    dispatch<SET>(dt, name, [&](auto tag) {       \
      using S = typename decltype(tag)::type;     \
      using T = opmath_t<S>;                      \
      launch<bool, S>(it, F<T>{param<T>(it, 0)}); \
    });                                           \
    return true;
#define TG_CMP(OP, SET, F)                    \
  case ElemOp::OP:                            \
    dispatch<SET>(dt, name, [&](auto tag) {   \
      using S = typename decltype(tag)::type; \
      using T = opmath_t<S>;                  \
      launch<bool, S, S>(it, F<T>{});         \
    });                                       \
    return true;
    TG_CMP_SCALAR(EqScalar, kFloats | kInts | kBoolSet, EqScalarF)
    TG_CMP_SCALAR(NeScalar, kFloats | kInts | kBoolSet, NeScalarF)
    TG_CMP_SCALAR(LtScalar, kFloats | kInts, LtScalarF)
    TG_CMP_SCALAR(LeScalar, kFloats | kInts, LeScalarF)
    TG_CMP_SCALAR(GtScalar, kFloats | kInts, GtScalarF)
    TG_CMP_SCALAR(GeScalar, kFloats | kInts, GeScalarF)
    TG_CMP(Eq, kFloats | kInts | kBoolSet, EqF)
    TG_CMP(Ne, kFloats | kInts | kBoolSet, NeF)
    TG_CMP(Lt, kFloats | kInts, LtF)
    TG_CMP(Le, kFloats | kInts, LeF)
    TG_CMP(Gt, kFloats | kInts, GtF)
    TG_CMP(Ge, kFloats | kInts, GeF)
#undef TG_CMP_SCALAR
#undef TG_CMP
    case ElemOp::Where:
      TG_CHECK(it.dtypes[1] == DType::Bool, "where: condition must be bool, got ", dtype_name(it.dtypes[1]));
      dispatch<kFloats | kInts | kBoolSet>(it.dtypes[0], name, [&](auto tag) {
        using S = typename decltype(tag)::type;
        launch<S, bool, S, S>(it, WhereF<opmath_t<S>>{});
      });
      return true;
    default:
      return false;
  }
}

}  // namespace tg::cuda::kern
