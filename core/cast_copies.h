// Lower-precision copies of float32 parameters, kept with the parameter's storage. Internal
// (tg::detail, not installed).
//
// Autocast lowers a float32 CUDA parameter (a leaf that requires grad) to float16 / bfloat16 at
// every region; the cast reads 4 bytes and writes 2 per element. Instead the cast is kept as a
// copy owned by the parameter's storage (Storage::attachment, so it goes away with the memory),
// tagged with the storage version it equals the cast of. A fused CUDA optimizer step, which
// rewrites the parameter anyway, writes the round-to-nearest-even cast of each new value into
// the copy in the same pass and re-tags it (or leaves both when found_inf skips the step). The
// next region reuses a copy whose tag matches: no cast kernel, no float32 read. Any other change
// to the parameter (load_state_dict, a manual edit, a CPU or non-fused step) bumps its version,
// so the next region casts afresh. Cost: one low-precision copy per parameter stays allocated
// between steps.
//
// Two users, no other coupling: amp/autocast.cpp makes and reuses copies, optim/ updates them.
//
// CUDA graphs: a copy read while capturing is pinned (the graph holds its address): it is never
// replaced, only recast in place when stale, and the capturing tg::cuda::Graph gets a replay
// prologue that recasts it when its parameter changed outside the captured step.
#pragma once
#include <cstdint>
#include <optional>

#include <tapegrad/core/dtype.h>
#include <tapegrad/core/tensor.h>

namespace tg::detail {

// The cast of `dense` (float32, CUDA, contiguous: a parameter, or the memory-order view of a
// permuted one) to `to`, from its valid copy (no kernel, *reused set) or cast now and kept as
// its copy. A plain detached cast when copies are off or `dense` does not qualify. Not recorded
// for autograd: the caller records the cast.
Tensor cast_copy(const Tensor& dense, DType to, bool* reused = nullptr);

// For a fused step about to rewrite `param` in place: its copy if valid at the current version
// (undefined otherwise; stale ones are dropped unless pinned). With `only`, a copy of another
// dtype is not returned.
Tensor cast_copy_for_update(const Tensor& param, std::optional<DType> only = std::nullopt);
// After that step was launched (param's version already bumped): the copy holds the cast of the
// new value. Re-tags it and bumps its own version (autograd refuses saved aliases of the old).
void cast_copy_updated(const Tensor& param, const Tensor& copy);

// For tests and memory control.
Tensor cast_copy_of(const Tensor& param, DType dtype);  // the valid copy, or undefined
int64_t cast_copy_hits();   // casts served from a copy since the last reset
int64_t cast_copy_casts();  // casts that made or recast a copy since the last reset
void reset_cast_copy_counters();
int64_t cast_copy_count();  // copies alive now
// On by default; off: autocast keeps no copies (PyTorch's memory behaviour) and reuses none.
void set_cast_copies_enabled(bool enabled);
bool cast_copies_enabled();

}  // namespace tg::detail
