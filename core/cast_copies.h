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
// Twins (the same list, one-shot): a kernel that writes a float32 result and knows its cast is
// wanted next (layer_norm under autocast, whose output a Linear lowers; layer_norm's backward,
// whose input gradient a mixed residual add also needs in its half operand's dtype) writes that
// cast in the same pass and attaches it to the result (attach_cast_twin). native::to, the one cast
// front, takes it (take_cast_twin) instead of launching a cast: no float32 read, no launch. A twin
// is handed out once (the caller owns it after), and only while the result is unchanged since it
// was attached (storage version) and is viewed as it was (offset, numel, contiguous); it goes away
// with the result's memory when never taken. Same bits as the cast kernel: both round the float32
// value to nearest even.
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

// Twins. attach: `result` float32 CUDA contiguous, `low` contiguous of its sizes in float16 /
// bfloat16 holding the cast of result's current values (no-op when twins are off or either does
// not qualify). take: that cast for native::to(t, t.device(), to), once, or undefined.
void attach_cast_twin(const Tensor& result, const Tensor& low);
Tensor take_cast_twin(const Tensor& t, DType to);
int64_t cast_twin_hits();  // twins taken since the process started (tests, profiles)
// On by default; off: producers write no twins (A/B measurements, memory control).
void set_cast_twins_enabled(bool enabled);
bool cast_twins_enabled();

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
