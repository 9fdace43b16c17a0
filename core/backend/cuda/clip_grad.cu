// The CUDA kernels of gradient clipping (issue 16), on flat multi-tensor plans
// (multi_tensor.cuh): the total norm is one pass reading every tensor once (each block writes one
// partial, in float64, to a buffer; one launch per dtype and per kFlatMaxTensors tensors) and a
// one-block kernel that combines the partials in a fixed order into the norm and the clip
// coefficient; scaling and clamping are one read-write pass. Nothing is read by the host, so all
// of it can be captured in a CUDA graph.
#include <cub/block/block_reduce.cuh>

#include <algorithm>
#include <cmath>
#include <map>
#include <type_traits>
#include <utility>
#include <vector>

#include <tapegrad/core/backend/cuda/kernels.cuh>
#include <tapegrad/core/backend/cuda/multi_tensor.cuh>
#include <tapegrad/core/backend/cuda/runtime.h>

namespace tg::cuda::kern {

int sm_count(int device);  // reduce.cu

namespace {

namespace mt = ::tg::cuda::mt;

enum class NormKind : int { L1, L2, Inf, P };

NormKind norm_kind(double p) {
  if (std::isinf(p)) return NormKind::Inf;
  if (p == 1.0) return NormKind::L1;
  if (p == 2.0) return NormKind::L2;
  return NormKind::P;
}

// max that keeps a NaN from either side (fmax would drop it).
template <class A>
__device__ __forceinline__ A nan_max(A a, A b) {
  return (a != a || a > b) ? a : b;
}

struct NanMaxOp {
  template <class A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    return nan_max(a, b);
  }
};

// Blocks per SM of the flat passes (512 threads each): ranges are equal, so every block is
// resident from the start and they all finish together.
constexpr int kBlocksPerSm = 2;

// One partial per block: sum |x|^p (max |x| for Inf) over the block's range, accumulated in A.
template <class T, NormKind K>
__global__ void __launch_bounds__(mt::kFlatBlockSize, kBlocksPerSm)
    norm_partials_kernel(const __grid_constant__ mt::FlatListMeta meta, double* partials, double p) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const A pp = static_cast<A>(p);
  A acc = A(0);
  auto op = [&](A& v) {
    const A a = v < A(0) ? -v : v;  // |v|; NaN stays NaN
    if constexpr (K == NormKind::L1)
      acc += a;
    else if constexpr (K == NormKind::L2)
      acc += a * a;
    else if constexpr (K == NormKind::Inf)
      acc = nan_max(acc, a);
    else
      acc += pow(a, pp);
  };
  mt::flat_foreach<T, /*kWrite=*/false, /*kU=*/8>(meta, op);  // 128 bytes in flight per thread
  using Reduce = cub::BlockReduce<A, mt::kFlatBlockSize>;
  __shared__ typename Reduce::TempStorage tmp;
  A block;
  if constexpr (K == NormKind::Inf)
    block = Reduce(tmp).Reduce(acc, NanMaxOp{});
  else
    block = Reduce(tmp).Sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = static_cast<double>(block);
}

constexpr int kFinishThreads = 256;

// Combines n partials (fixed order: bit-reproducible) into the norm, stores it as R and the clip
// coefficient min(max_norm / (stored + 1e-6), 1) in float32 arithmetic (float64 for R = double).
template <class R>
__global__ void __launch_bounds__(kFinishThreads)
    norm_finish_kernel(const double* partials, int n, NormKind kind, double p, R* total, double* coef,
                       double max_norm) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < n; i += kFinishThreads) acc = kind == NormKind::Inf ? nan_max(acc, partials[i]) : acc + partials[i];
  using Reduce = cub::BlockReduce<double, kFinishThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const double all = kind == NormKind::Inf ? Reduce(tmp).Reduce(acc, NanMaxOp{}) : Reduce(tmp).Sum(acc);
  if (threadIdx.x != 0) return;
  double norm = all;
  if (kind == NormKind::L2)
    norm = sqrt(all);
  else if (kind == NormKind::P)
    norm = pow(all, 1.0 / p);
  R stored;
  if constexpr (std::is_same_v<R, double>)
    stored = norm;
  else
    stored = mt::from_opmath<R>(static_cast<float>(norm));
  *total = stored;
  if (coef == nullptr) return;
  if constexpr (std::is_same_v<R, double>) {
    double c = max_norm / (stored + 1e-6);
    *coef = c > 1.0 ? 1.0 : c;  // NaN compares false and stays
  } else {
    const float c = static_cast<float>(max_norm) / (mt::to_opmath(stored) + 1e-6f);
    *coef = c > 1.f ? 1.0 : static_cast<double>(c);
  }
}

template <class T>
__global__ void __launch_bounds__(mt::kFlatBlockSize, kBlocksPerSm)
    scale_kernel(const __grid_constant__ mt::FlatListMeta meta, const double* factor) {
  using M = mt::opmath_t<T>;
  const M f = static_cast<M>(*factor);
  // x * 1 == x for every x (NaN stays NaN): clip_grad_norm_'s common "no clipping" case skips the pass.
  if (f == M(1)) return;
  auto op = [f](M& v) { v = v * f; };
  // Backwards: the norm pass over the same plan ended on each range's last bytes, still in L2.
  mt::flat_foreach<T, /*kWrite=*/true, /*kU=*/4, /*kReverse=*/true>(meta, op);
}

template <class T>
__global__ void __launch_bounds__(mt::kFlatBlockSize, kBlocksPerSm)
    clamp_kernel(const __grid_constant__ mt::FlatListMeta meta, double lo, double hi) {
  using M = mt::opmath_t<T>;
  const M l = static_cast<M>(lo), h = static_cast<M>(hi);
  auto op = [l, h](M& v) {
    v = v < l ? l : v;  // clamp_min then clamp_max, as PyTorch; NaN stays
    v = v > h ? h : v;
  };
  mt::flat_foreach<T, /*kWrite=*/true>(meta, op);
}

// The tensors grouped by dtype (in DType order: a fixed launch order), as (address, numel).
std::map<DType, std::vector<std::pair<void*, int64_t>>> by_dtype(const std::vector<Tensor>& tensors) {
  std::map<DType, std::vector<std::pair<void*, int64_t>>> out;
  for (const Tensor& t : tensors) out[t.dtype()].emplace_back(t.data_ptr(), t.numel());
  return out;
}

int device_of(const Tensor& t) { return t.device().index() < 0 ? 0 : t.device().index(); }

int64_t per_block_for(const std::vector<Tensor>& tensors, int device) {
  std::vector<int64_t> numels;
  numels.reserve(tensors.size());
  for (const Tensor& t : tensors) numels.push_back(t.numel());
  return mt::flat_per_block(numels, int64_t{kBlocksPerSm} * sm_count(device));
}

template <NormKind K>
void launch_partials(DType dtype, const mt::FlatPlan& plan, double* partials, double p, cudaStream_t stream) {
  mt::dispatch_floating(dtype, "clip_grad_norm_", [&](auto tag) {
    using T = decltype(tag);
    for (const auto& l : plan.launches()) {
      norm_partials_kernel<T, K><<<l.blocks, mt::kFlatBlockSize, 0, stream>>>(l.meta, partials + l.first_block, p);
      TG_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace

void total_norm(const std::vector<Tensor>& tensors, double norm_type, const Tensor& total, const Tensor& coef,
                double max_norm) {
  const int device = device_of(total);
  cudaStream_t stream = detail::current_stream_handle(device);
  const int64_t per_block = per_block_for(tensors, device);
  std::vector<std::pair<DType, mt::FlatPlan>> plans;
  int blocks = 0;
  for (const auto& [dtype, list] : by_dtype(tensors)) {
    plans.emplace_back(dtype, mt::FlatPlan(list, per_block));
    blocks += plans.back().second.total_blocks();
  }
  // One partial per block of every plan; the finish kernel reads them all. From the caching
  // allocator, freed for this stream after the launches (a graph's own pool while capturing).
  DataPtr partials = detail::device_allocate(sizeof(double) * std::max(blocks, 1), device);
  double* part = static_cast<double*>(partials.get());
  const NormKind kind = norm_kind(norm_type);
  int offset = 0;
  for (const auto& [dtype, plan] : plans) {
    switch (kind) {
      case NormKind::L1: launch_partials<NormKind::L1>(dtype, plan, part + offset, norm_type, stream); break;
      case NormKind::L2: launch_partials<NormKind::L2>(dtype, plan, part + offset, norm_type, stream); break;
      case NormKind::Inf: launch_partials<NormKind::Inf>(dtype, plan, part + offset, norm_type, stream); break;
      case NormKind::P: launch_partials<NormKind::P>(dtype, plan, part + offset, norm_type, stream); break;
    }
    offset += plan.total_blocks();
  }
  double* coef_ptr = coef.defined() ? static_cast<double*>(coef.data_ptr()) : nullptr;
  mt::dispatch_floating(total.dtype(), "clip_grad_norm_", [&](auto tag) {
    using R = decltype(tag);
    // blocks == 0 (only empty tensors): the norm is 0.
    norm_finish_kernel<R><<<1, kFinishThreads, 0, stream>>>(part, blocks, kind, norm_type,
                                                             static_cast<R*>(total.data_ptr()), coef_ptr, max_norm);
    TG_CUDA_CHECK_LAUNCH();
  });
}

void multi_tensor_scale(const std::vector<Tensor>& tensors, const Tensor& factor) {
  const int device = device_of(factor);
  cudaStream_t stream = detail::current_stream_handle(device);
  const int64_t per_block = per_block_for(tensors, device);
  const double* f = static_cast<const double*>(factor.data_ptr());
  for (const auto& [dtype, list] : by_dtype(tensors)) {
    const mt::FlatPlan plan(list, per_block);
    mt::dispatch_floating(dtype, "clip_grad_norm_", [&](auto tag) {
      using T = decltype(tag);
      for (const auto& l : plan.launches()) {
        scale_kernel<T><<<l.blocks, mt::kFlatBlockSize, 0, stream>>>(l.meta, f);
        TG_CUDA_CHECK_LAUNCH();
      }
    });
  }
}

void multi_tensor_clamp(const std::vector<Tensor>& tensors, double lo, double hi) {
  const int device = device_of(tensors.front());
  cudaStream_t stream = detail::current_stream_handle(device);
  const int64_t per_block = per_block_for(tensors, device);
  for (const auto& [dtype, list] : by_dtype(tensors)) {
    const mt::FlatPlan plan(list, per_block);
    mt::dispatch_floating(dtype, "clip_grad_value_", [&](auto tag) {
      using T = decltype(tag);
      for (const auto& l : plan.launches()) {
        clamp_kernel<T><<<l.blocks, mt::kFlatBlockSize, 0, stream>>>(l.meta, lo, hi);
        TG_CUDA_CHECK_LAUNCH();
      }
    });
  }
}

}  // namespace tg::cuda::kern
