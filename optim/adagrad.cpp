// Adagrad: options, state (step and sum, created at construction as PyTorch does) and the shared
// elementwise step (optim/elementwise_step.h) with torch.optim.Adagrad's rule (optim/update_math.h).
#include <tapegrad/optim/adagrad.h>

#include <tapegrad/core/ops.h>
#include <tapegrad/optim/elementwise_step.h>

namespace tg::optim {

Adagrad::Adagrad(std::vector<Tensor> params, AdagradOptions options) : GroupedOptimizer(options) {
  add_param_group({std::move(params), options});
  for (const Tensor& p : param_groups()[0].params) init_state(p, param_groups()[0].options.initial_accumulator_value);
}
Adagrad::Adagrad(std::vector<ParamGroup<AdagradOptions>> groups, AdagradOptions defaults) : GroupedOptimizer(defaults) {
  TG_CHECK(!groups.empty(), "Adagrad: optimizer got an empty list of parameter groups");
  for (auto& g : groups) add_param_group(std::move(g));
  for (const auto& g : param_groups())
    for (const Tensor& p : g.params) init_state(p, g.options.initial_accumulator_value);
}

void Adagrad::init_state(const Tensor& p, double initial_accumulator_value) {
  ParamState& st = state_of(p);
  st["step"] = tg::zeros({}, TensorOptions().device(p.device()));
  st["sum"] = detail::state_like(p, initial_accumulator_value);
}

void Adagrad::validate(const AdagradOptions& o) const {
  TG_CHECK(o.lr >= 0, "Adagrad: invalid learning rate: ", o.lr);
  TG_CHECK(o.lr_decay >= 0, "Adagrad: invalid lr_decay value: ", o.lr_decay);
  TG_CHECK(o.weight_decay >= 0, "Adagrad: invalid weight_decay value: ", o.weight_decay);
  TG_CHECK(o.initial_accumulator_value >= 0,
           "Adagrad: invalid initial_accumulator_value value: ", o.initial_accumulator_value);
  TG_CHECK(o.eps >= 0, "Adagrad: invalid epsilon value: ", o.eps);
}

void Adagrad::step(const StepArgs& args) {
  const char* op = "Adagrad.step";
  detail::check_step_args(op, args);
  // A CPU found_inf is read here; a CUDA one by the kernels.
  if (args.found_inf.defined() && args.found_inf.is_cpu() &&
      *static_cast<const float*>(args.found_inf.data_ptr()) != 0.f)
    return;
  for (size_t gi = 0; gi < param_groups().size(); ++gi) {
    const auto& group = param_groups()[gi];
    const AdagradOptions& o = group.options;
    const detail::AdagradHyper h{o.lr, o.lr_decay, o.weight_decay, o.eps, o.maximize};
    std::vector<Tensor> grads(group.params.size());
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = detail::usable_grad(op, group.params[i]);

    for (const auto& bucket : detail::bucket_by_device_dtype(group.params, grads)) {
      std::vector<Tensor> sums, steps;
      for (size_t i : bucket.indices) {
        const Tensor& p = group.params[i];
        ParamState& st = state_of(p);
        Tensor& step = st["step"];
        Tensor& sum = st["sum"];
        // None for a parameter added by add_param_group or left out of a loaded state dict.
        if (!step.defined() && !sum.defined()) init_state(p, o.initial_accumulator_value);
        TG_CHECK(sum.defined() && step.defined(), op, ": state of a parameter of shape ", p.sizes(), " lacks ",
                 sum.defined() ? "step" : "sum");
        sums.push_back(sum);
        steps.push_back(step);
      }
      detail::BucketLists lists;
      for (size_t i : bucket.indices) {
        lists.params.push_back(group.params[i]);
        lists.grads.push_back(grads[i]);
      }
      lists.states = {std::move(sums)};
      lists.steps = std::move(steps);
      detail::elementwise_step<detail::AdagradRule>(op, bucket, std::move(lists), h, args,
                                                    fused_cache(gi, bucket.device, bucket.dtype));
    }
  }
}

}  // namespace tg::optim
