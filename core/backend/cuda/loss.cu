// CUDA mse_loss: the mean / sum forward as one launch, 'none' as one
// elementwise launch, and the backward (both gradients) as one launch.
// The reduction accumulates in float (double for float64) in a fixed order and
// uses no floating-point atomics, so a result is bit-reproducible for a given
// input and device: up to kOneBlockMax elements one block does everything; beyond,
// each block writes a partial and the last block to finish (an atomic counter
// it resets to 0) adds the partials in index order.
#include <algorithm>
#include <type_traits>
#include <utility>

#include <tapegrad/core/backend/cuda/done_counters.h>
#include <tapegrad/core/backend/cuda/kernels.cuh>
#include <tapegrad/core/backend/cuda/loops.cuh>
#include <tapegrad/core/backend/cuda/reduce.cuh>

namespace tg::cuda::kern {
namespace {

using backend::LossReduction;

constexpr int kThreads = 512;            // reduction block
constexpr int kElemThreads = 256;        // elementwise blocks
constexpr int64_t kOneBlockMax = 32768;  // up to this many elements: one block, no partials

template <class S>
using sq_acc_t = std::conditional_t<std::is_same_v<S, double>, double, float>;

template <class S, int V>
struct alignas(16) Pack {
  S v[V];
};

// This thread's sum of (a - b)^2 over a grid-stride walk; V-wide 16-byte loads when V > 1.
template <class S, int V>
__device__ __forceinline__ sq_acc_t<S> thread_sq_sum(const S* a, const S* b, int64_t n, int64_t t, int64_t nt) {
  using Acc = sq_acc_t<S>;
  Acc acc = 0;
  int64_t tail = 0;
  if constexpr (V > 1) {
    const int64_t nv = n / V;
    const auto* pa = reinterpret_cast<const Pack<S, V>*>(a);
    const auto* pb = reinterpret_cast<const Pack<S, V>*>(b);
    for (int64_t v = t; v < nv; v += nt) {
      const Pack<S, V> x = pa[v], y = pb[v];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const Acc d = cast<Acc>(x.v[e]) - cast<Acc>(y.v[e]);
        acc += d * d;
      }
    }
    tail = nv * V;
  }
  for (int64_t i = tail + t; i < n; i += nt) {
    const Acc d = cast<Acc>(a[i]) - cast<Acc>(b[i]);
    acc += d * d;
  }
  return acc;
}

// The block's total in thread 0 (fixed order: warp shuffles, then the warps' sums by warp 0).
template <class Acc>
__device__ __forceinline__ Acc block_sum(Acc v) {
  __shared__ Acc warp_sums[kThreads / 32];
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v += __shfl_down_sync(0xffffffffu, v, d);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / 32 ? warp_sums[lane] : Acc(0);
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) v += __shfl_down_sync(0xffffffffu, v, d);
  }
  return v;
}

// Rounded as the Sum / Mean reductions store (the mean divided in double).
template <class S, class Acc>
__device__ __forceinline__ S finish(Acc s, int64_t n, bool mean) {
  if constexpr (std::is_same_v<S, double>) {
    return mean ? s / static_cast<double>(n) : s;
  } else {
    const float v = mean ? static_cast<float>(static_cast<double>(s) / static_cast<double>(n)) : s;
    return cast<S>(v);
  }
}

template <class S, int V>
__global__ void __launch_bounds__(kThreads)
    mse_reduce_kernel(const S* a, const S* b, int64_t n, bool mean, S* out, sq_acc_t<S>* partial, unsigned* counter) {
  using Acc = sq_acc_t<S>;
  const int64_t nt = static_cast<int64_t>(gridDim.x) * kThreads;
  Acc acc = block_sum(thread_sq_sum<S, V>(a, b, n, static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x, nt));
  if (gridDim.x == 1) {
    if (threadIdx.x == 0) out[0] = finish<S>(acc, n, mean);
    return;
  }
  __shared__ bool last;
  if (threadIdx.x == 0) {
    partial[blockIdx.x] = acc;
    __threadfence();  // the partial is visible before the count says so
    last = atomicAdd(counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  Acc t = 0;
  for (unsigned i = threadIdx.x; i < gridDim.x; i += kThreads) t += __ldcg(partial + i);
  t = block_sum(t);
  if (threadIdx.x == 0) {
    out[0] = finish<S>(t, n, mean);
    *counter = 0;  // ready for the next launch on this stream
  }
}

template <class S>
__global__ void mse_none_kernel(const S* a, const S* b, S* out, int64_t n) {
  using M = opmath_t<S>;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const M d = cast<M>(a[i]) - cast<M>(b[i]);
    out[i] = cast<S>(d * d);
  }
}

// grad_input = norm * (a - b) * g, grad_target = -grad_input; g read on the device.
template <class S>
__global__ void mse_backward_kernel(S* gi, S* gt, const S* g, bool per_element, const S* a, const S* b, int64_t n,
                                    double norm) {
  using M = opmath_t<S>;
  const M c = static_cast<M>(norm);
  const M g0 = per_element ? M(0) : cast<M>(g[0]);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const M v = c * (cast<M>(a[i]) - cast<M>(b[i])) * (per_element ? cast<M>(g[i]) : g0);
    if (gi) gi[i] = cast<S>(v);
    if (gt) gt[i] = cast<S>(-v);
  }
}

unsigned elem_grid(int64_t n, int device) {
  const int64_t blocks = std::max<int64_t>(1, (n + kElemThreads - 1) / kElemThreads);
  return static_cast<unsigned>(std::min<int64_t>(blocks, int64_t{sm_count(device)} * 16));
}

}  // namespace

void mse_loss(const Tensor& out, const Tensor& input, const Tensor& target, LossReduction r) {
  const int device = input.device().index();
  cudaStream_t stream = detail::current_stream_handle(device);
  const int64_t n = input.numel();
  dispatch<kFloats>(input.dtype(), "mse_loss", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using Acc = sq_acc_t<S>;
    const S* a = static_cast<const S*>(input.data_ptr());
    const S* b = static_cast<const S*>(target.data_ptr());
    S* o = static_cast<S*>(out.data_ptr());
    if (r == LossReduction::None) {
      mse_none_kernel<S><<<elem_grid(n, device), kElemThreads, 0, stream>>>(a, b, o, n);
      TG_CUDA_CHECK_LAUNCH();
      return;
    }
    constexpr int V = 16 / static_cast<int>(sizeof(S));
    const bool vec = reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0;
    int64_t blocks = 1;
    if (n > kOneBlockMax)  // a few 16-byte loads per thread, at most 2 blocks per SM
      blocks = std::min<int64_t>((n + int64_t{kThreads} * V * 4 - 1) / (int64_t{kThreads} * V * 4),
                                 int64_t{sm_count(device)} * 2);
    DataPtr ws, own_counter;
    Acc* partial = nullptr;
    unsigned* counter = nullptr;
    if (blocks > 1) {
      ws = detail::device_allocate(static_cast<size_t>(blocks) * sizeof(Acc), device);
      partial = static_cast<Acc*>(ws.get());
      counter = detail::done_counters(device, stream, 1, own_counter);
    }
    const bool mean = r == LossReduction::Mean;
    const unsigned grid = static_cast<unsigned>(blocks);
    if (vec)
      mse_reduce_kernel<S, V><<<grid, kThreads, 0, stream>>>(a, b, n, mean, o, partial, counter);
    else
      mse_reduce_kernel<S, 1><<<grid, kThreads, 0, stream>>>(a, b, n, mean, o, partial, counter);
    TG_CUDA_CHECK_LAUNCH();
    // ws returns to the stream-ordered cache; later work on this stream runs after the kernel.
  });
}

void mse_loss_backward(const Tensor& grad_input, const Tensor& grad_target, const Tensor& grad, const Tensor& input,
                       const Tensor& target, LossReduction r) {
  const int device = input.device().index();
  cudaStream_t stream = detail::current_stream_handle(device);
  const int64_t n = input.numel();
  const bool per_element = r == LossReduction::None && grad.numel() == n;
  const double norm = r == LossReduction::Mean ? 2.0 / static_cast<double>(n) : 2.0;
  dispatch<kFloats>(input.dtype(), "mse_loss_backward", [&](auto tag) {
    using S = typename decltype(tag)::type;
    S* gi = grad_input.defined() ? static_cast<S*>(grad_input.data_ptr()) : nullptr;
    S* gt = grad_target.defined() ? static_cast<S*>(grad_target.data_ptr()) : nullptr;
    mse_backward_kernel<S><<<elem_grid(n, device), kElemThreads, 0, stream>>>(
        gi, gt, static_cast<const S*>(grad.data_ptr()), per_element, static_cast<const S*>(input.data_ptr()),
        static_cast<const S*>(target.data_ptr()), n, norm);
    TG_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace tg::cuda::kern
