// Host<->device and device<->device byte copies on the current stream.
// Pinned host memory: one cudaMemcpyAsync (DMA at full speed). Pageable memory:
// large copies are chunked through two pinned staging buffers per device so the
// DMA of one chunk overlaps the host memcpy of the other (the host side is split
// over the CPU backend's threads, which also spreads first-touch page faults);
// small ones go through the driver's own staging.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include <tapegrad/core/backend/cuda/runtime.h>
#include <tapegrad/core/cuda.h>
#include <tapegrad/core/ops.h>

namespace tg::cuda::detail {
namespace {

constexpr size_t kSmallCopy = 256 << 10;  // below this, the driver's staging is as good
constexpr size_t kChunk = 16 << 20;       // staging chunk
constexpr int kStagingBuffers = 2;
constexpr size_t kParallelPiece = 1 << 20;  // host memcpy split into pieces of this size

struct Staging {
  std::mutex mu;  // one chunked copy per device at a time
  bool ready = false;
  std::array<void*, kStagingBuffers> buf{};
  std::array<cudaEvent_t, kStagingBuffers> done{};  // last DMA that used buf[i]
};

// Never destroyed (the pinned buffers live as long as the process).
Staging& staging(int device) {
  static auto* all = [] {
    auto v = std::make_unique<std::vector<std::unique_ptr<Staging>>>();
    for (int d = 0; d < device_count(); ++d) v->push_back(std::make_unique<Staging>());
    return v.release();
  }();
  TG_CHECK(device >= 0 && device < static_cast<int>(all->size()), "copy: invalid CUDA device ", device);
  Staging& s = *(*all)[device];
  return s;
}

// Caller holds s.mu and has the device current.
void init_staging(Staging& s) {
  if (s.ready) return;
  for (int i = 0; i < kStagingBuffers; ++i) {
    TG_CUDA_CHECK(cudaHostAlloc(&s.buf[i], kChunk, cudaHostAllocPortable));
    TG_CUDA_CHECK(cudaEventCreateWithFlags(&s.done[i], cudaEventDisableTiming));
  }
  s.ready = true;
}

void host_memcpy(void* dst, const void* src, size_t n) {
  if (n <= 2 * kParallelPiece) {
    std::memcpy(dst, src, n);
    return;
  }
  const auto pieces = static_cast<int64_t>((n + kParallelPiece - 1) / kParallelPiece);
  tg::parallel_for(0, pieces, 1, [&](int64_t lo, int64_t hi) {
    const size_t begin = static_cast<size_t>(lo) * kParallelPiece;
    const size_t end = std::min(n, static_cast<size_t>(hi) * kParallelPiece);
    std::memcpy(static_cast<char*>(dst) + begin, static_cast<const char*>(src) + begin, end - begin);
  });
}

// Destroying a recorded event is fine: CUDA releases it once it completes.
struct EventDestroy {
  void operator()(cudaEvent_t e) const { (void)cudaEventDestroy(e); }
};
using EventHandle = std::unique_ptr<CUevent_st, EventDestroy>;

EventHandle make_event(int device) {
  DeviceGuard g(device);
  cudaEvent_t e = nullptr;
  TG_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return EventHandle(e);
}

int resolve(int device) {
  if (device >= 0) return device;
  int d = 0;
  TG_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

}  // namespace

void copy_h2d(void* dst, const void* src, size_t nbytes, int device, bool non_blocking) {
  if (nbytes == 0) return;
  TG_CHECK(dst && src, "copy_h2d: null pointer for a copy of ", nbytes, " bytes");
  device = resolve(device);
  DeviceGuard g(device);
  cudaStream_t stream = current_stream_handle(device);
  if (is_pinned(src)) {
    TG_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, stream));
    if (non_blocking)
      record_host_use(src, stream);
    else
      TG_CUDA_CHECK(cudaStreamSynchronize(stream));
    return;
  }
  if (nbytes < kSmallCopy) {
    // The driver has consumed the pageable source when this returns.
    TG_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, stream));
    if (!non_blocking) TG_CUDA_CHECK(cudaStreamSynchronize(stream));
    return;
  }
  Staging& s = staging(device);
  std::lock_guard<std::mutex> lock(s.mu);
  init_staging(s);
  for (size_t off = 0, i = 0; off < nbytes; off += kChunk, ++i) {
    const int b = static_cast<int>(i % kStagingBuffers);
    const size_t n = std::min(kChunk, nbytes - off);
    TG_CUDA_CHECK(cudaEventSynchronize(s.done[b]));  // the DMA that last read buf[b] is over
    host_memcpy(s.buf[b], static_cast<const char*>(src) + off, n);
    TG_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + off, s.buf[b], n, cudaMemcpyHostToDevice, stream));
    TG_CUDA_CHECK(cudaEventRecord(s.done[b], stream));
  }
  // The source is fully consumed; the staging events protect the buffers' next use.
  if (!non_blocking) TG_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void copy_d2h(void* dst, const void* src, size_t nbytes, int device, bool non_blocking) {
  if (nbytes == 0) return;
  TG_CHECK(dst && src, "copy_d2h: null pointer for a copy of ", nbytes, " bytes");
  device = resolve(device);
  DeviceGuard g(device);
  cudaStream_t stream = current_stream_handle(device);
  if (is_pinned(dst)) {
    TG_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, stream));
    if (non_blocking)
      record_host_use(dst, stream);
    else
      TG_CUDA_CHECK(cudaStreamSynchronize(stream));
    return;
  }
  if (nbytes < kSmallCopy) {
    TG_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, stream));
    TG_CUDA_CHECK(cudaStreamSynchronize(stream));
    return;
  }
  Staging& s = staging(device);
  std::lock_guard<std::mutex> lock(s.mu);
  init_staging(s);
  const size_t nchunks = (nbytes + kChunk - 1) / kChunk;
  auto enqueue = [&](size_t i) {
    const int b = static_cast<int>(i % kStagingBuffers);
    const size_t off = i * kChunk;
    const size_t n = std::min(kChunk, nbytes - off);
    // Earlier (maybe non-blocking h2d) copies through buf[b] must finish first.
    TG_CUDA_CHECK(cudaStreamWaitEvent(stream, s.done[b], 0));
    TG_CUDA_CHECK(cudaMemcpyAsync(s.buf[b], static_cast<const char*>(src) + off, n, cudaMemcpyDeviceToHost, stream));
    TG_CUDA_CHECK(cudaEventRecord(s.done[b], stream));
  };
  for (size_t i = 0; i < std::min<size_t>(kStagingBuffers, nchunks); ++i) enqueue(i);
  for (size_t i = 0; i < nchunks; ++i) {
    const int b = static_cast<int>(i % kStagingBuffers);
    const size_t off = i * kChunk;
    const size_t n = std::min(kChunk, nbytes - off);
    TG_CUDA_CHECK(cudaEventSynchronize(s.done[b]));
    host_memcpy(static_cast<char*>(dst) + off, s.buf[b], n);
    if (i + kStagingBuffers < nchunks) enqueue(i + kStagingBuffers);
  }
}

void copy_d2d(void* dst, int dst_device, const void* src, int src_device, size_t nbytes) {
  if (nbytes == 0) return;
  TG_CHECK(dst && src, "copy_d2d: null pointer for a copy of ", nbytes, " bytes");
  dst_device = resolve(dst_device);
  src_device = resolve(src_device);
  if (dst_device == src_device) {
    DeviceGuard g(dst_device);
    TG_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, current_stream_handle(dst_device)));
    return;
  }
  // Across devices: run on the source's stream, ordered after the destination
  // stream's queued work, and make the destination stream wait for the copy.
  cudaStream_t src_stream = current_stream_handle(src_device);
  cudaStream_t dst_stream = current_stream_handle(dst_device);
  EventHandle dst_ready = make_event(dst_device), copied = make_event(src_device);
  {
    DeviceGuard g(dst_device);  // a null stream means the current device's legacy stream
    TG_CUDA_CHECK(cudaEventRecord(dst_ready.get(), dst_stream));
  }
  {
    DeviceGuard g(src_device);
    TG_CUDA_CHECK(cudaStreamWaitEvent(src_stream, dst_ready.get(), 0));
    TG_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, nbytes, src_stream));
    TG_CUDA_CHECK(cudaEventRecord(copied.get(), src_stream));
  }
  DeviceGuard g(dst_device);
  TG_CUDA_CHECK(cudaStreamWaitEvent(dst_stream, copied.get(), 0));
}

}  // namespace tg::cuda::detail
