// The CPU backend's thread pool: a fixed set of workers that run the chunks of
// tg::parallel_for (declared in core/ops.h). Kernels call tg::cpu::parallel(),
// which runs inline (no std::function, no locking) for small ranges, with one
// thread, or when already inside a parallel region (nested calls).
#pragma once
#include <cstdint>
#include <functional>

#include <tapegrad/core/ops.h>

namespace tg::cpu {

// True on a pool worker, or on the caller while it runs its own share of a parallel_for.
bool in_parallel_region();

// Calls f(lo, hi) over [begin, end) split into chunks of at least `grain` elements.
template <typename F>
void parallel(int64_t begin, int64_t end, int64_t grain, F&& f) {
  if (end <= begin) return;
  if (grain < 1) grain = 1;
  if (end - begin <= grain || in_parallel_region() || get_num_threads() <= 1) {
    f(begin, end);
    return;
  }
  // std::ref keeps the std::function from copying (or allocating for) the lambda.
  tg::parallel_for(begin, end, grain, std::ref(f));
}

}  // namespace tg::cpu
