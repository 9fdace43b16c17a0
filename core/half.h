// 16-bit floating types stored as raw bits. Bit-compatible with Eigen::half /
// Eigen::bfloat16 on the CPU and __half / __nv_bfloat16 on CUDA, so backends can
// reinterpret a buffer of these as their own type. Arithmetic goes through float.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TG_HOST_DEVICE __host__ __device__
#else
#define TG_HOST_DEVICE
#endif

namespace tg {
namespace detail {
TG_HOST_DEVICE inline uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
TG_HOST_DEVICE inline float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// IEEE binary16 with round-to-nearest-even, NaN kept quiet, overflow to inf.
TG_HOST_DEVICE inline uint16_t float_to_half_bits(float f) {
  uint32_t x = f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return static_cast<uint16_t>(sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520
  if (ax < 0x38800000u) {  // subnormal half (or zero)
    // Add 0.5 as a float so the FPU does the rounding of the shifted mantissa.
    float v = bits_f32(ax) + 0.5f;
    return static_cast<uint16_t>(sign | (f32_bits(v) - 0x3f000000u));
  }
  uint32_t mant_odd = (ax >> 13) & 1u;
  ax += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  return static_cast<uint16_t>(sign | (ax >> 13));
}
TG_HOST_DEVICE inline float half_bits_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t em = h & 0x7fffu;
  if (em >= 0x7c00u) return bits_f32(sign | 0x7f800000u | (static_cast<uint32_t>(em & 0x3ffu) << 13));
  if (em < 0x0400u) {  // subnormal: value = em * 2^-24
    return bits_f32(sign) + (sign ? -1.f : 1.f) * static_cast<float>(em) * 5.9604644775390625e-8f;
  }
  return bits_f32(sign | ((em << 13) + 0x38000000u));
}
TG_HOST_DEVICE inline uint16_t float_to_bf16_bits(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}
TG_HOST_DEVICE inline float bf16_bits_to_float(uint16_t b) { return bits_f32(static_cast<uint32_t>(b) << 16); }
}  // namespace detail

struct Half {
  uint16_t x = 0;
  Half() = default;
  TG_HOST_DEVICE Half(float f) : x(detail::float_to_half_bits(f)) {}
  TG_HOST_DEVICE operator float() const { return detail::half_bits_to_float(x); }
  TG_HOST_DEVICE static Half from_bits(uint16_t b) {
    Half h;
    h.x = b;
    return h;
  }
};

struct BFloat16 {
  uint16_t x = 0;
  BFloat16() = default;
  TG_HOST_DEVICE BFloat16(float f) : x(detail::float_to_bf16_bits(f)) {}
  TG_HOST_DEVICE operator float() const { return detail::bf16_bits_to_float(x); }
  TG_HOST_DEVICE static BFloat16 from_bits(uint16_t b) {
    BFloat16 h;
    h.x = b;
    return h;
  }
};
}  // namespace tg
