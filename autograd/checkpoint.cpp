// tg::utils::checkpoint (autograd/checkpoint.h): a custom-function node whose backward
// recomputes the segment with the forward's generator and autocast state and backpropagates
// through it with a nested backward.
#include <tapegrad/autograd/checkpoint.h>

#include <memory>
#include <optional>
#include <utility>

#include <tapegrad/amp/autocast.h>
#include <tapegrad/autograd/custom_function.h>
#include <tapegrad/autograd/function.h>

namespace tg::utils {

namespace {
using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

struct AutocastState {
  bool enabled[2];
  DType dtype[2];
  static AutocastState now() {
    return {{amp::is_enabled(kCPU), amp::is_enabled(kCUDA)}, {amp::get_dtype(kCPU), amp::get_dtype(kCUDA)}};
  }
};

// Sets the generators to `replay` for a scope and puts back the state they had.
class RngReplay {
 public:
  explicit RngReplay(const native::RngState* replay) : on_(replay != nullptr) {
    if (!on_) return;
    current_ = native::get_rng_state();
    native::set_rng_state(*replay);
  }
  ~RngReplay() {
    if (on_) native::set_rng_state(current_);
  }
  RngReplay(const RngReplay&) = delete;
  RngReplay& operator=(const RngReplay&) = delete;

 private:
  bool on_;
  native::RngState current_;
};

class EnableGrad {
 public:
  EnableGrad() : prev_(autograd::GradMode::is_enabled()) { autograd::GradMode::set_enabled(true); }
  ~EnableGrad() { autograd::GradMode::set_enabled(prev_); }
  EnableGrad(const EnableGrad&) = delete;
  EnableGrad& operator=(const EnableGrad&) = delete;

 private:
  bool prev_;
};

std::vector<Tensor> recompute_backward(const Fn& fn, const native::RngState* rng, const AutocastState& ac,
                                       autograd::AutogradContext* ctx, std::vector<Tensor> grads) {
  TG_CHECK(!autograd::in_grad_call(),
           "checkpoint: its backward writes the .grad() of the parameters the segment uses, so it cannot run under "
           "tg::autograd::grad; use backward()");
  const std::vector<Tensor> saved = ctx->saved_tensors();
  std::vector<Tensor> inputs(saved.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    if (!saved[i].defined()) continue;
    inputs[i] = autograd::alias(saved[i]);
    if (ctx->needs_input_grad(i)) inputs[i].requires_grad_();
  }
  std::vector<Tensor> outs;
  {
    RngReplay replay(rng);
    EnableGrad grad_on;
    const AutocastState now = AutocastState::now();
    std::optional<amp::Autocast> cpu_ac, cuda_ac;  // only where the state differs from the forward's
    if (now.enabled[0] != ac.enabled[0] || now.dtype[0] != ac.dtype[0]) cpu_ac.emplace(kCPU, ac.dtype[0], ac.enabled[0]);
    if (now.enabled[1] != ac.enabled[1] || now.dtype[1] != ac.dtype[1])
      cuda_ac.emplace(kCUDA, ac.dtype[1], ac.enabled[1]);
    outs = fn(inputs);
  }
  TG_CHECK(outs.size() == grads.size(), "checkpoint: the recompute returned ", outs.size(),
           " outputs but the forward returned ", grads.size(), " (fn must do the same on every call)");
  std::vector<Tensor> roots, root_grads;
  for (size_t k = 0; k < outs.size(); ++k) {
    if (!outs[k].defined() || !outs[k].requires_grad() || !grads[k].defined()) continue;
    TG_CHECK(outs[k].sizes() == grads[k].sizes() && outs[k].dtype() == grads[k].dtype(), "checkpoint: recomputed output ",
             k, " has shape ", outs[k].sizes(), " and dtype ", outs[k].dtype(), ", the forward's had ", grads[k].sizes(),
             " and ", grads[k].dtype(), " (fn must do the same on every call)");
    roots.push_back(std::move(outs[k]));
    root_grads.push_back(std::move(grads[k]));
  }
  // Nothing here keeps the recomputed outputs or the incoming gradients during the pass: an output's
  // value is read by no backward, and each gradient goes once the node it enters has run (the
  // segment's peak is then its saved activations plus the pass's own transients).
  outs = {};
  grads = {};
  if (!roots.empty()) autograd::detail::backward_releasing(std::move(roots), std::move(root_grads));
  std::vector<Tensor> result(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i)
    if (ctx->needs_input_grad(i)) result[i] = inputs[i].grad();
  return result;
}
}  // namespace

std::vector<Tensor> checkpoint(Fn fn, const std::vector<Tensor>& inputs, CheckpointOptions options) {
  TG_CHECK(fn != nullptr, "checkpoint: fn is empty");
  if (!autograd::GradMode::is_enabled()) return fn(inputs);
  for (size_t i = 0; i < inputs.size(); ++i) TG_CHECK(inputs[i].defined(), "checkpoint: input ", i, " is undefined");
  std::shared_ptr<native::RngState> rng;
  if (options.preserve_rng_state) rng = std::make_shared<native::RngState>(native::get_rng_state());
  const AutocastState ac = AutocastState::now();
  std::vector<Tensor> outs;
  {
    NoGradGuard no_grad;
    outs = fn(inputs);
  }
  auto ctx = std::make_shared<autograd::AutogradContext>();
  std::vector<bool> needs(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) needs[i] = inputs[i].requires_grad();
  ctx->set_needs_input_grad(std::move(needs));
  ctx->save_for_backward(inputs);
  auto shared_fn = std::make_shared<Fn>(std::move(fn));
  return autograd::detail::record_custom(
      "checkpoint", std::move(ctx), inputs, std::vector<bool>(inputs.size(), true), std::move(outs),
      [shared_fn, rng, ac](autograd::AutogradContext* c, std::vector<Tensor> grads) {
        return recompute_backward(*shared_fn, rng.get(), ac, c, std::move(grads));
      },
      /*differentiable=*/false);  // the recompute's nested backward records nothing
}

Tensor checkpoint(std::function<Tensor(const std::vector<Tensor>&)> fn, const std::vector<Tensor>& inputs,
                  CheckpointOptions options) {
  TG_CHECK(fn != nullptr, "checkpoint: fn is empty");
  auto outs = checkpoint([f = std::move(fn)](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in)}; },
                         inputs, options);
  return std::move(outs.at(0));
}

}  // namespace tg::utils
