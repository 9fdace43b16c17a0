// CUDA Max / Min / ArgMax reductions (a separate unit so it compiles in parallel).
#include <tapegrad/core/backend/cuda/reduce.cuh>

namespace tg::cuda::kern {

void reduce_minmax(backend::ReduceOp op, DType dt, const ReducePlan& plan) {
  constexpr unsigned kAll = kFloats | kInts | kBoolSet;
  switch (op) {
    case backend::ReduceOp::Max:
      dispatch<kAll>(dt, "max", [&](auto tag) {
        using S = typename decltype(tag)::type;
        run_reduce<MaxMinReducer<S, true>, S>(MaxMinReducer<S, true>{}, plan);
      });
      break;
    case backend::ReduceOp::Min:
      dispatch<kAll>(dt, "min", [&](auto tag) {
        using S = typename decltype(tag)::type;
        run_reduce<MaxMinReducer<S, false>, S>(MaxMinReducer<S, false>{}, plan);
      });
      break;
    case backend::ReduceOp::ArgMax:
      dispatch<kAll>(dt, "argmax", [&](auto tag) {
        using S = typename decltype(tag)::type;
        run_reduce<ArgMaxReducer<S>, S>(ArgMaxReducer<S>{}, plan);
      });
      break;
    default:
      TG_ERROR("reduce: op ", static_cast<int>(op), " is not a max/min/argmax reduction");
  }
}

}  // namespace tg::cuda::kern
