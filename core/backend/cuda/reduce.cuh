// CUDA reductions: the reducers (Sum/Mean, Welford Var/Std, Max, Min, ArgMax) and
// the two layouts every reduction is brought to:
//  - Inner  [M, K]: the reduced elements of an output are contiguous; a warp per
//    (row, K-chunk) with warp shuffles.
//  - Middle [A, K, B]: the outputs are contiguous columns (B); threads own columns,
//    blockDim.y and the grid split K.
// When K is split over several warps/blocks, each writes a partial accumulator and a
// second kernel combines them in a fixed order (deterministic results).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>

#include <tapegrad/core/backend/backend.h>
#include <tapegrad/core/backend/cuda/runtime.h>
#include <tapegrad/core/backend/cuda/dependent_launch.cuh>
#include <tapegrad/core/backend/cuda/elementwise_ops.cuh>

namespace tg::cuda::kern {

struct ReducePlan {
  enum Kind { kInner, kMiddle } kind = kInner;
  const char* in = nullptr;  // with storage offset applied
  void* out = nullptr;       // contiguous, M elements of out_dtype
  DType out_dtype = DType::Float32;
  int64_t M = 0;  // outputs
  int64_t K = 0;  // reduced elements per output
  int64_t row_stride = 0;            // Inner: in(o, k) = in[o * row_stride + k]
  int64_t A = 1, B = 1, sa = 0, sk = 0;  // Middle: in(a, k, b) = in[a * sa + k * sk + b], o = a * B + b
  int device = 0;
  cudaStream_t stream = nullptr;
};

int sm_count(int device);

// Writes v into out[o] converted to the runtime dtype (a uniform branch; keeps the
// number of instantiations independent of the output dtype).
template <class V>
__device__ __forceinline__ void store_value(void* out, DType dt, int64_t o, V v) {
  switch (dt) {
    case DType::Float32: static_cast<float*>(out)[o] = static_cast<float>(v); break;
    case DType::Float64: static_cast<double*>(out)[o] = static_cast<double>(v); break;
    case DType::Float16: static_cast<__half*>(out)[o] = __float2half_rn(static_cast<float>(v)); break;
    case DType::BFloat16: static_cast<__nv_bfloat16*>(out)[o] = __float2bfloat16_rn(static_cast<float>(v)); break;
    case DType::Int64: static_cast<int64_t*>(out)[o] = static_cast<int64_t>(v); break;
    case DType::Int32: static_cast<int32_t*>(out)[o] = static_cast<int32_t>(v); break;
    case DType::Bool: static_cast<bool*>(out)[o] = v != V(0); break;
    case DType::UInt8: static_cast<uint8_t*>(out)[o] = static_cast<uint8_t>(v); break;
    case DType::Int8: static_cast<int8_t*>(out)[o] = static_cast<int8_t>(v); break;
    case DType::Int16: static_cast<int16_t*>(out)[o] = static_cast<int16_t>(v); break;
  }
}

// The accumulation type: float for float32/16/bf16, double for float64, int64 for ints and bool.
template <class S>
using acc_t = std::conditional_t<std::is_same_v<S, double>, double,
                                 std::conditional_t<std::is_floating_point_v<opmath_t<S>>, float, int64_t>>;

template <class S>
struct SumReducer {
  using Acc = acc_t<S>;
  bool mean = false;
  int64_t count = 1;
  __device__ Acc identity() const { return Acc(0); }
  __device__ Acc step(Acc a, S v, int64_t) const { return a + cast<Acc>(v); }
  __device__ void step4(Acc& a, const S* v, int64_t, int64_t) const {
    a += (cast<Acc>(v[0]) + cast<Acc>(v[1])) + (cast<Acc>(v[2]) + cast<Acc>(v[3]));
  }
  __device__ Acc combine(Acc a, Acc b) const { return a + b; }
  __device__ void store(void* out, DType dt, int64_t o, Acc a) const {
    if (mean) store_value(out, dt, o, static_cast<double>(a) / static_cast<double>(count));
    else store_value(out, dt, o, a);
  }
};

template <class C>
struct WelfordAcc {
  C mean, m2, n;
};

// Var / Std by Welford's update, partials merged with Chan's formula.
template <class S>
struct WelfordReducer {
  using C = acc_t<S>;
  using Acc = WelfordAcc<C>;
  int64_t count = 1;
  int64_t correction = 1;
  bool take_sqrt = false;
  __device__ Acc identity() const { return Acc{C(0), C(0), C(0)}; }
  __device__ Acc step(Acc a, S v, int64_t) const {
    C x = cast<C>(v);
    a.n += C(1);
    C d = x - a.mean;
    a.mean += d / a.n;
    a.m2 += d * (x - a.mean);
    return a;
  }
  // Four values at once: their own mean and M2, then one Chan merge (one division per 4).
  __device__ void step4(Acc& a, const S* v, int64_t, int64_t) const {
    C x0 = cast<C>(v[0]), x1 = cast<C>(v[1]), x2 = cast<C>(v[2]), x3 = cast<C>(v[3]);
    C m = ((x0 + x1) + (x2 + x3)) * C(0.25);
    C d0 = x0 - m, d1 = x1 - m, d2 = x2 - m, d3 = x3 - m;
    C m2 = (d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3);
    a = combine(a, Acc{m, m2, C(4)});
  }
  __device__ Acc combine(Acc a, Acc b) const {
    if (a.n == C(0)) return b;
    if (b.n == C(0)) return a;
    C n = a.n + b.n;
    C d = b.mean - a.mean;
    C f = b.n / n;
    return Acc{a.mean + d * f, a.m2 + b.m2 + d * d * a.n * f, n};
  }
  __device__ void store(void* out, DType dt, int64_t o, Acc a) const {
    int64_t dof = count - correction;  // NaN when dof <= 0, as PyTorch gives
    C var = dof <= 0 ? std::numeric_limits<C>::quiet_NaN() : a.m2 / static_cast<C>(dof);
    store_value(out, dt, o, take_sqrt ? m_sqrt(var) : var);
  }
};

template <class C>
__device__ __forceinline__ C lowest() {
  if constexpr (std::is_floating_point_v<C>) return -std::numeric_limits<C>::infinity();
  else return std::numeric_limits<C>::lowest();
}
template <class C>
__device__ __forceinline__ bool is_nan(C x) {
  if constexpr (std::is_floating_point_v<C>) return x != x;
  else return false;
}

template <class S, bool kMax>
struct MaxMinReducer {
  using Acc = acc_t<S>;
  __device__ Acc identity() const {
    if constexpr (kMax) return lowest<Acc>();
    else if constexpr (std::is_floating_point_v<Acc>) return std::numeric_limits<Acc>::infinity();
    else return std::numeric_limits<Acc>::max();
  }
  // NaN propagates: once the accumulator is NaN it stays NaN.
  __device__ Acc combine(Acc a, Acc b) const {
    if constexpr (kMax) return (b > a || is_nan(b)) ? b : a;
    else return (b < a || is_nan(b)) ? b : a;
  }
  __device__ Acc step(Acc a, S v, int64_t) const { return combine(a, cast<Acc>(v)); }
  __device__ void step4(Acc& a, const S* v, int64_t, int64_t) const {
    a = combine(a, combine(combine(cast<Acc>(v[0]), cast<Acc>(v[1])), combine(cast<Acc>(v[2]), cast<Acc>(v[3]))));
  }
  __device__ void store(void* out, DType dt, int64_t o, Acc a) const { store_value(out, dt, o, a); }
};

template <class C>
struct ArgAcc {
  C v;
  int64_t i;
};

// ArgMax: NaN is the largest value; ties go to the smallest index (first occurrence),
// decided by index so the result does not depend on the combine order.
template <class S>
struct ArgMaxReducer {
  using C = acc_t<S>;
  using Acc = ArgAcc<C>;
  __device__ Acc identity() const { return Acc{lowest<C>(), std::numeric_limits<int64_t>::max()}; }
  __device__ Acc combine(Acc a, Acc b) const {
    bool an = is_nan(a.v), bn = is_nan(b.v);
    bool b_better;
    if (an || bn) b_better = bn && (!an || b.i < a.i);
    else b_better = b.v > a.v || (b.v == a.v && b.i < a.i);
    return b_better ? b : a;
  }
  __device__ Acc step(Acc a, S v, int64_t k) const { return combine(a, Acc{cast<C>(v), k}); }
  __device__ void step4(Acc& a, const S* v, int64_t k, int64_t stride) const {
#pragma unroll
    for (int u = 0; u < 4; ++u) a = combine(a, Acc{cast<C>(v[u]), k + u * stride});
  }
  __device__ void store(void* out, DType dt, int64_t o, Acc a) const { store_value(out, dt, o, a.i); }
};

template <class A>
__device__ __forceinline__ A shfl_down_acc(const A& a, int delta) {
  constexpr int kWords = (sizeof(A) + 3) / 4;
  uint32_t w[kWords];
  memcpy(w, &a, sizeof(A));
#pragma unroll
  for (int i = 0; i < kWords; ++i) w[i] = __shfl_down_sync(0xffffffffu, w[i], delta);
  A r;
  memcpy(&r, w, sizeof(A));
  return r;
}

template <class R, class Acc>
__device__ __forceinline__ Acc warp_reduce(const R& r, Acc acc) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) acc = r.combine(acc, shfl_down_acc(acc, d));
  return acc;
}

inline constexpr int kReduceThreads = 256;
inline constexpr int kWarpsPerBlock = kReduceThreads / 32;

template <class R, class S>
__global__ void __launch_bounds__(kReduceThreads)
    reduce_inner_kernel(R r, const S* in, int64_t M, int64_t K, int64_t row_stride, int64_t split, int64_t chunk,
                        typename R::Acc* partial, void* out, DType out_dtype) {
  wait_prior_grids();  // launched dependent (dependent_launch.cuh)
  using Acc = typename R::Acc;
  int lane = threadIdx.x & 31;
  int64_t g = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (g >= M * split) return;  // uniform per warp
  int64_t row = g / split, s = g % split;
  int64_t k0 = s * chunk, k1 = min(K, k0 + chunk);
  const S* p = in + row * row_stride;
  Acc acc = r.identity();
  int64_t k = k0 + lane;
  for (; k + 96 < k1; k += 128) {
    S v[4] = {p[k], p[k + 32], p[k + 64], p[k + 96]};
    r.step4(acc, v, k, 32);
  }
  for (; k < k1; k += 32) acc = r.step(acc, p[k], k);
  acc = warp_reduce(r, acc);
  if (lane == 0) {
    if (split == 1) r.store(out, out_dtype, row, acc);
    else partial[row * split + s] = acc;
  }
}

template <class R, class S>
__global__ void __launch_bounds__(kReduceThreads)
    reduce_middle_kernel(R r, const S* in, int64_t K, int64_t B, int64_t sa, int64_t sk, int64_t bblocks,
                         int64_t split, int64_t chunk, typename R::Acc* partial, void* out, DType out_dtype) {
  wait_prior_grids();  // launched dependent (dependent_launch.cuh)
  using Acc = typename R::Acc;
  __shared__ alignas(16) unsigned char smem[kReduceThreads * sizeof(Acc)];
  Acc* sh = reinterpret_cast<Acc*>(smem);
  int64_t a = blockIdx.x / bblocks;
  int64_t b = (blockIdx.x % bblocks) * blockDim.x + threadIdx.x;
  int64_t s = blockIdx.y;
  int64_t k0 = s * chunk, k1 = min(K, k0 + chunk);
  Acc acc = r.identity();
  if (b < B) {
    const S* p = in + a * sa + b;
    int64_t step = blockDim.y;
    int64_t k = k0 + threadIdx.y;
    for (; k + 3 * step < k1; k += 4 * step) {
      S v[4] = {p[k * sk], p[(k + step) * sk], p[(k + 2 * step) * sk], p[(k + 3 * step) * sk]};
      r.step4(acc, v, k, step);
    }
    for (; k < k1; k += step) acc = r.step(acc, p[k * sk], k);
  }
  sh[threadIdx.y * blockDim.x + threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && b < B) {
    for (unsigned y = 1; y < blockDim.y; ++y) acc = r.combine(acc, sh[y * blockDim.x + threadIdx.x]);
    int64_t o = a * B + b;
    if (split == 1) r.store(out, out_dtype, o, acc);
    else partial[o * split + s] = acc;
  }
}

// The middle kernel with 16-byte loads: each thread owns 4 adjacent columns (b .. b + 3),
// so a warp reads whole 512-byte row segments per load instruction. Used when B, the
// strides and the pointer allow 4-wide aligned vectors (e.g. mean(0) of a [1M, 64] tensor).
template <class S>
struct alignas(4 * sizeof(S)) Vec4 {
  S v[4];
};

template <class R, class S>
__global__ void __launch_bounds__(kReduceThreads)
    reduce_middle_vec4_kernel(R r, const S* in, int64_t K, int64_t B, int64_t sa, int64_t sk, int64_t bblocks,
                              int64_t split, int64_t chunk, typename R::Acc* partial, void* out, DType out_dtype) {
  wait_prior_grids();  // launched dependent (dependent_launch.cuh)
  using Acc = typename R::Acc;
  __shared__ Acc sh[4][kReduceThreads];
  const int64_t B4 = B / 4;
  int64_t a = blockIdx.x / bblocks;
  int64_t b4 = (blockIdx.x % bblocks) * blockDim.x + threadIdx.x;
  int64_t s = blockIdx.y;
  int64_t k0 = s * chunk, k1 = min(K, k0 + chunk);
  Acc acc[4] = {r.identity(), r.identity(), r.identity(), r.identity()};
  if (b4 < B4) {
    const S* p = in + a * sa + 4 * b4;
    int64_t step = blockDim.y;
    int64_t k = k0 + threadIdx.y;
    for (; k + 3 * step < k1; k += 4 * step) {
      Vec4<S> v0 = *reinterpret_cast<const Vec4<S>*>(p + k * sk);
      Vec4<S> v1 = *reinterpret_cast<const Vec4<S>*>(p + (k + step) * sk);
      Vec4<S> v2 = *reinterpret_cast<const Vec4<S>*>(p + (k + 2 * step) * sk);
      Vec4<S> v3 = *reinterpret_cast<const Vec4<S>*>(p + (k + 3 * step) * sk);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        S col[4] = {v0.v[e], v1.v[e], v2.v[e], v3.v[e]};
        r.step4(acc[e], col, k, step);
      }
    }
    for (; k < k1; k += step) {
      Vec4<S> v = *reinterpret_cast<const Vec4<S>*>(p + k * sk);
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[e] = r.step(acc[e], v.v[e], k);
    }
  }
  const int t = threadIdx.y * blockDim.x + threadIdx.x;
#pragma unroll
  for (int e = 0; e < 4; ++e) sh[e][t] = acc[e];
  __syncthreads();
  if (threadIdx.y == 0 && b4 < B4) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      Acc c = acc[e];
      for (unsigned y = 1; y < blockDim.y; ++y) c = r.combine(c, sh[e][y * blockDim.x + threadIdx.x]);
      int64_t o = a * B + 4 * b4 + e;
      if (split == 1) r.store(out, out_dtype, o, c);
      else partial[o * split + s] = c;
    }
  }
}

// A warp per output combines that output's partials in a fixed order.
template <class R>
__global__ void __launch_bounds__(kReduceThreads)
    reduce_finalize_kernel(R r, const typename R::Acc* partial, int64_t M, int64_t split, void* out, DType out_dtype) {
  wait_prior_grids();  // launched dependent (dependent_launch.cuh)
  using Acc = typename R::Acc;
  int lane = threadIdx.x & 31;
  int64_t o = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (o >= M) return;
  Acc acc = r.identity();
  // Each lane combines its partials s = lane, lane + 32, ... in order; they are loaded 8 at a
  // time first, so the loads overlap instead of each waiting for the previous combine.
  constexpr int kAhead = 8;
  const Acc* p = partial + o * split;
  for (int64_t s0 = lane; s0 < split; s0 += 32 * kAhead) {
    Acc v[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) v[u] = s0 + 32 * u < split ? p[s0 + 32 * u] : r.identity();
#pragma unroll
    for (int u = 0; u < kAhead; ++u)
      if (s0 + 32 * u < split) acc = r.combine(acc, v[u]);
  }
  acc = warp_reduce(r, acc);
  if (lane == 0) r.store(out, out_dtype, o, acc);
}

// Blocks of `threads` threads of `kKernel` (no dynamic shared memory) that fit on one SM at once,
// asked once per kernel and block size (a multiple of 32 up to 1024; others are asked each time).
// Grids sized by it run as one full wave (split reductions, layer_norm's backward).
template <auto kKernel>
int resident_blocks(int threads = kReduceThreads) {
  static std::array<std::atomic<int>, 33> cache{};  // by threads / 32; 0: not asked yet
  const bool cached = threads > 0 && threads <= 1024 && threads % 32 == 0;
  if (cached) {
    const int n = cache[threads / 32].load(std::memory_order_relaxed);
    if (n > 0) return n;
  }
  int b = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kKernel, threads, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    b = 0;
  }
  b = b > 0 ? b : 8;  // unknown: the old fixed guess
  if (cached) cache[threads / 32].store(b, std::memory_order_relaxed);
  return b;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// Reduced lengths up to this are done by one launch (no partials / finalize).
inline constexpr int64_t kSplitMinK = 8192;

template <class R, class S>
void run_reduce(const R& r, const ReducePlan& p) {
  using Acc = typename R::Acc;
  const S* in = reinterpret_cast<const S*>(p.in);
  int sms = sm_count(p.device);
  int64_t split = 1, chunk = p.K;
  DataPtr ws;
  Acc* partial = nullptr;
  auto make_partials = [&] {
    if (split > 1) {
      ws = detail::device_allocate(static_cast<size_t>(p.M * split) * sizeof(Acc), p.device);
      partial = static_cast<Acc*>(ws.get());
    }
  };
  if (p.kind == ReducePlan::kInner) {
    int64_t target_warps = int64_t{sms} * 32;
    // Split K (partials + a finalize launch) only when the rows are long: for short ones a
    // second launch costs more than the extra parallelism saves.
    if (p.M < target_warps && p.K > kSplitMinK)
      split = std::max<int64_t>(1, std::min(ceil_div(target_warps, p.M), ceil_div(p.K, 1024)));
    chunk = ceil_div(ceil_div(p.K, split), 128) * 128;
    split = ceil_div(p.K, chunk);
    make_partials();
    int64_t blocks = ceil_div(p.M * split, kWarpsPerBlock);
    launch_dependent(reduce_inner_kernel<R, S>,
                     LaunchShape{dim3(static_cast<unsigned>(blocks)), dim3(kReduceThreads), 0, p.stream, p.device}, r,
                     in, p.M, p.K, p.row_stride, split, chunk, partial, p.out, p.out_dtype);
    TG_CUDA_CHECK_LAUNCH();
  } else if (sizeof(S) <= 4 && p.B % 4 == 0 && p.sa % 4 == 0 && p.sk % 4 == 0 &&
             reinterpret_cast<uintptr_t>(in) % (4 * sizeof(S)) == 0) {
    const int64_t B4 = p.B / 4;
    int bx = 1;
    while (bx < 32 && bx < B4) bx *= 2;
    int by = kReduceThreads / bx;
    int64_t bblocks = ceil_div(B4, bx);
    int64_t base = p.A * bblocks;
    // One full wave: as many blocks as fit on the SMs at once (a Welford block holds more
    // registers than a sum's, and a second partial wave would leave SMs idle at its end).
    int64_t target_blocks = int64_t{sms} * resident_blocks<reduce_middle_vec4_kernel<R, S>>();
    if (base < target_blocks && p.K > kSplitMinK)
      split = std::max<int64_t>(1, std::min({ceil_div(target_blocks, base), ceil_div(p.K, int64_t{by} * 16), int64_t{65535}}));
    chunk = ceil_div(p.K, split);
    split = ceil_div(p.K, chunk);
    make_partials();
    dim3 grid(static_cast<unsigned>(base), static_cast<unsigned>(split));
    launch_dependent(reduce_middle_vec4_kernel<R, S>, LaunchShape{dim3(grid), dim3(bx, by), 0, p.stream, p.device}, r,
                     in, p.K, p.B, p.sa, p.sk, bblocks, split, chunk, partial, p.out, p.out_dtype);
    TG_CUDA_CHECK_LAUNCH();
  } else {
    int bx = 1;
    while (bx < 32 && bx < p.B) bx *= 2;
    int by = kReduceThreads / bx;
    int64_t bblocks = ceil_div(p.B, bx);
    int64_t base = p.A * bblocks;
    int64_t target_blocks = int64_t{sms} * resident_blocks<reduce_middle_kernel<R, S>>();
    if (base < target_blocks && p.K > kSplitMinK)
      split = std::max<int64_t>(1, std::min({ceil_div(target_blocks, base), ceil_div(p.K, int64_t{by} * 16), int64_t{65535}}));
    chunk = ceil_div(p.K, split);
    split = ceil_div(p.K, chunk);
    make_partials();
    dim3 grid(static_cast<unsigned>(base), static_cast<unsigned>(split));
    launch_dependent(reduce_middle_kernel<R, S>, LaunchShape{dim3(grid), dim3(bx, by), 0, p.stream, p.device}, r, in,
                     p.K, p.B, p.sa, p.sk, bblocks, split, chunk, partial, p.out, p.out_dtype);
    TG_CUDA_CHECK_LAUNCH();
  }
  if (split > 1) {
    int64_t blocks = ceil_div(p.M, kWarpsPerBlock);
    launch_dependent(reduce_finalize_kernel<R>,
                     LaunchShape{dim3(static_cast<unsigned>(blocks)), dim3(kReduceThreads), 0, p.stream, p.device}, r,
                     partial, p.M, split, p.out, p.out_dtype);
    TG_CUDA_CHECK_LAUNCH();
  }
  // ws returns to the stream-ordered cache here; later work on this stream runs after the kernels.
}

// Max / Min / ArgMax (reduce_minmax.cu).
void reduce_minmax(backend::ReduceOp op, DType in_dtype, const ReducePlan& plan);

}  // namespace tg::cuda::kern
