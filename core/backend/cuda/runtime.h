// Internal CUDA runtime helpers shared by the front-ends and the CUDA kernels:
// checked calls, per-thread current streams, the caching allocators, and
// host<->device copies. Compiled only with TG_CUDA.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <tapegrad/core/error.h>
#include <tapegrad/core/storage.h>

namespace tg::cuda::detail {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t st, const char* call, const char* file, int line);

}  // namespace tg::cuda::detail

// Every CUDA runtime / cuBLAS status is checked and becomes a tg::Error naming the call.
#define TG_CUDA_CHECK(expr)                                                              \
  do {                                                                                   \
    cudaError_t tg_err_ = (expr);                                                        \
    if (tg_err_ != cudaSuccess) [[unlikely]]                                             \
      ::tg::cuda::detail::throw_cuda_error(tg_err_, #expr, __FILE__, __LINE__);          \
  } while (0)
#define TG_CUBLAS_CHECK(expr)                                                            \
  do {                                                                                   \
    cublasStatus_t tg_st_ = (expr);                                                      \
    if (tg_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                    \
      ::tg::cuda::detail::throw_cublas_error(tg_st_, #expr, __FILE__, __LINE__);         \
  } while (0)
// After every kernel launch.
#define TG_CUDA_CHECK_LAUNCH() TG_CUDA_CHECK(cudaGetLastError())

namespace tg::cuda::detail {

// Ensures the device is current for a scope (cheap when it already is). Every CUDA op takes one
// to run on its operands' device; while one lives, the thread is inside a CUDA op and the
// elementwise launches it makes are not deferred (launch_queue.h).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_;
};

// The current stream of `device` (-1: the current device) for work about to be enqueued on
// it: deferred launches (launch_queue.h) are flushed first, so the work runs after them.
cudaStream_t current_stream_handle(int device);
// The same without flushing, for the allocator (which enqueues nothing) and for launches that
// may themselves be deferred.
cudaStream_t current_stream_noflush(int device);

// Whether kernels launched through launch_dependent (dependent_launch.cuh) may overlap the
// previous kernel's tail on `device`: sm_90+, unless TG_DEPENDENT_LAUNCH=0 in the environment or
// set_dependent_launch(false) (on by default; an A/B switch for
// benchmarks and tests: set it between steps).
bool dependent_launch(int device);
bool dependent_launch_setting();
void set_dependent_launch(bool on);

// Whether the current stream of `device` is being captured into a CUDA graph (then nothing
// may synchronise with the host, so host-side checks that read device data are skipped).
bool current_stream_capturing(int device);

// Stream-aware caching device allocator (one per device).
DataPtr device_allocate(size_t nbytes, int device);
// Registers it as the allocator of CUDA devices (get_allocator, core/storage.h); CudaBackend's
// constructor calls it, so it is registered before backend::cuda() first returns.
void register_device_allocator();
// Record that a block is used on another stream (so it is not reused before that work ends).
void record_stream(const DataPtr& ptr, cudaStream_t stream);

// Graph-private pools of the caching allocator (used by tg::cuda::Graph). Between
// capture_begin and capture_end, this thread's allocations on `device` come from
// `pool`, and the blocks it frees stay there. release hands a dead graph's memory
// back to the general cache; call it only once no replay can still be running.
uint64_t graph_pool_create(int device);
void graph_pool_capture_begin(int device, uint64_t pool);
void graph_pool_capture_end(int device);
void graph_pool_release(int device, uint64_t pool);

// Caching host allocator: pinned memory when a GPU is present (so copies run at
// DMA speed), plain aligned memory otherwise; freed blocks are reused.
DataPtr host_allocate(size_t nbytes);
bool is_pinned(const void* ptr);
// Marks pinned memory from host_allocate (any address inside a block) as read or
// written by queued work on `stream`: the block is not reused before that work ends.
void record_host_use(const void* host_ptr, cudaStream_t stream);
// Frees the cached, unused pinned blocks (part of tg::cuda::empty_cache()).
void empty_host_cache();

// Contiguous byte copies on the current stream of `device`. Copies into or out
// of pageable memory go through pinned staging buffers in chunks, overlapping
// the DMA with the host memcpy. Blocking unless non_blocking and pinned.
void copy_h2d(void* dst, const void* src, size_t nbytes, int device, bool non_blocking = false);
void copy_d2h(void* dst, const void* src, size_t nbytes, int device, bool non_blocking = false);
void copy_d2d(void* dst, int dst_device, const void* src, int src_device, size_t nbytes);

cublasHandle_t cublas_handle(int device);       // bound to the current stream
cublasLtHandle_t cublaslt_handle(int device);
void* cublas_workspace(int device, size_t* nbytes);  // per device/stream workspace
// A reference that keeps the cuBLAS workspace of (device, stream) alive (null when it has none):
// a graph captured on the stream holds one, since its replays use that memory.
std::shared_ptr<void> cublas_workspace_ref(int device, cudaStream_t stream);
// Drops what tapegrad keeps per stream (the cuBLAS workspace, the done counters of
// done_counters.h) when the stream is destroyed, after its work finished. Never throws.
void release_stream_resources(int device, cudaStream_t stream) noexcept;

}  // namespace tg::cuda::detail
