// See queue_unaware_op.h.
#include "core/queue_unaware_op.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <tapegrad/core/backend/cuda/runtime.h>
#include <tapegrad/core/ops.h>

namespace tg::testing {
namespace {

__global__ void add_one(float* p, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) p[i] += 1.f;
}

cublasHandle_t handle() {
  static cublasHandle_t h = [] {
    cublasHandle_t c = nullptr;
    TG_CUBLAS_CHECK(cublasCreate(&c));
    return c;
  }();
  return h;
}

}  // namespace

void queue_unaware_op(const Tensor& x, const Tensor& w, const Tensor& out) {
  const int device = x.device().index() < 0 ? 0 : x.device().index();
  cuda::detail::DeviceGuard guard(device);
  cudaStream_t stream = cuda::detail::current_stream_handle(device);
  const int64_t m = x.size(0), k = x.size(1), n = w.size(1);
  Tensor buf = empty({m, k}, TensorOptions().dtype(kFloat32).device(x.device()));
  float* pb = static_cast<float*>(buf.data_ptr());
  const float* pw = static_cast<const float*>(w.data_ptr());
  float* po = static_cast<float*>(out.data_ptr());
  buf.copy_(x);  // tiny elementwise steps: deferred if the queue took them
  buf.mul_(2.0);
  buf.add_(1.0);
  add_one<<<static_cast<unsigned>((m * k + 255) / 256), 256, 0, stream>>>(pb, m * k);
  TG_CUDA_CHECK_LAUNCH();
  // Row-major out[m, n] = buf[m, k] @ w[k, n] is column-major out^T = w^T buf^T.
  TG_CUBLAS_CHECK(cublasSetStream(handle(), stream));
  const float one = 1.f, zero = 0.f;
  TG_CUBLAS_CHECK(cublasSgemm(handle(), CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                              static_cast<int>(k), &one, pw, static_cast<int>(n), pb, static_cast<int>(k), &zero, po,
                              static_cast<int>(n)));
}

}  // namespace tg::testing
