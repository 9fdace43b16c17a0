// The seed's numba @cuda.jit matvec kernel, compiled by nvcc as part of the
// custom_kernels example. One thread per row of A; launched by the example on
// tapegrad's current stream with the tensors' data_ptr<double>().
#include <cuda_runtime.h>

namespace {
__global__ void matvec_kernel(const double* A, const double* x, double* out, long long rows, long long cols) {
  long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;  // cuda.grid(1)
  if (i < rows) {
    double s = 0.0;
    for (long long j = 0; j < cols; ++j) s += A[i * cols + j] * x[j];
    out[i] = s;
  }
}
}  // namespace

// Returns the launch's cudaError_t (0 on success) so the caller needs no CUDA headers.
int launch_matvec(const double* A, const double* x, double* out, long long rows, long long cols, int threads,
                  void* stream) {
  const long long blocks = (rows + threads - 1) / threads;  // round up to cover every row
  matvec_kernel<<<static_cast<unsigned>(blocks), threads, 0, static_cast<cudaStream_t>(stream)>>>(A, x, out, rows, cols);
  return static_cast<int>(cudaGetLastError());
}
