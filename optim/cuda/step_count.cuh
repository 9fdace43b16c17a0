// What a fused CUDA step keeps between steps: its multi-tensor plans (one per list
// depth, rebuilt only when a pointer changes) and the device done-counter its
// launches use to advance the per-parameter step counts in the same launch
// (mt::advance_counts_when_done): a step is one launch per plan launch, with no
// separate launch for the counts. Also the dispatch over the dtype of the
// low-precision shadow copies a step may write (core/cast_copies.h).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <tapegrad/core/backend/cuda/multi_tensor.cuh>
#include <tapegrad/core/ops.h>
#include <tapegrad/core/tensor.h>
#include <tapegrad/optim/optimizer.h>

namespace tg::optim::cuda {

namespace mt = ::tg::cuda::mt;

struct FusedStepCache final : FusedCache {
  Tensor done;  // int32 0-d, zero between launches (each launch re-arms it)
  std::tuple<mt::MultiTensorPlan<2>, mt::MultiTensorPlan<3>, mt::MultiTensorPlan<4>, mt::MultiTensorPlan<5>,
             mt::MultiTensorPlan<6>>
      plans;

  unsigned int* done_ptr() const { return static_cast<unsigned int*>(done.data_ptr()); }

  // The plan for these entries: the cached one when every pointer and size matches.
  template <int Depth>
  const mt::MultiTensorPlan<Depth>& plan(std::vector<mt::TensorListEntry<Depth>>&& entries) {
    auto& p = std::get<mt::MultiTensorPlan<Depth>>(plans);
    if (!p.matches(entries)) p = mt::MultiTensorPlan<Depth>(std::move(entries));
    return p;
  }
};

// The cache of a bucket, created on first use. The done-counter is allocated (and
// zeroed on the current stream) once per cache, not per step.
inline FusedStepCache& step_cache(std::unique_ptr<FusedCache>& cache, Device device) {
  auto* c = dynamic_cast<FusedStepCache*>(cache.get());
  if (c == nullptr || c->done.device() != device) {
    auto fresh = std::make_unique<FusedStepCache>();
    fresh->done = tg::zeros({}, TensorOptions().dtype(kInt32).device(device));
    c = fresh.get();
    cache = std::move(fresh);
  }
  return *c;
}

// Whether any shadow is defined, and their one dtype (mixing dtypes is an error).
inline bool shadow_dtype(const std::vector<Tensor>& shadows, const std::vector<Tensor>& params, const char* op,
                         DType& dtype) {
  bool any = false;
  for (size_t i = 0; i < shadows.size(); ++i) {
    const Tensor& s = shadows[i];
    if (!s.defined()) continue;
    TG_CHECK(!any || s.dtype() == dtype, op, ": low-precision copies of one bucket mix ", dtype, " and ", s.dtype());
    TG_CHECK(params[i].dtype() == kFloat32 && s.numel() == params[i].numel() && s.is_contiguous(), op,
             ": a low-precision copy ", s.dtype(), " ", s.sizes(), " does not fit its parameter ", params[i].dtype(),
             " ", params[i].sizes());
    any = true;
    dtype = s.dtype();
  }
  return any;
}

// Calls f(S{}) with S = void (no shadows), __half or __nv_bfloat16, the CUDA type
// of the shadows' dtype (float32 parameters only).
template <class F>
void dispatch_shadow(bool any, DType dtype, const char* op, F&& f) {
  if (!any) {
    f(std::type_identity<void>{});
    return;
  }
  switch (dtype) {
    case DType::Float16: f(std::type_identity<__half>{}); return;
    case DType::BFloat16: f(std::type_identity<__nv_bfloat16>{}); return;
    default: TG_ERROR(op, ": a low-precision parameter copy must be float16 or bfloat16, got ", dtype_name(dtype));
  }
}

// Launches one fused step over `entries` on the parameters' device and current stream:
// the bucket's cached plan and done-counter, and the functor make(T{}) for the parameters'
// CUDA type T (float when Shadow is a low-precision type: shadows need float32 parameters).
// make's functor is called as f(meta, chunk, hyper, lr, grad_scale, found_inf, done) (lr: the device
// lr overriding hyper.lr, or null).
template <int kDepth, class Shadow, class Hyper, class Make>
void launch_fused_step(std::unique_ptr<FusedCache>& cache, const Tensor& param0, const char* op,
                       std::vector<mt::TensorListEntry<kDepth>> entries, const Hyper& h, const double* lr,
                       const float* grad_scale, const float* found_inf, Make make) {
  const Device device = param0.device();
  ::tg::cuda::detail::DeviceGuard guard(device.index());
  cudaStream_t stream = ::tg::cuda::detail::current_stream_handle(device.index());
  FusedStepCache& c = step_cache(cache, device);
  const auto& plan = c.plan<kDepth>(std::move(entries));
  unsigned int* done = c.done_ptr();
  if constexpr (!std::is_void_v<Shadow>) {
    plan.launch(stream, make(float{}), h, lr, grad_scale, found_inf, done);
  } else {
    mt::dispatch_floating(param0.dtype(), op, [&](auto tag) { plan.launch(stream, make(tag), h, lr, grad_scale, found_inf, done); });
  }
}

}  // namespace tg::optim::cuda
