// The seed's user-written kernels in tapegrad, each checked against built-in ops:
//   1. numba's @cuda.jit matvec, both ways: compiled by nvcc (custom_kernels_matvec.cu)
//      and launched on tg::cuda::current_stream() with data_ptr<double>(), and the same
//      source compiled at run time with tg::cuda::RawKernel (NVRTC);
//   2. numba's @vectorize(target='cuda') multiply of two host arrays of 10M float64,
//      as a tg::cuda::ElementwiseKernel (copies to the GPU and back included);
//   3. numba's @njit pairwise loop on the CPU with accessor<double, 2>() and tg::parallel_for.
// Without a GPU (or built without CUDA) only the CPU part runs.
//
//   custom_kernels [--n N] [--device cpu|cuda]   (N: the pairwise size, default 4000; cpu: only the CPU part)
#include <tapegrad/tapegrad.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli.h"

#if defined(TG_WITH_CUDA) && defined(TG_EXAMPLE_NVCC_MATVEC)
// From custom_kernels_matvec.cu (built by nvcc).
int launch_matvec(const double* A, const double* x, double* out, long long rows, long long cols, int threads,
                  void* stream);
#endif

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double max_abs_diff(const tg::Tensor& a, const tg::Tensor& b) { return (a - b).abs().max().item<double>(); }

// The same kernel as custom_kernels_matvec.cu, as a string for NVRTC.
const char* kMatvecSource = R"(
extern "C" __global__ void matvec_kernel(const double* A, const double* x, double* out, long long rows, long long cols) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < rows) {
    double s = 0.0;
    for (long long j = 0; j < cols; ++j) s += A[i * cols + j] * x[j];
    out[i] = s;
  }
}
)";

void matvec_both_ways() {
  const int64_t rows = int64_t{1} << 16, cols = 512;
  auto o = tg::TensorOptions().dtype(tg::kFloat64).device(tg::kCUDA);
  tg::Tensor A = tg::rand({rows, cols}, o);
  tg::Tensor x = tg::rand({cols}, o);
  tg::Tensor want = tg::matmul(A, x);
  const int threads = 256;
  const int64_t blocks = (rows + threads - 1) / threads;

#ifdef TG_EXAMPLE_NVCC_MATVEC
  {
    tg::Tensor out = tg::empty({rows}, o);
    int err = launch_matvec(A.data_ptr<double>(), x.data_ptr<double>(), out.data_ptr<double>(), rows, cols, threads,
                            tg::cuda::current_stream().handle());
    if (err != 0) throw tg::Error("matvec (nvcc): launch failed with cudaError " + std::to_string(err));
    std::printf("matvec nvcc:      %lld x %lld, max |out - A@x| = %.3g\n", static_cast<long long>(rows),
                static_cast<long long>(cols), max_abs_diff(out, want));
  }
#endif
  {
    double t0 = now_ms();
    tg::cuda::RawKernel matvec(kMatvecSource, "matvec_kernel");  // compiled once, then cached on disk
    double t_compile = now_ms() - t0;
    tg::Tensor out = tg::empty({rows}, o);
    matvec.launch(blocks, threads, A, x, out, static_cast<long long>(rows), static_cast<long long>(cols));
    std::printf("matvec RawKernel: %lld x %lld, max |out - A@x| = %.3g (kernel ready in %.1f ms)\n",
                static_cast<long long>(rows), static_cast<long long>(cols), max_abs_diff(out, want), t_compile);
  }
}

void vectorize_multiply() {
  tg::cuda::ElementwiseKernel gpu_mul("double a, double b", "double c", "c = a * b", "gpu_mul");
  tg::Tensor a = tg::rand({10'000'000}, tg::kFloat64);  // host arrays, like np.random.rand
  tg::Tensor b = tg::rand({10'000'000}, tg::kFloat64);
  gpu_mul(a, b);  // first call compiles (or loads from the disk cache)
  double t0 = now_ms();
  tg::Tensor c = gpu_mul(a, b);  // to the GPU, multiply, back to the host
  double ms = now_ms() - t0;
  std::printf("vectorize multiply: 10M float64 host arrays in %.2f ms (copies included), on %s, max |c - a*b| = %.3g\n",
              ms, c.device().str().c_str(), max_abs_diff(c, a * b));
}

// out[i] = sum_j a[i, j] * b[j, i], rows split over the CPU backend's threads.
void pairwise(int64_t n) {
  tg::Tensor a = tg::rand({n, n}, tg::kFloat64);
  tg::Tensor b = tg::rand({n, n}, tg::kFloat64);
  tg::Tensor out = tg::empty({n}, tg::kFloat64);
  auto A = a.accessor<double, 2>();
  auto B = b.accessor<double, 2>();
  auto O = out.accessor<double, 1>();
  double t0 = now_ms();
  tg::parallel_for(0, n, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      double s = 0.0;
      for (int64_t j = 0; j < A.size(1); ++j) s += A[i][j] * B[j][i];
      O[i] = s;
    }
  });
  double ms = now_ms() - t0;
  tg::Tensor want = (a * b.t()).sum(1);
  std::printf("pairwise (CPU, %d threads): %lld x %lld in %.1f ms, max |out - ref| = %.3g\n", tg::get_num_threads(),
              static_cast<long long>(n), static_cast<long long>(n), ms, max_abs_diff(out, want));
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = 4000;
  std::string device;
  examples::App app{"User-written kernels (nvcc, NVRTC, elementwise, CPU accessor loop), each checked",
                    "custom_kernels"};
  app.add_option("--n", n, "the pairwise loop's size")->check(examples::kPositive);
  examples::add_device_option(app, device, "cpu (only the CPU part) or cuda (gpu: cuda); default cuda if usable");
  if (int rc = examples::parse(app, argc, argv); rc >= 0) return rc;
  const auto picked = examples::pick_device(app, device);
  if (!picked) return 2;
  try {
    pairwise(n);
    if (picked->is_cuda()) {
      matvec_both_ways();
      vectorize_multiply();
    } else {
      std::printf("on the CPU: skipped the GPU kernels\n");
    }
  } catch (const tg::Error& e) {
    std::fprintf(stderr, "custom_kernels: %s\n", e.what());
    return 1;
  }
  return 0;
}
