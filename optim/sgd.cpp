// SGD: the CPU loop and the dispatch to the fused CUDA kernel, per group and
// (device, dtype) bucket. torch.optim.SGD's update (see optim/update_math.h).
#include <tapegrad/optim/sgd.h>

#include <cmath>

#include <tapegrad/core/ops.h>
#include <tapegrad/optim/step_util.h>
#include <tapegrad/optim/update_math.h>
#if defined(TG_WITH_CUDA)
#include <tapegrad/optim/cuda/fused.h>
#endif

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

namespace {

template <class T>
void sgd_cpu(const Tensor& p, const Tensor& g, const Tensor& buf, float step, const detail::SgdHyper& h,
             bool scaled, float scale) {
  using M = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const auto c = detail::sgd_coeffs<M>(h, step);
  T* pp = static_cast<T*>(p.data_ptr());
  const T* gp = static_cast<const T*>(g.data_ptr());
  T* bp = buf.defined() ? static_cast<T*>(buf.data_ptr()) : nullptr;
  const M s = static_cast<M>(scale);
  tg::parallel_for(0, p.numel(), 1 << 15, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      M pv = static_cast<M>(pp[i]);
      M gv = static_cast<M>(gp[i]);
      if (scaled) gv = gv / s;
      M bv = bp ? static_cast<M>(bp[i]) : M(0);
      detail::sgd_update(pv, gv, bv, c);
      pp[i] = static_cast<T>(pv);
      if (bp) bp[i] = static_cast<T>(bv);
    }
  });
}

}  // namespace

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
            buf = tg::zeros(p.sizes(), p.options());
            step = tg::zeros({}, TensorOptions().device(p.device()));
          } else if (!step.defined()) {
            step = tg::ones({}, TensorOptions().device(p.device()));  // a loaded buffer is initialized
          }
          bufs.push_back(buf);
          steps.push_back(step);
        }
      }
      if (bucket.device.is_cpu()) {
        detail::cpu_scalar("SGD.step", args.found_inf, "found_inf", bucket.device, 0.f);  // checks the device
        const bool scaled = args.grad_scale.defined();
        const float scale = detail::cpu_scalar("SGD.step", args.grad_scale, "grad_scale", bucket.device, 1.f);
        for (size_t k = 0; k < bucket.indices.size(); ++k) {
          const size_t i = bucket.indices[k];
          float step = 1.f;
          if (!steps.empty()) {
            float* s = static_cast<float*>(steps[k].data_ptr());
            *s += 1.f;
            step = *s;
          }
          const Tensor buf = bufs.empty() ? Tensor() : bufs[k];
          visit_dtype(bucket.dtype, [&](auto tag) {
            using T = decltype(tag);
            if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, Half> ||
                          std::is_same_v<T, BFloat16>)
              sgd_cpu<T>(group.params[i], grads[i], buf, step, h, scaled, scale);
          });
          detail::bump_version(group.params[i]);
        }
      } else {
#if defined(TG_WITH_CUDA)
        cuda::SgdLists lists;
        for (size_t i : bucket.indices) {
          lists.params.push_back(group.params[i]);
          lists.grads.push_back(grads[i]);
        }
        lists.shadows = detail::shadows_for_update(lists.params);  // before the version bumps
        for (const Tensor& p : lists.params) detail::bump_version(p);
        lists.momentum_buffers = std::move(bufs);
        lists.steps = std::move(steps);
        cuda::fused_sgd_step(fused_cache(gi, bucket.device, bucket.dtype), lists, h,
                             detail::device_scalar("SGD.step", args.grad_scale, "grad_scale", bucket.device),
                             detail::device_scalar("SGD.step", args.found_inf, "found_inf", bucket.device));
        detail::shadows_updated(lists.params, lists.shadows);
#else
        TG_ERROR("SGD.step: parameters on ", bucket.device, " but tapegrad was built without CUDA");
#endif
      }
    }
  }
}

}  // namespace tg::optim
