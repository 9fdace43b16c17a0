// What programmatic dependent launch saves a kernel boundary, apart from any tapegrad code: a chain
// of 12 dependent kernels (each reads the previous one's output), launched on a stream and
// replayed as a CUDA graph, with and without cudaLaunchAttributeProgrammaticStreamSerialization.
// Empty kernels (work 0) show the launch gap itself; kernels of a few microseconds (work 2000)
// show what overlapping block placement with the previous kernel's tail leaves of it.
// benchmarks/NOTES.md, "programmatic dependent launch measured". Prints one JSON line per row
// (us per kernel, median of 7 rounds of 200 chains). Needs sm_90 for the attribute to matter.
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "benchmarks/bench_util.h"

namespace {

#define CHECK_CUDA(x)                                                                        \
  do {                                                                                       \
    cudaError_t e_ = (x);                                                                    \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));       \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

template <bool kDependent>
__global__ void chain_step(const float* __restrict__ in, float* __restrict__ out, int n, int work) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (kDependent) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
#endif
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float v = in[i];
    for (int w = 0; w < work; ++w) v = v * 0.999f + 0.001f;
    out[i] = v + 1.f;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const tg::bench::Options o = tg::bench::parse_options(argc, argv);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "# tg_bench_pdl_chain: no CUDA device, nothing timed\n");
    return 0;
  }
  constexpr int kElems = 128 * 512, kChain = 12, kChains = 200, kRounds = 7;
  float *a = nullptr, *b = nullptr;
  CHECK_CUDA(cudaMalloc(&a, kElems * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&b, kElems * sizeof(float)));
  CHECK_CUDA(cudaMemset(a, 0, kElems * sizeof(float)));
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  for (int work : {0, 2000}) {
    for (int blocks : {64, 256}) {
      for (bool dependent : {false, true}) {
        const std::string name = "pdl_chain_work" + std::to_string(work) + "_blocks" + std::to_string(blocks) +
                                 (dependent ? "_dependent" : "_plain");
        if (!o.wants(name)) continue;
        const int threads = std::min(1024, (kElems + blocks - 1) / blocks);
        const int n = std::min(kElems, blocks * threads);
        auto enqueue = [&] {
          for (int c = 0; c < kChain; ++c) {
            cudaLaunchConfig_t cfg{};
            cfg.gridDim = dim3(blocks);
            cfg.blockDim = dim3(threads);
            cfg.stream = s;
            cudaLaunchAttribute attr{};
            attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
            attr.val.programmaticStreamSerializationAllowed = 1;
            cfg.attrs = &attr;
            cfg.numAttrs = dependent ? 1 : 0;
            const float* in = c % 2 ? b : a;
            float* out = c % 2 ? a : b;
            if (dependent)
              CHECK_CUDA(cudaLaunchKernelEx(&cfg, chain_step<true>, in, out, n, work));
            else
              CHECK_CUDA(cudaLaunchKernelEx(&cfg, chain_step<false>, in, out, n, work));
          }
        };
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        enqueue();
        CHECK_CUDA(cudaStreamEndCapture(s, &graph));
        CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
        std::vector<double> on_graph, on_stream;
        auto per_kernel_us = [&](auto&& submit) {
          CHECK_CUDA(cudaEventRecord(e0, s));
          for (int i = 0; i < kChains; ++i) submit();
          CHECK_CUDA(cudaEventRecord(e1, s));
          CHECK_CUDA(cudaEventSynchronize(e1));
          float ms = 0;
          CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
          return ms * 1e3 / (kChains * kChain);
        };
        for (int r = 0; r < kRounds + 1; ++r) {  // round 0: warm-up, discarded
          const double g = per_kernel_us([&] { CHECK_CUDA(cudaGraphLaunch(exec, s)); });
          const double st = per_kernel_us(enqueue);
          if (r > 0) {
            on_graph.push_back(g);
            on_stream.push_back(st);
          }
        }
        const double g = tg::bench::median(on_graph), st = tg::bench::median(on_stream);
        tg::bench::emit(name + "_graph", g, "us/kernel", g * kChain * 1e-3);
        tg::bench::emit(name + "_stream", st, "us/kernel", st * kChain * 1e-3);
        CHECK_CUDA(cudaGraphExecDestroy(exec));
        CHECK_CUDA(cudaGraphDestroy(graph));
      }
    }
  }
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  return 0;
}
