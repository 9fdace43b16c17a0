// The "blocks done" counters of done_counters.h.
#include "core/backend/cuda/done_counters.h"

#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "core/backend/cuda/runtime.h"

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

}  // namespace

unsigned* done_counters(int device, cudaStream_t stream, int n, DataPtr& own) {
  TG_CHECK(n >= 1 && n <= kMaxDoneCounters, "done_counters: ", n, " counters asked, 1 to ", kMaxDoneCounters,
           " available");
  constexpr size_t kBytes = sizeof(unsigned) * kMaxDoneCounters;
  if (current_stream_capturing(device)) {
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

}  // namespace tg::cuda::detail
