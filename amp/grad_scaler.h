// tg::amp::GradScaler: dynamic loss scaling for mixed-precision training,
// torch.amp.GradScaler's behaviour and state machine, with everything kept on the
// device. The scale, the growth tracker and each optimizer's found_inf live in
// device tensors; unscale_ is one fused multi-tensor kernel per dtype that
// unscales every gradient and records any inf/NaN; step hands found_inf to the
// optimizer, whose kernels skip the update on the device; update adjusts the
// scale with a one-thread kernel that also clears the found_inf flags it read
// (each optimizer's flag is one persistent tensor, so an iteration needs no
// zero-fill launch). None of scale / unscale_ / step / update waits for the device
// (a training step can be captured into a CUDA graph); only get_scale(),
// get_growth_tracker() and state_dict() read values back. Launches per iteration
// on CUDA: scale's multiply, one check per gradient dtype, the optimizer's step,
// and the update.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include <tapegrad/core/state_dict.h>
#include <tapegrad/core/tensor.h>
#include <tapegrad/optim/optimizer.h>

namespace tg::amp {

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  // loss * scale (the scale tensor is created on the loss's device on first use).
  // Disabled: the loss itself.
  Tensor scale(const Tensor& outputs);

  // Divides the gradients of `opt`'s parameters by the scale in place and records in
  // the optimizer's found_inf whether any was inf or NaN: one fused kernel per
  // (dtype) over all of them, no host sync. At most once per optimizer between updates.
  void unscale_(optim::Optimizer& opt);

  // Steps `opt` unless a gradient overflowed; the decision is made on the device
  // (the optimizer reads found_inf). If unscale_ was not called, the gradients are
  // checked (not rewritten) and the optimizer divides them by the scale itself as it
  // reads them, like PyTorch's fused optimizers: .grad then keeps the scaled values.
  void step(optim::Optimizer& opt);

  // Adjusts the scale from the found_inf of every optimizer stepped since the last
  // update (PyTorch's _amp_update_scale_): backoff and reset the tracker on overflow,
  // else grow after growth_interval clean steps. Runs on the device.
  void update();
  // Sets the scale to `new_scale` instead (a host value: no device read).
  void update(double new_scale);

  // The current scale. SYNCHRONIZES with the device (reads the scale tensor back).
  double get_scale() const;
  // The consecutive clean steps counted so far. Synchronizes, like get_scale().
  int64_t get_growth_tracker() const;
  double get_growth_factor() const { return options_.growth_factor; }
  double get_backoff_factor() const { return options_.backoff_factor; }
  int64_t get_growth_interval() const { return options_.growth_interval; }
  void set_growth_factor(double v) { options_.growth_factor = v; }
  void set_backoff_factor(double v) { options_.backoff_factor = v; }
  void set_growth_interval(int64_t v) { options_.growth_interval = v; }
  bool is_enabled() const { return options_.enabled; }

  // The device tensors themselves (float32 0-d scale, int32 0-d tracker), undefined
  // before the first scale(); for graphs and tests. No sync.
  const Tensor& scale_tensor() const { return scale_; }
  const Tensor& growth_tracker_tensor() const { return growth_tracker_; }
  // This iteration's found_inf of `opt` (float32 0-d on the device), undefined if none
  // yet. The same tensor serves every iteration: update() sets it back to zero.
  Tensor found_inf(const optim::Optimizer& opt) const;

  // PyTorch's keys: "scale", "growth_factor", "backoff_factor" (float64 0-d),
  // "growth_interval", "_growth_tracker" (int64 0-d). Empty when disabled.
  // Synchronizes (reads scale and tracker back).
  StateDict state_dict() const;
  // Accepts any numeric one-element tensors (a torch checkpoint's floats too);
  // validated in full before anything changes. Ignored when disabled.
  void load_state_dict(const StateDict& state);

 private:
  enum class OptState : uint8_t { Ready, Unscaled, Stepped };
  struct PerOptimizer {
    OptState state = OptState::Ready;
    Tensor found_inf;
  };
  // An optimizer's persistent found_inf; `dirty` when it may be non-zero on the device
  // (written by a check and not yet cleared by an update kernel).
  struct FoundInfBuffer {
    Tensor flag;
    bool dirty = false;
  };
  void check_scale(const char* op) const;
  // found_inf of `opt`'s gradients; with `unscale`, the gradients are divided by the scale.
  Tensor check_grads(optim::Optimizer& opt, bool unscale, const char* op);

  GradScalerOptions options_;
  Tensor scale_;           // float32 0-d on the device of the first scaled loss
  Tensor growth_tracker_;  // int32 0-d, same device
  int64_t init_growth_tracker_ = 0;  // from load_state_dict before the tensors exist
  std::unordered_map<const optim::Optimizer*, PerOptimizer> per_optimizer_;
  std::unordered_map<const optim::Optimizer*, FoundInfBuffer> found_inf_buffers_;
};

}  // namespace tg::amp
