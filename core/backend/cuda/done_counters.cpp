// The "blocks done" counters of done_counters.h.
#include <tapegrad/core/backend/cuda/done_counters.h>

#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include <tapegrad/core/backend/cuda/runtime.h>

namespace tg::cuda::detail {
namespace {

struct Counters {
  std::mutex mu;
  std::map<std::pair<int, cudaStream_t>, DataPtr> by_stream;
};
Counters& counters() {
  static Counters* c = std::make_unique<Counters>().release();  // outlives static destructors
  return *c;
}

// The arena of the tg::cuda::Graph capture this thread runs (the capture mode is
// thread-local, so only this thread's launches can belong to it).
struct CaptureArena {
  int device = -1;
  unsigned long long capture_id = 0;
  unsigned* base = nullptr;
  int size = 0;
  int used = 0;
};
thread_local CaptureArena tls_arena;

// n counters from the arena, or null when none is registered for the capture `stream`
// belongs to (another capture on this thread) or it is used up.
unsigned* from_arena(int device, cudaStream_t stream, int n) {
  CaptureArena& a = tls_arena;
  if (!a.base || a.device != device || a.size - a.used < n) return nullptr;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  if (cudaStreamGetCaptureInfo(stream, &status, &id) != cudaSuccess) {
    (void)cudaGetLastError();  // the fallback path reports what is wrong with the stream
    return nullptr;
  }
  if (status != cudaStreamCaptureStatusActive || id != a.capture_id) return nullptr;
  unsigned* p = a.base + a.used;
  a.used += n;
  return p;
}

}  // namespace

void set_capture_counter_arena(int device, unsigned long long capture_id, unsigned* base, int size) {
  tls_arena = CaptureArena{device, capture_id, base, size, 0};
}

void clear_capture_counter_arena(unsigned long long capture_id) {
  if (tls_arena.capture_id == capture_id) tls_arena = CaptureArena{};
}

unsigned* done_counters(int device, cudaStream_t stream, int n, DataPtr& own) {
  TG_CHECK(n >= 1 && n <= kMaxDoneCounters, "done_counters: ", n, " counters asked, 1 to ", kMaxDoneCounters,
           " available");
  constexpr size_t kBytes = sizeof(unsigned) * kMaxDoneCounters;
  if (current_stream_capturing(device)) {
    if (unsigned* p = from_arena(device, stream, n)) return p;
    own = device_allocate(sizeof(unsigned) * static_cast<size_t>(n), device);
    TG_CUDA_CHECK(cudaMemsetAsync(own.get(), 0, sizeof(unsigned) * static_cast<size_t>(n), stream));
    return static_cast<unsigned*>(own.get());
  }
  Counters& c = counters();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.by_stream.find({device, stream});
  if (it == c.by_stream.end()) {
    DataPtr p = device_allocate(kBytes, device);
    TG_CUDA_CHECK(cudaMemsetAsync(p.get(), 0, kBytes, stream));
    it = c.by_stream.emplace(std::make_pair(device, stream), std::move(p)).first;
  }
  return static_cast<unsigned*>(it->second.get());
}

void release_done_counters(int device, cudaStream_t stream) noexcept {
  DataPtr p;
  Counters& c = counters();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.by_stream.find({device, stream});
  if (it == c.by_stream.end()) return;
  p = std::move(it->second);
  c.by_stream.erase(it);
}

}  // namespace tg::cuda::detail
