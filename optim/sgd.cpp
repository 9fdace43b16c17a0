// SGD: its options, state (momentum_buffer and step, created on a parameter's first step) and
// the shared elementwise step (optim/elementwise_step.h) with torch.optim.SGD's rule.
#include <tapegrad/optim/sgd.h>

#include <cmath>

#include <tapegrad/core/ops.h>
#include <tapegrad/optim/elementwise_step.h>

namespace tg::optim {

SGD::SGD(std::vector<Tensor> params, SGDOptions options) : GroupedOptimizer(options) {
  add_param_group({std::move(params), options});
}

SGD::SGD(std::vector<ParamGroup<SGDOptions>> groups, SGDOptions defaults) : GroupedOptimizer(defaults) {
  TG_CHECK(!groups.empty(), "SGD: optimizer got an empty list of parameter groups");
  for (auto& g : groups) add_param_group(std::move(g));
}

void SGD::validate(const SGDOptions& o) const {
  TG_CHECK(!std::isnan(o.lr), "SGD: lr is required, e.g. SGD(params, {.lr = 1e-3})");
  TG_CHECK(o.lr >= 0, "SGD: invalid learning rate: ", o.lr);
  TG_CHECK(o.momentum >= 0, "SGD: invalid momentum value: ", o.momentum);
  TG_CHECK(o.weight_decay >= 0, "SGD: invalid weight_decay value: ", o.weight_decay);
  TG_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
           "SGD: Nesterov momentum requires a momentum and zero dampening (momentum ", o.momentum, ", dampening ",
           o.dampening, ")");
}

void SGD::step(const StepArgs& args) {
  detail::check_step_args("SGD.step", args);
  // A CPU found_inf is read here, before any state is created; a CUDA one by the kernels.
  if (args.found_inf.defined() && args.found_inf.is_cpu() && *static_cast<const float*>(args.found_inf.data_ptr()) != 0.f)
    return;
  for (size_t gi = 0; gi < param_groups().size(); ++gi) {
    const auto& group = param_groups()[gi];
    const SGDOptions& o = group.options;
    const detail::SgdHyper h{o.lr, o.momentum, o.dampening, o.weight_decay, o.nesterov, o.maximize};
    std::vector<Tensor> grads(group.params.size());
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = detail::usable_grad("SGD.step", group.params[i]);

    for (const auto& bucket : detail::bucket_by_device_dtype(group.params, grads)) {
      // Momentum state, created on the parameter's first step.
      std::vector<Tensor> bufs, steps;
      if (o.momentum != 0) {
        for (size_t i : bucket.indices) {
          const Tensor& p = group.params[i];
          ParamState& st = state_of(p);
          Tensor& buf = st["momentum_buffer"];
          Tensor& step = st["step"];
          if (!buf.defined()) {
            buf = detail::state_like(p);
            step = tg::zeros({}, TensorOptions().device(p.device()));
          } else if (!step.defined()) {
            step = tg::ones({}, TensorOptions().device(p.device()));  // a loaded buffer is initialized
          }
          bufs.push_back(buf);
          steps.push_back(step);
        }
      }
      detail::BucketLists lists;
      for (size_t i : bucket.indices) {
        lists.params.push_back(group.params[i]);
        lists.grads.push_back(grads[i]);
      }
      if (o.momentum != 0) {
        lists.states = {std::move(bufs)};
        lists.steps = std::move(steps);
      }
      detail::elementwise_step<detail::SgdRule>("SGD.step", bucket, std::move(lists), h, args,
                                                fused_cache(gi, bucket.device, bucket.dtype));
    }
  }
}

}  // namespace tg::optim
