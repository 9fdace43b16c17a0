// Multi-tensor apply: one kernel launch updates chunks of many tensors at once
// (PyTorch's MultiTensorApply idea). The host packs, per launch, the addresses of
// up to kMaxTensors<Depth> tensors from Depth parallel lists (e.g. params, grads,
// exp_avg, exp_avg_sq) plus a per-tensor auxiliary pointer (e.g. a step count)
// and a block -> (tensor, chunk) map into the kernel's argument struct, which
// stays under the classic 4 KB kernel-parameter limit. A MultiTensorPlan is built
// once for a list of tensors and relaunched as long as the pointers stay the same,
// so a step costs a few launches and almost no host work.
//
// A kernel author writes a functor `f(meta, chunk_size, args...)` that runs on a
// block; chunk_foreach<T, Depth, kWriteMask>(meta, chunk_size, op) does the loads
// (16-byte vectors when aligned), calls op(M (&v)[Depth]) per element in "opmath"
// M (float for half/bfloat16) and stores back the lists named in kWriteMask.
// Used by the fused optimizers (optim/cuda) and the AMP grad scaler (amp/cuda).
//
// Per-tensor counters (the optimizers' float step counts behind aux) are read by
// every block of a tensor and advanced in the same launch: the last block of the
// launch that holds a tensor's final chunk adds one (advance_counts_when_done),
// found through a device done-counter that it re-arms, so no block can read a
// count that was already advanced. Entries with numel 0 and an aux pointer keep a
// slot (their count advances too).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include <tapegrad/core/backend/cuda/dependent_launch.cuh>
#include <tapegrad/core/backend/cuda/launch_queue.h>
#include <tapegrad/core/backend/cuda/opmath.cuh>
#include <tapegrad/core/backend/cuda/runtime.h>
#include <tapegrad/core/dtype.h>

namespace tg::cuda::mt {

using kern::LaunchShape;
using kern::launch_dependent;
using kern::wait_prior_grids;

inline constexpr int kBlockSize = 512;
inline constexpr int kILP = 4;                // elements per thread per iteration
inline constexpr int64_t kChunkSize = 65536;  // elements of one tensor per block
inline constexpr int kMaxBlocks = 320;        // blocks per launch (one chunk each)

// Tensors per launch by list depth, sized so TensorListMeta stays < 3.7 KB.
template <int Depth>
inline constexpr int kMaxTensors =
    Depth == 1 ? 80 : Depth == 2 ? 64 : Depth == 3 ? 48 : Depth == 4 ? 36 : Depth == 5 ? 30 : 26;

template <int Depth>
struct TensorListMeta {
  void* addresses[Depth][kMaxTensors<Depth>];
  void* aux[kMaxTensors<Depth>];  // one extra pointer per tensor (may be null)
  int64_t numel[kMaxTensors<Depth>];
  uint8_t block_to_tensor[kMaxBlocks];
  int32_t block_to_chunk[kMaxBlocks];
  // Bit t: this launch holds the final chunk of tensor slot t (its count advances here).
  uint32_t last_chunk_here[(kMaxTensors<Depth> + 31) / 32];
  int32_t num_blocks;
  int32_t num_tensors;
};
static_assert(sizeof(TensorListMeta<1>) <= 3700 && sizeof(TensorListMeta<2>) <= 3700 &&
                  sizeof(TensorListMeta<3>) <= 3700 && sizeof(TensorListMeta<4>) <= 3700 &&
                  sizeof(TensorListMeta<5>) <= 3700 && sizeof(TensorListMeta<6>) <= 3700,
              "kernel arguments must leave room under 4 KB");
static_assert(kMaxTensors<1> < 256, "block_to_tensor is 8-bit");

// One tensor (one element of each of the Depth lists) as the plan sees it.
template <int Depth>
struct TensorListEntry {
  void* ptrs[Depth];
  void* aux;
  int64_t numel;
  bool operator==(const TensorListEntry& o) const {
    return std::memcmp(ptrs, o.ptrs, sizeof(ptrs)) == 0 && aux == o.aux && numel == o.numel;
  }
};

template <int Depth, class Functor, class... Args>
__global__ void __launch_bounds__(kBlockSize)
    multi_tensor_kernel(TensorListMeta<Depth> meta, int64_t chunk_size, Functor f, Args... args) {
  wait_prior_grids();  // launched dependent (dependent_launch.cuh)
  f(meta, chunk_size, args...);
}

// The launches for one list of tensors; rebuilt only when a pointer or size changes.
template <int Depth>
class MultiTensorPlan {
 public:
  MultiTensorPlan() = default;
  // chunk_size 0: kChunkSize for large lists, halved (down to kMinChunkSize) while the list would
  // give fewer than kTargetBlocks blocks; at kMinChunkSize (a block's chunk is one pass of its
  // threads), the chunk that leaves the busiest SM the fewest elements with every block resident
  // at once (two an SM): a small list's step is bound by its busiest SM's instructions. An MLP's
  // 670k Adam parameters in 65536-element chunks were 15 blocks on 132 SMs and took 73 us; in
  // 4096-element chunks 167 blocks, 35 SMs with two (8192 elements); in 2816-element chunks 242
  // blocks, at most 5632 elements an SM.
  explicit MultiTensorPlan(std::vector<TensorListEntry<Depth>> entries, int64_t chunk_size = 0)
      : entries_(std::move(entries)), chunk_size_(chunk_size > 0 ? chunk_size : auto_chunk(entries_)) {
    build();
  }
  bool matches(const std::vector<TensorListEntry<Depth>>& entries) const { return entries == entries_; }
  const std::vector<TensorListEntry<Depth>>& entries() const { return entries_; }
  size_t num_launches() const { return launches_.size(); }

  // Launches f over every chunk on `stream` (of the current device); args are passed by value to
  // every launch.
  template <class Functor, class... Args>
  void launch(cudaStream_t stream, Functor f, Args... args) const {
    int device = 0;
    TG_CUDA_CHECK(cudaGetDevice(&device));
    for (const auto& meta : launches_)
      launch_dependent(multi_tensor_kernel<Depth, Functor, Args...>,
                       LaunchShape{dim3(meta.num_blocks), dim3(kBlockSize), 0, stream, device}, meta, chunk_size_, f,
                       args...);
  }

 private:
  static constexpr int64_t kMinChunkSize = 4096;  // of the halving
  static constexpr int64_t kMinTunedChunk = 2048, kChunkGrain = 256;
  static constexpr int64_t kSms = 132;                // an H100 / H200
  static constexpr int64_t kTargetBlocks = 2 * kSms;  // two blocks per SM
  static int64_t auto_chunk(const std::vector<TensorListEntry<Depth>>& entries) {
    auto blocks = [&](int64_t c) {
      int64_t b = 0;
      for (const auto& e : entries) b += (e.numel + c - 1) / c;
      return b;
    };
    int64_t chunk = kChunkSize;
    while (chunk > kMinChunkSize && blocks(chunk) < kTargetBlocks) chunk /= 2;
    if (chunk > kMinChunkSize) return chunk;
    // A small list (a block's chunk is one pass of its threads): among chunks of at most this
    // one, the one whose busiest SM gets the fewest elements.
    auto load = [&](int64_t c) { return (blocks(c) + kSms - 1) / kSms * c; };
    int64_t best = chunk, best_load = load(chunk);
    for (int64_t c = chunk - kChunkGrain; c >= kMinTunedChunk; c -= kChunkGrain) {
      const int64_t b = blocks(c);
      if (b > kTargetBlocks || b > kMaxBlocks) continue;
      if (load(c) < best_load) {
        best_load = load(c);
        best = c;
      }
    }
    return best;
  }

  void build() {
    launches_.clear();
    TensorListMeta<Depth> cur;
    std::memset(&cur, 0, sizeof(cur));
    int nt = 0, nb = 0;
    auto flush = [&] {
      if (nb == 0) {  // only empty tensors: one block with an empty chunk runs the launch's epilogue
        cur.block_to_tensor[0] = 0;
        cur.block_to_chunk[0] = 0;
        nb = 1;
      }
      cur.num_blocks = nb;
      cur.num_tensors = nt;
      launches_.push_back(cur);
      std::memset(&cur, 0, sizeof(cur));
      nt = nb = 0;
    };
    auto mark_last = [&](int slot) { cur.last_chunk_here[slot / 32] |= 1u << (slot % 32); };
    auto add_slot = [&](const TensorListEntry<Depth>& e) {
      if (nt == kMaxTensors<Depth>) flush();
      for (int d = 0; d < Depth; ++d) cur.addresses[d][nt] = e.ptrs[d];
      cur.aux[nt] = e.aux;
      cur.numel[nt] = e.numel;
      ++nt;
    };
    for (const auto& e : entries_) {
      if (e.numel == 0) {
        if (e.aux == nullptr) continue;
        add_slot(e);  // no chunk, but its count advances with the launch
        mark_last(nt - 1);
        continue;
      }
      const int64_t chunks = (e.numel + chunk_size_ - 1) / chunk_size_;
      bool in_cur = false;
      for (int64_t c = 0; c < chunks; ++c) {
        if (!in_cur) {
          add_slot(e);
          in_cur = true;
        }
        cur.block_to_tensor[nb] = static_cast<uint8_t>(nt - 1);
        cur.block_to_chunk[nb] = static_cast<int32_t>(c);
        if (c == chunks - 1) mark_last(nt - 1);
        if (++nb == kMaxBlocks) {
          flush();
          in_cur = false;
        }
      }
    }
    if (nb > 0 || nt > 0) flush();
  }

  std::vector<TensorListEntry<Depth>> entries_;
  std::vector<TensorListMeta<Depth>> launches_;
  int64_t chunk_size_ = kChunkSize;
};

// Calls f(T{}) with the CUDA type of a floating dtype (__half, __nv_bfloat16, float, double).
template <class F>
void dispatch_floating(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::Float32: f(float{}); return;
    case DType::Float64: f(double{}); return;
    case DType::Float16: f(__half{}); return;
    case DType::BFloat16: f(__nv_bfloat16{}); return;
    default: TG_ERROR(op, ": expected a floating dtype, got ", dtype_name(t));
  }
}

// ---- device side

using ::tg::cuda::opmath_t;

template <class T>
__device__ __forceinline__ opmath_t<T> to_opmath(T v) {
  if constexpr (std::is_same_v<T, __half>)
    return __half2float(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(v);
  else
    return v;
}
template <class T>
__device__ __forceinline__ T from_opmath(opmath_t<T> v) {
  if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(v);
  else
    return v;
}

template <class T>
struct alignas(sizeof(T) * kILP) AlignedVec {
  T v[kILP];
};

// This block's tensor slot, and the start and length of its chunk.
struct BlockChunk {
  int tensor;
  int64_t offset;
  int64_t n;
};
template <int Depth>
__device__ __forceinline__ BlockChunk block_chunk(const TensorListMeta<Depth>& meta, int64_t chunk_size) {
  const int tensor = meta.block_to_tensor[blockIdx.x];
  const int64_t offset = static_cast<int64_t>(meta.block_to_chunk[blockIdx.x]) * chunk_size;
  int64_t n = meta.numel[tensor] - offset;
  return {tensor, offset, n < chunk_size ? n : chunk_size};
}

// op(e) on each of a thread's kILP elements, e[d] being list d's value (0 for the write-only
// shadow list); the loaded lists take the results back.
template <int Depth, int kLoaded, class M, class Op>
__device__ __forceinline__ void apply_op(M (&r)[Depth][kILP], Op& op) {
#pragma unroll
  for (int ii = 0; ii < kILP; ++ii) {
    M e[Depth];
#pragma unroll
    for (int d = 0; d < Depth; ++d) e[d] = d < kLoaded ? r[d][ii] : M(0);
    op(e);
#pragma unroll
    for (int d = 0; d < kLoaded; ++d) r[d][ii] = e[d];
  }
}

// Runs op(v) on every element of this block's chunk, v[d] being the element of
// list d in opmath; the lists whose bit is set in kWriteMask are stored back.
// With a Shadow type (__half / __nv_bfloat16), list Depth - 1 is a write-only
// low-precision copy of list 0: it is not loaded, and after op it receives
// from_opmath<Shadow>(v[0]) (the round-to-nearest-even cast of the value stored
// in list 0, when T is float); a null address there skips the copy.
template <class T, int Depth, unsigned kWriteMask, class Shadow = void, class Op>
__device__ __forceinline__ void chunk_foreach(const TensorListMeta<Depth>& meta, int64_t chunk_size, Op op) {
  using M = opmath_t<T>;
  constexpr bool kShadow = !std::is_void_v<Shadow>;
  constexpr int kLoaded = kShadow ? Depth - 1 : Depth;  // lists of type T
  using S = std::conditional_t<kShadow, Shadow, T>;
  static_assert(!kShadow || (Depth >= 2 && !(kWriteMask & (1u << (Depth - 1)))),
                "the shadow list is the last one and is written by chunk_foreach itself");
  const BlockChunk bc = block_chunk(meta, chunk_size);
  T* ptr[Depth];
  S* shadow = nullptr;
  bool aligned = bc.n % kILP == 0 && chunk_size % kILP == 0;
#pragma unroll
  for (int d = 0; d < kLoaded; ++d) {
    ptr[d] = static_cast<T*>(meta.addresses[d][bc.tensor]) + bc.offset;
    aligned = aligned && reinterpret_cast<uintptr_t>(ptr[d]) % sizeof(AlignedVec<T>) == 0;
  }
  if constexpr (kShadow) {
    if (meta.addresses[Depth - 1][bc.tensor] != nullptr) {
      shadow = static_cast<S*>(meta.addresses[Depth - 1][bc.tensor]) + bc.offset;
      aligned = aligned && reinterpret_cast<uintptr_t>(shadow) % sizeof(AlignedVec<S>) == 0;
    }
  }
  M r[Depth][kILP];
  if (aligned) {
    // kU vectors per list in flight per thread: all loads of a round before any store, so
    // that a 512-thread block keeps enough bytes in flight to run at memory bandwidth.
    constexpr int kU = kLoaded <= 2 ? 4 : 2;
    const int64_t nvec = bc.n / kILP;
    for (int64_t i0 = threadIdx.x; i0 < nvec; i0 += static_cast<int64_t>(blockDim.x) * kU) {
      AlignedVec<T> in[kU][kLoaded];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t i = i0 + static_cast<int64_t>(u) * blockDim.x;
        if (i < nvec) {
#pragma unroll
          for (int d = 0; d < kLoaded; ++d) in[u][d] = reinterpret_cast<const AlignedVec<T>*>(ptr[d])[i];
        }
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t i = i0 + static_cast<int64_t>(u) * blockDim.x;
        if (i >= nvec) continue;
#pragma unroll
        for (int d = 0; d < kLoaded; ++d) {
#pragma unroll
          for (int ii = 0; ii < kILP; ++ii) r[d][ii] = to_opmath(in[u][d].v[ii]);
        }
        apply_op<Depth, kLoaded>(r, op);
#pragma unroll
        for (int d = 0; d < kLoaded; ++d) {
          if (kWriteMask & (1u << d)) {
            AlignedVec<T> vec;
#pragma unroll
            for (int ii = 0; ii < kILP; ++ii) vec.v[ii] = from_opmath<T>(r[d][ii]);
            reinterpret_cast<AlignedVec<T>*>(ptr[d])[i] = vec;
          }
        }
        if constexpr (kShadow) {
          if (shadow != nullptr) {
            AlignedVec<S> vec;
#pragma unroll
            for (int ii = 0; ii < kILP; ++ii)
              vec.v[ii] = from_opmath<S>(static_cast<opmath_t<S>>(from_opmath<T>(r[0][ii])));
            reinterpret_cast<AlignedVec<S>*>(shadow)[i] = vec;
          }
        }
      }
    }
  } else {
    for (int64_t base = 0; base < bc.n; base += static_cast<int64_t>(blockDim.x) * kILP) {
#pragma unroll
      for (int ii = 0; ii < kILP; ++ii) {
        const int64_t idx = base + threadIdx.x + static_cast<int64_t>(ii) * blockDim.x;
#pragma unroll
        for (int d = 0; d < kLoaded; ++d) r[d][ii] = idx < bc.n ? to_opmath(ptr[d][idx]) : M(0);
      }
      apply_op<Depth, kLoaded>(r, op);
#pragma unroll
      for (int ii = 0; ii < kILP; ++ii) {
        const int64_t idx = base + threadIdx.x + static_cast<int64_t>(ii) * blockDim.x;
        if (idx < bc.n) {
#pragma unroll
          for (int d = 0; d < kLoaded; ++d)
            if (kWriteMask & (1u << d)) ptr[d][idx] = from_opmath<T>(r[d][ii]);
          if constexpr (kShadow) {
            if (shadow != nullptr) shadow[idx] = from_opmath<S>(static_cast<opmath_t<S>>(from_opmath<T>(r[0][ii])));
          }
        }
      }
    }
  }
}

// The count advance of a launch whose blocks read per-tensor float counts through aux:
// call it from every thread of every block after the block's last read of a count, as
// early as that (the fused optimizer steps call it before their chunk's loads, so the
// atomic and the last block's updates overlap the data work). The last block to get here
// adds 1 to the count of every slot whose final chunk is in this launch and re-arms `done`
// (a zero device counter owned by the caller, one per stream of launches: launches on one
// stream never overlap). Every block of a launch must call it, or none (e.g. all of them
// return early on found_inf).
template <int Depth>
__device__ __forceinline__ void advance_counts_when_done(const TensorListMeta<Depth>& meta, unsigned int* done) {
  __syncthreads();  // every thread of this block is past its reads
  if (threadIdx.x != 0) return;
  // Release: the block's reads of the counts (ordered by the barrier) happen before its increment;
  // acquire: the last block's writes below come after every other block's increment (an
  // acq_rel RMW, not __threadfence's sequentially consistent fences on both sides).
  unsigned int prev = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], 1;" : "=r"(prev) : "l"(done) : "memory");
#else
  __threadfence();
  prev = atomicAdd(done, 1u);
  __threadfence();
#endif
  if (prev != gridDim.x - 1) return;
  for (int t = 0; t < meta.num_tensors; ++t) {
    if (!((meta.last_chunk_here[t / 32] >> (t % 32)) & 1u)) continue;
    float* count = static_cast<float*>(meta.aux[t]);
    if (count != nullptr) *count += 1.f;
  }
  *done = 0u;
}

}  // namespace tg::cuda::mt

// ---- issue 16: flat plans (gradient clipping). MultiTensorPlan gives each block one
// (tensor, chunk) pair and each launch at most kMaxBlocks of them, so a long list is several
// launches, each ending in a tail where SMs idle, and blocks of a small tensor's chunk do less work
// than others. A FlatPlan lays the tensors end to end in one index space (each starting at a
// multiple of kFlatAlign elements, so that 16-byte vectors of any dtype stay aligned) and cuts it
// into equal ranges, one per block: every block reads the same bytes, a range may span many small
// tensors, and a launch holds up to kFlatMaxTensors tensors whatever their sizes (GPT-2's 148
// gradients: one launch of two blocks per SM). Plans of several lists can share one range size
// (flat_per_block), so their blocks' partial results are comparable and can go to one buffer.
#include <algorithm>
#include <utility>

namespace tg::cuda::mt {

inline constexpr int kFlatMaxTensors = 224;  // per launch: FlatListMeta stays < 3.7 KB
inline constexpr int64_t kFlatAlign = 16;    // elements
inline constexpr int kFlatBlockSize = 512;

struct FlatListMeta {
  void* ptr[kFlatMaxTensors];
  // Tensor t holds [start(t), end[t]) of the index space, start(t) = end[t - 1] rounded up to
  // kFlatAlign (0 for t = 0); end is ascending.
  int64_t end[kFlatMaxTensors];
  int64_t per_block;  // elements of the index space per block, a multiple of kFlatAlign
  int32_t num_tensors;
};
static_assert(sizeof(FlatListMeta) <= 3700, "kernel arguments must leave room under 4 KB");

__host__ __device__ inline int64_t flat_round_up(int64_t n) { return (n + kFlatAlign - 1) / kFlatAlign * kFlatAlign; }

// The range size that cuts lists of these numels (all lists together) into about target_blocks
// ranges of at least min_per_block elements.
inline int64_t flat_per_block(const std::vector<int64_t>& numels, int64_t target_blocks, int64_t min_per_block = 8192) {
  int64_t space = 0;
  for (int64_t n : numels) space += flat_round_up(n);
  const int64_t per = (space + target_blocks - 1) / std::max<int64_t>(target_blocks, 1);
  return flat_round_up(std::max(per, min_per_block));
}

class FlatPlan {
 public:
  struct Launch {
    FlatListMeta meta;
    int blocks;       // grid size
    int first_block;  // of this launch among the plan's blocks (an offset into per-block outputs)
  };
  // tensors: (address, numel) pairs; numel 0 ones are left out. per_block: flat_per_block's.
  FlatPlan(const std::vector<std::pair<void*, int64_t>>& tensors, int64_t per_block) {
    Launch cur{};
    int64_t space = 0;
    auto flush = [&] {
      if (cur.meta.num_tensors == 0) return;
      cur.meta.per_block = per_block;
      cur.blocks = static_cast<int>((space + per_block - 1) / per_block);
      cur.first_block = total_blocks_;
      total_blocks_ += cur.blocks;
      launches_.push_back(cur);
      cur = Launch{};
      space = 0;
    };
    for (const auto& [ptr, numel] : tensors) {
      if (numel == 0) continue;
      if (cur.meta.num_tensors == kFlatMaxTensors) flush();
      const int t = cur.meta.num_tensors++;
      cur.meta.ptr[t] = ptr;
      space = flat_round_up(space) + numel;
      cur.meta.end[t] = space;
    }
    flush();
  }
  const std::vector<Launch>& launches() const { return launches_; }
  int total_blocks() const { return total_blocks_; }

 private:
  std::vector<Launch> launches_;
  int total_blocks_ = 0;
};

// ---- device side

// Calls piece(t, begin, end) for every part of tensor t inside this block's range (elements
// [begin, end) of the tensor, begin a multiple of kFlatAlign), in order (kReverse: last part first).
// The same calls in every thread of the block.
template <bool kReverse = false, class Piece>
__device__ __forceinline__ void flat_block_pieces(const FlatListMeta& meta, Piece&& piece) {
  const int64_t lo = static_cast<int64_t>(blockIdx.x) * meta.per_block;
  const int64_t hi = lo + meta.per_block;
  auto start = [&](int t) { return t == 0 ? int64_t{0} : flat_round_up(meta.end[t - 1]); };
  int a = 0, b = meta.num_tensors;  // first: the first tensor ending after lo
  while (a < b) {
    const int m = (a + b) / 2;
    if (meta.end[m] > lo)
      b = m;
    else
      a = m + 1;
  }
  const int first = a;
  b = meta.num_tensors;  // last: the tensor before the first one starting at or after hi
  while (a < b) {
    const int m = (a + b) / 2;
    if (start(m) >= hi)
      b = m;
    else
      a = m + 1;
  }
  const int last = a - 1;
  for (int i = 0; i <= last - first; ++i) {
    const int t = kReverse ? last - i : first + i;
    const int64_t st = start(t);
    const int64_t s = lo > st ? lo : st;
    const int64_t e = hi < meta.end[t] ? hi : meta.end[t];
    if (s < e) piece(t, s - st, e - st);
  }
}

template <class T>
struct alignas(16) Vec16 {
  T v[16 / sizeof(T)];
};

// op(M& v) on every element of x[0, n) (v in opmath; stored back when kWrite), 16-byte vectors
// when x is 16-byte aligned, kU of them in flight per thread. kReverse: from the end backwards.
template <class T, bool kWrite, int kU = 4, bool kReverse = false, class Op>
__device__ __forceinline__ void flat_piece_foreach(T* x, int64_t n, Op& op) {
  using M = opmath_t<T>;
  constexpr int kV = 16 / sizeof(T);
  int64_t done = 0;
  if (reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    const int64_t nvec = n / kV;
    Vec16<T>* xv = reinterpret_cast<Vec16<T>*>(x);
    const int64_t step = static_cast<int64_t>(blockDim.x) * kU;
    for (int64_t i0 = threadIdx.x; i0 < nvec; i0 += step) {
      Vec16<T> in[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t i = i0 + static_cast<int64_t>(u) * blockDim.x;
        if (i < nvec) in[u] = xv[kReverse ? nvec - 1 - i : i];
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t i = i0 + static_cast<int64_t>(u) * blockDim.x;
        if (i >= nvec) continue;
#pragma unroll
        for (int k = 0; k < kV; ++k) {
          M v = to_opmath(in[u].v[k]);
          op(v);
          if constexpr (kWrite) in[u].v[k] = from_opmath<T>(v);
        }
        if constexpr (kWrite) xv[kReverse ? nvec - 1 - i : i] = in[u];
      }
    }
    done = nvec * kV;
  }
  for (int64_t i = done + threadIdx.x; i < n; i += blockDim.x) {
    M v = to_opmath(x[i]);
    op(v);
    if constexpr (kWrite) x[i] = from_opmath<T>(v);
  }
}

// op(M& v) on every element of this block's range of the plan's tensors (all of type T).
// kReverse walks the range from its end: a pass right after a forward pass over the same plan
// starts on the bytes the forward pass read last, which are still in L2.
template <class T, bool kWrite, int kU = 4, bool kReverse = false, class Op>
__device__ __forceinline__ void flat_foreach(const FlatListMeta& meta, Op& op) {
  flat_block_pieces<kReverse>(meta, [&](int t, int64_t b, int64_t e) {
    flat_piece_foreach<T, kWrite, kU, kReverse>(static_cast<T*>(meta.ptr[t]) + b, e - b, op);
  });
}

}  // namespace tg::cuda::mt
