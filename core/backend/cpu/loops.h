// The CPU elementwise loop: one template that runs a per-element functor over
// an ElementwiseIter, with a contiguous fast path (plain indexed loops the
// compiler vectorises) and a strided path (index counter over the dims, the
// innermost dim as a tight loop), split across the thread pool. Kernel authors
// write one lambda taking the inputs' storage types and returning the output's.
#pragma once
#include <algorithm>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include <tapegrad/core/backend/backend.h>
#include <tapegrad/core/backend/cpu/cpu.h>
#include <tapegrad/core/backend/cpu/thread_pool.h>

namespace tg::cpu {

// The type arithmetic runs in: float for the 16-bit floats ("opmath"), int64 for
// int32 and the narrower integers (so overflow wraps on the narrowing store instead of being
// undefined, and uint8 arithmetic is not done in unsigned char's promoted int by accident).
template <typename T>
struct OpMath {
  using type = T;
};
template <>
struct OpMath<Half> {
  using type = float;
};
template <>
struct OpMath<BFloat16> {
  using type = float;
};
template <>
struct OpMath<int32_t> {
  using type = int64_t;
};
template <>
struct OpMath<int16_t> {
  using type = int64_t;
};
template <>
struct OpMath<int8_t> {
  using type = int64_t;
};
template <>
struct OpMath<uint8_t> {
  using type = int64_t;
};
template <typename T>
using opmath_t = typename OpMath<T>::type;

template <typename T>
inline constexpr bool kIsFloat = std::is_floating_point_v<T> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

namespace detail {

template <typename Out, typename... In, typename F, size_t... I>
void contiguous_loop(char* const* data, int64_t lo, int64_t hi, const F& f, std::index_sequence<I...>) {
  Out* out = reinterpret_cast<Out*>(data[0]);
  std::tuple<const In*...> in{reinterpret_cast<const In*>(data[I + 1])...};
  for (int64_t i = lo; i < hi; ++i) out[i] = f(std::get<I>(in)[i]...);
}

template <typename Out, typename... In, typename F, size_t... I>
void strided_loop(const backend::ElementwiseIter& it, int64_t lo, int64_t hi, const F& f, std::index_sequence<I...>) {
  constexpr int kN = sizeof...(In) + 1;
  const int nd = it.ndim;
  if (nd == 0) {  // a single element
    *reinterpret_cast<Out*>(it.data[0]) = f(*reinterpret_cast<const In*>(it.data[I + 1])...);
    return;
  }
  int64_t idx[backend::kMaxDims];
  int64_t off[kN] = {};
  int64_t rem = lo;
  for (int d = nd - 1; d >= 0; --d) {
    idx[d] = rem % it.shape[d];
    rem /= it.shape[d];
    for (int k = 0; k < kN; ++k) off[k] += idx[d] * it.strides[k][d];
  }
  const int64_t inner = it.shape[nd - 1];
  int64_t s[kN];
  bool unit = true;
  for (int k = 0; k < kN; ++k) {
    s[k] = it.strides[k][nd - 1];
    unit = unit && s[k] == 1;
  }
  int64_t left = hi - lo;
  while (left > 0) {
    const int64_t cnt = std::min(inner - idx[nd - 1], left);
    Out* out = reinterpret_cast<Out*>(it.data[0]) + off[0];
    std::tuple<const In*...> in{reinterpret_cast<const In*>(it.data[I + 1]) + off[I + 1]...};
    if (unit) {
      for (int64_t j = 0; j < cnt; ++j) out[j] = f(std::get<I>(in)[j]...);
    } else {
      const int64_t so = s[0];
      for (int64_t j = 0; j < cnt; ++j) out[j * so] = f(std::get<I>(in)[j * s[I + 1]]...);
    }
    left -= cnt;
    idx[nd - 1] += cnt;
    for (int k = 0; k < kN; ++k) off[k] += cnt * s[k];
    if (idx[nd - 1] < inner) continue;
    // Carry into the outer dims.
    idx[nd - 1] = 0;
    for (int k = 0; k < kN; ++k) off[k] -= inner * s[k];
    for (int d = nd - 2; d >= 0; --d) {
      ++idx[d];
      for (int k = 0; k < kN; ++k) off[k] += it.strides[k][d];
      if (idx[d] < it.shape[d]) break;
      for (int k = 0; k < kN; ++k) off[k] -= it.shape[d] * it.strides[k][d];
      idx[d] = 0;
    }
  }
}

}  // namespace detail

// Runs out = f(in...) over the iter; Out and In... are the operands' storage types.
template <typename Out, typename... In, typename F>
void cpu_kernel(const backend::ElementwiseIter& it, const F& f) {
  if (it.numel == 0) return;
  auto seq = std::index_sequence_for<In...>{};
  parallel(0, it.numel, kGrain, [&](int64_t lo, int64_t hi) {
    if (it.contiguous) {
      detail::contiguous_loop<Out, In...>(it.data, lo, hi, f, seq);
    } else {
      detail::strided_loop<Out, In...>(it, lo, hi, f, seq);
    }
  });
}

}  // namespace tg::cpu
