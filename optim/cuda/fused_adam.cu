// The fused CUDA step of Adam and AdamW: one multi-tensor launch (per 320 chunks /
// list of tensors) updates every parameter, exp_avg, exp_avg_sq (and
// max_exp_avg_sq) of a bucket. Each block computes its parameter's step as the
// stored count plus one; the launch's last block advances the counts (so a step is
// a single launch, and a step skipped on found_inf advances nothing). Optionally
// the same pass writes the parameters' low-precision shadow copies. found_inf and
// grad_scale are read on the device, so nothing here waits for the GPU.
#include <memory>
#include <vector>

#include <tapegrad/core/backend/cuda/multi_tensor.cuh>
#include <tapegrad/optim/cuda/fused.h>
#include <tapegrad/optim/cuda/step_count.cuh>

namespace tg::optim::cuda {
namespace {

// Lists: params, grads, exp_avg, exp_avg_sq, [max_exp_avg_sq], [shadows].
template <class T, bool kAmsgrad, class Shadow>
struct AdamFunctor {
  static constexpr bool kShadow = !std::is_void_v<Shadow>;
  static constexpr int kDepth = 4 + (kAmsgrad ? 1 : 0) + (kShadow ? 1 : 0);
  // params, exp_avg, exp_avg_sq (and max_exp_avg_sq) are written; grads only read.
  static constexpr unsigned kWriteMask = kAmsgrad ? 0b11101u : 0b1101u;

  __device__ void operator()(const mt::TensorListMeta<kDepth>& meta, int64_t chunk_size, detail::AdamHyper h,
                             const float* grad_scale, const float* found_inf, unsigned int* done) const {
    using M = mt::opmath_t<T>;
    if (found_inf != nullptr && *found_inf != 0.f) return;  // every block: no count advances
    const int tensor = meta.block_to_tensor[blockIdx.x];
    // This step's count: the stored one (advanced only after every block has read it) plus one.
    const float step = *static_cast<const float*>(meta.aux[tensor]) + 1.f;
    const detail::AdamCoeffs<M> c = detail::adam_coeffs<M>(h, step);
    const bool scaled = grad_scale != nullptr;
    const M scale = scaled ? static_cast<M>(*grad_scale) : M(1);
    mt::chunk_foreach<T, kDepth, kWriteMask, Shadow>(meta, chunk_size, [&](M(&e)[kDepth]) {
      const M g = scaled ? e[1] / scale : e[1];
      if constexpr (kAmsgrad) {
        detail::adam_update(e[0], g, e[2], e[3], e[4], c);
      } else {
        M unused = 0;
        detail::adam_update(e[0], g, e[2], e[3], unused, c);
      }
    });
    mt::advance_counts_when_done(meta, done);
  }
};

template <bool kAmsgrad, class Shadow>
void run(std::unique_ptr<FusedCache>& cache, const AdamLists& l, const detail::AdamHyper& h, const float* grad_scale,
         const float* found_inf) {
  constexpr bool kShadow = !std::is_void_v<Shadow>;
  constexpr int kDepth = 4 + (kAmsgrad ? 1 : 0) + (kShadow ? 1 : 0);
  const size_t n = l.params.size();
  std::vector<mt::TensorListEntry<kDepth>> entries(n);
  for (size_t i = 0; i < n; ++i) {
    auto& e = entries[i];
    e.ptrs[0] = l.params[i].data_ptr();
    e.ptrs[1] = l.grads[i].data_ptr();
    e.ptrs[2] = l.exp_avgs[i].data_ptr();
    e.ptrs[3] = l.exp_avg_sqs[i].data_ptr();
    if constexpr (kAmsgrad) e.ptrs[4] = l.max_exp_avg_sqs[i].data_ptr();
    if constexpr (kShadow) e.ptrs[kDepth - 1] = l.shadows[i].defined() ? l.shadows[i].data_ptr() : nullptr;
    e.aux = l.steps[i].data_ptr();
    e.numel = l.params[i].numel();
  }
  launch_fused_step<kDepth, Shadow>(cache, l.params[0], "Adam.step", std::move(entries), h, grad_scale, found_inf,
                                    [](auto tag) { return AdamFunctor<decltype(tag), kAmsgrad, Shadow>{}; });
}

}  // namespace

void fused_adam_step(std::unique_ptr<FusedCache>& cache, const AdamLists& lists, const detail::AdamHyper& hyper,
                     const float* grad_scale, const float* found_inf) {
  if (lists.params.empty()) return;
  DType sdtype = kFloat16;
  const bool any_shadow = shadow_dtype(lists.shadows, lists.params, "Adam.step", sdtype);
  dispatch_shadow(any_shadow, sdtype, "Adam.step", [&](auto shadow_tag) {
    using S = typename decltype(shadow_tag)::type;
    if (hyper.amsgrad)
      run<true, S>(cache, lists, hyper, grad_scale, found_inf);
    else
      run<false, S>(cache, lists, hyper, grad_scale, found_inf);
  });
}

}  // namespace tg::optim::cuda
