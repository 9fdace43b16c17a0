// Adam and AdamW: options, state (step, exp_avg, exp_avg_sq, max_exp_avg_sq) and the shared
// elementwise step (optim/elementwise_step.h) with torch.optim.Adam / AdamW's rule
// (optim/update_math.h); the two differ only in how weight decay is applied.
#include <tapegrad/optim/adam.h>

#include <type_traits>

#include <tapegrad/core/ops.h>
#include <tapegrad/optim/elementwise_step.h>

namespace tg::optim {
namespace {

template <class O>
void validate_adam(const char* name, const O& o) {
  TG_CHECK(o.lr >= 0, name, ": invalid learning rate: ", o.lr);
  TG_CHECK(o.eps >= 0, name, ": invalid epsilon value: ", o.eps);
  TG_CHECK(o.betas.first >= 0 && o.betas.first < 1, name, ": invalid beta parameter at index 0: ", o.betas.first);
  TG_CHECK(o.betas.second >= 0 && o.betas.second < 1, name, ": invalid beta parameter at index 1: ", o.betas.second);
  TG_CHECK(o.weight_decay >= 0, name, ": invalid weight_decay value: ", o.weight_decay);
}

template <class O>
void adam_step(GroupedOptimizer<O>& opt, bool decoupled, const StepArgs& args) {
  const std::string op_str = std::string(opt.name()) + ".step";
  const char* op = op_str.c_str();
  detail::check_step_args(op, args);
  // A CPU found_inf is read here, before any state is created; a CUDA one by the kernels.
  if (args.found_inf.defined() && args.found_inf.is_cpu() && *static_cast<const float*>(args.found_inf.data_ptr()) != 0.f)
    return;
  for (size_t gi = 0; gi < opt.param_groups().size(); ++gi) {
    const auto& group = opt.param_groups()[gi];
    const O& o = group.options;
    const detail::AdamHyper h{o.lr,           o.betas.first, o.betas.second, o.eps,
                              o.weight_decay, o.amsgrad,     o.maximize,     decoupled};
    std::vector<Tensor> grads(group.params.size());
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = detail::usable_grad(op, group.params[i]);

    for (const auto& bucket : detail::bucket_by_device_dtype(group.params, grads)) {
      std::vector<Tensor> ms, vs, xs, steps;
      for (size_t i : bucket.indices) {
        const Tensor& p = group.params[i];
        ParamState& st = opt.state_of(p);
        Tensor& step = st["step"];
        Tensor& m = st["exp_avg"];
        Tensor& v = st["exp_avg_sq"];
        if (!m.defined()) {
          TG_CHECK(!step.defined() && !v.defined(), op, ": inconsistent state for a parameter of shape ", p.sizes(),
                   " (step/exp_avg_sq without exp_avg)");
          step = tg::zeros({}, TensorOptions().device(p.device()));
          m = detail::state_like(p);
          v = detail::state_like(p);
        }
        TG_CHECK(step.defined() && v.defined(), op, ": state of a parameter of shape ", p.sizes(),
                 " lacks step or exp_avg_sq");
        if (o.amsgrad) {
          Tensor& x = st["max_exp_avg_sq"];
          if (!x.defined()) x = detail::state_like(p);
          xs.push_back(x);
        }
        steps.push_back(step);
        ms.push_back(m);
        vs.push_back(v);
      }
      detail::BucketLists lists;
      for (size_t i : bucket.indices) {
        lists.params.push_back(group.params[i]);
        lists.grads.push_back(grads[i]);
      }
      lists.states = {std::move(ms), std::move(vs)};
      if (o.amsgrad) lists.states.push_back(std::move(xs));
      lists.steps = std::move(steps);
      detail::elementwise_step<detail::AdamRule>(op, bucket, std::move(lists), h, args,
                                                 opt.fused_cache(gi, bucket.device, bucket.dtype));
    }
  }
}

}  // namespace

Adam::Adam(std::vector<Tensor> params, AdamOptions options) : GroupedOptimizer(options) {
  add_param_group({std::move(params), options});
}
Adam::Adam(std::vector<ParamGroup<AdamOptions>> groups, AdamOptions defaults) : GroupedOptimizer(defaults) {
  TG_CHECK(!groups.empty(), "Adam: optimizer got an empty list of parameter groups");
  for (auto& g : groups) add_param_group(std::move(g));
}
void Adam::validate(const AdamOptions& o) const { validate_adam("Adam", o); }
void Adam::step(const StepArgs& args) { adam_step(*this, false, args); }

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options) : GroupedOptimizer(options) {
  add_param_group({std::move(params), options});
}
AdamW::AdamW(std::vector<ParamGroup<AdamWOptions>> groups, AdamWOptions defaults) : GroupedOptimizer(defaults) {
  TG_CHECK(!groups.empty(), "AdamW: optimizer got an empty list of parameter groups");
  for (auto& g : groups) add_param_group(std::move(g));
}
void AdamW::validate(const AdamWOptions& o) const { validate_adam("AdamW", o); }
void AdamW::step(const StepArgs& args) { adam_step(*this, true, args); }

}  // namespace tg::optim
