// RMSprop: options, state (step, square_avg, momentum_buffer, grad_avg, created on a parameter's
// first step) and the shared elementwise step (optim/elementwise_step.h) with torch.optim.RMSprop's
// rule (optim/update_math.h).
#include <tapegrad/optim/rmsprop.h>

#include <tapegrad/core/ops.h>
#include <tapegrad/optim/elementwise_step.h>

namespace tg::optim {

RMSprop::RMSprop(std::vector<Tensor> params, RMSpropOptions options) : GroupedOptimizer(options) {
  add_param_group({std::move(params), options});
}
RMSprop::RMSprop(std::vector<ParamGroup<RMSpropOptions>> groups, RMSpropOptions defaults) : GroupedOptimizer(defaults) {
  TG_CHECK(!groups.empty(), "RMSprop: optimizer got an empty list of parameter groups");
  for (auto& g : groups) add_param_group(std::move(g));
}

void RMSprop::validate(const RMSpropOptions& o) const {
  TG_CHECK(o.lr >= 0, "RMSprop: invalid learning rate: ", o.lr);
  TG_CHECK(o.eps >= 0, "RMSprop: invalid epsilon value: ", o.eps);
  TG_CHECK(o.momentum >= 0, "RMSprop: invalid momentum value: ", o.momentum);
  TG_CHECK(o.weight_decay >= 0, "RMSprop: invalid weight_decay value: ", o.weight_decay);
  TG_CHECK(o.alpha >= 0, "RMSprop: invalid alpha value: ", o.alpha);
}

void RMSprop::step(const StepArgs& args) {
  const char* op = "RMSprop.step";
  detail::check_step_args(op, args);
  // A CPU found_inf is read here, before any state is created; a CUDA one by the kernels.
  if (args.found_inf.defined() && args.found_inf.is_cpu() &&
      *static_cast<const float*>(args.found_inf.data_ptr()) != 0.f)
    return;
  for (size_t gi = 0; gi < param_groups().size(); ++gi) {
    const auto& group = param_groups()[gi];
    const RMSpropOptions& o = group.options;
    const detail::RmspropHyper h{o.lr, o.alpha, o.eps, o.weight_decay, o.momentum, o.centered, o.maximize};
    const bool use_momentum = o.momentum > 0;
    std::vector<Tensor> grads(group.params.size());
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = detail::usable_grad(op, group.params[i]);

    for (const auto& bucket : detail::bucket_by_device_dtype(group.params, grads)) {
      // The rule's state lists in its order: square_avg, [grad_avg], [momentum_buffer].
      std::vector<Tensor> sq, ga, buf, steps;
      for (size_t i : bucket.indices) {
        const Tensor& p = group.params[i];
        ParamState& st = state_of(p);
        Tensor& step = st["step"];
        Tensor& s = st["square_avg"];
        if (!s.defined()) {
          TG_CHECK(!step.defined(), op, ": inconsistent state for a parameter of shape ", p.sizes(),
                   " (step without square_avg)");
          step = tg::zeros({}, TensorOptions().device(p.device()));
          s = detail::state_like(p);
        }
        TG_CHECK(step.defined(), op, ": state of a parameter of shape ", p.sizes(), " lacks step");
        // Created when first needed (also when a group's momentum / centered is switched on later).
        if (use_momentum) {
          Tensor& b = st["momentum_buffer"];
          if (!b.defined()) b = detail::state_like(p);
          buf.push_back(b);
        }
        if (o.centered) {
          Tensor& a = st["grad_avg"];
          if (!a.defined()) a = detail::state_like(p);
          ga.push_back(a);
        }
        steps.push_back(step);
        sq.push_back(s);
      }
      detail::BucketLists lists;
      for (size_t i : bucket.indices) {
        lists.params.push_back(group.params[i]);
        lists.grads.push_back(grads[i]);
      }
      lists.states.push_back(std::move(sq));
      if (o.centered) lists.states.push_back(std::move(ga));
      if (use_momentum) lists.states.push_back(std::move(buf));
      lists.steps = std::move(steps);
      detail::elementwise_step<detail::RmspropRule>(op, bucket, std::move(lists), h, args,
                                                    fused_cache(gi, bucket.device, bucket.dtype));
    }
  }
}

}  // namespace tg::optim
