// Launch batching: tiny elementwise launches are recorded instead of launched, and a run of them
// goes to the GPU as one replay of a cached chain graph whose kernel nodes are rewritten in
// place (cudaGraphExecKernelNodeSetParams). One launch costs 3.3-4.7 µs of host time on our
// machines whatever the API; a node update costs about 0.2 µs, and the replay runs dependent
// tiny kernels about 1 µs apart (benchmarks/NOTES.md, "Launch batching").
//
// One queue per process holds the launches of one (device, stream) in order. It is flushed
// before anything else can observe or order work on a stream:
//  - current_stream_handle() (every other launch, copy, cuBLAS call and user-visible stream),
//    Stream::handle(), stream and device synchronisation, event record/wait;
//  - Tensor::data_ptr() of a CUDA tensor (the pointer may go to a user's kernel) and DLPack export;
//  - the allocator before it records cross-stream events or frees memory;
//  - a launch onto another stream or device, and every kMaxBatch launches.
// Nothing is deferred while the stream is being captured into a graph, nor inside another
// CUDA op (NoDeferScope): such an op may hold a stream handle taken before an elementwise step
// of its own and launch on it afterwards, which must find that step already on the stream.
// TG_LAUNCH_BATCHING=0 in the environment turns batching off for the process.
#pragma once
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace tg::cuda::detail {

inline constexpr int kMaxBatch = 64;          // launches per flush
inline constexpr int kMaxDeferredArgs = 8;    // kernel parameters of one deferred launch
inline constexpr size_t kMaxArgBytes = 1024;  // their bytes, each at 16-byte alignment

extern std::atomic<bool> g_launches_pending;

// While one lives on a thread, that thread's launches are not deferred. Every CUDA backend op
// but elementwise holds one (backend.cu), as do the fused optimizer and GradScaler launches.
inline thread_local int tls_no_defer = 0;
struct NoDeferScope {
  NoDeferScope() { ++tls_no_defer; }
  ~NoDeferScope() { --tls_no_defer; }
  NoDeferScope(const NoDeferScope&) = delete;
  NoDeferScope& operator=(const NoDeferScope&) = delete;
};

// Flushes the queue: its launches are on the GPU's stream afterwards. Throws tg::Error when
// a launch fails (the queue is empty either way).
void flush_launches_slow();
inline void flush_launches() {
  if (g_launches_pending.load(std::memory_order_acquire)) [[unlikely]]
    flush_launches_slow();
}
// For destructors: logs instead of throwing.
void flush_launches_nothrow() noexcept;

// Whether launches may be deferred at all (TG_LAUNCH_BATCHING, read once).
bool launch_batching_enabled();

// Records a launch of `func` (a __global__ function's host stub) with the kernel parameters
// `args` (pointers to the values, whose sizes are `sizes`) on `stream` of `device`. Returns
// false when it declines (batching off, capture, too many argument bytes): then the queue
// has been flushed and the caller launches now.
bool defer_launch(const void* func, dim3 grid, dim3 block, cudaStream_t stream, int device, void* const* args,
                  const size_t* sizes, int nargs);

}  // namespace tg::cuda::detail
