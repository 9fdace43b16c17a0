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
// Only an elementwise op or a deferrable gemm called from outside every other CUDA op is deferred
// (the rule is kept in one place, CudaBackend's elementwise and gemm, by DeferScope): any other op may take a
// stream handle, run elementwise steps of its own and launch on the handle afterwards, and
// those steps must already be on the stream. "Inside a CUDA op" is counted by DeviceGuard,
// which every CUDA op takes to run on its operands' device (runtime.h): no op code knows the
// queue (tests/core/launch_batching_test.cpp, OpUnawareOfTheQueueIsExact). No launch is deferred
// while the stream is being captured into a graph (a deferred call may be: it runs on the stream
// itself, and Graph::capture_end flushes it into the capture). TG_LAUNCH_BATCHING=0 in the environment
// turns batching off for the process.
//
// A deferred call is a library call (a cuBLASLt matmul, blas.cpp) that waits in the same queue, in
// order with the launches, so that the op after it may still amend it before it is enqueued: a
// linear's gemm takes a following GELU (half types) or ReLU (float32) as its epilogue
// (Backend::fuse_into_deferred_gemm), and a residual add the norm after it (normalization.cu's
// DeferredAdd). Whoever
// defers a call has already flushed what came before (it took the stream handle).
#pragma once
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

namespace tg {
class Tensor;
}

namespace tg::cuda::detail {

inline constexpr int kMaxBatch = 64;          // launches per flush
inline constexpr int kMaxDeferredArgs = 8;    // kernel parameters of one deferred launch
inline constexpr size_t kMaxArgBytes = 1024;  // their bytes, each at 16-byte alignment

extern std::atomic<bool> g_launches_pending;

// How many CUDA ops are running on this thread: DeviceGuards alive (runtime.cpp keeps it).
inline thread_local int tls_cuda_op_depth = 0;
// Whether this thread's launches may be deferred now: only inside an elementwise op or a
// deferrable gemm that started outside every other CUDA op. Held by CudaBackend's elementwise
// and gemm alone.
inline thread_local bool tls_defer_allowed = false;
class DeferScope {
 public:
  explicit DeferScope(bool wanted = true) : prev_(tls_defer_allowed) {
    tls_defer_allowed = wanted && tls_cuda_op_depth == 0;
  }
  ~DeferScope() { tls_defer_allowed = prev_; }
  DeferScope(const DeferScope&) = delete;
  DeferScope& operator=(const DeferScope&) = delete;

 private:
  bool prev_;
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

// A call waiting in the queue. run(stream) enqueues its work on `stream` at the flush, with the
// queue's device current and the queue's lock held: it may not flush, synchronise or look up a
// stream (it may throw tg::Error; the queue is emptied either way).
class DeferredCall {
 public:
  virtual ~DeferredCall() = default;
  virtual void run(cudaStream_t stream) = 0;
};

// Queues `call` on (stream, device) like a deferred launch. Returns false (the queue flushed,
// `call` untouched) where a launch would not be deferred: batching off, inside another CUDA op,
// or the stream capturing; the caller then runs it now.
bool defer_call(std::unique_ptr<DeferredCall>& call, cudaStream_t stream, int device);

// A CUDA tensor's data address (storage offset applied; null when undefined) without
// Tensor::data_ptr(), which flushes the queue: for an op that looks for its operand among the
// queue's deferred calls before anything runs (fuse_into_deferred_gemm, a norm absorbing an add).
void* address_noflush(const Tensor& t);

// Calls amend(c) under the queue's lock when the queue's last entry is a deferred call c on
// (stream, device), and returns what amend returned; false when there is none.
bool amend_last_call(cudaStream_t stream, int device, const std::function<bool(DeferredCall&)>& amend);

}  // namespace tg::cuda::detail
