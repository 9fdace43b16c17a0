// Adam and AdamW: the CPU loop and the dispatch to the fused CUDA kernel, per
// group and (device, dtype) bucket. torch.optim.Adam / AdamW's update (see
// optim/update_math.h); the two differ only in how weight decay is applied.
#include <tapegrad/optim/adam.h>

#include <type_traits>

#include <tapegrad/core/ops.h>
#include <tapegrad/optim/step_util.h>
#include <tapegrad/optim/update_math.h>
#if defined(TG_WITH_CUDA)
#include <tapegrad/optim/cuda/fused.h>
#endif

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

template <class T>
void adam_cpu(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const Tensor& vmax, float step,
              const detail::AdamHyper& h, bool scaled, float scale) {
  using M = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const auto c = detail::adam_coeffs<M>(h, step);
  T* pp = static_cast<T*>(p.data_ptr());
  const T* gp = static_cast<const T*>(g.data_ptr());
  T* mp = static_cast<T*>(m.data_ptr());
  T* vp = static_cast<T*>(v.data_ptr());
  T* xp = vmax.defined() ? static_cast<T*>(vmax.data_ptr()) : nullptr;
  const M s = static_cast<M>(scale);
  tg::parallel_for(0, p.numel(), 1 << 14, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      M pv = static_cast<M>(pp[i]), mv = static_cast<M>(mp[i]), vv = static_cast<M>(vp[i]);
      M xv = xp ? static_cast<M>(xp[i]) : M(0);
      M gv = static_cast<M>(gp[i]);
      if (scaled) gv = gv / s;
      detail::adam_update(pv, gv, mv, vv, xv, c);
      pp[i] = static_cast<T>(pv);
      mp[i] = static_cast<T>(mv);
      vp[i] = static_cast<T>(vv);
      if (xp) xp[i] = static_cast<T>(xv);
    }
  });
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
          m = tg::zeros(p.sizes(), p.options());
          v = tg::zeros(p.sizes(), p.options());
        }
        TG_CHECK(step.defined() && v.defined(), op, ": state of a parameter of shape ", p.sizes(),
                 " lacks step or exp_avg_sq");
        if (o.amsgrad) {
          Tensor& x = st["max_exp_avg_sq"];
          if (!x.defined()) x = tg::zeros(p.sizes(), p.options());
          xs.push_back(x);
        }
        steps.push_back(step);
        ms.push_back(m);
        vs.push_back(v);
      }
      if (bucket.device.is_cpu()) {
        detail::cpu_scalar(op, args.found_inf, "found_inf", bucket.device, 0.f);  // checks the device
        const bool scaled = args.grad_scale.defined();
        const float scale = detail::cpu_scalar(op, args.grad_scale, "grad_scale", bucket.device, 1.f);
        for (size_t k = 0; k < bucket.indices.size(); ++k) {
          const size_t i = bucket.indices[k];
          float* s = static_cast<float*>(steps[k].data_ptr());
          *s += 1.f;
          const Tensor x = o.amsgrad ? xs[k] : Tensor();
          visit_dtype(bucket.dtype, [&](auto tag) {
            using T = decltype(tag);
            if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, Half> ||
                          std::is_same_v<T, BFloat16>)
              adam_cpu<T>(group.params[i], grads[i], ms[k], vs[k], x, *s, h, scaled, scale);
          });
          detail::bump_version(group.params[i]);
        }
      } else {
#if defined(TG_WITH_CUDA)
        cuda::AdamLists lists;
        for (size_t i : bucket.indices) {
          lists.params.push_back(group.params[i]);
          lists.grads.push_back(grads[i]);
        }
        lists.shadows = detail::shadows_for_update(lists.params);  // before the version bumps
        for (const Tensor& p : lists.params) detail::bump_version(p);
        lists.exp_avgs = std::move(ms);
        lists.exp_avg_sqs = std::move(vs);
        lists.max_exp_avg_sqs = std::move(xs);
        lists.steps = std::move(steps);
        cuda::fused_adam_step(opt.fused_cache(gi, bucket.device, bucket.dtype), lists, h,
                              detail::device_scalar(op, args.grad_scale, "grad_scale", bucket.device),
                              detail::device_scalar(op, args.found_inf, "found_inf", bucket.device));
        detail::shadows_updated(lists.params, lists.shadows);
#else
        TG_ERROR(op, ": parameters on ", bucket.device, " but tapegrad was built without CUDA");
#endif
      }
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
