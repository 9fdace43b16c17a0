// The caching pinned host allocator: page-locked memory (cudaHostAlloc) so that
// host<->device copies run at DMA speed, cached by size because pinning is slow
// (milliseconds for large blocks). Without a GPU it hands out the CPU backend's
// host memory instead.
//
// Reuse safety: a pinned block may still be read or written by an asynchronous
// copy when its tensor dies. Our copy functions (copy.cpp) are the only code that
// starts such copies without waiting; they call record_host_use(), which records
// an event on the copy's stream into the block. A freed block with unfinished
// events waits in a pending list and is reused only when they have completed.
// Code that launches its own async copies from this memory must do the same.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <tapegrad/core/backend/cpu/cpu.h>
#include <tapegrad/core/backend/cuda/runtime.h>
#include <tapegrad/core/cuda.h>
#include <tapegrad/core/shape.h>

namespace tg::cuda::detail {
namespace {

constexpr size_t kHostRound = 512;
// A cached block serves a request when it is at most this much larger (bounded waste).
constexpr size_t kMinReuseSlack = 64 << 10;

struct HostEvent {
  cudaEvent_t event;
  int device;
};

struct HostBlock {
  void* ptr = nullptr;
  size_t size = 0;
  bool allocated = false;
  std::vector<HostEvent> events;  // queued work on streams that uses this block
};

void host_block_deleter(void* ctx);

class HostCache {
 public:
  DataPtr allocate(size_t nbytes) {
    if (nbytes == 0) return DataPtr(nullptr, nullptr, nullptr, Device(kCPU));
    const size_t size = (nbytes + kHostRound - 1) / kHostRound * kHostRound;
    std::lock_guard<std::mutex> lock(mu_);
    if (!pending_.empty()) process_pending();
    HostBlock* b = nullptr;
    auto it = free_.lower_bound(size);
    if (it != free_.end() && it->first <= std::max(2 * size, size + kMinReuseSlack)) {
      b = it->second;
      free_.erase(it);
    } else {
      b = new_block(size);
    }
    b->allocated = true;
    return DataPtr(b->ptr, b, &host_block_deleter, Device(kCPU));
  }

  void free(HostBlock* b) {
    std::lock_guard<std::mutex> lock(mu_);
    b->allocated = false;
    if (drop_finished_events(b))
      free_.emplace(b->size, b);
    else
      pending_.push_back(b);
  }

  void record_use(const void* p, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.upper_bound(reinterpret_cast<uintptr_t>(p));
    if (it == blocks_.begin()) return;
    --it;
    HostBlock* b = it->second;
    if (!b->allocated || reinterpret_cast<uintptr_t>(p) >= it->first + b->size) return;  // not ours
    drop_finished_events(b);  // keeps the list short under repeated async copies
    int device = 0;
    TG_CUDA_CHECK(cudaGetDevice(&device));  // the caller has the stream's device current
    cudaEvent_t ev = take_event(device);
    TG_CUDA_CHECK(cudaEventRecord(ev, stream));
    b->events.push_back({ev, device});
  }

  void empty() {
    std::lock_guard<std::mutex> lock(mu_);
    process_pending();
    release_free_locked();
  }

 private:
  HostBlock* new_block(size_t size) {
    void* p = nullptr;
    // Portable: pinned for every device's context, not only the current one.
    cudaError_t err = cudaHostAlloc(&p, size, cudaHostAllocPortable);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      release_free_locked();
      err = cudaHostAlloc(&p, size, cudaHostAllocPortable);
      if (err != cudaSuccess) (void)cudaGetLastError();
      TG_CHECK(err == cudaSuccess, "host_allocate: cudaHostAlloc of ", size,
               " bytes of pinned memory failed: ", cudaGetErrorString(err));
    }
    HostBlock* b = nullptr;
    if (!spare_blocks_.empty()) {
      b = spare_blocks_.back();
      spare_blocks_.pop_back();
    } else {
      b = &storage_.emplace_back();
    }
    b->ptr = p;
    b->size = size;
    blocks_.emplace(reinterpret_cast<uintptr_t>(p), b);
    return b;
  }

  void release_free_locked() {
    for (auto& [size, b] : free_) {
      if (cudaFreeHost(b->ptr) != cudaSuccess) (void)cudaGetLastError();
      blocks_.erase(reinterpret_cast<uintptr_t>(b->ptr));
      *b = HostBlock{};
      spare_blocks_.push_back(b);
    }
    free_.clear();
  }

  // Drops completed events; true when none is left.
  bool drop_finished_events(HostBlock* b) {
    auto& evs = b->events;
    for (size_t i = 0; i < evs.size();) {
      cudaError_t err = cudaEventQuery(evs[i].event);
      if (err == cudaErrorNotReady) {
        ++i;
        continue;
      }
      if (err != cudaSuccess) (void)cudaGetLastError();  // a failed stream: the memory is no longer in use
      spare_events_.push_back(evs[i]);
      evs[i] = evs.back();
      evs.pop_back();
    }
    return evs.empty();
  }

  void process_pending() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (drop_finished_events(*it)) {
        free_.emplace((*it)->size, *it);
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }

  cudaEvent_t take_event(int device) {
    for (size_t i = 0; i < spare_events_.size(); ++i) {
      if (spare_events_[i].device == device) {
        cudaEvent_t e = spare_events_[i].event;
        spare_events_[i] = spare_events_.back();
        spare_events_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    TG_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  std::mutex mu_;
  std::multimap<size_t, HostBlock*> free_;  // cached, reusable now
  std::map<uintptr_t, HostBlock*> blocks_;  // every pinned block by address
  std::deque<HostBlock*> pending_;          // freed, waiting for their events
  std::deque<HostBlock> storage_;
  std::vector<HostBlock*> spare_blocks_;
  std::vector<HostEvent> spare_events_;
};

// Never destroyed: pinned tensors in statics may be freed during process teardown.
HostCache& host_cache() {
  static HostCache* cache = std::make_unique<HostCache>().release();
  return *cache;
}

void host_block_deleter(void* ctx) {
  try {
    host_cache().free(static_cast<HostBlock*>(ctx));
  } catch (const std::exception& e) {
    ::tg::detail::log_warning(::tg::detail::str_cat("pinned host allocator: free failed: ", e.what()));
  }
}

}  // namespace

DataPtr host_allocate(size_t nbytes) {
  TG_CHECK(nbytes <= tg::detail::kMaxStorageBytes, "pinned host allocator: request of ", nbytes,
           " bytes is larger than 2^62");
  if (!is_available()) return tg::cpu::host_allocator()->allocate(nbytes);
  return host_cache().allocate(nbytes);
}

bool is_pinned(const void* ptr) {
  if (!ptr || !is_available()) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
}

void record_host_use(const void* host_ptr, cudaStream_t stream) {
  if (!is_available()) return;
  host_cache().record_use(host_ptr, stream);
}

void empty_host_cache() {
  if (!is_available()) return;
  host_cache().empty();
}

}  // namespace tg::cuda::detail
