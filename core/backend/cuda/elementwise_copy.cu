// Copy (conversion between any two dtypes, any strides) and Fill on CUDA.
#include <tapegrad/core/backend/cuda/elementwise_ops.cuh>

namespace tg::cuda::kern {

using backend::ElemOp;

bool elementwise_copy(ElemOp op, const ElementwiseIter& it) {
  const char* name = backend::elem_op_name(op);
  constexpr unsigned kAll = kFloats | kInts | kBoolSet;
  switch (op) {
    case ElemOp::Fill:
      dispatch<kAll>(it.dtypes[0], name, [&](auto tag) {
        using S = typename decltype(tag)::type;
        launch<S>(it, FillF<opmath_t<S>>{param<opmath_t<S>>(it, 0)});
      });
      return true;
    case ElemOp::Copy:
      dispatch<kAll>(it.dtypes[0], name, [&](auto out_tag) {
        using O = typename decltype(out_tag)::type;
        dispatch<kAll>(it.dtypes[1], name, [&](auto in_tag) {
          using I = typename decltype(in_tag)::type;
          launch<O, I>(it, IdentityF<opmath_t<I>>{});
        });
      });
      return true;
    default:
      return false;
  }
}

}  // namespace tg::cuda::kern
