// The CUDA kernels of gradient clipping (issue 16), on flat multi-tensor plans
// (multi_tensor.cuh). The total norm is one pass reading every tensor once: each block writes one
// partial, in float64, to a buffer, then counts itself done on a device counter (done_counters.h);
// the last block of the call to finish adds all the partials in a fixed order (bit-reproducible)
// and writes the norm and the clip coefficient, and re-arms the counter. That is one launch for
// up to kFlatMaxTensors tensors of one dtype (more tensors or dtypes: one launch each, in stream
// order, all counting on the same counter). Scaling and clamping are one read-write pass each.
// Nothing is read by the host, so all of it can be captured in a CUDA graph.
#include <cub/block/block_reduce.cuh>

#include <algorithm>
#include <cmath>
#include <map>
#include <type_traits>
#include <utility>
#include <vector>

#include <tapegrad/core/backend/cuda/done_counters.h>
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

// Blocks per SM of the norm pass (512 threads each): ranges are equal, so every block is
// resident from the start and they all finish together.
constexpr int kBlocksPerSm = 2;
// Blocks per SM of the read-write passes (scale, clamp): two waves of smaller ranges. Measured on
// the H200 in place over 497 MB of float32 (GPT-2 124M's gradients): 2 blocks per SM reach 3.0
// TB/s (read + written), 8 per SM 3.9 TB/s, against 4.2 TB/s for cudaMemcpy: with few long ranges
// the writes of hundreds of far-apart streams keep the DRAM switching pages.
constexpr int kRmwBlocksPerSm = 8;

// The dtype of the stored norm (the gradients' promoted dtype), known on the device.
enum class OutType : int { F32, F64, F16, BF16 };

OutType out_type(DType t) {
  switch (t) {
    case DType::Float32: return OutType::F32;
    case DType::Float64: return OutType::F64;
    case DType::Float16: return OutType::F16;
    case DType::BFloat16: return OutType::BF16;
    default: TG_ERROR("clip_grad_norm_: expected a floating dtype, got ", dtype_name(t));
  }
}

// What every launch of one total-norm call shares: the partials of all its blocks, the counter
// of blocks done, and where the last block writes the results.
struct NormCall {
  double* partials;  // one per block of every launch of the call
  unsigned* done;    // starts at 0; the last block sets it back to 0
  int total_blocks;  // of all the call's launches
  double p;
  void* total;  // one element of `total_type`
  OutType total_type;
  double* coef;  // or null
  double max_norm;
};

// Stores the norm as R and the clip coefficient min(max_norm / (stored + 1e-6), 1) in float32
// arithmetic (float64 for R = double), as PyTorch.
template <class R>
__device__ void store_norm(const NormCall& c, double norm) {
  R stored;
  if constexpr (std::is_same_v<R, double>)
    stored = norm;
  else
    stored = mt::from_opmath<R>(static_cast<float>(norm));
  *static_cast<R*>(c.total) = stored;
  if (c.coef == nullptr) return;
  if constexpr (std::is_same_v<R, double>) {
    const double q = c.max_norm / (stored + 1e-6);
    *c.coef = q > 1.0 ? 1.0 : q;  // NaN compares false and stays
  } else {
    const float q = static_cast<float>(c.max_norm) / (mt::to_opmath(stored) + 1e-6f);
    *c.coef = q > 1.f ? 1.0 : static_cast<double>(q);
  }
}

// Threads that read partials in the finish; the others of the block add nothing (0, which
// changes no sum and no max of values >= 0, NaN included). The order is the one the former
// separate 256-thread finish kernel used (strided per thread, then cub's warp reductions
// added in warp order), so the results are the same bits.
constexpr int kFinishThreads = 256;
static_assert(kFinishThreads <= mt::kFlatBlockSize && kFinishThreads % 32 == 0);

// Run by every thread of the last block: combines the partials into the norm and stores it.
template <NormKind K>
__device__ void finish_norm(const NormCall& c) {
  double acc = 0.0;
  if (threadIdx.x < kFinishThreads)
    for (int i = threadIdx.x; i < c.total_blocks; i += kFinishThreads) {
      const double v = __ldcg(c.partials + i);  // written by other blocks: past L1
      acc = K == NormKind::Inf ? nan_max(acc, v) : acc + v;
    }
  using Reduce = cub::BlockReduce<double, mt::kFlatBlockSize>;
  __shared__ typename Reduce::TempStorage tmp;
  const double all = K == NormKind::Inf ? Reduce(tmp).Reduce(acc, NanMaxOp{}) : Reduce(tmp).Sum(acc);
  if (threadIdx.x != 0) return;
  double norm = all;
  if constexpr (K == NormKind::L2)
    norm = sqrt(all);
  else if constexpr (K == NormKind::P)
    norm = pow(all, 1.0 / c.p);
  switch (c.total_type) {
    case OutType::F32: store_norm<float>(c, norm); break;
    case OutType::F64: store_norm<double>(c, norm); break;
    case OutType::F16: store_norm<__half>(c, norm); break;
    case OutType::BF16: store_norm<__nv_bfloat16>(c, norm); break;
  }
  *c.done = 0;  // re-armed for the next call on this stream (or the next replay of a graph)
}

// One partial per block, sum |x|^p (max |x| for Inf) over the block's range accumulated in A,
// stored at partials[first_block + blockIdx.x]; the call's last block to finish (of this launch
// or, with several launches, of the last one: launches on a stream run in order) adds them all.
template <class T, NormKind K>
__global__ void __launch_bounds__(mt::kFlatBlockSize, kBlocksPerSm)
    norm_kernel(const __grid_constant__ mt::FlatListMeta meta, int first_block, const NormCall call) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const A pp = static_cast<A>(call.p);
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
  __shared__ bool last;
  if (threadIdx.x == 0) {
    call.partials[first_block + static_cast<int>(blockIdx.x)] = static_cast<double>(block);
    __threadfence();  // the partial is visible before the count says so
    last = atomicAdd(call.done, 1u) == static_cast<unsigned>(call.total_blocks - 1);
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  finish_norm<K>(call);
}

template <class T>
__global__ void __launch_bounds__(mt::kFlatBlockSize, kBlocksPerSm)
    scale_kernel(const __grid_constant__ mt::FlatListMeta meta, const double* factor) {
  using M = mt::opmath_t<T>;
  const M f = static_cast<M>(*factor);
  // x * 1 == x for every x (NaN stays NaN): clip_grad_norm_'s common "no clipping" case skips the pass.
  if (f == M(1)) return;
  auto op = [f](M& v) { v = v * f; };
  mt::flat_foreach<T, /*kWrite=*/true, /*kU=*/8>(meta, op);  // 8 x 16 bytes in flight per thread
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
  mt::flat_foreach<T, /*kWrite=*/true, /*kU=*/8>(meta, op);
}

// The tensors grouped by dtype (in DType order: a fixed launch order), as (address, numel).
std::map<DType, std::vector<std::pair<void*, int64_t>>> by_dtype(const std::vector<Tensor>& tensors) {
  std::map<DType, std::vector<std::pair<void*, int64_t>>> out;
  for (const Tensor& t : tensors) out[t.dtype()].emplace_back(t.data_ptr(), t.numel());
  return out;
}

int device_of(const Tensor& t) { return t.device().index() < 0 ? 0 : t.device().index(); }

int64_t per_block_for(const std::vector<Tensor>& tensors, int device, int blocks_per_sm) {
  std::vector<int64_t> numels;
  numels.reserve(tensors.size());
  for (const Tensor& t : tensors) numels.push_back(t.numel());
  return mt::flat_per_block(numels, int64_t{blocks_per_sm} * sm_count(device));
}

template <NormKind K>
void launch_norm(DType dtype, const std::vector<mt::FlatPlan::Launch>& launches, int first_block, const NormCall& call,
                 cudaStream_t stream) {
  mt::dispatch_floating(dtype, "clip_grad_norm_", [&](auto tag) {
    using T = decltype(tag);
    for (const auto& l : launches) {
      norm_kernel<T, K><<<l.blocks, mt::kFlatBlockSize, 0, stream>>>(l.meta, first_block + l.first_block, call);
      TG_CUDA_CHECK_LAUNCH();
    }
  });
}

// The launches of one plan (first_block: the plan's first among the call's blocks).
void launch_norm(NormKind kind, DType dtype, const std::vector<mt::FlatPlan::Launch>& launches, int first_block,
                 const NormCall& call, cudaStream_t stream) {
  switch (kind) {
    case NormKind::L1: launch_norm<NormKind::L1>(dtype, launches, first_block, call, stream); break;
    case NormKind::L2: launch_norm<NormKind::L2>(dtype, launches, first_block, call, stream); break;
    case NormKind::Inf: launch_norm<NormKind::Inf>(dtype, launches, first_block, call, stream); break;
    case NormKind::P: launch_norm<NormKind::P>(dtype, launches, first_block, call, stream); break;
  }
}

}  // namespace

void total_norm(const std::vector<Tensor>& tensors, double norm_type, const Tensor& total, const Tensor& coef,
                double max_norm) {
  const int device = device_of(total);
  cudaStream_t stream = detail::current_stream_handle(device);
  const int64_t per_block = per_block_for(tensors, device, kBlocksPerSm);
  std::vector<std::pair<DType, mt::FlatPlan>> plans;
  int blocks = 0;
  for (const auto& [dtype, list] : by_dtype(tensors)) {
    plans.emplace_back(dtype, mt::FlatPlan(list, per_block));
    blocks += plans.back().second.total_blocks();
  }
  // One partial per block of every plan. From the caching allocator, freed for this stream after
  // the launches (a graph's own pool while capturing). The counter is the stream's own (a
  // capture's arena slot while capturing a tg::cuda::Graph), left at 0 by the last block.
  DataPtr partials = detail::device_allocate(sizeof(double) * std::max(blocks, 1), device);
  DataPtr own_counter;
  NormCall call{};
  call.partials = static_cast<double*>(partials.get());
  call.done = detail::done_counters(device, stream, 1, own_counter);
  call.total_blocks = std::max(blocks, 1);
  call.p = norm_type;
  call.total = total.data_ptr();
  call.total_type = out_type(total.dtype());
  call.coef = coef.defined() ? static_cast<double*>(coef.data_ptr()) : nullptr;
  call.max_norm = max_norm;
  const NormKind kind = norm_kind(norm_type);
  int offset = 0;
  for (const auto& [dtype, plan] : plans) {
    launch_norm(kind, dtype, plan.launches(), offset, call, stream);
    offset += plan.total_blocks();
  }
  if (blocks == 0) {
    // Only empty tensors: one block over no tensors writes a partial of 0 and finishes (norm 0).
    mt::FlatPlan::Launch none{};
    none.blocks = 1;
    launch_norm(kind, DType::Float32, {none}, 0, call, stream);
  }
}

void multi_tensor_scale(const std::vector<Tensor>& tensors, const Tensor& factor) {
  const int device = device_of(factor);
  cudaStream_t stream = detail::current_stream_handle(device);
  const int64_t per_block = per_block_for(tensors, device, kRmwBlocksPerSm);
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
  const int64_t per_block = per_block_for(tensors, device, kRmwBlocksPerSm);
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
