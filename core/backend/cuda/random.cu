// CUDA random fills with the shared Philox mapping (core/philox.h): a thread per
// Philox block writes the elements whose counters fall in it, so CUDA and CPU give
// the same values for a seed. randperm sorts random 64-bit keys with CUB.
#include <cub/device/device_radix_sort.cuh>
#include <type_traits>

#include <tapegrad/core/backend/cuda/kernels.cuh>
#include <tapegrad/core/backend/cuda/loops.cuh>
#include <tapegrad/core/philox.h>

namespace tg::cuda::kern {
namespace {

constexpr int kThreads = 256;

// x * scale + shift rounded twice (no FMA contraction), exactly as the CPU backend
// computes it: in double for float64, in float for the other float types.
__device__ __forceinline__ double affine(double x, double scale, double shift) {
  return __dadd_rn(__dmul_rn(x, scale), shift);
}
__device__ __forceinline__ float affine(float x, float scale, float shift) {
  return __fadd_rn(__fmul_rn(x, scale), shift);
}

// Uniform (kNormal false) or normal fill. float32/16/bf16 take one word per
// element (4 per block); float64 takes two (2 per block).
template <class S, bool kNormal>
__global__ void philox_fill_kernel(S* out, uint64_t n, uint64_t seed, uint64_t offset, uint64_t first_block,
                                   uint64_t nblocks, double scale, double shift) {
  uint64_t j = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  if (j >= nblocks) return;
  uint64_t blk = first_block + j;
  philox::Block w = philox::generate(seed, blk);
  if constexpr (std::is_same_v<S, double>) {
    // Element i owns counters offset + 2i, offset + 2i + 1: the pair (2e, 2e + 1) of this block.
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      uint64_t c = blk * 4 + 2 * e;
      if (c < offset) continue;
      uint64_t i = (c - offset) / 2;
      if (i >= n) break;
      if constexpr (kNormal) {
        double u1 = 1.0 - philox::to_unit_f64(w.w[0], w.w[1]);
        double u2 = philox::to_unit_f64(w.w[2], w.w[3]);
        double r = ::sqrt(-2.0 * ::log(u1));
        double ang = 6.283185307179586 * u2;
        out[i] = affine(e ? r * ::sin(ang) : r * ::cos(ang), scale, shift);
      } else {
        out[i] = affine(philox::to_unit_f64(w.w[2 * e], w.w[2 * e + 1]), scale, shift);
      }
    }
  } else {
    const float fscale = static_cast<float>(scale), fshift = static_cast<float>(shift);
    uint64_t c0 = blk * 4;
    // Box-Muller radius and angle of the block's two pairs, once per pair (the same
    // expressions as per element, so the same bits).
    float rad[2] = {0.f, 0.f}, ang[2] = {0.f, 0.f};
    if constexpr (kNormal) {
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        rad[q] = sqrtf(-2.0f * logf(1.0f - philox::to_unit_f32(w.w[2 * q])));
        ang[q] = 6.283185307179586f * philox::to_unit_f32(w.w[2 * q + 1]);
      }
    }
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      uint64_t c = c0 + l;
      if (c < offset) continue;
      uint64_t i = c - offset;
      if (i >= n) break;
      if constexpr (kNormal) {
        const int q = l >> 1;
        float z = (l & 1) ? rad[q] * sinf(ang[q]) : rad[q] * cosf(ang[q]);
        out[i] = cast<S>(affine(z, fscale, fshift));
      } else {
        S v = cast<S>(affine(philox::to_unit_f32(w.w[l]), fscale, fshift));
        if constexpr (!std::is_same_v<S, float>) {
          // Rounding to 16 bits can reach hi (u > 1 - 2^-12 gives 1.0 in half): step to the
          // value just below hi, exactly as the CPU backend does, to keep [lo, hi).
          const float hi = fshift + fscale;
          if (cast<float>(v) >= hi && fscale > 0) {
            uint16_t hb;
            S h = cast<S>(hi);
            memcpy(&hb, &h, 2);
            hb = (hb & 0x7fffu) == 0 ? 0x8001u : ((hb & 0x8000u) ? hb + 1 : hb - 1);
            memcpy(&v, &hb, 2);
          }
        }
        out[i] = v;
      }
    }
  }
}

template <bool kNormal>
void philox_fill(const Tensor& out, uint64_t seed, uint64_t offset, double scale, double shift) {
  const char* name = kNormal ? "normal" : "uniform";
  TG_CHECK(out.is_contiguous(), name, ": output must be contiguous, got strides ", out.strides());
  uint64_t n = static_cast<uint64_t>(out.numel());
  uint64_t words = out.dtype() == DType::Float64 ? 2 * n : n;
  uint64_t first_block = offset / 4;
  uint64_t last_block = (offset + words + 3) / 4;
  uint64_t nblocks = last_block - first_block;
  cudaStream_t stream = detail::current_stream_handle(out.device().index());
  dispatch<kFloats>(out.dtype(), name, [&](auto tag) {
    using S = typename decltype(tag)::type;
    unsigned grid = static_cast<unsigned>((nblocks + kThreads - 1) / kThreads);
    philox_fill_kernel<S, kNormal><<<grid, kThreads, 0, stream>>>(static_cast<S*>(out.data_ptr()), n, seed, offset,
                                                                  first_block, nblocks, scale, shift);
    TG_CUDA_CHECK_LAUNCH();
  });
}

// Key i: the two words at counters offset + 2i, offset + 2i + 1; value i: i.
template <class V>
__global__ void randperm_init_kernel(uint64_t* keys, V* vals, uint64_t n, uint64_t seed, uint64_t offset) {
  uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  uint64_t c = offset + 2 * i;
  philox::Block w = philox::generate(seed, c >> 2);
  int l = static_cast<int>(c & 3);
  keys[i] = (static_cast<uint64_t>(w.w[l]) << 32) | w.w[l + 1];
  vals[i] = static_cast<V>(i);
}

template <class V>
void randperm_impl(const Tensor& out, uint64_t seed, uint64_t offset) {
  int device = out.device().index();
  cudaStream_t stream = detail::current_stream_handle(device);
  uint64_t n = static_cast<uint64_t>(out.numel());
  size_t temp_bytes = 0;
  TG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, static_cast<const uint64_t*>(nullptr),
                                                static_cast<uint64_t*>(nullptr), static_cast<const V*>(nullptr),
                                                static_cast<V*>(nullptr), static_cast<int64_t>(n), 0, 64, stream));
  // One workspace: keys in, keys out, values in, then CUB's temp storage.
  size_t kb = (n * sizeof(uint64_t) + 255) / 256 * 256, vb = (n * sizeof(V) + 255) / 256 * 256;
  DataPtr ws = detail::device_allocate(2 * kb + vb + temp_bytes, device);
  char* base = static_cast<char*>(ws.get());
  auto* keys_in = reinterpret_cast<uint64_t*>(base);
  auto* keys_out = reinterpret_cast<uint64_t*>(base + kb);
  auto* vals_in = reinterpret_cast<V*>(base + 2 * kb);
  void* temp = base + 2 * kb + vb;
  unsigned grid = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  randperm_init_kernel<V><<<grid, kThreads, 0, stream>>>(keys_in, vals_in, n, seed, offset);
  TG_CUDA_CHECK_LAUNCH();
  TG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, vals_in,
                                                static_cast<V*>(out.data_ptr()), static_cast<int64_t>(n), 0, 64,
                                                stream));
}

}  // namespace

void uniform(const Tensor& out, uint64_t seed, uint64_t offset, double lo, double hi) {
  philox_fill<false>(out, seed, offset, hi - lo, lo);
}

void normal(const Tensor& out, uint64_t seed, uint64_t offset, double mean, double std) {
  philox_fill<true>(out, seed, offset, std, mean);
}

void randperm(const Tensor& out, uint64_t seed, uint64_t offset) {
  TG_CHECK(out.is_contiguous(), "randperm: output must be contiguous");
  if (out.dtype() == DType::Int64) randperm_impl<int64_t>(out, seed, offset);
  else if (out.dtype() == DType::Int32) randperm_impl<int32_t>(out, seed, offset);
  else TG_ERROR("randperm: output dtype must be int64 or int32, got ", dtype_name(out.dtype()));
}

}  // namespace tg::cuda::kern
