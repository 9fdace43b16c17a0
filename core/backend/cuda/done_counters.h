// "Blocks done" counters for single-launch reductions whose last block to finish adds the
// other blocks' partials in a fixed order (mse_loss, linear's small weight gradient). A
// launch takes n counters that start at 0; the last block on each resets it to 0.
#pragma once
#include <cuda_runtime_api.h>

#include "core/storage.h"

namespace tg::cuda::detail {

inline constexpr int kMaxDoneCounters = 64;  // per launch

// n (<= kMaxDoneCounters) zeroed counters for one launch on `stream`. Eagerly: the
// (device, stream)'s own, kept for the process (launches on one stream run in order and each
// leaves its counters at 0). Under graph capture: the launch's own, allocated into `own` and
// zeroed by a captured memset, so a replay on another stream never shares counters with eager
// work on the capture stream. Keep `own` until the launch is queued.
unsigned* done_counters(int device, cudaStream_t stream, int n, DataPtr& own);

}  // namespace tg::cuda::detail
