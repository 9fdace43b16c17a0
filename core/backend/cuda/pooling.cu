// CUDA 2-d pooling (issue 17): one thread per output element forward, one per input element
// backward (a gather over the windows that contain it: a fixed order, no atomics), with the
// per-element math shared with the CPU (core/backend/pool_window.h). Storage types are tg::Half /
// tg::BFloat16 (host-device conversions through float), accumulation float (double for float64).
#include <algorithm>
#include <type_traits>

#include <tapegrad/core/backend/cuda/kernels.cuh>
#include <tapegrad/core/backend/cuda/runtime.h>
#include <tapegrad/core/backend/pool_window.h>

namespace tg::cuda::kern {
namespace {

constexpr int kThreads = 256;

template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
__global__ void pool2d_kernel(backend::Pool2dArgs a, const T* __restrict__ x, T* __restrict__ out,
                              int64_t* __restrict__ indices, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t ow = i % a.OW, oh = (i / a.OW) % a.OH, p = i / (a.OW * a.OH);
    int64_t idx = 0;
    const acc_t<T> v = backend::pool::forward_at<acc_t<T>>(a, x + p * a.H * a.W, oh, ow, idx);
    out[i] = T(v);
    if (indices) indices[i] = idx;
  }
}

template <class T>
__global__ void pool2d_backward_kernel(backend::Pool2dArgs a, const T* __restrict__ g, const int64_t* __restrict__ indices,
                                       T* __restrict__ grad_in, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t w = i % a.W, h = (i / a.W) % a.H, p = i / (a.W * a.H);
    const int64_t plane = p * a.OH * a.OW;
    grad_in[i] = T(backend::pool::backward_at<acc_t<T>>(a, g + plane, indices ? indices + plane : nullptr, h, w));
  }
}

template <class F>
void visit(DType dt, const char* op, F&& f) {
  switch (dt) {
    case kFloat32: f(float{}); return;
    case kFloat64: f(double{}); return;
    case kFloat16: f(Half{}); return;
    case kBFloat16: f(BFloat16{}); return;
    default: TG_ERROR(op, ": expected a floating dtype, got ", dt);
  }
}

unsigned grid_for(int64_t n) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t{1} << 20)));
}
}  // namespace

void pool2d(const backend::Pool2dArgs& a, const Tensor& out, const Tensor& indices, const Tensor& x) {
  cudaStream_t stream = detail::current_stream_handle(x.device().index());
  const int64_t n = out.numel();
  visit(x.dtype(), "pool2d", [&](auto tag) {
    using T = decltype(tag);
    pool2d_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(
        a, static_cast<const T*>(x.data_ptr()), static_cast<T*>(out.data_ptr()),
        indices.defined() ? static_cast<int64_t*>(indices.data_ptr()) : nullptr, n);
    TG_CUDA_CHECK_LAUNCH();
  });
}

void pool2d_backward(const backend::Pool2dArgs& a, const Tensor& grad_in, const Tensor& grad_out,
                     const Tensor& indices) {
  cudaStream_t stream = detail::current_stream_handle(grad_in.device().index());
  const int64_t n = grad_in.numel();
  visit(grad_out.dtype(), "pool2d backward", [&](auto tag) {
    using T = decltype(tag);
    pool2d_backward_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(
        a, static_cast<const T*>(grad_out.data_ptr()),
        indices.defined() ? static_cast<const int64_t*>(indices.data_ptr()) : nullptr,
        static_cast<T*>(grad_in.data_ptr()), n);
    TG_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace tg::cuda::kern
