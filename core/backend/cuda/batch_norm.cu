// CUDA kernels of batch_norm (issue 17) on contiguous [n, c, s]. Per-channel statistics and
// gradient sums: one block per channel over its n * s elements (two-pass mean / variance in
// float, double for float64), block sums in a fixed order: bit-reproducible. The elementwise
// passes: one thread per element, the channel from the flat index.
#include <type_traits>

#include <tapegrad/core/backend/cuda/kernels.cuh>
#include <tapegrad/core/backend/cuda/loops.cuh>
#include <tapegrad/core/backend/cuda/runtime.h>

namespace tg::cuda::kern {
namespace {

template <class T>
using bacc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

constexpr int kThreads = 512;

// Sum over the block (kThreads threads); every thread gets the result.
template <class A>
__device__ __forceinline__ A block_sum(A v, A* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  __syncthreads();  // the previous use of red is over
  if (lane == 0) red[w] = v;
  __syncthreads();
  A s = 0;
  for (int i = 0; i < kThreads / 32; ++i) s += red[i];
  return s;
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    bn_stats_kernel(const T* __restrict__ x, int64_t n, int64_t c, int64_t s, bacc_t<T>* mean, bacc_t<T>* var) {
  using A = bacc_t<T>;
  __shared__ A red[kThreads / 32];
  const int64_t ch = blockIdx.x, m = n * s;
  A sum = 0;
  for (int64_t j = threadIdx.x; j < m; j += kThreads) sum += cast<A>(x[((j / s) * c + ch) * s + j % s]);
  const A mu = block_sum(sum, red) / static_cast<A>(m);
  A ss = 0;
  for (int64_t j = threadIdx.x; j < m; j += kThreads) {
    const A d = cast<A>(x[((j / s) * c + ch) * s + j % s]) - mu;
    ss += d * d;
  }
  ss = block_sum(ss, red);
  if (threadIdx.x == 0) {
    mean[ch] = mu;
    var[ch] = ss / static_cast<A>(m);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    bn_reduce_kernel(const T* __restrict__ dy, const T* __restrict__ x, int64_t n, int64_t c, int64_t s,
                     const bacc_t<T>* mean, const bacc_t<T>* invstd, bacc_t<T>* sum_dy, bacc_t<T>* sum_dy_xhat) {
  using A = bacc_t<T>;
  __shared__ A red[kThreads / 32];
  const int64_t ch = blockIdx.x, m = n * s;
  const A mu = mean[ch];
  A s1 = 0, s2 = 0;
  for (int64_t j = threadIdx.x; j < m; j += kThreads) {
    const int64_t idx = ((j / s) * c + ch) * s + j % s;
    const A g = cast<A>(dy[idx]);
    s1 += g;
    s2 += g * (cast<A>(x[idx]) - mu);
  }
  s1 = block_sum(s1, red);
  s2 = block_sum(s2, red);
  if (threadIdx.x == 0) {
    sum_dy[ch] = s1;
    sum_dy_xhat[ch] = s2 * invstd[ch];
  }
}

template <class T>
__global__ void bn_elemt_kernel(T* __restrict__ y, const T* __restrict__ x, int64_t total, int64_t c, int64_t s,
                                const bacc_t<T>* mean, const bacc_t<T>* scale, const bacc_t<T>* shift) {
  using A = bacc_t<T>;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t ch = (i / s) % c;
    const A v = (cast<A>(x[i]) - mean[ch]) * scale[ch] + (shift ? shift[ch] : A(0));
    y[i] = cast<T>(v);
  }
}

template <class T>
__global__ void bn_backward_elemt_kernel(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ x,
                                         int64_t total, int64_t c, int64_t s, const bacc_t<T>* mean,
                                         const bacc_t<T>* invstd, const bacc_t<T>* scale, const bacc_t<T>* mean_dy,
                                         const bacc_t<T>* mean_dy_xhat) {
  using A = bacc_t<T>;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t ch = (i / s) % c;
    const A v = (cast<A>(dy[i]) - mean_dy[ch] - (cast<A>(x[i]) - mean[ch]) * invstd[ch] * mean_dy_xhat[ch]) * scale[ch];
    dx[i] = cast<T>(v);
  }
}

template <class A>
const A* vptr(const Tensor& t) {
  return t.defined() ? static_cast<const A*>(t.data_ptr()) : nullptr;
}

unsigned elemt_grid(int64_t total) {
  const int64_t blocks = (total + 255) / 256;
  return static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
}

}  // namespace

void batch_norm_stats(const Tensor& x, int64_t n, int64_t c, int64_t s, const Tensor& mean, const Tensor& var) {
  cudaStream_t stream = detail::current_stream_handle(x.device().index());
  dispatch<kFloats>(x.dtype(), "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = bacc_t<T>;
    bn_stats_kernel<T><<<static_cast<unsigned>(c), kThreads, 0, stream>>>(
        static_cast<const T*>(x.data_ptr()), n, c, s, static_cast<A*>(mean.data_ptr()), static_cast<A*>(var.data_ptr()));
    TG_CUDA_CHECK_LAUNCH();
  });
}

void batch_norm_elemt(const Tensor& y, const Tensor& x, int64_t n, int64_t c, int64_t s, const Tensor& mean,
                      const Tensor& scale, const Tensor& shift) {
  cudaStream_t stream = detail::current_stream_handle(x.device().index());
  dispatch<kFloats>(x.dtype(), "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = bacc_t<T>;
    const int64_t total = n * c * s;
    bn_elemt_kernel<T><<<elemt_grid(total), 256, 0, stream>>>(static_cast<T*>(y.data_ptr()),
                                                             static_cast<const T*>(x.data_ptr()), total, c, s,
                                                             vptr<A>(mean), vptr<A>(scale), vptr<A>(shift));
    TG_CUDA_CHECK_LAUNCH();
  });
}

void batch_norm_reduce(const Tensor& dy, const Tensor& x, int64_t n, int64_t c, int64_t s, const Tensor& mean,
                       const Tensor& invstd, const Tensor& sum_dy, const Tensor& sum_dy_xhat) {
  cudaStream_t stream = detail::current_stream_handle(x.device().index());
  dispatch<kFloats>(x.dtype(), "batch_norm backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = bacc_t<T>;
    bn_reduce_kernel<T><<<static_cast<unsigned>(c), kThreads, 0, stream>>>(
        static_cast<const T*>(dy.data_ptr()), static_cast<const T*>(x.data_ptr()), n, c, s, vptr<A>(mean),
        vptr<A>(invstd), static_cast<A*>(sum_dy.data_ptr()), static_cast<A*>(sum_dy_xhat.data_ptr()));
    TG_CUDA_CHECK_LAUNCH();
  });
}

void batch_norm_backward_elemt(const Tensor& dx, const Tensor& dy, const Tensor& x, int64_t n, int64_t c, int64_t s,
                               const Tensor& mean, const Tensor& invstd, const Tensor& scale, const Tensor& mean_dy,
                               const Tensor& mean_dy_xhat) {
  cudaStream_t stream = detail::current_stream_handle(x.device().index());
  dispatch<kFloats>(x.dtype(), "batch_norm backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = bacc_t<T>;
    const int64_t total = n * c * s;
    bn_backward_elemt_kernel<T><<<elemt_grid(total), 256, 0, stream>>>(
        static_cast<T*>(dx.data_ptr()), static_cast<const T*>(dy.data_ptr()), static_cast<const T*>(x.data_ptr()),
        total, c, s, vptr<A>(mean), vptr<A>(invstd), vptr<A>(scale), vptr<A>(mean_dy), vptr<A>(mean_dy_xhat));
    TG_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace tg::cuda::kern
