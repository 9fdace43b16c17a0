// The one step of the elementwise optimizers (SGD, Adam, AdamW; RMSprop and Adagrad join it) over
// a (device, dtype) bucket of a group: the CPU loop, or the fused multi-tensor CUDA launch
// (optim/cuda/fused_step.cuh), with the rule of optim/update_math.h. The optimizer only gathers
// its state lists (and creates them on the first step). Not installed.
#pragma once
#include <memory>
#include <tuple>
#include <type_traits>
#include <vector>

#include <tapegrad/core/dtype.h>
#include <tapegrad/core/ops.h>
#include <tapegrad/optim/optimizer.h>
#include <tapegrad/optim/step_util.h>
#include <tapegrad/optim/update_math.h>
#if defined(TG_WITH_CUDA)
#include <tapegrad/optim/cuda/fused.h>
#endif

namespace tg::optim::detail {

// A bucket's tensors: one entry per parameter in each list; states[k] is the rule's k-th state
// list; steps: float32 0-d counts (advanced by the step), or empty when the variant counts none.
struct BucketLists {
  std::vector<Tensor> params, grads;
  std::vector<std::vector<Tensor>> states;
  std::vector<Tensor> steps;
};

template <class Rule, int K, class T>
void cpu_update(const BucketLists& l, size_t i, float step, const typename Rule::Hyper& h, bool scaled,
                float scale) {
  using M = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const auto c = Rule::template coeffs<M>(h, step);
  T* pp = static_cast<T*>(l.params[i].data_ptr());
  const T* gp = static_cast<const T*>(l.grads[i].data_ptr());
  T* sp[K > 0 ? K : 1] = {};
  for (int k = 0; k < K; ++k) sp[k] = static_cast<T*>(l.states[k][i].data_ptr());
  const M s = static_cast<M>(scale);
  tg::parallel_for(0, l.params[i].numel(), Rule::kCpuGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi; ++j) {
      M pv = static_cast<M>(pp[j]);
      M gv = static_cast<M>(gp[j]);
      if (scaled) gv = gv / s;
      M sv[K > 0 ? K : 1] = {};
      for (int k = 0; k < K; ++k) sv[k] = static_cast<M>(sp[k][j]);
      Rule::template update<K>(pv, gv, sv, c);
      pp[j] = static_cast<T>(pv);
      for (int k = 0; k < K; ++k) sp[k][j] = static_cast<T>(sv[k]);
    }
  });
}

// Runs the step of `Rule` over one bucket. `target`: the bucket's fused-step cache and the group's
// device lr (CUDA; the kernels read the lr there, overriding h.lr); the CPU loop uses h.lr.
template <class Rule>
void elementwise_step(const char* op, const Bucket& bucket, BucketLists lists, const typename Rule::Hyper& h,
                      const StepArgs& args, FusedStepTarget target) {
  if (bucket.device.is_cpu()) {
    cpu_scalar(op, args.found_inf, "found_inf", bucket.device, 0.f);  // checks the device
    const bool scaled = args.grad_scale.defined();
    const float scale = cpu_scalar(op, args.grad_scale, "grad_scale", bucket.device, 1.f);
    const int k = static_cast<int>(lists.states.size());
    for (size_t i = 0; i < lists.params.size(); ++i) {
      float step = 1.f;
      if (!lists.steps.empty()) {
        float* s = static_cast<float*>(lists.steps[i].data_ptr());
        *s += 1.f;
        step = *s;
      }
      visit_dtype(bucket.dtype, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, Half> ||
                      std::is_same_v<T, BFloat16>) {
          auto try_variant = [&](auto v) {
            if (decltype(v)::kStates == k) cpu_update<Rule, decltype(v)::kStates, T>(lists, i, step, h, scaled, scale);
          };
          std::apply([&](auto... v) { (try_variant(v), ...); }, typename Rule::Variants{});
        }
      });
      bump_version(lists.params[i]);
    }
    return;
  }
#if defined(TG_WITH_CUDA)
  cuda::StepLists l;
  l.shadows = shadows_for_update(lists.params);  // before the version bumps
  for (const Tensor& p : lists.params) bump_version(p);
  l.params = std::move(lists.params);
  l.grads = std::move(lists.grads);
  l.states = std::move(lists.states);
  l.steps = std::move(lists.steps);
  const float* grad_scale = device_scalar(op, args.grad_scale, "grad_scale", bucket.device);
  const float* found_inf = device_scalar(op, args.found_inf, "found_inf", bucket.device);
  l.lr = target.lr;
  cuda::fused_rule_step(target.cache, op, l, h, grad_scale, found_inf);
  shadows_updated(l.params, l.shadows);
#else
  (void)target;
  TG_ERROR(op, ": parameters on ", bucket.device, " but tapegrad was built without CUDA");
#endif
}

}  // namespace tg::optim::detail
