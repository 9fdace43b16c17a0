// CUDA softmax / log_softmax (forward and backward) over contiguous rows, and cross_entropy over
// class indices. Hand-written because no library call fits: cuDNN's softmax has no fused
// cross-entropy, and what pays here is the fusion itself. The forward makes one online pass over
// a row for its max and sum of exponentials (the second read, to write, comes from L1/L2), the
// backward one kernel; cross_entropy's forward writes per-row loss and logsumexp and, when asked,
// the gradient (softmax - smoothed one-hot) * scale in the same pass, so the probabilities are
// never materialised. Rows of up to 1024 elements go one warp per row (4 rows per block), longer
// rows one block per row; 16-byte vector loads when rows are aligned; float accumulation for
// float16 / bfloat16 (double for float64). A block-per-row forward that writes from its row
// (softmax / log_softmax, cross_entropy with the gradient) keeps the row in dynamic shared memory
// from its first read when it fits (<= 110 KB: bfloat16 rows up to 56320 elements, float32 up to
// 28160), so the logits are read from DRAM once: at [16384, 50304] bfloat16 the write pass's re-read
// missed L2 (1.81 ms against 0.69 ms for one read and one write at 4.8 TB/s).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include <tapegrad/core/backend/cuda/kernels.cuh>
#include <tapegrad/core/backend/cuda/loops.cuh>

namespace tg::cuda::kern {
namespace {

using CeArgs = backend::Backend::CrossEntropyArgs;

template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T, int V>
struct alignas(16) Pack {
  T v[V];
};

constexpr int kWarpRowMax = 1024;  // rows up to this many elements: one warp each
constexpr int kRowsPerWarpBlock = 4;

template <class A>
__device__ __forceinline__ A neg_inf() {
  return -std::numeric_limits<A>::infinity();
}
__device__ __forceinline__ float ex(float v) { return expf(v); }
__device__ __forceinline__ double ex(double v) { return exp(v); }
// The exponential per element of a T row: for float16 / bfloat16 rows the hardware's ex2 (__expf,
// two instructions against expf's ten; a relative error near 2^-21, far below the 2^-8 / 2^-11 of
// the values written), the accurate one for float32 and float64.
template <class T>
__device__ __forceinline__ float ex_row(float v) {
  if constexpr (sizeof(T) == 2) return __expf(v);
  else return expf(v);
}
template <class T>
__device__ __forceinline__ double ex_row(double v) {
  return exp(v);
}
// exp(v - m) for float16 / bfloat16 rows with the shift folded into one FFMA: ex2(v log2(e) - m log2(e)),
// nm2 = -m log2(e) computed once per row (or block of values). Saves the subtraction of ex_row (the
// row kernels are issue-bound at 50k-class rows); the product m log2(e) is rounded once, an error of
// |m| 2^-24 in the exponent, far below the 2^-8 / 2^-11 of the values written.
constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ float ex2_approx(float v) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}
__device__ __forceinline__ float ex_shifted(float v, float nm2) { return ex2_approx(fmaf(v, kLog2e, nm2)); }
__device__ __forceinline__ float lg(float v) { return logf(v); }
__device__ __forceinline__ double lg(double v) { return log(v); }

// (m, s) <- (m, s) + (m2, s2) for running max m and sum s of exp(x - m).
template <class A>
__device__ __forceinline__ void ms_combine(A& m, A& s, A m2, A s2) {
  if (m2 == neg_inf<A>()) return;
  if (m == neg_inf<A>()) {
    m = m2;
    s = s2;
  } else if (m2 > m) {
    s = s * ex(m - m2) + s2;
    m = m2;
  } else {
    s += s2 * ex(m2 - m);
  }
}

template <class A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <class A>
__device__ __forceinline__ void warp_ms(A& m, A& s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const A m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const A s2 = __shfl_xor_sync(0xffffffffu, s, o);
    ms_combine(m, s, m2, s2);
  }
}

// Row-wide reductions: within the warp (kWarpRow) or across the block; every thread gets the result.
template <bool kWarpRow, class A>
__device__ __forceinline__ A row_sum(A v) {
  v = warp_sum(v);
  if constexpr (kWarpRow) {
    return v;
  } else {
    __shared__ A sh[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();  // the previous use of sh is over
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : A(0);
    return warp_sum(v);
  }
}
template <bool kWarpRow, class A>
__device__ __forceinline__ void row_ms(A& m, A& s) {
  warp_ms(m, s);
  if constexpr (!kWarpRow) {
    __shared__ A shm[32], shs[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) {
      shm[w] = m;
      shs[w] = s;
    }
    __syncthreads();
    m = lane < nw ? shm[lane] : neg_inf<A>();
    s = lane < nw ? shs[lane] : A(0);
    warp_ms(m, s);
  }
}

// This thread's place in its row: (row, first vector, vector stride).
template <bool kWarpRow>
__device__ __forceinline__ void row_coords(int64_t& row, int& tid, int& nt) {
  if constexpr (kWarpRow) {
    row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
    tid = threadIdx.x;
    nt = 32;
  } else {
    row = blockIdx.x;
    tid = threadIdx.x;
    nt = blockDim.x;
  }
}

// Calls f(j, value) for this thread's elements of a row (16-byte packs when V > 1: cols % V == 0
// and the row aligned, checked by the launcher).
template <class T, int V, class F>
__device__ __forceinline__ void for_row(const T* r, int64_t cols, int tid, int nt, F&& f) {
  using A = acc_t<T>;
  if constexpr (V > 1) {
    const auto* p = reinterpret_cast<const Pack<T, V>*>(r);
    for (int64_t k = tid; k < cols / V; k += nt) {
      const Pack<T, V> pk = p[k];
      A v[V];
      cast_all(pk.v, v);
#pragma unroll
      for (int e = 0; e < V; ++e) f(k * V + e, v[e]);
    }
  } else {
    for (int64_t j = tid; j < cols; j += nt) f(j, cast<A>(r[j]));
  }
}

// Folds a block of values into the running (m, s): one rescale per block, one exp per value.
template <class T, class A, int N>
__device__ __forceinline__ void ms_fold(const A (&v)[N], A& m, A& s) {
  A vm = neg_inf<A>();
#pragma unroll
  for (int e = 0; e < N; ++e) vm = fmax(vm, v[e]);  // one FMNMX; a NaN is left to the sum
  if (vm > m) {
    s = m == neg_inf<A>() ? A(0) : s * ex(m - vm);
    m = vm;
  }
  if (m != neg_inf<A>()) {
    if constexpr (sizeof(T) == 2) {
      const float nm2 = -m * kLog2e;
#pragma unroll
      for (int e = 0; e < N; ++e) s += ex_shifted(v[e], nm2);
    } else {
#pragma unroll
      for (int e = 0; e < N; ++e) s += ex_row<T>(v[e] - m);
    }
  }
}

// Online max / sum of exp over this thread's elements. kUnroll packs are loaded before any is
// used (independent 16-byte loads in flight: the row comes from DRAM here) and folded two at a
// time (one rescale test per 2V values: the loop is bound by instruction issue). kStage also copies each
// pack to the same place of `stage` (shared memory, 16-byte aligned; needs V > 1): a thread later
// reads back only the packs it wrote (for_row / map_row walk the same k), so no barrier is needed.
template <class T, int V, bool kStage = false>
__device__ __forceinline__ void thread_ms(const T* r, int64_t cols, int tid, int nt, acc_t<T>& m, acc_t<T>& s,
                                          T* stage = nullptr) {
  using A = acc_t<T>;
  static_assert(!kStage || V > 1, "staged rows use 16-byte packs");
  m = neg_inf<A>();
  s = 0;
  if constexpr (V > 1) {
    constexpr int kUnroll = 4;
    const auto* p = reinterpret_cast<const Pack<T, V>*>(r);
    auto* sp = reinterpret_cast<Pack<T, V>*>(stage);
    // A staged row fits in shared memory: 32-bit pack indices (fewer address instructions).
    using I = std::conditional_t<kStage, int, int64_t>;
    const I npk = static_cast<I>(cols / V);
    I k = tid;
    for (; k + I{kUnroll - 1} * nt < npk; k += I{kUnroll} * nt) {
      Pack<T, V> pk[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) pk[u] = p[k + u * nt];
      if constexpr (kStage) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) sp[k + u * nt] = pk[u];
      }
      static_assert(kUnroll % 2 == 0);
#pragma unroll
      for (int u = 0; u < kUnroll; u += 2) {
        A v[2][V];
        cast_all(pk[u].v, v[0]);
        cast_all(pk[u + 1].v, v[1]);
        ms_fold<T>(reinterpret_cast<A(&)[2 * V]>(v), m, s);
      }
    }
    for (; k < npk; k += nt) {
      const Pack<T, V> pk = p[k];
      if constexpr (kStage) sp[k] = pk;
      A v[V];
      cast_all(pk.v, v);
      ms_fold<T>(v, m, s);
    }
  } else {
    for (int64_t j = tid; j < cols; j += nt) {
      const A v[1] = {cast<A>(r[j])};
      ms_fold<T>(v, m, s);
    }
  }
}

// Writes out[j] = f(j, in[j]) over this thread's elements of a row.
template <class T, int V, class F>
__device__ __forceinline__ void map_row(const T* in, T* out, int64_t cols, int tid, int nt, F&& f) {
  using A = acc_t<T>;
  if constexpr (V > 1) {
    const auto* p = reinterpret_cast<const Pack<T, V>*>(in);
    auto* q = reinterpret_cast<Pack<T, V>*>(out);
#pragma unroll 4
    for (int64_t k = tid; k < cols / V; k += nt) {
      const Pack<T, V> pk = p[k];
      A v[V];
      cast_all(pk.v, v);
      Pack<T, V> o;
#pragma unroll
      for (int e = 0; e < V; ++e) o.v[e] = cast<T>(f(k * V + e, v[e]));
      q[k] = o;
    }
  } else {
    for (int64_t j = tid; j < cols; j += nt) out[j] = cast<T>(f(j, cast<A>(in[j])));
  }
}

// thread_ms over row r; returns where the write pass reads the row: r itself, or (kStage: one block
// per row, cols * sizeof(T) bytes of dynamic shared memory) the block's shared copy.
template <class T, int V, bool kStage>
__device__ __forceinline__ const T* thread_ms_row(const T* r, int64_t cols, int tid, int nt, acc_t<T>& m,
                                                  acc_t<T>& s) {
  if constexpr (kStage) {
    extern __shared__ __align__(16) unsigned char row_stage[];
    T* st = reinterpret_cast<T*>(row_stage);
    thread_ms<T, V, true>(r, cols, tid, nt, m, s, st);
    return st;
  } else {
    thread_ms<T, V>(r, cols, tid, nt, m, s);
    return r;
  }
}

template <class T, int V, bool kWarpRow, bool kLog, bool kStage = false>
__global__ void softmax_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t cols) {
  wait_prior_grids();  // launched dependent (dependent_launch.cuh)
  using A = acc_t<T>;
  int64_t row;
  int tid, nt;
  row_coords<kWarpRow>(row, tid, nt);
  if (row >= rows) return;  // whole warps (kWarpRow) or the whole block leave together
  A m, s;
  const T* xr = thread_ms_row<T, V, kStage>(x + row * cols, cols, tid, nt, m, s);
  row_ms<kWarpRow>(m, s);
  if constexpr (kLog) {
    const A lse = m + lg(s);
    map_row<T, V>(xr, y + row * cols, cols, tid, nt, [=](int64_t, A v) { return v - lse; });
  } else {
    const A inv = A(1) / s;
    map_row<T, V>(xr, y + row * cols, cols, tid, nt, [=](int64_t, A v) { return ex_row<T>(v - m) * inv; });
  }
}

// Two inputs, one output, row-wise: the backward's shapes.
template <class T, int V, class F>
__device__ __forceinline__ void map_row2(const T* a, const T* b, T* out, int64_t cols, int tid, int nt, F&& f) {
  using A = acc_t<T>;
  if constexpr (V > 1) {
    const auto* pa = reinterpret_cast<const Pack<T, V>*>(a);
    const auto* pb = reinterpret_cast<const Pack<T, V>*>(b);
    auto* q = reinterpret_cast<Pack<T, V>*>(out);
#pragma unroll 4
    for (int64_t k = tid; k < cols / V; k += nt) {
      const Pack<T, V> ka = pa[k], kb = pb[k];
      A va[V], vb[V];
      cast_all(ka.v, va);
      cast_all(kb.v, vb);
      Pack<T, V> o;
#pragma unroll
      for (int e = 0; e < V; ++e) o.v[e] = cast<T>(f(va[e], vb[e]));
      q[k] = o;
    }
  } else {
    for (int64_t j = tid; j < cols; j += nt) out[j] = cast<T>(f(cast<A>(a[j]), cast<A>(b[j])));
  }
}

template <class T, int V, bool kWarpRow, bool kLog>
__global__ void softmax_bwd_kernel(const T* __restrict__ g, const T* __restrict__ y, T* __restrict__ gi, int64_t rows,
                                   int64_t cols) {
  wait_prior_grids();  // launched dependent (dependent_launch.cuh)
  using A = acc_t<T>;
  int64_t row;
  int tid, nt;
  row_coords<kWarpRow>(row, tid, nt);
  if (row >= rows) return;
  const T* gr = g + row * cols;
  const T* yr = y + row * cols;
  A dot = 0;
  if constexpr (V > 1) {
    const auto* pg = reinterpret_cast<const Pack<T, V>*>(gr);
    const auto* py = reinterpret_cast<const Pack<T, V>*>(yr);
#pragma unroll 4
    for (int64_t k = tid; k < cols / V; k += nt) {
      const Pack<T, V> kg = pg[k];
      Pack<T, V> ky;
      if constexpr (!kLog) ky = py[k];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        if constexpr (kLog)
          dot += cast<A>(kg.v[e]);
        else
          dot += cast<A>(kg.v[e]) * cast<A>(ky.v[e]);
      }
    }
  } else {
    for (int64_t j = tid; j < cols; j += nt) dot += kLog ? cast<A>(gr[j]) : cast<A>(gr[j]) * cast<A>(yr[j]);
  }
  dot = row_sum<kWarpRow>(dot);
  if constexpr (kLog)
    map_row2<T, V>(gr, yr, gi + row * cols, cols, tid, nt, [=](A gv, A yv) { return gv - ex_row<T>(yv) * dot; });
  else
    map_row2<T, V>(gr, yr, gi + row * cols, cols, tid, nt, [=](A gv, A yv) { return yv * (gv - dot); });
}

// ---- cross_entropy
template <class A>
struct CeParams {
  const int64_t* target;
  const A* weight;     // [C] or null
  const A* weight_sum;  // 0-d or null
  int64_t ignore_index;
  A eps;
};

// d loss_i / d x_ij * s for one row, from its logsumexp (s = 0 for an ignored row). kShortRow: the
// row has fewer than 2^31 packs (a staged row), so pack indices are 32-bit.
template <class T, int V, bool kShortRow = false, class A>
__device__ __forceinline__ void ce_grad_row(const T* xr, T* gr, int64_t cols, int tid, int nt, const CeParams<A>& p,
                                            int64_t t, A lse, A s) {
  const bool bad = t != p.ignore_index && (t < 0 || t >= cols);
  if (t == p.ignore_index || bad) {
    const A fill = bad ? std::numeric_limits<A>::quiet_NaN() : A(0);
    map_row<T, V>(xr, gr, cols, tid, nt, [=](int64_t, A) { return fill; });
    return;
  }
  const A c = static_cast<A>(cols);
  const A w_t = p.weight ? p.weight[t] : A(1);
  const A wsum = p.weight ? *p.weight_sum : c;
  const A pcoef = s * ((A(1) - p.eps) * w_t + p.eps * wsum / c);
  const A onehot = s * (A(1) - p.eps) * w_t;
  const A smooth = s * p.eps / c;
  const A* w = p.weight;
  if constexpr (V > 1 && sizeof(T) == 2) {
    // Packs of float16 / bfloat16, written for instruction issue (the loop's limit at 50k classes):
    // the shifted ex2 with a positive pcoef folded into the shift (pcoef e^(v - lse) =
    // 2^(v log2 e - lse log2 e + log2 pcoef): no multiply per element), the smoothing term only
    // when there is one, and the one-hot left out of the loop: the thread that wrote the target's
    // pack writes that element again afterwards (its own earlier store: program order).
    const auto* src = reinterpret_cast<const Pack<T, V>*>(xr);
    auto* dst = reinterpret_cast<Pack<T, V>*>(gr);
    const bool fold = pcoef > A(0) && pcoef < std::numeric_limits<A>::infinity();
    const float nm2 = -lse * kLog2e + (fold ? log2f(pcoef) : 0.f);
    const A coef = fold ? A(1) : pcoef;
    const bool smoothing = p.eps > A(0);
    auto grad_at = [&](A v, int64_t j) {
      A r = fold ? ex_shifted(v, nm2) : coef * ex_shifted(v, nm2);
      if (smoothing) r -= smooth * (w ? w[j] : A(1));
      return r;
    };
    using I = std::conditional_t<kShortRow, int, int64_t>;
    auto pass = [&](auto folded, auto smoothed) {
#pragma unroll 4
      for (I k = tid; k < static_cast<I>(cols / V); k += nt) {
        const Pack<T, V> pk = src[k];
        A r[V];
        cast_all(pk.v, r);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          r[e] = decltype(folded)::value ? ex_shifted(r[e], nm2) : coef * ex_shifted(r[e], nm2);
          if constexpr (decltype(smoothed)::value) r[e] -= smooth * (w ? w[k * V + e] : A(1));
        }
        Pack<T, V> o;
#pragma unroll
        for (int e = 0; e < V; ++e) o.v[e] = cast<T>(r[e]);
        dst[k] = o;
      }
    };
    using F = std::false_type;
    using Tr = std::true_type;
    if (smoothing) fold ? pass(Tr{}, Tr{}) : pass(F{}, Tr{});
    else fold ? pass(Tr{}, F{}) : pass(F{}, F{});
    if ((t / V) % nt == tid) gr[t] = cast<T>(grad_at(cast<A>(xr[t]), t) - onehot);
  } else {
    map_row<T, V>(xr, gr, cols, tid, nt, [=](int64_t j, A v) {
      A r = pcoef * ex_row<T>(v - lse) - smooth * (w ? w[j] : A(1));
      return j == t ? r - onehot : r;
    });
  }
}

// Row loss (1 - eps) w[t] (lse - x[t]) + eps / C (W lse - sum_j w_j x_j); 0 when ignored, NaN for a
// target out of range; wt = w[t] (0 / NaN likewise).
template <class T, class A>
__device__ __forceinline__ A ce_row_loss(const T* xr, int64_t cols, const CeParams<A>& p, int64_t t, A lse, A wx,
                                         A& wt) {
  if (t == p.ignore_index) {
    wt = 0;
    return 0;
  }
  if (t < 0 || t >= cols) {
    wt = std::numeric_limits<A>::quiet_NaN();
    return wt;
  }
  wt = p.weight ? p.weight[t] : A(1);
  A l = (A(1) - p.eps) * wt * (lse - cast<A>(xr[t]));
  if (p.eps > A(0)) {
    const A wsum = p.weight ? *p.weight_sum : static_cast<A>(cols);
    l += p.eps / static_cast<A>(cols) * (wsum * lse - wx);
  }
  return l;
}

template <class T, int V, bool kWarpRow, bool kGrad, bool kStage = false>
__global__ void ce_fwd_kernel(const T* __restrict__ x, CeParams<acc_t<T>> p, acc_t<T>* loss, acc_t<T>* lse_out,
                              acc_t<T>* wt_out, T* __restrict__ gx, const acc_t<T>* denom, int64_t rows,
                              int64_t cols) {
  wait_prior_grids();  // launched dependent (dependent_launch.cuh)
  using A = acc_t<T>;
  int64_t row;
  int tid, nt;
  row_coords<kWarpRow>(row, tid, nt);
  if (row >= rows) return;
  const T* xr = x + row * cols;
  A m, s;
  const T* src = thread_ms_row<T, V, kStage>(xr, cols, tid, nt, m, s);  // the row again (shared when staged)
  A wx = 0;  // sum_j w_j x_j, for label smoothing (L1-hot or shared: the row was just read)
  if (p.eps > A(0)) {
    const A* w = p.weight;
    for_row<T, V>(src, cols, tid, nt, [&](int64_t j, A v) { wx += (w ? w[j] : A(1)) * v; });
  }
  row_ms<kWarpRow>(m, s);
  if (p.eps > A(0)) wx = row_sum<kWarpRow>(wx);
  const A lse = m + lg(s);
  const int64_t t = p.target[row];
  if (tid == 0) {
    lse_out[row] = lse;
    A wt;
    loss[row] = ce_row_loss(xr, cols, p, t, lse, wx, wt);
    wt_out[row] = wt;
  }
  if constexpr (kGrad) {
    const A sc = denom ? A(1) / *denom : A(1);
    ce_grad_row<T, V, kStage>(src, gx + row * cols, cols, tid, nt, p, t, lse, sc);
  }
}

template <class T, int V, bool kWarpRow>
__global__ void ce_bwd_kernel(const T* __restrict__ x, CeParams<acc_t<T>> p, const acc_t<T>* lse,
                              const acc_t<T>* grad, bool per_row, const acc_t<T>* denom, T* __restrict__ gx,
                              int64_t rows, int64_t cols) {
  wait_prior_grids();  // launched dependent (dependent_launch.cuh)
  using A = acc_t<T>;
  int64_t row;
  int tid, nt;
  row_coords<kWarpRow>(row, tid, nt);
  if (row >= rows) return;
  const A sc = grad[per_row ? row : 0] / (denom ? *denom : A(1));
  ce_grad_row<T, V>(x + row * cols, gx + row * cols, cols, tid, nt, p, p.target[row], lse[row], sc);
}

// The whole reduced forward of a small problem in one block (launches dominate there): the
// denominator from the targets, then one warp per row (loss, lse, and the gradient when asked),
// then the block's sum in a fixed order.
constexpr int kSmallThreads = 512;  // 1024 would cap registers at 64 and spill
constexpr int64_t kSmallThreadRowMax = 32;  // rows up to this long: one thread each
constexpr int64_t kSmallMaxNumel = int64_t{1} << 16;

template <class T, int V>
__global__ void __launch_bounds__(kSmallThreads)
    ce_small_kernel(const T* __restrict__ x, CeParams<acc_t<T>> p, bool mean, acc_t<T>* out, acc_t<T>* denom_out,
                    acc_t<T>* lse_out, T* __restrict__ gx, int64_t rows, int64_t cols) {
  wait_prior_grids();  // launched dependent (dependent_launch.cuh)
  using A = acc_t<T>;
  A d = 0;
  for (int64_t i = threadIdx.x; i < rows; i += kSmallThreads) {
    const int64_t t = p.target[i];
    if (t != p.ignore_index) d += p.weight ? p.weight[t >= 0 && t < cols ? t : 0] : A(1);
  }
  d = row_sum<false>(d);
  const A sc = mean ? A(1) / d : A(1);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  A acc = 0;
  if (cols <= kSmallThreadRowMax) {
    // Narrow rows (the MNIST MLP's [128, 10]): one thread per row, no shuffles. A warp per row
    // walked 8 rows per warp one after another and took 18 us on the H200 for [128, 10].
    const A* w = p.weight;
    for (int64_t r = threadIdx.x; r < rows; r += kSmallThreads) {
      const T* xr = x + r * cols;
      A m, s;
      thread_ms<T, 1>(xr, cols, 0, 1, m, s);
      A wx = 0;
      if (p.eps > A(0)) for_row<T, 1>(xr, cols, 0, 1, [&](int64_t j, A v) { wx += (w ? w[j] : A(1)) * v; });
      const A lse = m + lg(s);
      const int64_t t = p.target[r];
      lse_out[r] = lse;
      A wt;
      acc += ce_row_loss(xr, cols, p, t, lse, wx, wt);
      if (gx) ce_grad_row<T, 1>(xr, gx + r * cols, cols, 0, 1, p, t, lse, sc);
    }
  } else {
  for (int64_t r = warp; r < rows; r += kSmallThreads / 32) {
    const T* xr = x + r * cols;
    A m, s;
    thread_ms<T, V>(xr, cols, lane, 32, m, s);
    warp_ms(m, s);
    A wx = 0;
    if (p.eps > A(0)) {
      const A* w = p.weight;
      for_row<T, V>(xr, cols, lane, 32, [&](int64_t j, A v) { wx += (w ? w[j] : A(1)) * v; });
      wx = warp_sum(wx);
    }
    const A lse = m + lg(s);
    const int64_t t = p.target[r];
    if (lane == 0) {
      lse_out[r] = lse;
      A wt;
      acc += ce_row_loss(xr, cols, p, t, lse, wx, wt);
    }
    if (gx) ce_grad_row<T, V>(xr, gx + r * cols, cols, lane, 32, p, t, lse, sc);
  }
  }
  acc = row_sum<false>(acc);
  if (threadIdx.x == 0) {
    out[0] = mean ? acc / d : acc;
    if (denom_out) denom_out[0] = d;
  }
}

// ---- launch helpers
int row_threads(int64_t cols, int v) {
  const int64_t packs = (cols + v - 1) / v;
  int64_t t = ((packs + 3) / 4 + 31) / 32 * 32;  // about 4 packs per thread
  return static_cast<int>(t < 128 ? 128 : t > 1024 ? 1024 : t);
}

template <class T>
bool aligned_rows(int64_t cols, std::initializer_list<const void*> ptrs) {
  constexpr int V = 16 / sizeof(T);
  if (V <= 1 || cols % V != 0) return false;
  for (const void* p : ptrs)
    if (p && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// Launches kernel<V, kWarpRow> for (rows, cols) with the vector width and geometry chosen here.
template <class T, class L>
void launch_rows(int64_t rows, int64_t cols, bool vec, int device, L&& launch) {
  constexpr int V = 16 / sizeof(T) > 1 ? 16 / sizeof(T) : 1;
  cudaStream_t stream = detail::current_stream_handle(device);
  if (cols <= kWarpRowMax) {
    const dim3 block(32, kRowsPerWarpBlock);
    const dim3 grid(static_cast<unsigned>((rows + kRowsPerWarpBlock - 1) / kRowsPerWarpBlock));
    if (vec)
      launch(std::integral_constant<int, V>{}, std::true_type{}, grid, block, stream);
    else
      launch(std::integral_constant<int, 1>{}, std::true_type{}, grid, block, stream);
  } else {
    const dim3 block(row_threads(cols, vec ? V : 1));
    const dim3 grid(static_cast<unsigned>(rows));
    if (vec)
      launch(std::integral_constant<int, V>{}, std::false_type{}, grid, block, stream);
    else
      launch(std::integral_constant<int, 1>{}, std::false_type{}, grid, block, stream);
  }
  TG_CUDA_CHECK_LAUNCH();
}

// Staged rows (thread_ms_row): a row of up to kStageMaxBytes in dynamic shared memory, one block of
// up to kStageThreads threads per row, so two blocks fit an sm_90 SM (2 x 110 KB of its 228 KB;
// 512 threads each at <= 64 registers) and one block's write pass overlaps the other's read.
constexpr int64_t kStageMaxBytes = 110 * 1024;
constexpr int kStageThreads = 512;

// Dynamic shared memory a staged row may take on this device (the opt-in per-block maximum, less
// 1 KB for the kernels' static shared memory, capped at kStageMaxBytes).
int64_t stage_limit(int device) {
  static std::once_flag once;
  static std::vector<int64_t> lim;
  std::call_once(once, [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    lim.assign(static_cast<size_t>(std::max(n, 1)), 0);
    for (int d = 0; d < n; ++d) {
      int optin = 0;
      if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, d) != cudaSuccess) optin = 0;
      lim[d] = std::max<int64_t>(0, std::min<int64_t>(kStageMaxBytes, optin - 1024));
    }
  });
  return device >= 0 && device < static_cast<int>(lim.size()) ? lim[device] : 0;
}

// Whether a forward over (rows, cols) stages its rows: block-per-row rows, 16-byte packs, fits.
template <class T>
bool stage_rows(int64_t cols, bool vec, int device) {
  return vec && cols > kWarpRowMax && cols * static_cast<int64_t>(sizeof(T)) <= stage_limit(device);
}

// Launches a staged kernel (one block per row), raising its dynamic shared memory cap to
// stage_limit(device) the first time per kernel and device.
template <class T, class K, class... Args>
void launch_staged(K kernel, int64_t rows, int64_t cols, int device, Args... args) {
  constexpr int V = 16 / sizeof(T);
  if (rows == 0) return;
  {
    static std::mutex mu;
    static std::vector<std::pair<const void*, int>> raised;
    const std::pair<const void*, int> key{reinterpret_cast<const void*>(kernel), device};
    std::lock_guard<std::mutex> lock(mu);
    if (std::find(raised.begin(), raised.end(), key) == raised.end()) {
      TG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(stage_limit(device))));
      raised.push_back(key);
    }
  }
  const dim3 block(std::min(row_threads(cols, V), kStageThreads));
  const dim3 grid(static_cast<unsigned>(rows));
  const auto smem = static_cast<size_t>(cols * static_cast<int64_t>(sizeof(T)));
  launch_dependent(kernel, LaunchShape{grid, block, smem, detail::current_stream_handle(device), device}, args...);
  TG_CUDA_CHECK_LAUNCH();
}

template <class A>
CeParams<A> ce_params(const CeArgs& a) {
  CeParams<A> p;
  p.target = static_cast<const int64_t*>(a.target.data_ptr());
  p.weight = a.weight.defined() ? static_cast<const A*>(a.weight.data_ptr()) : nullptr;
  p.weight_sum = a.weight_sum.defined() ? static_cast<const A*>(a.weight_sum.data_ptr()) : nullptr;
  p.ignore_index = a.ignore_index;
  p.eps = static_cast<A>(a.label_smoothing);
  return p;
}

}  // namespace

void softmax(const Tensor& out, const Tensor& in, bool log) {
  const int64_t cols = in.dim() == 0 ? 1 : in.size(-1);
  const int64_t rows = in.numel() / cols;
  const int device = in.device().index();
  dispatch<kFloats>(in.dtype(), log ? "log_softmax" : "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = static_cast<const T*>(in.data_ptr());
    T* y = static_cast<T*>(out.data_ptr());
    const bool vec = aligned_rows<T>(cols, {x, y});
    if (stage_rows<T>(cols, vec, device)) {
      constexpr int V = 16 / sizeof(T);
      if (log)
        launch_staged<T>(softmax_fwd_kernel<T, V, false, true, true>, rows, cols, device, x, y, rows, cols);
      else
        launch_staged<T>(softmax_fwd_kernel<T, V, false, false, true>, rows, cols, device, x, y, rows, cols);
      return;
    }
    launch_rows<T>(rows, cols, vec, device, [&](auto v, auto warp, dim3 grid, dim3 block, cudaStream_t st) {
      constexpr int V = decltype(v)::value;
      constexpr bool W = decltype(warp)::value;
      if (log)
        launch_dependent(softmax_fwd_kernel<T, V, W, true>, LaunchShape{grid, block, 0, st, device}, x, y, rows, cols);
      else
        launch_dependent(softmax_fwd_kernel<T, V, W, false>, LaunchShape{grid, block, 0, st, device}, x, y, rows, cols);
    });
  });
}

void softmax_backward(const Tensor& grad_in, const Tensor& grad, const Tensor& out, bool log) {
  const int64_t cols = out.dim() == 0 ? 1 : out.size(-1);
  const int64_t rows = out.numel() / cols;
  const int device = out.device().index();
  dispatch<kFloats>(out.dtype(), log ? "log_softmax_backward" : "softmax_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* g = static_cast<const T*>(grad.data_ptr());
    const T* y = static_cast<const T*>(out.data_ptr());
    T* gi = static_cast<T*>(grad_in.data_ptr());
    const bool vec = aligned_rows<T>(cols, {g, y, gi});
    launch_rows<T>(rows, cols, vec, device, [&](auto v, auto warp, dim3 grid, dim3 block, cudaStream_t st) {
      constexpr int V = decltype(v)::value;
      constexpr bool W = decltype(warp)::value;
      if (log)
        launch_dependent(softmax_bwd_kernel<T, V, W, true>, LaunchShape{grid, block, 0, st, device}, g, y, gi, rows,
                         cols);
      else
        launch_dependent(softmax_bwd_kernel<T, V, W, false>, LaunchShape{grid, block, 0, st, device}, g, y, gi, rows,
                         cols);
    });
  });
}

void cross_entropy(const CeArgs& a, const Tensor& loss, const Tensor& lse, const Tensor& wt, const Tensor& grad_logits,
                   const Tensor& denom) {
  const int64_t rows = a.logits.size(0), cols = a.logits.size(1);
  const int device = a.logits.device().index();
  dispatch<kFloats>(a.logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* x = static_cast<const T*>(a.logits.data_ptr());
    T* gx = grad_logits.defined() ? static_cast<T*>(grad_logits.data_ptr()) : nullptr;
    const A* dn = denom.defined() ? static_cast<const A*>(denom.data_ptr()) : nullptr;
    A* l = static_cast<A*>(loss.data_ptr());
    A* ls = static_cast<A*>(lse.data_ptr());
    A* w = static_cast<A*>(wt.data_ptr());
    const CeParams<A> p = ce_params<A>(a);
    const bool vec = aligned_rows<T>(cols, {x, gx});
    if (gx && stage_rows<T>(cols, vec, device)) {  // without the gradient the row is read once anyway
      constexpr int V = 16 / sizeof(T);
      launch_staged<T>(ce_fwd_kernel<T, V, false, true, true>, rows, cols, device, x, p, l, ls, w, gx, dn, rows,
                       cols);
      return;
    }
    launch_rows<T>(rows, cols, vec, device, [&](auto v, auto warp, dim3 grid, dim3 block, cudaStream_t st) {
      constexpr int V = decltype(v)::value;
      constexpr bool W = decltype(warp)::value;
      if (gx)
        launch_dependent(ce_fwd_kernel<T, V, W, true>, LaunchShape{grid, block, 0, st, device}, x, p, l, ls, w, gx, dn,
                         rows, cols);
      else
        launch_dependent(ce_fwd_kernel<T, V, W, false>, LaunchShape{grid, block, 0, st, device}, x, p, l, ls, w, gx, dn,
                         rows, cols);
    });
  });
}

bool cross_entropy_reduced(const CeArgs& a, bool mean, const Tensor& out, const Tensor& lse, const Tensor& denom,
                           const Tensor& grad_logits) {
  const int64_t rows = a.logits.size(0), cols = a.logits.size(1);
  if (a.logits.numel() > kSmallMaxNumel || cols > kWarpRowMax) return false;
  const int device = a.logits.device().index();
  const LaunchShape shape{dim3(1), dim3(kSmallThreads), 0, detail::current_stream_handle(device), device};
  dispatch<kFloats>(a.logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    constexpr int V = 16 / sizeof(T) > 1 ? 16 / sizeof(T) : 1;
    const T* x = static_cast<const T*>(a.logits.data_ptr());
    T* gx = grad_logits.defined() ? static_cast<T*>(grad_logits.data_ptr()) : nullptr;
    A* o = static_cast<A*>(out.data_ptr());
    A* dn = denom.defined() ? static_cast<A*>(denom.data_ptr()) : nullptr;
    A* ls = static_cast<A*>(lse.data_ptr());
    const CeParams<A> p = ce_params<A>(a);
    if (aligned_rows<T>(cols, {x, gx}))
      launch_dependent(ce_small_kernel<T, V>, shape, x, p, mean, o, dn, ls, gx, rows, cols);
    else
      launch_dependent(ce_small_kernel<T, 1>, shape, x, p, mean, o, dn, ls, gx, rows, cols);
  });
  return true;
}

void cross_entropy_backward(const CeArgs& a, const Tensor& grad_logits, const Tensor& lse, const Tensor& grad,
                            const Tensor& denom) {
  const int64_t rows = a.logits.size(0), cols = a.logits.size(1);
  const int device = a.logits.device().index();
  dispatch<kFloats>(a.logits.dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* x = static_cast<const T*>(a.logits.data_ptr());
    T* gx = static_cast<T*>(grad_logits.data_ptr());
    const A* dn = denom.defined() ? static_cast<const A*>(denom.data_ptr()) : nullptr;
    const A* ls = static_cast<const A*>(lse.data_ptr());
    const A* g = static_cast<const A*>(grad.data_ptr());
    const bool per_row = grad.dim() > 0;
    const CeParams<A> p = ce_params<A>(a);
    const bool vec = aligned_rows<T>(cols, {x, gx});
    launch_rows<T>(rows, cols, vec, device, [&](auto v, auto warp, dim3 grid, dim3 block, cudaStream_t st) {
      constexpr int V = decltype(v)::value;
      constexpr bool W = decltype(warp)::value;
      launch_dependent(ce_bwd_kernel<T, V, W>, LaunchShape{grid, block, 0, st, device}, x, p, ls, g, per_row, dn, gx,
                       rows, cols);
    });
  });
}

}  // namespace tg::cuda::kern
