// Philox4x32-10 counter-based generator (Salmon et al., SC'11), shared by the
// CPU and CUDA backends so a seed gives the same uniform values on both and the
// values never depend on the launch configuration.
//
// Mapping: the generator of a device hands out counters; a call that reserves
// counters [offset, offset + count) gives element i the 32-bit word
// (offset + i) % 4 of block (offset + i) / 4. float64 uses two words per element.
#pragma once
#include <cmath>
#include <cstdint>

#include <tapegrad/core/half.h>

namespace tg::philox {

struct Block {
  uint32_t w[4];
};

TG_HOST_DEVICE inline uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
#if defined(__CUDA_ARCH__)
  *hi = __umulhi(a, b);
  return a * b;
#else
  uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
#endif
}

// The 4 words of counter block `block` under `seed`.
TG_HOST_DEVICE inline Block generate(uint64_t seed, uint64_t block) {
  uint32_t c0 = static_cast<uint32_t>(block), c1 = static_cast<uint32_t>(block >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, hi1;
    uint32_t lo0 = mulhilo(0xD2511F53u, c0, &hi0);
    uint32_t lo1 = mulhilo(0xCD9E8D57u, c2, &hi1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Block{{c0, c1, c2, c3}};
}

// Uniform in [0, 1) with 24 (float) or 53 (double) random bits.
TG_HOST_DEVICE inline float to_unit_f32(uint32_t x) { return static_cast<float>(x >> 8) * 5.9604644775390625e-8f; }
TG_HOST_DEVICE inline double to_unit_f64(uint32_t hi, uint32_t lo) {
  uint64_t v = (static_cast<uint64_t>(hi) << 21) ^ (lo >> 11);
  return static_cast<double>(v & ((1ull << 53) - 1)) * 1.1102230246251565e-16;
}

// Counters a fill of n elements of a float type of `elem_bytes` needs (a multiple of 4).
TG_HOST_DEVICE inline uint64_t counters_for(uint64_t n, int elem_bytes) {
  uint64_t words = elem_bytes == 8 ? 2 * n : n;
  return (words + 3) / 4 * 4;
}

// Element i of a float32/16 uniform fill whose reservation starts at offset (a multiple of 4).
TG_HOST_DEVICE inline float uniform_f32(uint64_t seed, uint64_t offset, uint64_t i) {
  uint64_t c = offset + i;
  return to_unit_f32(generate(seed, c >> 2).w[c & 3]);
}
TG_HOST_DEVICE inline double uniform_f64(uint64_t seed, uint64_t offset, uint64_t i) {
  uint64_t c = offset + 2 * i;
  Block b = generate(seed, c >> 2);
  int l = static_cast<int>(c & 3);
  return to_unit_f64(b.w[l], b.w[l + 1]);
}

// Normal N(0, 1) by Box-Muller on the pair of words (2j, 2j + 1) of a block:
// word 2j gives the radius, 2j + 1 the angle; even lanes take cos, odd sin.
TG_HOST_DEVICE inline float normal_f32(uint64_t seed, uint64_t offset, uint64_t i) {
  uint64_t c = offset + i;
  Block b = generate(seed, c >> 2);
  int l = static_cast<int>(c & 3), p = l & ~1;
  float u1 = 1.0f - to_unit_f32(b.w[p]);  // (0, 1]
  float u2 = to_unit_f32(b.w[p + 1]);
  float r = sqrtf(-2.0f * logf(u1));
  float a = 6.283185307179586f * u2;
  return (l & 1) ? r * sinf(a) : r * cosf(a);
}
TG_HOST_DEVICE inline double normal_f64(uint64_t seed, uint64_t offset, uint64_t i) {
  uint64_t c = offset + 2 * i;  // element i owns words c, c + 1; a pair of elements shares a block
  Block b = generate(seed, c >> 2);
  int e = static_cast<int>((c >> 1) & 1);  // which element of the block's pair
  double u1 = 1.0 - to_unit_f64(b.w[0], b.w[1]);
  double u2 = to_unit_f64(b.w[2], b.w[3]);
  double r = ::sqrt(-2.0 * ::log(u1));
  double a = 6.283185307179586 * u2;
  return e ? r * ::sin(a) : r * ::cos(a);
}

}  // namespace tg::philox
