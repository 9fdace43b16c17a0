// "Blocks done" counters for single-launch reductions whose last block to finish adds the
// other blocks' partials in a fixed order (mse_loss, linear's small weight gradient). A
// launch takes n counters that start at 0; the last block on each resets it to 0.
#pragma once
#include <cuda_runtime_api.h>

#include <tapegrad/core/storage.h>

namespace tg::cuda::detail {

inline constexpr int kMaxDoneCounters = 64;  // per launch

// n (<= kMaxDoneCounters) zeroed counters for one launch on `stream`. Eagerly: the
// (device, stream)'s own, kept for the process (launches on one stream run in order and each
// leaves its counters at 0). Under a tg::cuda::Graph capture: a slice of that capture's
// arena, never handed out twice, so a replay on another stream never shares counters with
// eager work and the graph gets no node for them. Under any other capture (or with the
// arena used up): the launch's own, allocated into `own` and zeroed by a captured memset.
// Keep `own` until the launch is queued.
unsigned* done_counters(int device, cudaStream_t stream, int n, DataPtr& own);

// Drops the eager counters of (device, stream) (the stream is being destroyed; its work ended).
// Captures never use them, so no graph needs them afterwards.
void release_done_counters(int device, cudaStream_t stream) noexcept;

// Counters in a capture's arena: 64 KiB, room for 256 launches of 64 counters.
inline constexpr int kCaptureArenaCounters = 16384;

// tg::cuda::Graph (cuda_graph.cpp) registers the zeroed arena it owns (`size` counters at
// `base` on `device`, zeroed before the capture began and kept while its graph lives) for
// its capture `capture_id` on this thread. Each launch leaves its counters at 0, so every
// replay finds them zeroed. Clearing is a no-op unless that capture's arena is registered.
void set_capture_counter_arena(int device, unsigned long long capture_id, unsigned* base, int size);
void clear_capture_counter_arena(unsigned long long capture_id);

}  // namespace tg::cuda::detail
