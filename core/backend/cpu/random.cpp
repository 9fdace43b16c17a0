// CPU random fills (uniform, normal, randperm) and arange. The fills follow the
// element -> counter mapping of core/philox.h exactly (so a seed gives the same
// values as the CUDA backend), but generate each Philox block once for all the
// elements that share it instead of once per element.
#include <cmath>
#include <type_traits>

#include <tapegrad/core/backend/cpu/cpu.h>
#include <tapegrad/core/backend/cpu/loops.h>
#include <tapegrad/core/backend/cpu/thread_pool.h>
#include <tapegrad/core/error.h>
#include <tapegrad/core/philox.h>

namespace tg::cpu {

namespace {

// Philox words in counter order, generating each block once.
class WordStream {
 public:
  explicit WordStream(uint64_t seed) : seed_(seed) {}
  const philox::Block& block(uint64_t b) {
    if (b != cur_ || !valid_) {
      blk_ = philox::generate(seed_, b);
      cur_ = b;
      valid_ = true;
    }
    return blk_;
  }
  uint32_t word(uint64_t c) { return block(c >> 2).w[c & 3]; }

 private:
  uint64_t seed_;
  uint64_t cur_ = 0;
  bool valid_ = false;
  philox::Block blk_{};
};

template <typename T>
T narrow(double v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return T(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

// The largest 16-bit float below h (IEEE bit order: one step toward -inf).
template <typename T>
T next_below(T h) {
  if ((h.x & 0x7fffu) == 0) return T::from_bits(0x8001u);  // below +-0: the smallest negative subnormal
  return T::from_bits(static_cast<uint16_t>((h.x & 0x8000u) ? h.x + 1 : h.x - 1));
}

void check_float(const Tensor& out, const char* op) {
  TG_CHECK(is_floating(out.dtype()), op, ": expected a floating dtype, got ", dtype_name(out.dtype()));
  TG_CHECK(out.is_contiguous(), op, ": expected a contiguous output of shape ", out.sizes());
}

}  // namespace

void uniform(const Tensor& out, uint64_t seed, uint64_t offset, double lo, double hi) {
  check_float(out, "uniform");
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (kIsFloat<T>) {
      T* dst = static_cast<T*>(out.data_ptr());
      parallel(0, out.numel(), kGrain, [&](int64_t b, int64_t e) {
        WordStream ws(seed);
        if constexpr (std::is_same_v<T, double>) {
          const double range = hi - lo;
          for (int64_t i = b; i < e; ++i) {
            const uint64_t c = offset + 2 * static_cast<uint64_t>(i);  // as philox::uniform_f64
            const philox::Block& blk = ws.block(c >> 2);
            const int l = static_cast<int>(c & 3);
            dst[i] = philox::to_unit_f64(blk.w[l], blk.w[l + 1]) * range + lo;
          }
        } else {
          const float range = static_cast<float>(hi - lo), base = static_cast<float>(lo);
          for (int64_t i = b; i < e; ++i) {
            const float u = philox::to_unit_f32(ws.word(offset + static_cast<uint64_t>(i)));  // as uniform_f32
            if constexpr (std::is_same_v<T, float>) {
              dst[i] = u * range + base;
            } else {
              // Rounding to 16 bits can reach hi (u > 1 - 2^-12 gives 1.0 in half): keep [lo, hi).
              T v(u * range + base);
              // hi as float arithmetic sees it (lo + (hi - lo)), the same test as the CUDA fill.
              const float hi_f = base + range;
              if (static_cast<float>(v) >= hi_f && range > 0) v = next_below(T(hi_f));
              dst[i] = v;
            }
          }
        }
      });
    }
  });
}

void normal(const Tensor& out, uint64_t seed, uint64_t offset, double mean, double std) {
  check_float(out, "normal");
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (kIsFloat<T>) {
      T* dst = static_cast<T*>(out.data_ptr());
      parallel(0, out.numel(), kGrain, [&](int64_t b, int64_t e) {
        WordStream ws(seed);
        if constexpr (std::is_same_v<T, double>) {
          for (int64_t i = b; i < e; ++i) {
            // Same arithmetic as philox::normal_f64.
            const uint64_t c = offset + 2 * static_cast<uint64_t>(i);
            const philox::Block& blk = ws.block(c >> 2);
            const int which = static_cast<int>((c >> 1) & 1);
            const double u1 = 1.0 - philox::to_unit_f64(blk.w[0], blk.w[1]);
            const double u2 = philox::to_unit_f64(blk.w[2], blk.w[3]);
            const double r = std::sqrt(-2.0 * std::log(u1));
            const double a = 6.283185307179586 * u2;
            dst[i] = (which ? r * std::sin(a) : r * std::cos(a)) * std + mean;
          }
        } else {
          const float s = static_cast<float>(std), m = static_cast<float>(mean);
          for (int64_t i = b; i < e; ++i) {
            // Same arithmetic as philox::normal_f32.
            const uint64_t c = offset + static_cast<uint64_t>(i);
            const philox::Block& blk = ws.block(c >> 2);
            const int l = static_cast<int>(c & 3), p = l & ~1;
            const float u1 = 1.0f - philox::to_unit_f32(blk.w[p]);
            const float u2 = philox::to_unit_f32(blk.w[p + 1]);
            const float r = sqrtf(-2.0f * logf(u1));
            const float a = 6.283185307179586f * u2;
            const float z = (l & 1) ? r * sinf(a) : r * cosf(a);
            dst[i] = T(z * s + m);
          }
        }
      });
    }
  });
}

// Fisher-Yates driven by Philox: step t (swapping position n-1-t) draws the
// 64-bit value of counters offset + 2t, offset + 2t + 1, so the permutation
// depends only on (seed, offset). Uses counters [offset, offset + 2n).
void randperm(const Tensor& out, uint64_t seed, uint64_t offset) {
  TG_CHECK(out.dtype() == kInt64 || out.dtype() == kInt32, "randperm: expected an int64 or int32 output, got ",
           dtype_name(out.dtype()));
  TG_CHECK(out.is_contiguous(), "randperm: expected a contiguous output");
  const int64_t n = out.numel();
  auto run = [&](auto* p) {
    using I = std::remove_pointer_t<decltype(p)>;
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<I>(i);
    WordStream ws(seed);
    for (int64_t i = n - 1; i > 0; --i) {
      const uint64_t c = offset + 2 * static_cast<uint64_t>(n - 1 - i);
      const uint64_t r = (static_cast<uint64_t>(ws.word(c)) << 32) | ws.word(c + 1);
      const int64_t j = static_cast<int64_t>(r % static_cast<uint64_t>(i + 1));  // bias <= n / 2^64
      std::swap(p[i], p[j]);
    }
  };
  if (out.dtype() == kInt64) {
    run(static_cast<int64_t*>(out.data_ptr()));
  } else {
    run(static_cast<int32_t*>(out.data_ptr()));
  }
}

void arange(const Tensor& out, double start, double step) {
  TG_CHECK(out.is_contiguous(), "arange: expected a contiguous output");
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* dst = static_cast<T*>(out.data_ptr());
    parallel(0, out.numel(), kGrain, [&](int64_t b, int64_t e) {
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        // Exact integer arithmetic when start and step are whole numbers (beyond 2^53 too).
        if (start == std::floor(start) && step == std::floor(step)) {
          const auto s0 = static_cast<int64_t>(start), st = static_cast<int64_t>(step);
          for (int64_t i = b; i < e; ++i) dst[i] = static_cast<T>(s0 + i * st);
          return;
        }
      }
      for (int64_t i = b; i < e; ++i) dst[i] = narrow<T>(start + static_cast<double>(i) * step);
    });
  });
}

}  // namespace tg::cpu
