// The type CUDA kernels do arithmetic in ("opmath"): float for __half and
// __nv_bfloat16, int for the integers narrower than 32 bits (a scalar such as 300 beside a
// uint8 tensor compares and clamps correctly; results wrap on the narrowing store), the type
// itself otherwise. Shared by the elementwise engine,
// reductions and the multi-tensor kernels.
#pragma once
#include <cstdint>

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
template <>
struct OpMath<uint8_t> {
  using type = int;
};
template <>
struct OpMath<int8_t> {
  using type = int;
};
template <>
struct OpMath<int16_t> {
  using type = int;
};
template <class T>
using opmath_t = typename OpMath<T>::type;

}  // namespace tg::cuda
