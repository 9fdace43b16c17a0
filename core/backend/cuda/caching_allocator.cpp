// The stream-aware caching device allocator (one per device), after the ideas of
// PyTorch's CUDACachingAllocator: cudaMalloc'd segments are carved into blocks,
// freed blocks stay cached and are reused by later requests on the same stream.
//  - sizes are rounded up to 512 bytes; requests <= 1 MiB come from the small pool
//    (2 MiB segments), larger ones from the large pool (>= 20 MiB segments);
//  - best fit in a set ordered by (stream, size, address); the remainder of a
//    split stays cached; free neighbours merge back together;
//  - a block used on other streams (record_stream) is reusable only once events
//    recorded on those streams at free time have completed;
//  - on out-of-memory the cache is released and the cudaMalloc retried once;
//  - CUDA graphs (core/cuda_graph.h) get private pools: while a thread captures on a
//    device, its allocations there come from the graph's pool and the blocks it frees
//    stay in that pool, so replays never write into memory someone else was given.
//    The pool's blocks return to the general cache when the graph is destroyed.
// Also the public memory counters of core/cuda.h.
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <string_view>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include <tapegrad/core/backend/cuda/launch_queue.h>
#include <tapegrad/core/backend/cuda/runtime.h>
#include <tapegrad/core/cuda.h>
#include <tapegrad/core/shape.h>

namespace tg::cuda {
namespace detail {
namespace {

constexpr size_t kRound = 512;                    // every block size is a multiple of this
constexpr size_t kSmallSize = 1 << 20;            // requests up to 1 MiB use the small pool
constexpr size_t kSmallSegment = 2 << 20;         // small pool segments are 2 MiB
constexpr size_t kMinLargeAlloc = 10 << 20;       // below this, large requests get a kLargeSegment
constexpr size_t kLargeSegment = 20 << 20;        // 20 MiB large pool segments
constexpr size_t kSegmentRound = 2 << 20;         // bigger segments round up to 2 MiB
constexpr size_t kLargeSplitRemainder = 1 << 20;  // a large block splits only if > 1 MiB would remain

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// The graph pool this thread is capturing into, per device (0: not capturing).
constexpr int kMaxDevices = 64;
thread_local std::array<uint64_t, kMaxDevices> tls_capture_pool{};
uint64_t capture_pool_of_thread(int device) {
  return device >= 0 && device < kMaxDevices ? tls_capture_pool[device] : 0;
}

struct Block {
  void* ptr = nullptr;
  size_t size = 0;
  cudaStream_t stream = nullptr;
  int device = 0;
  bool small = false;
  bool allocated = false;
  uint64_t pool = 0;       // 0: the general cache; otherwise the id of a graph-private pool
  int pending_events = 0;  // cross-stream uses not yet finished (after free)
  Block* prev = nullptr;   // neighbours inside the same segment
  Block* next = nullptr;
  std::vector<cudaStream_t> stream_uses;  // other streams the block was used on
};

struct BlockLess {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return reinterpret_cast<uintptr_t>(a->stream) < reinterpret_cast<uintptr_t>(b->stream);
    if (a->size != b->size) return a->size < b->size;
    return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
  }
};
using FreeSet = std::set<Block*, BlockLess>;

std::string mib(size_t bytes) { return ::tg::detail::str_cat(static_cast<double>(bytes) / (1 << 20), " MiB"); }

void free_block_deleter(void* ctx);

class DeviceAllocator {
 public:
  explicit DeviceAllocator(int device) : device_(device), no_cache_(caching_disabled()) {}

  DataPtr allocate(size_t nbytes) {
    const Device dev(kCUDA, device_);
    if (nbytes == 0) return DataPtr(nullptr, nullptr, nullptr, dev);
    // Byte counts from shapes are checked against 2^62 before they get here; so no rounding wraps.
    TG_CHECK(nbytes <= tg::detail::kMaxStorageBytes, "cuda allocator: request of ", nbytes,
             " bytes on ", dev, " is larger than 2^62");
    // Allocation enqueues nothing, so deferred launches stay deferred (launch_queue.h).
    cudaStream_t stream = current_stream_noflush(device_);
    const uint64_t capture = capture_pool_of_thread(device_);
    // Without caching every block is its own cudaMalloc of exactly nbytes, so that
    // compute-sanitizer's memcheck sees each tensor's real bounds (graph pools still split).
    const size_t size = no_cache_ && !capture ? nbytes : round_up(nbytes, kRound);
    const bool small = size <= kSmallSize;

    std::lock_guard<std::mutex> lock(mu_);
    Block* block = nullptr;
    if (capture) {
      // No event queries while capturing (they may conflict with the capture).
      block = find_free(free_set(capture, small), stream, size);
      if (!block) {
        // A cached block of the capture stream is idle (capture_begin synchronised the
        // device), so the graph's pool may take it over until the graph dies.
        block = find_free(small ? small_free_ : large_free_, stream, size);
        if (block) block->pool = capture;
      }
      if (!block) block = new_segment(size, small, stream, capture);
    } else {
      if (!pending_.empty()) process_events();
      if (!no_cache_) block = find_free(small ? small_free_ : large_free_, stream, size);
      if (!block) block = new_segment(size, small, stream, 0);
    }
    if (should_split(block, size)) split(block, size, free_set(block->pool, small));
    block->allocated = true;
    allocated_ += block->size;
    if (allocated_ > peak_) peak_ = allocated_;
    return DataPtr(block->ptr, block, &free_block_deleter, dev);
  }

  void free(Block* block) {
    const uint64_t capture = capture_pool_of_thread(device_);
    std::lock_guard<std::mutex> lock(mu_);
    block->allocated = false;
    allocated_ -= block->size;
    if (capture) {
      // Freed by the capturing thread: captured kernels may still touch this memory at
      // every replay, so it stays with the graph (no events: the capture is one stream,
      // and other streams' earlier uses ended when capture_begin synchronised).
      block->stream_uses.clear();
      if (block->pool == 0) block->pool = capture;
      release_to_pool(block);
      return;
    }
    if (!block->stream_uses.empty()) {
      // Used on other streams: the memory is reusable only after their queued work ends
      // (including launches still deferred).
      flush_launches();
      DeviceGuard g(device_);
      for (cudaStream_t s : block->stream_uses) {
        cudaEvent_t ev = take_event();
        TG_CUDA_CHECK(cudaEventRecord(ev, s));
        pending_.push_back({ev, block});
        ++block->pending_events;
      }
      block->stream_uses.clear();
      return;
    }
    release_to_pool(block);
  }

  void record_stream(Block* block, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stream == block->stream) return;
    for (cudaStream_t s : block->stream_uses)
      if (s == stream) return;
    block->stream_uses.push_back(stream);
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    DeviceGuard g(device_);
    release_cached();
  }

  uint64_t create_graph_pool() {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t id = next_pool_id_++;
    graph_pools_[id];
    return id;
  }

  // Returns a dead graph's memory to the general cache. The caller synchronised the
  // device, so no replay still uses it. Blocks still held by tensors join the general
  // cache when those tensors die.
  void release_graph_pool(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = graph_pools_.find(id);
    if (it == graph_pools_.end()) return;
    std::vector<Block*> cached;
    for (Block& b : block_storage_) {
      if (!b.ptr || b.pool != id) continue;
      if (b.allocated || b.pending_events > 0)
        b.pool = 0;
      else
        cached.push_back(&b);
    }
    graph_pools_.erase(it);
    // One at a time: a block still tagged with the pool never merges, so none is
    // recycled before its turn.
    for (Block* b : cached) {
      b->pool = 0;
      release_to_pool(b);
    }
  }

  size_t allocated() {
    std::lock_guard<std::mutex> lock(mu_);
    return allocated_;
  }
  size_t peak() {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
  }
  size_t reserved() {
    std::lock_guard<std::mutex> lock(mu_);
    return reserved_;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    peak_ = allocated_;
  }

 private:
  struct PendingEvent {
    cudaEvent_t event;
    Block* block;
  };

  static Block* find_free(FreeSet& pool, cudaStream_t stream, size_t size) {
    Block key;
    key.stream = stream;
    key.size = size;
    key.ptr = nullptr;
    auto it = pool.lower_bound(&key);
    if (it == pool.end() || (*it)->stream != stream) return nullptr;
    Block* b = *it;
    pool.erase(it);
    return b;
  }

  static bool should_split(const Block* b, size_t size) {
    const size_t rest = b->size - size;
    return b->small ? rest >= kRound : rest > kLargeSplitRemainder;
  }

  void split(Block* b, size_t size, FreeSet& pool) {
    Block* rest = make_block();
    rest->ptr = static_cast<char*>(b->ptr) + size;
    rest->size = b->size - size;
    rest->stream = b->stream;
    rest->device = b->device;
    rest->small = b->small;
    rest->pool = b->pool;
    rest->prev = b;
    rest->next = b->next;
    if (b->next) b->next->prev = rest;
    b->next = rest;
    b->size = size;
    pool.insert(rest);
  }

  // A neighbour can merge only when it is cached (free with no pending event) in the same pool.
  static bool mergeable(const Block* b, const Block* n) {
    return n && !n->allocated && n->pending_events == 0 && n->pool == b->pool;
  }

  // The free set of the general cache (pool 0) or of a live graph pool.
  FreeSet& free_set(uint64_t pool, bool small) {
    if (pool == 0) return small ? small_free_ : large_free_;
    auto it = graph_pools_.find(pool);
    TG_CHECK(it != graph_pools_.end(), "CUDA caching allocator: graph memory pool ", pool, " of device ", device_,
             " does not exist (the tg::cuda::Graph was destroyed?)");
    return small ? it->second.small_free : it->second.large_free;
  }

  void release_to_pool(Block* b) {
    FreeSet& pool = free_set(b->pool, b->small);
    if (mergeable(b, b->prev)) {
      Block* p = b->prev;
      pool.erase(p);
      p->size += b->size;
      p->next = b->next;
      if (b->next) b->next->prev = p;
      recycle(b);
      b = p;
    }
    if (mergeable(b, b->next)) {
      Block* n = b->next;
      pool.erase(n);
      b->size += n->size;
      b->next = n->next;
      if (n->next) n->next->prev = b;
      recycle(n);
    }
    if (no_cache_ && b->pool == 0 && !b->prev && !b->next && !must_cache()) {
      // Nothing is cached: the segment goes back to CUDA once the work queued on it is done.
      flush_launches();
      DeviceGuard g(device_);
      TG_CUDA_CHECK(cudaDeviceSynchronize());
      TG_CUDA_CHECK(cudaFree(b->ptr));
      reserved_ -= b->size;
      recycle(b);
      return;
    }
    pool.insert(b);
  }

  Block* new_segment(size_t size, bool small, cudaStream_t stream, uint64_t pool) {
    size_t seg = small ? kSmallSegment : (size < kMinLargeAlloc ? kLargeSegment : round_up(size, kSegmentRound));
    if (no_cache_ && pool == 0) seg = size;
    DeviceGuard g(device_);
    void* ptr = nullptr;
    if (pool) {
      // cudaMalloc is not a stream operation, so a capture would refuse it: the thread
      // switches to the relaxed capture mode for this one call. The segment belongs to
      // the graph's pool until the graph dies, which keeps its replays valid.
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      TG_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
      const cudaError_t err = cudaMalloc(&ptr, seg);
      const cudaError_t restore = cudaThreadExchangeStreamCaptureMode(&mode);
      if (err != cudaSuccess) {
        (void)cudaGetLastError();
        TG_CHECK(err != cudaErrorMemoryAllocation, "CUDA out of memory during CUDA graph capture: tried to allocate ",
                 size, " bytes (", mib(size), ") on device ", device_, "; ", allocated_, " bytes allocated, ",
                 reserved_, " bytes reserved (the cache cannot be released while capturing)");
        TG_CUDA_CHECK(err);
      }
      if (restore != cudaSuccess) {
        (void)cudaFree(ptr);
        TG_CUDA_CHECK(restore);
      }
      reserved_ += seg;
      Block* b = make_block();
      b->ptr = ptr;
      b->size = seg;
      b->stream = stream;
      b->device = device_;
      b->small = small;
      b->pool = pool;
      return b;
    }
    cudaError_t err = cudaMalloc(&ptr, seg);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_cached();  // synchronizes, then frees every unused cached segment
      err = cudaMalloc(&ptr, seg);
      if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        (void)cudaMemGetInfo(&free_b, &total_b);
        (void)cudaGetLastError();
        TG_ERROR("CUDA out of memory: tried to allocate ", size, " bytes (", mib(size), ") on device ", device_, "; ",
                 allocated_, " bytes allocated, ", reserved_, " bytes reserved/held by tapegrad on device ", device_,
                 " (device free ", free_b, " of ", total_b, " bytes)");
      }
    }
    TG_CUDA_CHECK(err);
    reserved_ += seg;
    Block* b = make_block();
    b->ptr = ptr;
    b->size = seg;
    b->stream = stream;
    b->device = device_;
    b->small = small;
    return b;
  }

  // Frees every cached segment that is wholly unused. Caller holds mu_ and the device guard.
  void release_cached() {
    // The cached blocks may still be read by queued (or deferred) kernels of their own stream.
    flush_launches();
    TG_CUDA_CHECK(cudaDeviceSynchronize());
    process_events();
    for (FreeSet* pool : {&small_free_, &large_free_}) {
      for (auto it = pool->begin(); it != pool->end();) {
        Block* b = *it;
        if (b->prev || b->next) {  // part of a segment still in use
          ++it;
          continue;
        }
        TG_CUDA_CHECK(cudaFree(b->ptr));
        reserved_ -= b->size;
        it = pool->erase(it);
        recycle(b);
      }
    }
  }

  // Returns to the pools the blocks whose cross-stream uses have completed.
  void process_events() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      cudaError_t err = cudaEventQuery(it->event);
      if (err == cudaErrorNotReady) {
        ++it;
        continue;
      }
      TG_CUDA_CHECK(err);
      spare_events_.push_back(it->event);
      Block* b = it->block;
      it = pending_.erase(it);
      if (--b->pending_events == 0) release_to_pool(b);
    }
  }

  cudaEvent_t take_event() {
    if (!spare_events_.empty()) {
      cudaEvent_t e = spare_events_.back();
      spare_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    TG_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  // Block records are pooled (no per-split heap allocation once warm).
  Block* make_block() {
    if (!spare_blocks_.empty()) {
      Block* b = spare_blocks_.back();
      spare_blocks_.pop_back();
      return b;
    }
    return &block_storage_.emplace_back();
  }
  void recycle(Block* b) {
    *b = Block{};
    spare_blocks_.push_back(b);
  }

  // TG_NO_CUDA_MEMORY_CACHING=1 (like PyTorch's PYTORCH_NO_CUDA_MEMORY_CACHING): no block is
  // reused or split, each is its own cudaMalloc, freed as soon as its tensor dies. For
  // compute-sanitizer (scripts/gpu-check --sanitize); slow. Graph pools still cache, since a
  // captured graph's replays need their memory.
  // Whether this thread's current stream is capturing (then no synchronising call is allowed,
  // and a block freed without caching waits in the cache instead), or the process is exiting
  // (the CUDA context may be gone: nothing is freed then).
  bool must_cache() const {
    if (exiting().load()) return true;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(current_stream_noflush(device_), &status) != cudaSuccess) {
      (void)cudaGetLastError();
      return true;
    }
    return status != cudaStreamCaptureStatusNone;
  }
  static std::atomic<bool>& exiting() {
    static std::atomic<bool> flag{false};
    return flag;
  }
  static bool caching_disabled() {
    const char* v = std::getenv("TG_NO_CUDA_MEMORY_CACHING");
    const bool off = v && *v && std::string_view(v) != "0";
    // Registered after the CUDA runtime's own exit handler, so it runs first.
    static const bool registered = off && std::atexit([] { exiting().store(true); }) == 0;
    (void)registered;
    return off;
  }

  int device_;
  bool no_cache_;
  std::mutex mu_;
  FreeSet small_free_, large_free_;
  std::deque<Block> block_storage_;
  std::vector<Block*> spare_blocks_;
  std::deque<PendingEvent> pending_;
  std::vector<cudaEvent_t> spare_events_;
  size_t allocated_ = 0, peak_ = 0, reserved_ = 0;
  struct GraphPool {
    FreeSet small_free, large_free;
  };
  std::map<uint64_t, GraphPool> graph_pools_;
  uint64_t next_pool_id_ = 1;
};

// One allocator per device, created once. Never destroyed: tensors held in
// statics may free their blocks during process teardown, after other statics are gone.
std::vector<std::unique_ptr<DeviceAllocator>>& allocators() {
  static auto* all = [] {
    auto v = std::make_unique<std::vector<std::unique_ptr<DeviceAllocator>>>();
    const int n = device_count();
    for (int d = 0; d < n; ++d) v->push_back(std::make_unique<DeviceAllocator>(d));
    return v.release();
  }();
  return *all;
}

DeviceAllocator& allocator_for(int device, const char* what) {
  auto& all = allocators();
  TG_CHECK(device >= 0 && device < static_cast<int>(all.size()), what, ": invalid CUDA device ", device, " (",
           all.size(), " device(s) available)");
  return *all[device];
}

void free_block_deleter(void* ctx) {
  auto* block = static_cast<Block*>(ctx);
  try {
    allocators()[block->device]->free(block);
  } catch (const std::exception& e) {
    ::tg::detail::log_warning(::tg::detail::str_cat("CUDA caching allocator: free failed: ", e.what()));
  }
}

int resolve(int device) {
  if (device >= 0) return device;
  int d = 0;
  TG_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

}  // namespace

DataPtr device_allocate(size_t nbytes, int device) {
  return allocator_for(resolve(device), "device_allocate").allocate(nbytes);
}

void record_stream(const DataPtr& ptr, cudaStream_t stream) {
  // Only blocks of this allocator carry a Block context; other memory (from_blob, DLPack) is the owner's business.
  if (ptr.deleter() != &free_block_deleter || !ptr.context()) return;
  auto* block = static_cast<Block*>(ptr.context());
  allocators()[block->device]->record_stream(block, stream);
}

uint64_t graph_pool_create(int device) {
  return allocator_for(resolve(device), "tg::cuda::Graph").create_graph_pool();
}

void graph_pool_capture_begin(int device, uint64_t pool) {
  device = resolve(device);
  (void)allocator_for(device, "tg::cuda::Graph::capture_begin");
  TG_CHECK(device < kMaxDevices, "tg::cuda::Graph::capture_begin: device ", device, " out of range");
  TG_CHECK(tls_capture_pool[device] == 0, "tg::cuda::Graph::capture_begin: this thread is already capturing on cuda:",
           device);
  tls_capture_pool[device] = pool;
}

void graph_pool_capture_end(int device) {
  if (device >= 0 && device < kMaxDevices) tls_capture_pool[device] = 0;
}

void graph_pool_release(int device, uint64_t pool) {
  allocator_for(resolve(device), "tg::cuda::Graph").release_graph_pool(pool);
}

namespace {
// The tg::Allocator of one device index (get_allocator, core/storage.h): device_allocate there.
class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int device) : device_(device) {}
  DataPtr allocate(size_t nbytes) override { return device_allocate(nbytes, device_); }

 private:
  int device_;
};

// One per device index, created on first use and never destroyed (as the allocators above).
Allocator* cuda_allocator(int device) {
  TG_CHECK(device >= 0 && device < kMaxDevices, "get_allocator: bad device ", Device(kCUDA, device));
  static const std::array<CudaAllocator*, kMaxDevices> all = [] {
    std::array<CudaAllocator*, kMaxDevices> a{};
    for (int i = 0; i < kMaxDevices; ++i) a[i] = new CudaAllocator(i);  // never deleted
    return a;
  }();
  return all[device];
}
}  // namespace

void register_device_allocator() { ::tg::detail::register_allocator_factory(kCUDA, &cuda_allocator); }

}  // namespace detail

// ---- the public counters

size_t memory_allocated(int device) {
  if (!is_available()) return 0;
  return detail::allocator_for(detail::resolve(device), "tg::cuda::memory_allocated").allocated();
}

size_t max_memory_allocated(int device) {
  if (!is_available()) return 0;
  return detail::allocator_for(detail::resolve(device), "tg::cuda::max_memory_allocated").peak();
}

size_t memory_reserved(int device) {
  if (!is_available()) return 0;
  return detail::allocator_for(detail::resolve(device), "tg::cuda::memory_reserved").reserved();
}

void reset_peak_memory_stats(int device) {
  if (!is_available()) return;
  detail::allocator_for(detail::resolve(device), "tg::cuda::reset_peak_memory_stats").reset_peak();
}

void empty_cache() {
  if (!is_available()) return;
  for (auto& a : detail::allocators()) a->empty_cache();
  detail::empty_host_cache();
}

}  // namespace tg::cuda
