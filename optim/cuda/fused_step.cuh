// The one fused multi-tensor CUDA step of the elementwise optimizers (SGD, Adam, AdamW; RMSprop
// and Adagrad join it): one launch per multi-tensor plan updates every parameter of a bucket and
// its K state tensors with the optimizer's rule (optim/update_math.h). Each block computes its
// parameter's step as the stored count plus one; the launch's last block advances the counts (a
// step is a single launch, and a step skipped on found_inf advances nothing). Optionally the same
// pass writes the parameters' low-precision copies (core/cast_copies.h). found_inf, grad_scale and
// the lr (StepLists::lr, overriding the Hyper's `lr`, which every rule has) are read on the device,
// so nothing here waits for the GPU and a captured step uses the lr set before each replay.
#pragma once
#include <memory>
#include <tuple>
#include <type_traits>
#include <vector>

#include <tapegrad/core/backend/cuda/multi_tensor.cuh>
#include <tapegrad/optim/cuda/fused.h>
#include <tapegrad/optim/cuda/step_count.cuh>
#include <tapegrad/optim/update_math.h>

namespace tg::optim::cuda {
namespace fused_detail {

// Lists: params, grads, K state lists, [shadows]. Shadow = void: none.
template <class T, class Rule, int K, bool kCounted, class Shadow>
struct StepFunctor {
  static constexpr bool kShadow = !std::is_void_v<Shadow>;
  static constexpr int kDepth = 2 + K + (kShadow ? 1 : 0);
  // The parameter and the states are written, the gradient only read (the shadow by chunk_foreach).
  static constexpr unsigned kWriteMask = 1u | (((1u << K) - 1u) << 2);

  __device__ void operator()(const mt::TensorListMeta<kDepth>& meta, int64_t chunk_size, typename Rule::Hyper h,
                             const double* lr, const float* grad_scale, const float* found_inf,
                             unsigned int* done) const {
    using M = mt::opmath_t<T>;
    if (found_inf != nullptr && *found_inf != 0.f) return;  // every block: no count advances
    if (lr != nullptr) h.lr = *lr;
    const int tensor = meta.block_to_tensor[blockIdx.x];
    // This step's count: the stored one (advanced only after every block has read it) plus one.
    const float step = kCounted ? *static_cast<const float*>(meta.aux[tensor]) + 1.f : 1.f;
    // The block's only read of a count is above: it arrives at the done counter now, so the
    // counter's atomic and the last block's count updates overlap the chunk's loads instead of
    // following them.
    if constexpr (kCounted) mt::advance_counts_when_done(meta, done);
    const auto c = Rule::template coeffs<M>(h, step);
    const bool scaled = grad_scale != nullptr;
    const M scale = scaled ? static_cast<M>(*grad_scale) : M(1);
    mt::chunk_foreach<T, kDepth, kWriteMask, Shadow>(meta, chunk_size, [&](M(&e)[kDepth]) {
      const M g = scaled ? e[1] / scale : e[1];
      Rule::template update<K>(e[0], g, e + 2, c);
    });
  }
};

template <class Rule, int K, bool kCounted, class Shadow>
void run(std::unique_ptr<FusedCache>& cache, const char* op, const StepLists& l, const typename Rule::Hyper& h,
         const float* grad_scale, const float* found_inf) {
  constexpr bool kShadow = !std::is_void_v<Shadow>;
  constexpr int kDepth = 2 + K + (kShadow ? 1 : 0);
  const size_t n = l.params.size();
  std::vector<mt::TensorListEntry<kDepth>> entries(n);
  for (size_t i = 0; i < n; ++i) {
    auto& e = entries[i];
    e.ptrs[0] = l.params[i].data_ptr();
    e.ptrs[1] = l.grads[i].data_ptr();
    for (int k = 0; k < K; ++k) e.ptrs[2 + k] = l.states[k][i].data_ptr();
    if constexpr (kShadow) e.ptrs[kDepth - 1] = l.shadows[i].defined() ? l.shadows[i].data_ptr() : nullptr;
    e.aux = kCounted ? l.steps[i].data_ptr() : nullptr;
    e.numel = l.params[i].numel();
  }
  launch_fused_step<kDepth, Shadow>(cache, l.params[0], op, std::move(entries), h, l.lr, grad_scale, found_inf,
                                    [](auto tag) { return StepFunctor<decltype(tag), Rule, K, kCounted, Shadow>{}; });
}

}  // namespace fused_detail

// The step of `Rule` over one bucket, in the variant its lists have (Rule::Variants).
template <class Rule>
void fused_step(std::unique_ptr<FusedCache>& cache, const char* op, const StepLists& lists,
                const typename Rule::Hyper& hyper, const float* grad_scale, const float* found_inf) {
  if (lists.params.empty()) return;
  DType sdtype = kFloat16;
  const bool any_shadow = shadow_dtype(lists.shadows, lists.params, op, sdtype);
  const int k = static_cast<int>(lists.states.size());
  const bool counted = !lists.steps.empty();
  dispatch_shadow(any_shadow, sdtype, op, [&](auto shadow_tag) {
    using S = typename decltype(shadow_tag)::type;
    bool ran = false;
    auto try_variant = [&](auto v) {
      using V = decltype(v);
      if (ran || V::kStates != k || V::kCounted != counted) return;
      fused_detail::run<Rule, V::kStates, V::kCounted, S>(cache, op, lists, hyper, grad_scale, found_inf);
      ran = true;
    };
    std::apply([&](auto... v) { (try_variant(v), ...); }, typename Rule::Variants{});
    TG_CHECK(ran, op, ": no fused step with ", k, " state lists", counted ? " and step counts" : "");
  });
}

}  // namespace tg::optim::cuda
