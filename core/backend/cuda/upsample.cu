// CUDA interpolate (issue 17): one thread per output element forward, one per input element
// backward (a gather over the outputs that read it: a fixed order, no atomics), with the
// per-element math shared with the CPU (core/backend/upsample_index.h). Storage types are tg::Half /
// tg::BFloat16 (host-device conversions through float), accumulation float (double for float64).
#include <algorithm>
#include <type_traits>

#include <tapegrad/core/backend/cuda/kernels.cuh>
#include <tapegrad/core/backend/cuda/runtime.h>
#include <tapegrad/core/backend/upsample_index.h>

namespace tg::cuda::kern {
namespace {

constexpr int kThreads = 256;

template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
__global__ void upsample2d_kernel(backend::upsample::Axis<acc_t<T>> ah, backend::upsample::Axis<acc_t<T>> aw,
                                  const T* __restrict__ x, T* __restrict__ out, int64_t W, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t ow = i % aw.out, oh = (i / aw.out) % ah.out, p = i / (aw.out * ah.out);
    out[i] = T(backend::upsample::forward_at<acc_t<T>>(ah, aw, x + p * ah.in * W, W, oh, ow));
  }
}

template <class T>
__global__ void upsample2d_backward_kernel(backend::upsample::Axis<acc_t<T>> ah, backend::upsample::Axis<acc_t<T>> aw,
                                           const T* __restrict__ g, T* __restrict__ grad_in, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t w = i % aw.in, h = (i / aw.in) % ah.in, p = i / (aw.in * ah.in);
    grad_in[i] = T(backend::upsample::backward_at<acc_t<T>>(ah, aw, g + p * ah.out * aw.out, aw.out, h, w));
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

void upsample2d(const backend::Upsample2dArgs& a, const Tensor& out, const Tensor& x) {
  cudaStream_t stream = detail::current_stream_handle(x.device().index());
  const int64_t n = out.numel();
  visit(x.dtype(), "interpolate", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const auto ah = backend::upsample::make_axis<A>(a, a.H, a.OH, a.scale_h);
    const auto aw = backend::upsample::make_axis<A>(a, a.W, a.OW, a.scale_w);
    upsample2d_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(ah, aw, static_cast<const T*>(x.data_ptr()),
                                                                static_cast<T*>(out.data_ptr()), a.W, n);
    TG_CUDA_CHECK_LAUNCH();
  });
}

void upsample2d_backward(const backend::Upsample2dArgs& a, const Tensor& grad_in, const Tensor& grad_out) {
  cudaStream_t stream = detail::current_stream_handle(grad_in.device().index());
  const int64_t n = grad_in.numel();
  visit(grad_out.dtype(), "interpolate backward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const auto ah = backend::upsample::make_axis<A>(a, a.H, a.OH, a.scale_h);
    const auto aw = backend::upsample::make_axis<A>(a, a.W, a.OW, a.scale_w);
    upsample2d_backward_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(
        ah, aw, static_cast<const T*>(grad_out.data_ptr()), static_cast<T*>(grad_in.data_ptr()), n);
    TG_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace tg::cuda::kern
