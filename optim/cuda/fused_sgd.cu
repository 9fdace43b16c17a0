// The fused CUDA step of SGD: one multi-tensor launch (per 320 chunks / list of
// tensors) updates every parameter (and momentum buffer) of a bucket. With
// momentum each block reads its parameter's step count (old + 1 tells whether
// the buffer is new) and the launch's last block advances the counts; optionally
// the same pass writes the parameters' low-precision shadow copies. found_inf and
// grad_scale are read on the device, so nothing here waits for the GPU.
#include <memory>
#include <vector>

#include <tapegrad/core/backend/cuda/multi_tensor.cuh>
#include <tapegrad/optim/cuda/fused.h>
#include <tapegrad/optim/cuda/step_count.cuh>

namespace tg::optim::cuda {
namespace {

// Lists: params, grads, [momentum buffers], [shadows]. Shadow = void: none.
template <class T, bool kMomentum, class Shadow>
struct SgdFunctor {
  static constexpr bool kShadow = !std::is_void_v<Shadow>;
  static constexpr int kDepth = 2 + (kMomentum ? 1 : 0) + (kShadow ? 1 : 0);
  static constexpr unsigned kWriteMask = kMomentum ? 0b101u : 0b1u;

  __device__ void operator()(const mt::TensorListMeta<kDepth>& meta, int64_t chunk_size, detail::SgdHyper h,
                             const float* grad_scale, const float* found_inf, unsigned int* done) const {
    using M = mt::opmath_t<T>;
    if (found_inf != nullptr && *found_inf != 0.f) return;  // every block: no count advances
    const int tensor = meta.block_to_tensor[blockIdx.x];
    // This step's count: the stored one (advanced only after every block has read it) plus one.
    const float step = kMomentum ? *static_cast<const float*>(meta.aux[tensor]) + 1.f : 1.f;
    const detail::SgdCoeffs<M> c = detail::sgd_coeffs<M>(h, step);
    const bool scaled = grad_scale != nullptr;
    const M scale = scaled ? static_cast<M>(*grad_scale) : M(1);
    mt::chunk_foreach<T, kDepth, kWriteMask, Shadow>(meta, chunk_size, [&](M(&e)[kDepth]) {
      const M g = scaled ? e[1] / scale : e[1];
      if constexpr (kMomentum) {
        detail::sgd_update(e[0], g, e[2], c);
      } else {
        M unused = 0;
        detail::sgd_update(e[0], g, unused, c);
      }
    });
    if constexpr (kMomentum) mt::advance_counts_when_done(meta, done);
  }
};

template <bool kMomentum, class Shadow>
void run(std::unique_ptr<FusedCache>& cache, const SgdLists& l, const detail::SgdHyper& h, const float* grad_scale,
         const float* found_inf) {
  constexpr bool kShadow = !std::is_void_v<Shadow>;
  constexpr int kDepth = 2 + (kMomentum ? 1 : 0) + (kShadow ? 1 : 0);
  const size_t n = l.params.size();
  std::vector<mt::TensorListEntry<kDepth>> entries(n);
  for (size_t i = 0; i < n; ++i) {
    auto& e = entries[i];
    e.ptrs[0] = l.params[i].data_ptr();
    e.ptrs[1] = l.grads[i].data_ptr();
    if constexpr (kMomentum) {
      e.ptrs[2] = l.momentum_buffers[i].data_ptr();
      e.aux = l.steps[i].data_ptr();
    } else {
      e.aux = nullptr;
    }
    if constexpr (kShadow) e.ptrs[kDepth - 1] = l.shadows[i].defined() ? l.shadows[i].data_ptr() : nullptr;
    e.numel = l.params[i].numel();
  }
  launch_fused_step<kDepth, Shadow>(cache, l.params[0], "SGD.step", std::move(entries), h, grad_scale, found_inf,
                                    [](auto tag) { return SgdFunctor<decltype(tag), kMomentum, Shadow>{}; });
}

}  // namespace

void fused_sgd_step(std::unique_ptr<FusedCache>& cache, const SgdLists& lists, const detail::SgdHyper& hyper,
                    const float* grad_scale, const float* found_inf) {
  if (lists.params.empty()) return;
  DType sdtype = kFloat16;
  const bool any_shadow = shadow_dtype(lists.shadows, lists.params, "SGD.step", sdtype);
  dispatch_shadow(any_shadow, sdtype, "SGD.step", [&](auto shadow_tag) {
    using S = typename decltype(shadow_tag)::type;
    if (hyper.momentum != 0)
      run<true, S>(cache, lists, hyper, grad_scale, found_inf);
    else
      run<false, S>(cache, lists, hyper, grad_scale, found_inf);
  });
}

}  // namespace tg::optim::cuda
