// The caching host allocator. Sizes are rounded up (to 64 bytes, then to an
// eighth of the next power of two) so similar requests share a bucket; a freed
// block waits in its bucket's free list for the next request of that size,
// which avoids faulting in fresh pages on every temporary. Each block carries a
// 64-byte header with its bucket size so the deleter needs no lookup.
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <tapegrad/core/backend/cpu/cpu.h>
#include <tapegrad/core/error.h>
#include <tapegrad/core/shape.h>

namespace tg::cpu {
namespace {

constexpr size_t kAlign = 64;
constexpr size_t kHeader = 64;  // keeps the user pointer 64-byte aligned
constexpr size_t kDefaultCacheLimit = size_t{1} << 30;

// Callers pass at most kMaxStorageBytes (2^62, checked where a shape becomes a byte count), so
// neither the rounding nor the power of two below can wrap; a larger request is refused here too.
size_t round_size(size_t n) {
  TG_CHECK(n <= detail::kMaxStorageBytes, "cpu allocator: request of ", n, " bytes is larger than 2^62");
  n = (n + kAlign - 1) / kAlign * kAlign;
  if (n <= 4096) return n == 0 ? kAlign : n;
  size_t p = 1;
  while (p < n) p <<= 1;
  size_t step = p / 8;  // at most 12.5% waste
  return (n + step - 1) / step * step;
}

size_t initial_limit() {
  if (const char* env = std::getenv("TG_CPU_CACHE_MB")) {
    char* end = nullptr;
    unsigned long long mb = std::strtoull(env, &end, 10);
    if (end != env) return static_cast<size_t>(mb) << 20;
  }
  return kDefaultCacheLimit;
}

// The settable cap on bytes in use (set_memory_limit, TG_CPU_MEMORY_LIMIT_MB; 0 = none), so that
// tests can provoke an out-of-memory on the host as a full GPU would. Checked before each
// allocation, not reserved atomically: concurrent requests may overshoot it by one block each.
size_t initial_memory_limit() {
  if (const char* env = std::getenv("TG_CPU_MEMORY_LIMIT_MB")) {
    char* end = nullptr;
    unsigned long long mb = std::strtoull(env, &end, 10);
    if (end != env) return static_cast<size_t>(mb) << 20;
  }
  return 0;
}
std::atomic<size_t> g_memory_limit{initial_memory_limit()};

void check_memory_limit(size_t nbytes, size_t size, size_t in_use, size_t cached) {
  const size_t limit = g_memory_limit.load(std::memory_order_relaxed);
  TG_CHECK(limit == 0 || (in_use <= limit && size <= limit - in_use), "cpu allocator: out of memory: requested ",
           nbytes, " bytes (", size, " rounded) with ", in_use, " bytes held (", cached, " more cached) and a limit of ",
           limit, " bytes (tg::cpu::set_memory_limit / TG_CPU_MEMORY_LIMIT_MB)");
}

class HostAllocator final : public Allocator {
 public:
  DataPtr allocate(size_t nbytes) override {
    size_t size = round_size(nbytes);
    if (g_memory_limit.load(std::memory_order_relaxed) != 0) check_memory_limit(nbytes, size, allocated_.load(), cached());
    void* base = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        base = it->second.back();
        it->second.pop_back();
        cached_ -= size;
      }
    }
    if (base == nullptr) {
      base = std::aligned_alloc(kAlign, size + kHeader);
      if (base == nullptr) {
        release_cached();  // give the cache back and try once more
        base = std::aligned_alloc(kAlign, size + kHeader);
      }
      TG_CHECK(base != nullptr, "cpu allocator: out of memory allocating ", nbytes, " bytes (", allocated_.load(),
               " bytes in use)");
    }
    *static_cast<size_t*>(base) = size;
    const size_t now = allocated_ += size;
    size_t peak = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
    char* data = static_cast<char*>(base) + kHeader;
    return DataPtr(data, base, &HostAllocator::free_block, Device(kCPU));
  }

  void release_cached() {
    std::vector<void*> blocks;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& [size, list] : free_) blocks.insert(blocks.end(), list.begin(), list.end());
      free_.clear();
      cached_ = 0;
    }
    for (void* b : blocks) std::free(b);
  }

  size_t cached() {
    std::lock_guard<std::mutex> lock(mutex_);
    return cached_;
  }
  size_t allocated() const { return allocated_.load(); }
  size_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(allocated_.load()); }
  void set_limit(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      limit_ = bytes;
      if (cached_ <= limit_) return;
    }
    release_cached();
  }

  static HostAllocator& instance();

 private:
  static void free_block(void* base) noexcept { instance().release(base); }

  void release(void* base) noexcept {
    size_t size = *static_cast<size_t*>(base);
    allocated_ -= size;
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      if (cached_ + size <= limit_) {
        free_[size].push_back(base);
        cached_ += size;
        return;
      }
    } catch (...) {
      // push_back failed to grow the list: free the block instead of caching it.
    }
    std::free(base);
  }

  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
  size_t limit_ = initial_limit();
  std::atomic<size_t> allocated_{0};
  std::atomic<size_t> peak_{0};  // the most allocated_ has been since the last reset_peak
};

// Never destroyed, so tensors freed by late static destructors still find it.
HostAllocator& HostAllocator::instance() {
  union Holder {
    HostAllocator alloc;
    Holder() : alloc() {}
    ~Holder() {}
  };
  static Holder holder;
  return holder.alloc;
}

}  // namespace

Allocator* host_allocator() { return &HostAllocator::instance(); }
void register_host_allocator() {
  detail::register_allocator_factory(kCPU, [](int) -> Allocator* { return host_allocator(); });
}
void release_cached() { HostAllocator::instance().release_cached(); }
size_t cached_bytes() { return HostAllocator::instance().cached(); }
size_t allocated_bytes() { return HostAllocator::instance().allocated(); }
size_t max_allocated_bytes() { return HostAllocator::instance().peak(); }
void reset_peak_allocated_bytes() { HostAllocator::instance().reset_peak(); }
void set_cache_limit(size_t bytes) { HostAllocator::instance().set_limit(bytes); }
void set_memory_limit(size_t bytes) { g_memory_limit.store(bytes); }
size_t memory_limit() { return g_memory_limit.load(); }

}  // namespace tg::cpu
