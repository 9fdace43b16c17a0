// CUDA: float32 gemms with few output tiles (a batch-128 MLP's layers and their gradients), on
// CUDA cores, split over K, with the bias / bias-gradient epilogues fused.
// Why hand-written: with TF32 off (PyTorch's default) cuBLAS / cuBLASLt run these shapes
// ([128, 784] x [784, 512] and the like) with 16-32 output tiles, i.e. most SMs idle, 4-9 us
// each plus a separate split-K reduction kernel (NOTES.md, issue 15: none of the offered
// algorithms ran one below ~7 us). Here a 64 x 64 tile is split over K into up to 16 blocks
// (about two per SM over the grid, at most 16 K steps each: longer loops stay with cuBLAS);
// each block keeps 4 x 4 accumulators a thread (256 threads, 16-wide K steps through
// double-buffered shared memory, the next step's loads in registers meanwhile). The blocks of
// one tile form a thread block cluster (sm_90; older GPUs get unsplit launches only): each
// leaves its partial tile in its shared memory, and after a cluster barrier each block adds a
// slice of the tile from all of them (distributed shared memory) in split order and runs the
// epilogue. No global workspace, no atomics: bit-reproducible for given operands and device.
// Epilogues: bias; bias gradient (A's row sums or B's column sums); ReLU, the pre-activation also
// written (a linear and the ReLU after it: fuse_into_deferred_gemm); the gradient through a ReLU
// (a linear's input gradient times its saved output's mask: the ReLU's backward pass goes).
// Group launches: up to four independent problems in one kernel (blas.cpp joins a linear's input
// and weight gradient gemms waiting in the launch queue); every cluster has the group's size, and
// a problem of fewer splits packs several tiles into each of its clusters.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include <cooperative_groups.h>

#include <tapegrad/core/backend/cuda/dependent_launch.cuh>
#include <tapegrad/core/backend/cuda/kernels.cuh>
#include <tapegrad/core/backend/cuda/reduce.cuh>
#include <tapegrad/core/backend/cuda/runtime.h>
#include <tapegrad/core/error.h>

namespace tg::cuda::kern {
namespace {

constexpr int kTile = 64, kStep = 16, kThreads = 256, kPad = 4;
constexpr int kMaxSplits = 16;                     // a cluster's blocks (> 8: non-portable, asked for)
constexpr int64_t kMaxOutputs = int64_t{1} << 19;  // m * n routed here, at most
constexpr int kMaxStepsPerSplit = 16;              // K steps a block, at most (see plan_of)
constexpr int kLd = kTile + kPad;                  // shared rows of a K step, padded
constexpr int kStageFloats = kStep * kLd;          // one operand's K step

enum Epi : int { kNone, kBias, kRowSumsA, kColSumsB, kRelu, kBiasRelu, kReluBackward };

struct SgemmArgs {
  const float* a;
  const float* b;
  float* c;
  int m, n, k;
  int64_t lda, ldb, ldc;
  int tiles_n;
  int k_per_split;  // a multiple of kStep
  int epi;
  float* v;    // bias or saved ReLU output (read), or row / column sums (written)
  float* aux;  // kRelu / kBiasRelu: the pre-activation, m x n row-major
};

// The cluster barrier in its two halves (sm_90; every thread of the block, no divergence):
// arrive with release semantics (this block's shared memory writes are visible to the cluster's
// blocks once they have waited) or relaxed (nothing to publish), and wait (acquire).
__device__ __forceinline__ void cluster_arrive(bool release) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (release)
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  else
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#endif
}

// What the epilogue of output elements (gi, gj .. gj + 3) reads: the bias of those columns, or
// the saved ReLU output (kReluBackward's mask); zero outside the matrix. gj is a multiple of 4.
__device__ __forceinline__ float4 epilogue_operand(const SgemmArgs& p, int gi, int gj) {
  float o[4] = {0.f, 0.f, 0.f, 0.f};
  if (p.epi == kBias || p.epi == kBiasRelu) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (gj + j < p.n) o[j] = __ldg(p.v + gj + j);
  } else if (p.epi == kReluBackward && gi < p.m) {
    const float* src = p.v + int64_t{gi} * p.n + gj;
    if (gj + 3 < p.n && p.n % 4 == 0 && reinterpret_cast<uintptr_t>(p.v) % 16 == 0) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(src));
      return v;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (gj + j < p.n) o[j] = __ldg(src + j);
  }
  return make_float4(o[0], o[1], o[2], o[3]);
}

// Output elements (gi, gj .. gj + 3) of the sums s through the epilogue (operands o from
// epilogue_operand): C, and the pre-activation for kRelu / kBiasRelu; 16-byte stores where the
// row's four columns are inside the matrix and aligned.
__device__ __forceinline__ void write_quad(const SgemmArgs& p, int gi, int gj, float4 s4, float4 o4) {
  if (gi >= p.m) return;
  float s[4] = {s4.x, s4.y, s4.z, s4.w};
  const float o[4] = {o4.x, o4.y, o4.z, o4.w};
  float pre[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (p.epi == kBias || p.epi == kBiasRelu) s[j] += o[j];
    pre[j] = s[j];
    if (p.epi == kRelu || p.epi == kBiasRelu)
      s[j] = s[j] < 0.f ? 0.f : s[j];  // ReluF: NaN stays
    else if (p.epi == kReluBackward)
      s[j] = o[j] > 0.f ? s[j] : 0.f;  // ReluBackwardF
  }
  const bool full = gj + 3 < p.n;
  float* c = p.c + int64_t{gi} * p.ldc + gj;
  if (full && p.ldc % 4 == 0 && reinterpret_cast<uintptr_t>(p.c) % 16 == 0) {
    *reinterpret_cast<float4*>(c) = make_float4(s[0], s[1], s[2], s[3]);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (gj + j < p.n) c[j] = s[j];
  }
  if (p.epi == kRelu || p.epi == kBiasRelu) {
    float* a = p.aux + int64_t{gi} * p.n + gj;
    if (full && p.n % 4 == 0 && reinterpret_cast<uintptr_t>(p.aux) % 16 == 0) {
      *reinterpret_cast<float4*>(a) = make_float4(pre[0], pre[1], pre[2], pre[3]);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (gj + j < p.n) a[j] = pre[j];
    }
  }
}

// One block's part of problem p: output tile `tile`, K split `split` of `splits`. The tile's
// splits are the cluster's blocks of ranks [base, base + splits) (a group launch packs several
// tiles into one cluster); csize: the cluster's size, whose barriers every block takes (a block
// with no tile calls idle_block instead). sm: the kernel's [A buffer 0, A buffer 1, B buffer 0,
// B buffer 1] staging, each [kStep][kLd], reused for the partial tile; vsum: the block's row /
// column sums.
template <bool TA, bool TB>
__device__ __forceinline__ void sgemm_block(const SgemmArgs& p, int tile, int split, int splits, int base, int csize,
                                            float* sm, float* vsum) {
  namespace cg = cooperative_groups;
  const int t = threadIdx.x, tx = t % 16, ty = t / 16;
  const int tm = tile / p.tiles_n, tn = tile % p.tiles_n;
  const int m0 = tm * kTile, n0 = tn * kTile;
  const int kb = split * p.k_per_split, ke = min(p.k, kb + p.k_per_split);
  // Which sums this thread keeps: A's rows (the tile column 0's blocks, a thread per 4 rows)
  // or B's columns (tile row 0's, a thread per 4 columns).
  const bool row_lane = p.epi == kRowSumsA && tn == 0 && tx == 0;
  const bool col_lane = p.epi == kColSumsB && tm == 0 && ty == 0;
  auto as = [&](int buf, int kk, int row) -> float& { return sm[buf * kStageFloats + kk * kLd + row]; };
  auto bs = [&](int buf, int kk, int col) -> float& { return sm[(2 + buf) * kStageFloats + kk * kLd + col]; };

  // Loader: 4 elements of A's and of B's 64 x 16 step per thread, coalesced along the
  // operand's contiguous dimension; zero outside the matrix and this split's K range.
  float ra[4], rb[4];
  auto a_pos = [&](int r, int& row, int& kk) {
    const int e = t + kThreads * r;
    if (TA) {
      kk = e / kTile;
      row = e % kTile;
    } else {
      row = e / kStep;
      kk = e % kStep;
    }
  };
  auto b_pos = [&](int r, int& col, int& kk) {
    const int e = t + kThreads * r;
    if (TB) {
      col = e / kStep;
      kk = e % kStep;
    } else {
      kk = e / kTile;
      col = e % kTile;
    }
  };
  auto load = [&](int k0) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      int row, kk, col, kb2;
      a_pos(r, row, kk);
      const int gi = m0 + row, gk = k0 + kk;
      ra[r] = gi < p.m && gk < ke ? __ldg(p.a + (TA ? int64_t{gk} * p.lda + gi : int64_t{gi} * p.lda + gk)) : 0.f;
      b_pos(r, col, kb2);
      const int gj = n0 + col, gk2 = k0 + kb2;
      rb[r] = gj < p.n && gk2 < ke ? __ldg(p.b + (TB ? int64_t{gj} * p.ldb + gk2 : int64_t{gk2} * p.ldb + gj)) : 0.f;
    }
  };
  auto store = [&](int buf) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      int row, kk, col, kb2;
      a_pos(r, row, kk);
      as(buf, kk, row) = ra[r];
      b_pos(r, col, kb2);
      bs(buf, kb2, col) = rb[r];
    }
  };

  float acc[4][4];
  float vs[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;

  int buf = 0;
  load(kb);  // every split has kb < ke
  store(0);
  __syncthreads();
  for (int k0 = kb; k0 < ke; k0 += kStep) {
    const bool more = k0 + kStep < ke;
    if (more) load(k0 + kStep);
#pragma unroll
    for (int kk = 0; kk < kStep; ++kk) {
      const float4 av = *reinterpret_cast<const float4*>(&as(buf, kk, ty * 4));
      const float4 bv = *reinterpret_cast<const float4*>(&bs(buf, kk, tx * 4));
      const float a4[4] = {av.x, av.y, av.z, av.w}, b4[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a4[i], b4[j], acc[i][j]);
    }
    if (row_lane || col_lane) {
      for (int kk = 0; kk < kStep; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i) vs[i] += row_lane ? as(buf, kk, ty * 4 + i) : bs(buf, kk, tx * 4 + i);
    }
    if (more) store(buf ^ 1);
    __syncthreads();
    buf ^= 1;
  }

  auto write_v = [&](int e, float s) {
    const int o = (p.epi == kRowSumsA ? m0 : n0) + e;
    if (o < (p.epi == kRowSumsA ? p.m : p.n)) p.v[o] = s;
  };

  if (splits == 1) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int gi = m0 + ty * 4 + i, gj = n0 + tx * 4;
      write_quad(p, gi, gj, make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]), epilogue_operand(p, gi, gj));
    }
    if (row_lane || col_lane)
      for (int i = 0; i < 4; ++i) write_v((row_lane ? ty : tx) * 4 + i, vs[i]);
  }
  if (csize == 1) return;

  // Split K: the tile's blocks are in one cluster. Each leaves its partial tile (and sums) in its
  // shared memory and arrives at the cluster barrier (release); the tile's block `split` then
  // adds quads [split, split + 1) * 1024 / splits of every partial in split order (the same bits
  // whichever block ran first), 16-byte reads of the other blocks' shared memory, its epilogue
  // operands (bias, ReLU mask) loaded before it waits. The exit barrier only keeps every block's
  // shared memory alive until the others have read it, so its arrive publishes nothing (relaxed:
  // no wait for this block's global stores).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // clusters need sm_90; the plans never split on older GPUs
#else
  const bool sums = (p.epi == kRowSumsA && tn == 0) || (p.epi == kColSumsB && tm == 0);
  cg::cluster_group cluster = cg::this_cluster();
  if (splits > 1) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      *reinterpret_cast<float4*>(&sm[(ty * 4 + i) * kTile + tx * 4]) =
          make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    if (row_lane || col_lane)
      for (int i = 0; i < 4; ++i) vsum[(row_lane ? ty : tx) * 4 + i] = vs[i];
  }
  cluster_arrive(true);
  constexpr int kQuads = kTile * kTile / 4, kQuadsPerRow = kTile / 4, kInFlight = 8;
  static_assert(kQuads / 2 <= 2 * kThreads, "two splits or more leave at most two quads a thread");
  const int lo = split * kQuads / splits, hi = (split + 1) * kQuads / splits;
  float4 opnd[2] = {};
  if (splits > 1) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int e = lo + t + r * kThreads;
      if (e < hi) opnd[r] = epilogue_operand(p, m0 + e / kQuadsPerRow, n0 + e % kQuadsPerRow * 4);
    }
  }
  cluster_wait();
  if (splits > 1) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int e = lo + t + r * kThreads;
      if (e >= hi) continue;
      // kInFlight partials read at a time (all 16 at once would hold 64 registers and cost the
      // kernel a block an SM), added in split order.
      float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int q0 = 0; q0 < kMaxSplits; q0 += kInFlight) {
        float4 part[kInFlight];
#pragma unroll
        for (int q = 0; q < kInFlight; ++q)
          if (q0 + q < splits) part[q] = cluster.map_shared_rank(reinterpret_cast<float4*>(sm), base + q0 + q)[e];
#pragma unroll
        for (int q = 0; q < kInFlight; ++q) {
          if (q0 + q < splits) {
            s.x += part[q].x;
            s.y += part[q].y;
            s.z += part[q].z;
            s.w += part[q].w;
          }
        }
      }
      write_quad(p, m0 + e / kQuadsPerRow, n0 + e % kQuadsPerRow * 4, s, opnd[r]);
    }
    if (sums && split == 0 && t < kTile) {
      float s = 0.f;
      for (int q = 0; q < splits; ++q) s += cluster.map_shared_rank(vsum, base + q)[t];
      write_v(t, s);
    }
  }
  cluster_arrive(false);  // no block leaves while another still reads its shared memory
  cluster_wait();
#endif
}

// A block of a group launch's cluster that has no tile: it takes the cluster's two barriers.
__device__ __forceinline__ void idle_block() {
  cluster_arrive(true);
  cluster_wait();
  cluster_arrive(false);
  cluster_wait();
}

template <bool TA, bool TB>
__global__ void __launch_bounds__(kThreads) small_sgemm_kernel(SgemmArgs p) {
  __shared__ __align__(16) float sm[4 * kStageFloats];
  __shared__ float vsum[kTile];
  static_assert(4 * kStageFloats >= kTile * kTile, "the partial tile reuses the staging buffers");
  wait_prior_grids();  // launched dependent (dependent_launch.cuh)
  sgemm_block<TA, TB>(p, blockIdx.x, blockIdx.y, gridDim.y, 0, gridDim.y, sm, vsum);
}

// Independent problems in one launch (a linear's input and weight gradients): blockIdx.x runs
// over every problem's clusters in turn (gridDim.y blocks each); a problem whose tiles take
// `splits` blocks packs csize / splits tiles into each of its clusters, so problems of different
// splits share one cluster size.
constexpr int kMaxGroup = kSmallSgemmMaxGroup;
struct GroupArgs {
  SgemmArgs p[kMaxGroup];
  int cluster_end[kMaxGroup];  // running sums of the problems' clusters
  int splits[kMaxGroup];
  int tiles_per_cluster[kMaxGroup];
  int tiles[kMaxGroup];
  unsigned char trans[kMaxGroup];  // 2 * trans_a + trans_b
  int count;
};

__global__ void __launch_bounds__(kThreads) small_sgemm_group_kernel(GroupArgs g) {
  __shared__ __align__(16) float sm[4 * kStageFloats];
  __shared__ float vsum[kTile];
  wait_prior_grids();
  // This block's problem, selected with constant indices (a dynamic index into the parameters
  // would copy them all to local memory).
  const int x = static_cast<int>(blockIdx.x), rank = static_cast<int>(blockIdx.y), csize = gridDim.y;
  SgemmArgs p = g.p[0];
  int cl = x, splits = g.splits[0], per = g.tiles_per_cluster[0], tiles = g.tiles[0], trans = g.trans[0];
#pragma unroll
  for (int j = 1; j < kMaxGroup; ++j) {
    if (j < g.count && x >= g.cluster_end[j - 1]) {
      p = g.p[j];
      cl = x - g.cluster_end[j - 1];
      splits = g.splits[j];
      per = g.tiles_per_cluster[j];
      tiles = g.tiles[j];
      trans = g.trans[j];
    }
  }
  const int sub = rank / splits, tile = cl * per + sub;
  if (sub >= per || tile >= tiles) {
    idle_block();
    return;
  }
  const int split = rank % splits, base = sub * splits;
  switch (trans) {
    case 0: sgemm_block<false, false>(p, tile, split, splits, base, csize, sm, vsum); break;
    case 1: sgemm_block<false, true>(p, tile, split, splits, base, csize, sm, vsum); break;
    case 2: sgemm_block<true, false>(p, tile, split, splits, base, csize, sm, vsum); break;
    default: sgemm_block<true, true>(p, tile, split, splits, base, csize, sm, vsum); break;
  }
}

using Kernel = void (*)(SgemmArgs);
Kernel kernel_of(bool ta, bool tb) {
  return ta ? (tb ? small_sgemm_kernel<true, true> : small_sgemm_kernel<true, false>)
            : (tb ? small_sgemm_kernel<false, true> : small_sgemm_kernel<false, false>);
}
// Cache key and occupancy queries of a launch: one of the four single-problem kernels, or the
// group kernel (ta, tb ignored).
const void* func_of(bool group, bool ta, bool tb) {
  return group ? reinterpret_cast<const void*>(small_sgemm_group_kernel)
               : reinterpret_cast<const void*>(kernel_of(ta, tb));
}

// How many clusters of `size` blocks (along y) of kernel k the device holds at once (0: none, or
// the size refused).
int resident_clusters(const void* k, int size) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(1, static_cast<unsigned>(size));
  cfg.blockDim = dim3(kThreads);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = static_cast<unsigned>(size);
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, k, &cfg) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return clusters;
}

// The largest cluster (<= kMaxSplits blocks along y) the device can hold for kernel k, asked
// once per device and kernel (16 where the GPU allows that non-portable size).
int max_cluster(int device, const void* k) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, int> known;
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = known.try_emplace({device, k}, 1);
  if (!fresh) return it->second;
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess || major < 9) {
    (void)cudaGetLastError();
    return it->second;  // no clusters before Hopper: unsplit only
  }
  if (cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) (void)cudaGetLastError();
  for (int size = kMaxSplits; size > 1; --size) {
    if (resident_clusters(k, size) > 0) {
      it->second = size;
      break;
    }
  }
  return it->second;
}

// How many clusters of `size` blocks of kernel k the device holds at once (cached per device,
// kernel and size): a grid of more tiles than that runs its clusters in two waves.
int active_clusters(int device, const void* k, int size) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int>, int> known;
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = known.try_emplace({device, k, size}, 0);
  if (fresh) it->second = resident_clusters(k, size);
  return it->second;
}

int epi_of(backend::GemmEpilogue e) {
  switch (e) {
    case backend::GemmEpilogue::None: return kNone;
    case backend::GemmEpilogue::Bias: return kBias;
    case backend::GemmEpilogue::RowSumsA: return kRowSumsA;
    case backend::GemmEpilogue::ColSumsB: return kColSumsB;
    case backend::GemmEpilogue::Relu: return kRelu;
    case backend::GemmEpilogue::BiasRelu: return kBiasRelu;
    case backend::GemmEpilogue::ReluBackward: return kReluBackward;
    default: return -1;
  }
}

// The launch's shape: tiles, and K split so the grid holds about two blocks per SM (8 warps
// each: more warps hide the loads and the shared-memory reads), at least two K steps each, as
// many steps in each. splits = 0: not this kernel's problem.
struct Plan {
  int tiles_n = 0, tiles = 0, splits = 0, per_split = 0;  // per_split in K steps
};

Plan plan_of(const backend::GemmArgs& g, int device) {
  Plan pl;
  const int epi = epi_of(g.epilogue);
  const bool wants_v = epi != kNone && epi != kRelu, wants_aux = epi == kRelu || epi == kBiasRelu;
  if (g.dtype != kFloat32 || g.c_float32 || g.batch != 1 || epi < 0 || (wants_v && g.epilogue_ptr == nullptr) ||
      (wants_aux && g.epilogue_aux == nullptr) || g.m < 1 || g.n < 1 || g.k < 1 ||
      g.m * g.n > kMaxOutputs || g.k > INT_MAX / 2 || g.lda > INT_MAX || g.ldb > INT_MAX || g.ldc > INT_MAX)
    return pl;
  const int tiles_m = static_cast<int>((g.m + kTile - 1) / kTile);
  pl.tiles_n = static_cast<int>((g.n + kTile - 1) / kTile);
  pl.tiles = tiles_m * pl.tiles_n;
  const int steps = static_cast<int>((g.k + kStep - 1) / kStep);
  int want =
      std::clamp(std::min(2 * sm_count(device) / pl.tiles, steps / 2), 1, max_cluster(device, func_of(false, g.trans_a, g.trans_b)));
  // Every tile's cluster resident at once: with 16 tiles in clusters of 13 or 16 the H100 / H200
  // held 14 (ncu, issue 15's MLP), and the last two ran as a second wave.
  while (want > 1 && active_clusters(device, func_of(false, g.trans_a, g.trans_b), want) < pl.tiles) --want;
  pl.per_split = (steps + want - 1) / want;
  // Past kMaxStepsPerSplit a block's K loop is long enough for cuBLAS's larger tiles to win
  // (this kernel issues at ~0.35 instructions a cycle per scheduler: it is for latency-bound
  // problems), so those stay with cuBLAS.
  if (pl.per_split > kMaxStepsPerSplit) return pl;
  pl.splits = (steps + pl.per_split - 1) / pl.per_split;
  return pl;
}


// The kernel's view of g, K split in per_split steps.
SgemmArgs sgemm_args(const backend::GemmArgs& g, int tiles_n, int per_split) {
  SgemmArgs p{};
  p.a = static_cast<const float*>(g.a);
  p.b = static_cast<const float*>(g.b);
  p.c = static_cast<float*>(g.c);
  p.m = static_cast<int>(g.m);
  p.n = static_cast<int>(g.n);
  p.k = static_cast<int>(g.k);
  p.lda = g.lda;
  p.ldb = g.ldb;
  p.ldc = g.ldc;
  p.epi = epi_of(g.epilogue);
  p.v = static_cast<float*>(g.epilogue_ptr);
  p.aux = static_cast<float*>(g.epilogue_aux);
  p.tiles_n = tiles_n;
  p.k_per_split = per_split * kStep;
  return p;
}

int device_of(const backend::GemmArgs& g) {
  int device = g.device.index();
  if (device < 0) TG_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

// A group launch's shape: the cluster size c and each problem's splits s (s <= c, c / s tiles
// a cluster) with the fewest K steps a block (then the fewest blocks) such that every cluster is
// resident at once; false where no shape keeps a block within kMaxStepsPerSplit K steps, or a
// problem does not fit the kernel at all. Deterministic for given problems and device: the same
// group gives the same bits on every run and replay.
bool group_plan(const backend::GemmArgs* gs, int count, int device, GroupArgs& ga, int& csize) {
  if (count < 2 || count > kMaxGroup) return false;
  Plan pl[kMaxGroup];
  int steps[kMaxGroup];
  for (int i = 0; i < count; ++i) {
    pl[i] = plan_of(gs[i], device);
    if (pl[i].splits == 0) return false;
    steps[i] = static_cast<int>((gs[i].k + kStep - 1) / kStep);
  }
  const void* k = func_of(true, false, false);
  const int cmax = max_cluster(device, k);
  int best_steps = INT_MAX, best_blocks = INT_MAX, best_c = 0, best_target = 0;
  for (int c = 1; c <= cmax; ++c) {
    const int resident = active_clusters(device, k, c);
    for (int target = 1; target <= kMaxStepsPerSplit && target <= best_steps; ++target) {
      int clusters = 0, worst = 0;
      bool ok = true;
      for (int i = 0; i < count && ok; ++i) {
        const int s = (steps[i] + target - 1) / target;  // splits for at most `target` steps a block
        if (s > c) {
          ok = false;
          break;
        }
        const int per_split = (steps[i] + s - 1) / s, per = c / s;
        worst = std::max(worst, per_split);
        clusters += (pl[i].tiles + per - 1) / per;
      }
      if (!ok || clusters > resident) continue;
      const int blocks = clusters * c;
      if (worst < best_steps || (worst == best_steps && blocks < best_blocks)) {
        best_steps = worst;
        best_blocks = blocks;
        best_c = c;
        best_target = target;
      }
      break;  // larger targets only give more steps a block
    }
  }
  if (best_c == 0) return false;
  csize = best_c;
  ga = GroupArgs{};
  ga.count = count;
  int end = 0;
  for (int i = 0; i < count; ++i) {
    const int s = (steps[i] + best_target - 1) / best_target;
    const int per_split = (steps[i] + s - 1) / s;
    ga.p[i] = sgemm_args(gs[i], pl[i].tiles_n, per_split);
    ga.splits[i] = (steps[i] + per_split - 1) / per_split;  // no empty split
    ga.tiles_per_cluster[i] = csize / ga.splits[i];
    ga.tiles[i] = pl[i].tiles;
    ga.trans[i] = static_cast<unsigned char>(2 * gs[i].trans_a + gs[i].trans_b);
    end += (pl[i].tiles + ga.tiles_per_cluster[i] - 1) / ga.tiles_per_cluster[i];
    ga.cluster_end[i] = end;
  }
  return true;
}

}  // namespace

bool small_sgemm_fits(const backend::GemmArgs& g) { return plan_of(g, device_of(g)).splits > 0; }

void small_sgemm(const backend::GemmArgs& g, int device, cudaStream_t stream) {
  const Plan pl = plan_of(g, device);
  TG_CHECK(pl.splits > 0, "matmul: the small float32 gemm does not take [", g.m, ", ", g.k, "] x [", g.k, ", ", g.n,
           "] (batch ", g.batch, ")");
  const SgemmArgs p = sgemm_args(g, pl.tiles_n, pl.per_split);
  LaunchShape shape;
  shape.grid = dim3(static_cast<unsigned>(pl.tiles), static_cast<unsigned>(pl.splits));
  shape.block = dim3(kThreads);
  shape.stream = stream;
  shape.device = device;
  shape.cluster = dim3(1, static_cast<unsigned>(pl.splits), 1);
  launch_dependent(kernel_of(g.trans_a, g.trans_b), shape, p);
}

bool small_sgemm_group_fits(const backend::GemmArgs* gs, int count) {
  GroupArgs ga;
  int csize = 0;
  return count >= 2 && group_plan(gs, count, device_of(gs[0]), ga, csize);
}

void small_sgemm_group(const backend::GemmArgs* gs, int count, int device, cudaStream_t stream) {
  GroupArgs ga;
  int csize = 0;
  TG_CHECK(group_plan(gs, count, device, ga, csize), "matmul: the small float32 gemm does not take these ", count,
           " problems in one launch");
  LaunchShape shape;
  shape.grid = dim3(static_cast<unsigned>(ga.cluster_end[count - 1]), static_cast<unsigned>(csize));
  shape.block = dim3(kThreads);
  shape.stream = stream;
  shape.device = device;
  shape.cluster = dim3(1, static_cast<unsigned>(csize), 1);
  launch_dependent(small_sgemm_group_kernel, shape, ga);
}

}  // namespace tg::cuda::kern
