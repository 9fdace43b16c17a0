// The type CUDA kernels do arithmetic in ("opmath"): float for __half and
// __nv_bfloat16, the type itself otherwise. Shared by the elementwise engine,
// reductions and the multi-tensor kernels.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace tg::cuda {

template <class T>
struct OpMath {
  using type = T;
};
template <>
struct OpMath<__half> {
  using type = float;
};
template <>
struct OpMath<__nv_bfloat16> {
  using type = float;
};
template <class T>
using opmath_t = typename OpMath<T>::type;

}  // namespace tg::cuda
