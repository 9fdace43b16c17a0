// Programmatic dependent launch (sm_90+): a kernel launched with launch_dependent may start
// while the kernel before it on the stream is still running. Its blocks are placed on the SMs
// and wait at wait_prior_grids() (griddepcontrol.wait) until that kernel has finished and its
// writes are visible. What it is meant to save is the gap between two dependent kernels (the
// launch of the next grid and the placing of its blocks), which weighs on a step made of many
// small kernels (issue 15's batch-128 MLP: -8% a step, benchmarks/NOTES.md, "programmatic
// dependent launch"). On by default; TG_DEPENDENT_LAUNCH=0 turns it off.
//
// The rule, for every kernel launched through launch_dependent: each thread calls
// wait_prior_grids() before its first access to global memory (read or write: the previous kernel
// may still read what this one overwrites). wait_prior_grids() then lets the next dependent
// kernel launch (griddepcontrol.launch_dependents): at most one kernel waits ahead of the
// running one, and every earlier kernel has finished once a wait returns (each waited for its
// own predecessor before it could finish). Kernels launched otherwise (cuBLAS, the launch
// queue's chain graphs, <<<>>>) are ordered as always; for them the wait returns at once.
// Stream capture turns the launches into programmatic graph edges, so graphs keep the overlap.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <tuple>
#include <utility>

#include <tapegrad/core/backend/cuda/runtime.h>

namespace tg::cuda::kern {

__device__ __forceinline__ void wait_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The shape of a launch: grid, block, dynamic shared memory, stream and its device, and a thread
// block cluster shape (sm_90) when not 1 x 1 x 1.
struct LaunchShape {
  dim3 grid, block;
  size_t smem = 0;
  cudaStream_t stream = nullptr;
  int device = 0;
  dim3 cluster = dim3(1, 1, 1);
};

// kernel<<<s.grid, s.block, s.smem, s.stream>>> with the kernel parameters `args` (pointers to
// the values), in clusters of s.cluster, allowed to overlap the previous kernel's tail where
// detail::dependent_launch(s.device) (sm_90+, turned on). The kernel must follow the rule above.
inline void launch_dependent_args(const void* kernel, const LaunchShape& s, void** args) {
  cudaLaunchAttribute attrs[2];
  unsigned n = 0;
  if (s.cluster.x * s.cluster.y * s.cluster.z != 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = s.cluster.x;
    attrs[n].val.clusterDim.y = s.cluster.y;
    attrs[n].val.clusterDim.z = s.cluster.z;
    ++n;
  }
  if (detail::dependent_launch(s.device)) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = s.grid;
  cfg.blockDim = s.block;
  cfg.dynamicSmemBytes = s.smem;
  cfg.stream = s.stream;
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  TG_CUDA_CHECK(cudaLaunchKernelExC(&cfg, kernel, args));
}

// The same with the arguments as values: kernel<<<...>>>(a...).
template <class... P, class... A>
void launch_dependent(void (*kernel)(P...), const LaunchShape& s, A&&... a) {
  static_assert(sizeof...(P) == sizeof...(A), "launch_dependent: argument count");
  std::tuple<P...> vals(std::forward<A>(a)...);
  std::apply(
      [&](auto&... v) {
        void* args[] = {static_cast<void*>(&v)..., nullptr};
        launch_dependent_args(reinterpret_cast<const void*>(kernel), s, args);
      },
      vals);
}

}  // namespace tg::cuda::kern
