// The fused CUDA step of Adam and AdamW: one launch advances the device-side step
// counts of a bucket, then multi-tensor launches update every parameter, exp_avg,
// exp_avg_sq (and max_exp_avg_sq) chunk by chunk. found_inf and grad_scale are
// read on the device, so nothing here waits for the GPU.
#include <memory>
#include <vector>

#include "core/backend/cuda/multi_tensor.cuh"
#include "optim/cuda/fused.h"
#include "optim/cuda/step_count.cuh"

namespace tg::optim::cuda {
namespace {

namespace mt = ::tg::cuda::mt;

template <class T, int Depth>
struct AdamFunctor {
  static_assert(Depth == 4 || Depth == 5);
  // params, exp_avg, exp_avg_sq (and max_exp_avg_sq) are written; grads only read.
  static constexpr unsigned kWriteMask = Depth == 5 ? 0b11101u : 0b1101u;

  __device__ void operator()(const mt::TensorListMeta<Depth>& meta, int64_t chunk_size, detail::AdamHyper h,
                             const float* grad_scale, const float* found_inf) const {
    using M = mt::opmath_t<T>;
    if (found_inf != nullptr && *found_inf != 0.f) return;
    const int tensor = meta.block_to_tensor[blockIdx.x];
    const float step = *static_cast<const float*>(meta.aux[tensor]);
    const detail::AdamCoeffs<M> c = detail::adam_coeffs<M>(h, step);
    const bool scaled = grad_scale != nullptr;
    const M scale = scaled ? static_cast<M>(*grad_scale) : M(1);
    mt::chunk_foreach<T, Depth, kWriteMask>(meta, chunk_size, [&](M(&e)[Depth]) {
      const M g = scaled ? e[1] / scale : e[1];
      if constexpr (Depth == 5) {
        detail::adam_update(e[0], g, e[2], e[3], e[4], c);
      } else {
        M unused = 0;
        detail::adam_update(e[0], g, e[2], e[3], unused, c);
      }
    });
  }
};

template <int Depth>
struct AdamCache final : FusedCache {
  mt::MultiTensorPlan<Depth> plan;
  std::vector<StepList> steps;
};

template <int Depth>
void run(std::unique_ptr<FusedCache>& cache, const AdamLists& l, const detail::AdamHyper& h, const float* grad_scale,
         const float* found_inf) {
  const size_t n = l.params.size();
  std::vector<mt::TensorListEntry<Depth>> entries(n);
  for (size_t i = 0; i < n; ++i) {
    auto& e = entries[i];
    e.ptrs[0] = l.params[i].data_ptr();
    e.ptrs[1] = l.grads[i].data_ptr();
    e.ptrs[2] = l.exp_avgs[i].data_ptr();
    e.ptrs[3] = l.exp_avg_sqs[i].data_ptr();
    if constexpr (Depth == 5) e.ptrs[4] = l.max_exp_avg_sqs[i].data_ptr();
    e.aux = l.steps[i].data_ptr();
    e.numel = l.params[i].numel();
  }
  auto* c = dynamic_cast<AdamCache<Depth>*>(cache.get());
  if (c == nullptr || !c->plan.matches(entries)) {
    auto fresh = std::make_unique<AdamCache<Depth>>();
    std::vector<float*> step_ptrs(n);
    for (size_t i = 0; i < n; ++i) step_ptrs[i] = static_cast<float*>(entries[i].aux);
    fresh->steps = make_step_lists(step_ptrs);
    fresh->plan = mt::MultiTensorPlan<Depth>(std::move(entries));
    c = fresh.get();
    cache = std::move(fresh);
  }
  const int device = l.params[0].device().index();
  ::tg::cuda::detail::DeviceGuard guard(device);
  cudaStream_t stream = ::tg::cuda::detail::current_stream_handle(device);
  advance_steps(c->steps, found_inf, stream);
  mt::dispatch_floating(l.params[0].dtype(), "Adam.step", [&](auto tag) {
    using T = decltype(tag);
    c->plan.launch(stream, AdamFunctor<T, Depth>{}, h, grad_scale, found_inf);
  });
}

}  // namespace

void fused_adam_step(std::unique_ptr<FusedCache>& cache, const AdamLists& lists, const detail::AdamHyper& hyper,
                     const float* grad_scale, const float* found_inf) {
  if (lists.params.empty()) return;
  if (hyper.amsgrad)
    run<5>(cache, lists, hyper, grad_scale, found_inf);
  else
    run<4>(cache, lists, hyper, grad_scale, found_inf);
}

}  // namespace tg::optim::cuda
