// Low-precision shadow copies of float32 CUDA parameters, shared by autocast and
// the fused CUDA optimizer steps. Internal (tg::amp::detail).
//
// When autocast lowers a float32 CUDA parameter (a leaf that requires grad, or a
// transpose / permute / view of one, cast as a dense block of memory), the cast is
// kept as the parameter's shadow after the region ends, tagged with the storage and
// version it was cast from. A fused SGD / Adam / AdamW step then writes the
// round-to-nearest-even cast of each updated parameter into its shadow in the same
// pass (or leaves both untouched when found_inf skips the step) and re-tags it with
// the parameter's new version. The next autocast region reuses a shadow whose tag
// still matches, as a differentiable cast recorded exactly like Tensor::to (the
// gradient reaches the float32 parameter): no cast kernel, no float32 read. Any
// other in-place change (a version bump: load_state_dict, a manual edit, a CPU or
// non-fused step) or a new storage makes the tag stale and the next region casts
// afresh. Cost: one low-precision copy per parameter stays allocated between
// steps (the cast that autocast used to free at the end of the region); copies of
// parameters that died are freed at the next autocast region exit or fused step.
//
// CUDA graphs: a shadow read while capturing is pinned: the graph holds its
// address, so it is never freed or replaced while its parameter lives (when stale,
// the next region or refresh_shadows() recasts it in place). A replay reuses what
// was decided while capturing: change the parameters between replays only through
// the captured step itself, or call refresh_shadows() before replay() after
// changing them (an eager autocast region in between also recasts them).
#pragma once
#include <cstdint>
#include <optional>

#include <tapegrad/core/dtype.h>
#include <tapegrad/core/tensor.h>

namespace tg::amp::detail {

// Autocast's side. The cast of `u` (float32, CUDA, contiguous) to the reduced dtype
// `to`, reusing a valid shadow (no kernel) or casting and keeping the result as the
// new shadow; plain u.to(to) for tensors that are not parameters (see above).
// *reused (if given) says whether a shadow was reused.
Tensor shadow_cast(const Tensor& u, DType to, bool* reused = nullptr);

// The optimizer's side. For a parameter about to be updated in place by a fused
// step: its shadow if one is valid at the current version (undefined otherwise;
// stale ones are dropped). With `only`, shadows of another dtype are dropped too.
Tensor shadow_for_update(const Tensor& param, std::optional<DType> only = std::nullopt);
// After the step was launched (the parameter's version already bumped): the shadow
// holds the cast of the new value; it is tagged with the new version and its own
// version is bumped (autograd refuses saved copies of its old values).
void shadow_updated(const Tensor& param, const Tensor& shadow);

// Recasts, in place and on the current stream, every shadow whose parameter
// changed since it was written (for CUDA graph replays); returns how many.
int64_t refresh_shadows();

// For tests and memory control.
Tensor shadow_of(const Tensor& param, DType dtype);  // the valid shadow, or undefined
int64_t shadow_hits();    // casts served from a shadow since the last reset
int64_t shadow_casts();   // casts that made a new shadow since the last reset
void reset_shadow_counters();
int64_t shadow_count();   // shadows held now (dead parameters are purged)
void clear_shadows();     // frees all but the pinned ones of live parameters
void purge_dead_shadows();
// On by default; off: autocast makes no shadows (PyTorch's memory behaviour) and
// clear_shadows() runs; pinned ones are still kept and updated.
void set_shadows_enabled(bool enabled);
bool shadows_enabled();

}  // namespace tg::amp::detail
