// The CPU Copy kernel: every pair of dtypes, strided either side.
// Conversions go through float for Half / bfloat16; to bool means != 0; float to integer
// truncates and saturates (NaN -> 0).
#include <cstring>
#include <limits>
#include <type_traits>

#include <tapegrad/core/backend/cpu/dispatch.h>

namespace tg::cpu {

namespace {

template <typename T>
inline constexpr bool kIs16 = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

template <typename To, typename From>
To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (kIs16<From>) {
    return convert<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (kIs16<To>) {
    return To(static_cast<float>(v));
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    // A float outside To's range (or NaN, which a loaded file may carry) has no defined cast:
    // truncate toward zero and saturate, NaN -> 0.
    const double d = static_cast<double>(v);
    if (!(d == d)) return To(0);
    if (d <= static_cast<double>(std::numeric_limits<To>::min())) return std::numeric_limits<To>::min();
    // max + 1 is a power of two, exact in a double (max itself is not for int64).
    if (d >= static_cast<double>(std::numeric_limits<To>::max()) + 1.0) return std::numeric_limits<To>::max();
    return static_cast<To>(d);
  } else {
    return static_cast<To>(v);
  }
}

}  // namespace

void copy_kernel(const backend::ElementwiseIter& it) {
  const DType to = it.dtypes[0], from = it.dtypes[1];
  if (to == from && it.contiguous) {
    const size_t es = element_size(to);
    parallel(0, it.numel, kGrain * 4, [&](int64_t lo, int64_t hi) {
      if (it.data[0] != it.data[1]) {
        std::memmove(it.data[0] + lo * es, it.data[1] + lo * es, static_cast<size_t>(hi - lo) * es);
      }
    });
    return;
  }
  dispatch<Kinds::All>(backend::ElemOp::Copy, to, [&](auto out_tag) {
    using To = decltype(out_tag);
    dispatch<Kinds::All>(backend::ElemOp::Copy, from, [&](auto in_tag) {
      using From = decltype(in_tag);
      cpu_kernel<To, From>(it, [](From v) { return convert<To>(v); });
    });
  });
}

}  // namespace tg::cpu
