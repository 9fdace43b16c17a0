// The grad scaler's kernels: the fused inf/NaN check (+ unscale) over every
// gradient, built on the shared multi-tensor apply, and the one-thread scale
// update, which also clears the found_inf flags it consumed. Both read the scale
// and found_inf on the device: no host sync.
#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include <tapegrad/amp/cuda/amp_kernels.h>
#include <tapegrad/core/backend/cuda/multi_tensor.cuh>

namespace tg::cuda::kern {
int sm_count(int device);  // core/backend/cuda/reduce.cu
}

namespace tg::amp::cuda {

namespace {
namespace mt = ::tg::cuda::mt;

// Depth 1 over the gradients. kUnscale: write back g * (1 / scale) (PyTorch's
// inv_scale, computed in double and rounded to float); otherwise read only.
template <class T, bool kUnscale>
struct CheckUnscaleFunctor {
  __device__ void operator()(const mt::TensorListMeta<1>& meta, int64_t chunk_size, float* found_inf,
                             const float* scale) const {
    using M = mt::opmath_t<T>;
    M inv = M(1);
    if constexpr (kUnscale) inv = static_cast<M>(static_cast<float>(1.0 / static_cast<double>(*scale)));
    bool bad = false;
    mt::chunk_foreach<T, 1, kUnscale ? 1u : 0u>(meta, chunk_size, [&](M(&e)[1]) {
      // Checked before scaling, as PyTorch does (the scaled value of a finite one is finite).
      bad |= !isfinite(e[0]);
      if constexpr (kUnscale) e[0] = inv == M(1) ? e[0] : e[0] * inv;
    });
    // Every writer stores the same 1.0f, so the race is benign; one write per thread at most.
    if (bad) *found_inf = 1.f;
  }
};

struct FoundInfs {
  float* ptr[kMaxFoundInfs];
  int n;
};

__global__ void update_scale_kernel(float* scale, int32_t* growth_tracker, FoundInfs found, double growth_factor,
                                    double backoff_factor, int64_t growth_interval) {
  bool overflow = false;
  for (int i = 0; i < found.n; ++i) {
    overflow |= *found.ptr[i] != 0.f;
    *found.ptr[i] = 0.f;  // consumed: zero for the next iteration's check
  }
  if (overflow) {
    *scale = static_cast<float>(static_cast<double>(*scale) * backoff_factor);
    *growth_tracker = 0;
  } else {
    const int64_t successful = static_cast<int64_t>(*growth_tracker) + 1;
    if (successful == growth_interval) {
      const float grown = static_cast<float>(static_cast<double>(*scale) * growth_factor);
      if (isfinite(grown)) *scale = grown;
      *growth_tracker = 0;
    } else {
      *growth_tracker = static_cast<int32_t>(successful);
    }
  }
}

}  // namespace

void non_finite_check_and_unscale(const std::vector<Tensor>& grads, const Tensor& found_inf, const Tensor& scale) {
  if (grads.empty()) return;
  const int device = found_inf.device().index();
  ::tg::cuda::detail::DeviceGuard guard(device);
  cudaStream_t stream = ::tg::cuda::detail::current_stream_handle(device);
  std::map<DType, std::vector<mt::TensorListEntry<1>>> by_dtype;
  for (const Tensor& g : grads) {
    mt::TensorListEntry<1> e{};
    e.ptrs[0] = g.data_ptr();
    e.aux = nullptr;
    e.numel = g.numel();
    by_dtype[g.dtype()].push_back(e);
  }
  float* inf_ptr = static_cast<float*>(found_inf.data_ptr());
  const float* scale_ptr = scale.defined() ? static_cast<const float*>(scale.data_ptr()) : nullptr;
  for (auto& [dtype, entries] : by_dtype) {
    // Chunks small enough that a few MB (the float16 operands standing in for a weight
    // gradient, core/finite_proxy.h) still spread over every SM: ~2 blocks per SM, a chunk
    // of 2048 to 65536 elements. Plans are a few hundred bytes of host work; the gradients
    // are new tensors every iteration, so there is little to gain from caching them.
    int64_t total = 0;
    for (const auto& e : entries) total += e.numel;
    const int64_t blocks = 2 * int64_t{::tg::cuda::kern::sm_count(device)};
    const int64_t per_block = (total + blocks - 1) / blocks;
    const int64_t chunk = std::clamp<int64_t>((per_block + 2047) / 2048 * 2048, 2048, mt::kChunkSize);
    const mt::MultiTensorPlan<1> plan(std::move(entries), chunk);
    mt::dispatch_floating(dtype, "GradScaler.unscale_", [&](auto tag) {
      using T = decltype(tag);
      if (scale_ptr)
        plan.launch(stream, CheckUnscaleFunctor<T, true>{}, inf_ptr, scale_ptr);
      else
        plan.launch(stream, CheckUnscaleFunctor<T, false>{}, inf_ptr, scale_ptr);
    });
  }
}

void update_scale(const Tensor& scale, const Tensor& growth_tracker, const std::vector<Tensor>& found_infs,
                  double growth_factor, double backoff_factor, int64_t growth_interval) {
  TG_CHECK(!found_infs.empty() && found_infs.size() <= static_cast<size_t>(kMaxFoundInfs),
           "GradScaler.update: ", found_infs.size(), " found_inf flags (1 to ", kMaxFoundInfs, " per launch)");
  FoundInfs found{};
  found.n = static_cast<int>(found_infs.size());
  for (size_t i = 0; i < found_infs.size(); ++i) found.ptr[i] = static_cast<float*>(found_infs[i].data_ptr());
  const int device = scale.device().index();
  ::tg::cuda::detail::DeviceGuard guard(device);
  cudaStream_t stream = ::tg::cuda::detail::current_stream_handle(device);
  update_scale_kernel<<<1, 1, 0, stream>>>(static_cast<float*>(scale.data_ptr()),
                                           static_cast<int32_t*>(growth_tracker.data_ptr()), found, growth_factor,
                                           backoff_factor, growth_interval);
  TG_CUDA_CHECK_LAUNCH();
}

}  // namespace tg::amp::cuda
