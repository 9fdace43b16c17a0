// The fused CUDA step of SGD: multi-tensor launches update every parameter (and
// momentum buffer) of a bucket; with momentum a first launch advances the
// device-side step counts that tell the kernel whether a buffer is new. found_inf
// and grad_scale are read on the device, so nothing here waits for the GPU.
#include <memory>
#include <vector>

#include "core/backend/cuda/multi_tensor.cuh"
#include "optim/cuda/fused.h"
#include "optim/cuda/step_count.cuh"

namespace tg::optim::cuda {
namespace {

namespace mt = ::tg::cuda::mt;

// Depth 2: params, grads (no momentum). Depth 3: params, grads, momentum buffers.
template <class T, int Depth>
struct SgdFunctor {
  static constexpr unsigned kWriteMask = Depth == 3 ? 0b101u : 0b1u;

  __device__ void operator()(const mt::TensorListMeta<Depth>& meta, int64_t chunk_size, detail::SgdHyper h,
                             const float* grad_scale, const float* found_inf) const {
    using M = mt::opmath_t<T>;
    if (found_inf != nullptr && *found_inf != 0.f) return;
    const int tensor = meta.block_to_tensor[blockIdx.x];
    const float step = Depth == 3 ? *static_cast<const float*>(meta.aux[tensor]) : 1.f;
    const detail::SgdCoeffs<M> c = detail::sgd_coeffs<M>(h, step);
    const bool scaled = grad_scale != nullptr;
    const M scale = scaled ? static_cast<M>(*grad_scale) : M(1);
    mt::chunk_foreach<T, Depth, kWriteMask>(meta, chunk_size, [&](M(&e)[Depth]) {
      const M g = scaled ? e[1] / scale : e[1];
      if constexpr (Depth == 3) {
        detail::sgd_update(e[0], g, e[2], c);
      } else {
        M unused = 0;
        detail::sgd_update(e[0], g, unused, c);
      }
    });
  }
};

template <int Depth>
struct SgdCache final : FusedCache {
  mt::MultiTensorPlan<Depth> plan;
  std::vector<StepList> steps;
};

template <int Depth>
void run(std::unique_ptr<FusedCache>& cache, const SgdLists& l, const detail::SgdHyper& h, const float* grad_scale,
         const float* found_inf) {
  const size_t n = l.params.size();
  std::vector<mt::TensorListEntry<Depth>> entries(n);
  for (size_t i = 0; i < n; ++i) {
    auto& e = entries[i];
    e.ptrs[0] = l.params[i].data_ptr();
    e.ptrs[1] = l.grads[i].data_ptr();
    if constexpr (Depth == 3) {
      e.ptrs[2] = l.momentum_buffers[i].data_ptr();
      e.aux = l.steps[i].data_ptr();
    } else {
      e.aux = nullptr;
    }
    e.numel = l.params[i].numel();
  }
  auto* c = dynamic_cast<SgdCache<Depth>*>(cache.get());
  if (c == nullptr || !c->plan.matches(entries)) {
    auto fresh = std::make_unique<SgdCache<Depth>>();
    if constexpr (Depth == 3) {
      std::vector<float*> step_ptrs(n);
      for (size_t i = 0; i < n; ++i) step_ptrs[i] = static_cast<float*>(entries[i].aux);
      fresh->steps = make_step_lists(step_ptrs);
    }
    fresh->plan = mt::MultiTensorPlan<Depth>(std::move(entries));
    c = fresh.get();
    cache = std::move(fresh);
  }
  const int device = l.params[0].device().index();
  ::tg::cuda::detail::DeviceGuard guard(device);
  cudaStream_t stream = ::tg::cuda::detail::current_stream_handle(device);
  advance_steps(c->steps, found_inf, stream);
  mt::dispatch_floating(l.params[0].dtype(), "SGD.step", [&](auto tag) {
    using T = decltype(tag);
    c->plan.launch(stream, SgdFunctor<T, Depth>{}, h, grad_scale, found_inf);
  });
}

}  // namespace

void fused_sgd_step(std::unique_ptr<FusedCache>& cache, const SgdLists& lists, const detail::SgdHyper& hyper,
                    const float* grad_scale, const float* found_inf) {
  if (lists.params.empty()) return;
  if (hyper.momentum != 0)
    run<3>(cache, lists, hyper, grad_scale, found_inf);
  else
    run<2>(cache, lists, hyper, grad_scale, found_inf);
}

}  // namespace tg::optim::cuda
