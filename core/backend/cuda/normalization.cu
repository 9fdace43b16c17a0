// CUDA layer_norm / rms_norm (forward and backward) and dropout (issue 15).
//
// Why hand-written: cuDNN has no layer_norm backward that gives the input, weight and bias
// gradients in one pass over the data, and composing reductions + elementwise ops reads a row
// 3-5 times. Here a row is read once into registers by a group of threads (a warp for rows of up
// to 64 16-byte vectors, else a block) with 16-byte loads; statistics are exact two-pass sums
// over those registers in float (double for float64); forward writes y and the row's mean and
// 1/std only. Backward reads x, dy (and the weight) once: each thread's columns are fixed across
// the rows it visits, so it keeps the weight / bias gradient of its columns in registers over all
// its rows; a block combines its groups in shared memory (in a fixed order), writes one partial
// row, and a small kernel sums the partials per column in a fixed order: bit-reproducible.
// Rows longer than 8192 vectors re-read the row per pass, and their weight / bias gradients come
// from a column-parallel kernel over row chunks (reading x and dy once more).
// Dropout: one thread per Philox block (4 elements), the mask recomputed, never stored.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string_view>
#include <type_traits>

#include <tapegrad/core/philox.h>
#include <tapegrad/core/backend/cuda/elementwise_ops.cuh>
#include <tapegrad/core/backend/cuda/kernels.cuh>
#include <tapegrad/core/backend/cuda/launch_queue.h>
#include <tapegrad/core/backend/cuda/loops.cuh>
#include <tapegrad/core/backend/cuda/reduce.cuh>

namespace tg::cuda::kern {
namespace {

template <class T>
using nacc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T, int V>
struct alignas(sizeof(T) * V) NPack {
  T v[V];
};

constexpr int kWarpRowsPerBlock = 4;  // warp mode: 4 rows (warps) per 128-thread block
// Block-mode kernels are launched with up to 1024 threads, so they carry __launch_bounds__(1024):
// at most 64 registers. Without it <bfloat16, 8, 2> backward (90 registers, rows of 8200-65536
// bf16 columns) and <float, 4, 4> (94, 8196-32768 float columns) could not launch at all; with
// it the K >= 4 forms spill a little (correct, slower: a plan by registers is the follow-up).
constexpr int kMaxK = 8;              // most 16-byte vectors per thread kept in registers

// The row kernels' reductions: sums of N values over the group with one barrier (block mode).
// red holds two buffers of N x 32 slots used by alternate calls (buf = 0, 1, 0, ...): a call
// writes its buffer only after every thread passed the previous call's barrier, so after every
// read of that buffer two calls ago. Within a warp and then across the warps' partial sums the
// values are added by an xor-shuffle tree in a fixed order (bit-reproducible; float addition is
// commutative, so every lane ends with the same bits).
template <int N, class A>
__device__ __forceinline__ void warp_sums(A (&v)[N], int from = 16) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    if (o > from) continue;
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], o);
  }
}
template <bool G32, int N, class A>
__device__ __forceinline__ void group_sums(A (&v)[N], A* red, int buf) {
  warp_sums(v);
  if constexpr (!G32) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    A* r = red + buf * N * 32;
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < N; ++i) r[i * 32 + w] = v[i];
    }
    __syncthreads();
    // Up to 16 partials: each half-warp holds them all and the tree starts at offset 8 (the
    // level at 16 would add zeros: the same bits).
    const int l = nw <= 16 ? lane & 15 : lane;
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = l < nw ? r[i * 32 + l] : A(0);
    warp_sums(v, nw <= 16 ? 8 : 16);
  }
}
// Explicitly rounded multiply / add for the steps whose bits must not depend on the kernel instance:
// ptxas may contract a separate multiply and add into an FMA in one instance (a twin's, say) and
// not in another, and a twin must leave the float32 result exactly as the plain kernel writes it.
template <class A>
__device__ __forceinline__ A mul_rn(A a, A b) {
  if constexpr (std::is_same_v<A, float>) return __fmul_rn(a, b);
  else return __dmul_rn(a, b);
}
template <class A>
__device__ __forceinline__ A add_rn(A a, A b) {
  if constexpr (std::is_same_v<A, float>) return __fadd_rn(a, b);
  else return __dadd_rn(a, b);
}

// One row per group (G32: a warp, for rows of <= 64 vectors; else the block); K vectors of V
// elements per thread. L != T: also writes y's cast to L into ylow (NormArgs::y_low, a twin).
// R not void: the row is x + res (R: the residual add's other operand, read as it is), written to
// xsum as it is read (the add the norm absorbed: DeferredAdd below).
template <class T, int V, int K, bool G32, class L = T, class R = void>
__global__ void __launch_bounds__(G32 ? 32 * kWarpRowsPerBlock : 1024) norm_fwd_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                T* __restrict__ y, nacc_t<T>* __restrict__ mean_out, nacc_t<T>* __restrict__ rstd_out,
                                int64_t rows, int cols, nacc_t<T> eps, bool rms, L* __restrict__ ylow,
                                const R* __restrict__ res, T* __restrict__ xsum) {
  wait_prior_grids();  // launched dependent (dependent_launch.cuh)
  constexpr bool kTwin = !std::is_same_v<L, T>;
  constexpr bool kRes = !std::is_void_v<R>;
  using A = nacc_t<T>;
  using P = NPack<T, V>;
  __shared__ A red[2 * 32];      // group_sums of 1 value: 2 buffers
  int it = 0;                     // which buffer the next reduction uses
  const int G = G32 ? 32 : blockDim.x;
  const int groups_per_block = G32 ? blockDim.x / 32 : 1;
  const int t = G32 ? (threadIdx.x & 31) : threadIdx.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * groups_per_block + (G32 ? threadIdx.x / 32 : 0);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * groups_per_block;
  const int nvec = cols / V;
  const A inv_n = A(1) / static_cast<A>(cols);
  // Software pipeline (PF): the raw packs of the group's next row (row + stride) are loaded into
  // nxt before this row's reductions and stores, so their latency overlaps them; swapped at the
  // end. Only for K == 1: at K == 2 it takes <float, 4, 2> from 32 registers to 48 and cost the
  // H200 7% on [8192, 4096] float32 (0.209 -> 0.221 ms fwd+bwd) and bfloat16 gained nothing.
  constexpr bool PF = K == 1;
  P buf[K], nxt[K];
  // Vector v of row r; with kRes, x + res, also stored to xsum (the same sum as the elementwise
  // add: a float add of the operand read as float; the add's alpha is 1).
  auto fetch = [&](int64_t r, int v) {
    P p = reinterpret_cast<const P*>(x + r * cols)[v];
    if constexpr (kRes) {
      using Q = NPack<R, V>;
      const Q q = reinterpret_cast<const Q*>(res + r * cols)[v];
#pragma unroll
      for (int e = 0; e < V; ++e) p.v[e] = p.v[e] + cast<T>(q.v[e]);
      reinterpret_cast<P*>(xsum + r * cols)[v] = p;
    }
    return p;
  };
  auto load = [&](P(&dst)[K], int64_t r) {
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (t + k * G < nvec) dst[k] = fetch(r, t + k * G);
  };
  if (PF && first < rows) load(buf, first);
  for (int64_t row = first; row < rows; row += stride) {
    if (PF && row + stride < rows) load(nxt, row + stride);
    A s = 0;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int v = t + k * G;
      if (v < nvec) {
        if (!PF) buf[k] = fetch(row, v);
        A xv[V];
        cast_all(buf[k].v, xv);
#pragma unroll
        for (int e = 0; e < V; ++e) s += rms ? xv[e] * xv[e] : xv[e];
      }
    }
    A mean = 0, var_sum;  // var = var_sum / cols
    if (rms) {
      A v1[1] = {s};
      group_sums<G32>(v1, red, it);
      var_sum = v1[0];
    } else {
      // Two passes over the registers: the mean, then the squared deviations from it.
      A v1[1] = {s};
      group_sums<G32>(v1, red, it);
      it ^= 1;
      mean = mul_rn(v1[0], inv_n);
      A ss = 0;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (t + k * G < nvec) {
          A xv[V];
          cast_all(buf[k].v, xv);
#pragma unroll
          for (int e = 0; e < V; ++e) {
            const A d = xv[e] - mean;
            ss += d * d;
          }
        }
      }
      A v2[1] = {ss};
      group_sums<G32>(v2, red, it);
      var_sum = v2[0];
    }
    it ^= 1;
    const A rstd = A(1) / sqrt(fma(var_sum, inv_n, eps));
    if (t == 0) {
      if (mean_out) mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
    P* yr = reinterpret_cast<P*>(y + row * cols);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int v = t + k * G;
      if (v < nvec) {
        P o;
        A xv[V], wf[V], bf[V];
        cast_all(buf[k].v, xv);
        if (w) {
          const P wv = reinterpret_cast<const P*>(w)[v];
          cast_all(wv.v, wf);
        }
        if (b) {
          const P bv = reinterpret_cast<const P*>(b)[v];
          cast_all(bv.v, bf);
        }
        NPack<L, V> lo;
#pragma unroll
        for (int e = 0; e < V; ++e) {
          A r = mul_rn(xv[e] - mean, rstd);
          if (w) r = b ? fma(r, wf[e], bf[e]) : mul_rn(r, wf[e]);
          else if (b) r = add_rn(r, bf[e]);
          o.v[e] = cast<T>(r);
          if constexpr (kTwin) lo.v[e] = cast<L>(o.v[e]);
        }
        yr[v] = o;
        if constexpr (kTwin) reinterpret_cast<NPack<L, V>*>(ylow + row * cols)[v] = lo;
      }
    }
    if constexpr (PF) {
#pragma unroll
      for (int k = 0; k < K; ++k) buf[k] = nxt[k];
    }
  }
}

// dx per row, and per-block partial sums of dw (g * xhat) and db (g) over the block's rows:
// pw / pb [gridDim.x, cols] (null when not wanted). smem: 2 * cols accumulators (warp mode).
// ADD: dx += add (the caller's addend, NormBackwardArgs::grad_x_addend), a template flag so that
// the plain kernels keep their registers.
// The kernel is bound by instructions per row, not bytes (ncu: ~300 warp instructions a row at
// [8192, 4096] bfloat16 before the rewrite below), so a row's work is written to keep them few:
// K == 1 visits its rows in pairs so the prefetched registers alternate instead of
// being copied, and dx is one FMA pair per element:
//   dx = rstd * (gy - s1 - xhat * s2) = fma(rstd, gy, fma(-rstd^2 s2, xc, -rstd s1')),
// where for half types xc = x and xhat = fma(x, rstd, -mean * rstd) (s1' = s1 + s2 * -mean * rstd:
// the rounding of the folded mean is far below a half output's), and for float32 / float64
// xc = x - mean, xhat = xc * rstd as before.
// L != T: also writes dx's cast to L into dxlow (NormBackwardArgs::grad_x_low, a twin).
template <class T, int V, int K, bool G32, bool ADD, class L = T>
__global__ void __launch_bounds__(G32 ? 32 * kWarpRowsPerBlock : 1024) norm_bwd_kernel(const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ w,
                                const nacc_t<T>* __restrict__ mean, const nacc_t<T>* __restrict__ rstd,
                                T* __restrict__ dx, const T* __restrict__ add, nacc_t<T>* __restrict__ pw,
                                nacc_t<T>* __restrict__ pb, int64_t rows, int cols, bool rms, L* __restrict__ dxlow) {
  wait_prior_grids();  // launched dependent (dependent_launch.cuh)
  constexpr bool kTwin = !std::is_same_v<L, T>;
  using A = nacc_t<T>;
  using P = NPack<T, V>;
  constexpr bool kFold = sizeof(T) == 2;  // fold the mean into an FMA (half types)
  __shared__ A red[2 * 2 * 32];  // group_sums of 2 values: 2 buffers
  int it = 0;
  extern __shared__ unsigned char smem_raw[];
  const int G = G32 ? 32 : blockDim.x;
  const int groups_per_block = G32 ? blockDim.x / 32 : 1;
  const int t = G32 ? (threadIdx.x & 31) : threadIdx.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * groups_per_block + (G32 ? threadIdx.x / 32 : 0);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * groups_per_block;
  const int nvec = cols / V;
  const A inv_n = A(1) / static_cast<A>(cols);
  A accw[K][V], accb[K][V];
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int e = 0; e < V; ++e) accw[k][e] = accb[k][e] = 0;
  // Row r starts at pack r * nvec of each tensor: the loops carry that offset and add
  // stride * nvec per visit (uniform across the group), so no row pays a 64-bit multiply.
  const int64_t step = stride * nvec;
  auto load = [&](P(&xd)[K], P(&gd)[K], A& md, A& rd, int64_t r, int64_t off) {
    const P* xr = reinterpret_cast<const P*>(x) + off;
    const P* gr = reinterpret_cast<const P*>(g) + off;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (t + k * G < nvec) {
        xd[k] = xr[t + k * G];
        gd[k] = gr[t + k * G];
      }
    }
    md = rms ? A(0) : mean[r];
    rd = rstd[r];
  };
  // Software pipeline (K == 1 only): x, dy and the statistics of the next row are loaded before
  // this row's reductions and stores.
  constexpr bool PF = K == 1;
  // The weight of this thread's columns, kept in registers over its rows when K == 1 (4 registers
  // for a 16-byte pack; its two loads per row were issue slots and load-queue entries: ncu showed
  // the backward stalled on lg_throttle); larger K read it per row.
  P wk[PF ? K : 1];
  if (PF && w) {
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (t + k * G < nvec) wk[k] = reinterpret_cast<const P*>(w)[t + k * G];
  }
  auto weight = [&](int k, int v) -> P {
    if constexpr (PF) return wk[k];
    else return reinterpret_cast<const P*>(w)[v];
  };
  auto row_body = [&](const P(&xb)[K], const P(&gb)[K], A m, A rs, int64_t off) {
    const A nmr = -m * rs;
    A s1 = 0, s2 = 0;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int v = t + k * G;
      if (v < nvec) {
        A gf[V], xf[V], wf[V];
        cast_all(gb[k].v, gf);
        cast_all(xb[k].v, xf);
        if (w) {
          const P wv = weight(k, v);
          cast_all(wv.v, wf);
        }
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const A gv = gf[e];
          const A xh = kFold ? fma(xf[e], rs, nmr) : (xf[e] - m) * rs;
          accw[k][e] = fma(gv, xh, accw[k][e]);
          accb[k][e] += gv;
          const A gy = w ? mul_rn(gv, wf[e]) : gv;
          s1 = add_rn(s1, gy);
          s2 = fma(gy, xh, s2);
        }
      }
    }
    if (!dx) return;
    A v2[2] = {s1, s2};
    group_sums<G32>(v2, red, it);
    it ^= 1;
    s1 = rms ? A(0) : mul_rn(v2[0], inv_n);
    s2 = mul_rn(v2[1], inv_n);
    const A c2 = -rs * rs * s2;
    const A c0 = kFold ? -rs * fma(s2, nmr, s1) : -rs * s1;
    P* dr = reinterpret_cast<P*>(dx) + off;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int v = t + k * G;
      if (v < nvec) {
        P o;
        NPack<L, V> lo;
        A gf[V], xf[V], wf[V], af[V];
        cast_all(gb[k].v, gf);
        cast_all(xb[k].v, xf);
        if (w) {
          const P wv = weight(k, v);
          cast_all(wv.v, wf);
        }
        if constexpr (ADD) {
          const P av = reinterpret_cast<const P*>(add)[off + v];
          cast_all(av.v, af);
        }
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const A gy = w ? mul_rn(gf[e], wf[e]) : gf[e];
          const A r = fma(rs, gy, fma(c2, kFold ? xf[e] : xf[e] - m, c0));
          if constexpr (ADD)
            o.v[e] = cast<T>(r + af[e]);
          else
            o.v[e] = cast<T>(r);
          if constexpr (kTwin) lo.v[e] = cast<L>(o.v[e]);
        }
        dr[v] = o;
        if constexpr (kTwin) reinterpret_cast<NPack<L, V>*>(dxlow)[off + v] = lo;
      }
    }
  };
  if constexpr (PF) {
    P xa[K], ga[K], xn[K], gn[K];
    A ma = 0, ra = 0, mn = 0, rn = 0;
    int64_t off = first * nvec;
    if (first < rows) load(xa, ga, ma, ra, first, off);
    for (int64_t row = first; row < rows; row += stride, off += step) {
      if (row + stride < rows) load(xn, gn, mn, rn, row + stride, off + step);
      row_body(xa, ga, ma, ra, off);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        xa[k] = xn[k];
        ga[k] = gn[k];
      }
      ma = mn;
      ra = rn;
    }
  } else {
    int64_t off = first * nvec;
    for (int64_t row = first; row < rows; row += stride, off += step) {
      P xb[K], gb[K];
      A m, rs;
      load(xb, gb, m, rs, row, off);
      row_body(xb, gb, m, rs, off);
    }
  }
  if (!pw && !pb) return;
  if constexpr (G32) {
    // The block's warps add their columns into shared memory one after another (fixed order).
    A* sw = reinterpret_cast<A*>(smem_raw);
    A* sb = sw + cols;
    const int warp = threadIdx.x / 32;
    for (int wi = 0; wi < groups_per_block; ++wi) {
      if (warp == wi) {
#pragma unroll
        for (int k = 0; k < K; ++k) {
          const int v = t + k * G;
          if (v < nvec) {
#pragma unroll
            for (int e = 0; e < V; ++e) {
              const int c = v * V + e;
              sw[c] = wi == 0 ? accw[k][e] : sw[c] + accw[k][e];
              sb[c] = wi == 0 ? accb[k][e] : sb[c] + accb[k][e];
            }
          }
        }
      }
      __syncthreads();
    }
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      if (pw) pw[static_cast<int64_t>(blockIdx.x) * cols + c] = sw[c];
      if (pb) pb[static_cast<int64_t>(blockIdx.x) * cols + c] = sb[c];
    }
  } else {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int v = t + k * G;
      if (v < nvec) {
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const int64_t c = static_cast<int64_t>(blockIdx.x) * cols + v * V + e;
          if (pw) pw[c] = accw[k][e];
          if (pb) pb[c] = accb[k][e];
        }
      }
    }
  }
}

// out[c] = sum over p of part[p, c], in p order. Block (32, 32): x a column, y strides over p.
template <class T>
__global__ void column_sum_kernel(const nacc_t<T>* __restrict__ part, int64_t parts, int cols, T* __restrict__ out) {
  wait_prior_grids();  // launched dependent (dependent_launch.cuh)
  using A = nacc_t<T>;
  __shared__ A s[32][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  A acc = 0;
  if (c < cols)
    for (int64_t p = threadIdx.y; p < parts; p += 32) acc += part[p * cols + c];
  s[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    A r = 0;
    for (int i = 0; i < 32; ++i) r += s[i][threadIdx.x];
    out[c] = cast<T>(r);
  }
}

// Rows longer than the registers hold (more than 8192 vectors): a block per row re-reads the
// row from memory (L2) for each pass instead of keeping it in registers.
template <class T, int V>
__global__ void __launch_bounds__(1024) norm_fwd_long_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                     T* __restrict__ y, nacc_t<T>* __restrict__ mean_out,
                                     nacc_t<T>* __restrict__ rstd_out, int64_t rows, int64_t cols, nacc_t<T> eps,
                                     bool rms) {
  wait_prior_grids();  // launched dependent (dependent_launch.cuh)
  using A = nacc_t<T>;
  using P = NPack<T, V>;
  __shared__ A red[2 * 32];  // group_sums of 1 value: 2 buffers
  int it = 0;
  const int64_t nvec = cols / V;
  const A inv_n = A(1) / static_cast<A>(cols);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const P* xr = reinterpret_cast<const P*>(x + row * cols);
    A s = 0;
    for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
      const P p = xr[v];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const A xv = cast<A>(p.v[e]);
        s += rms ? xv * xv : xv;
      }
    }
    A v1[1] = {s};
    group_sums<false>(v1, red, it);
    it ^= 1;
    s = v1[0];
    A mean = 0, var;
    if (rms) {
      var = s * inv_n;
    } else {
      mean = s * inv_n;
      A ss = 0;
      for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
        const P p = xr[v];
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const A d = cast<A>(p.v[e]) - mean;
          ss += d * d;
        }
      }
      A v2[1] = {ss};
      group_sums<false>(v2, red, it);
      it ^= 1;
      var = v2[0] * inv_n;
    }
    const A rstd = A(1) / sqrt(var + eps);
    if (threadIdx.x == 0) {
      if (mean_out) mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
    P* yr = reinterpret_cast<P*>(y + row * cols);
    for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
      const P p = xr[v];
      P wv, bv, o;
      if (w) wv = reinterpret_cast<const P*>(w)[v];
      if (b) bv = reinterpret_cast<const P*>(b)[v];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        A r = (cast<A>(p.v[e]) - mean) * rstd;
        if (w) r *= cast<A>(wv.v[e]);
        if (b) r += cast<A>(bv.v[e]);
        o.v[e] = cast<T>(r);
      }
      yr[v] = o;
    }
  }
}

// dx of long rows (two passes over the row); the weight / bias gradients come from
// norm_wb_long_kernel.
template <class T, int V>
__global__ void __launch_bounds__(1024) norm_bwd_long_kernel(const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ w,
                                     const nacc_t<T>* __restrict__ mean, const nacc_t<T>* __restrict__ rstd,
                                     T* __restrict__ dx, const T* __restrict__ add, int64_t rows, int64_t cols,
                                     bool rms) {
  wait_prior_grids();  // launched dependent (dependent_launch.cuh)
  using A = nacc_t<T>;
  using P = NPack<T, V>;
  __shared__ A red[2 * 2 * 32];  // group_sums of 2 values: 2 buffers
  int it = 0;
  const int64_t nvec = cols / V;
  const A inv_n = A(1) / static_cast<A>(cols);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const P* xr = reinterpret_cast<const P*>(x + row * cols);
    const P* gr = reinterpret_cast<const P*>(g + row * cols);
    const A m = rms ? A(0) : mean[row], rs = rstd[row];
    A s1 = 0, s2 = 0;
    for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
      const P xp = xr[v], gp = gr[v];
      P wv;
      if (w) wv = reinterpret_cast<const P*>(w)[v];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const A gv = cast<A>(gp.v[e]);
        const A gy = w ? gv * cast<A>(wv.v[e]) : gv;
        s1 += gy;
        s2 += gy * (cast<A>(xp.v[e]) - m) * rs;
      }
    }
    A v2[2] = {s1, s2};
    group_sums<false>(v2, red, it);
    it ^= 1;
    s1 = rms ? A(0) : v2[0] * inv_n;
    s2 = v2[1] * inv_n;
    P* dr = reinterpret_cast<P*>(dx + row * cols);
    const P* ar = add ? reinterpret_cast<const P*>(add + row * cols) : nullptr;
    for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
      const P xp = xr[v], gp = gr[v];
      P wv, o, av;
      if (w) wv = reinterpret_cast<const P*>(w)[v];
      if (ar) av = ar[v];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const A gv = cast<A>(gp.v[e]);
        const A gy = w ? gv * cast<A>(wv.v[e]) : gv;
        const A r = rs * (gy - s1 - (cast<A>(xp.v[e]) - m) * rs * s2);
        o.v[e] = cast<T>(ar ? r + cast<A>(av.v[e]) : r);
      }
      dr[v] = o;
    }
  }
}

// Partial weight / bias gradients of long rows: block (32, 8) over 32 columns and the rows of
// chunk blockIdx.y; pw / pb [gridDim.y, cols], summed by column_sum_kernel.
template <class T>
__global__ void __launch_bounds__(1024) norm_wb_long_kernel(const T* __restrict__ g, const T* __restrict__ x,
                                    const nacc_t<T>* __restrict__ mean, const nacc_t<T>* __restrict__ rstd,
                                    nacc_t<T>* __restrict__ pw, nacc_t<T>* __restrict__ pb, int64_t rows, int64_t cols,
                                    int64_t rows_per_chunk) {
  wait_prior_grids();  // launched dependent (dependent_launch.cuh)
  using A = nacc_t<T>;
  __shared__ A sw[8][33], sb[8][33];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  A aw = 0, ab = 0;
  if (c < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      const A gv = cast<A>(g[r * cols + c]);
      const A m = mean ? mean[r] : A(0);
      aw += gv * (cast<A>(x[r * cols + c]) - m) * rstd[r];
      ab += gv;
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    A tw = 0, tb = 0;
    for (int i = 0; i < 8; ++i) {
      tw += sw[i][threadIdx.x];
      tb += sb[i][threadIdx.x];
    }
    if (pw) pw[static_cast<int64_t>(blockIdx.y) * cols + c] = tw;
    if (pb) pb[static_cast<int64_t>(blockIdx.y) * cols + c] = tb;
  }
}

struct NormPlan {
  bool warp;     // a warp per row, else a block per row
  int threads;   // block size
  int k;         // vectors per thread (1, 2, 4 or 8); 0: a long row, read from memory per pass
  int vec;       // V or 1
  int64_t grid;  // blocks
};

// The smallest K of {1, 2, 4, 8} with per_group * K >= nvec.
int pick_k(int64_t nvec, int per_group) {
  for (int k = 1; k <= kMaxK; k *= 2)
    if (nvec <= int64_t{per_group} * k) return k;
  return 0;
}

NormPlan plan(int64_t rows, int64_t cols, int V, bool aligned, int device, bool forward) {
  NormPlan p;
  p.vec = aligned && cols % V == 0 ? V : 1;
  const int64_t nvec = cols / p.vec;
  const int sms = sm_count(device);
  // Warp mode up to 2 vectors per lane; blocks aim at 2 vectors per thread for 4-byte types and,
  // backward, 1 for narrower ones (8 elements per vector already): backward keeps 2 K x V
  // accumulators per thread, and more than ~64 registers costs occupancy (ptxas: <float, 4, 2>
  // 55 registers, <bfloat16, 8, 4> 168). The forward has no accumulators and aims at 2 for every
  // type: a row's reductions cost a thread the same ~110 instructions whatever its share of the
  // row, so 16 bfloat16 elements per thread rather than 8 take 25% fewer instructions (ncu,
  // [8192, 4096] bfloat16 forward: 36.1M warp instructions -> 27.2M; H200 fwd+bwd 0.171 -> 0.157
  // ms). 32 per thread (want_k 4) measured the same 0.156-0.157 ms.
  if (nvec <= 32 * 2) {
    p.warp = true;
    p.threads = 32 * kWarpRowsPerBlock;
    p.k = pick_k(nvec, 32);
    p.grid = std::min<int64_t>((rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock, int64_t{sms} * 16);
  } else {
    p.warp = false;
    // Whole warps, every thread with want_k vectors where the row allows ([32768, 768] float32:
    // 96 threads of 2 vectors rather than 128 threads of 1 or 2).
    const int64_t want_k = p.vec >= 8 && !forward ? 1 : 2;
    p.threads = static_cast<int>(std::clamp<int64_t>((nvec + want_k * 32 - 1) / (want_k * 32) * 32, 64, 1024));
    p.k = pick_k(nvec, p.threads);  // 0: longer than the registers hold (the *_long kernels)
    p.grid = std::min<int64_t>(rows, int64_t{sms} * std::max(1, 2048 / p.threads));
  }
  p.grid = std::max<int64_t>(p.grid, 1);
  return p;
}

template <class T, int V, class F>
void with_vk(const NormPlan& p, F&& f) {
  auto by_k = [&](auto vtag) {
    constexpr int VV = decltype(vtag)::value;
    switch (p.k) {
      case 1:
        f(std::integral_constant<int, VV>{}, std::integral_constant<int, 1>{});
        break;
      case 2:
        f(std::integral_constant<int, VV>{}, std::integral_constant<int, 2>{});
        break;
      case 4:
        f(std::integral_constant<int, VV>{}, std::integral_constant<int, 4>{});
        break;
      default:
        f(std::integral_constant<int, VV>{}, std::integral_constant<int, 8>{});
        break;
    }
  };
  if (p.vec == V)
    by_k(std::integral_constant<int, V>{});
  else
    by_k(std::integral_constant<int, 1>{});
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// f(L{}) with L the device type of a twin's dtype (float16 / bfloat16); false when `low` is
// undefined or not one of them. Twins are written by the float32 block-mode kernels with full
// 16-byte packs only (the other forms return false: the caller casts as before).
template <class F>
bool with_twin(const Tensor& low, F&& f) {
  if (!low.defined()) return false;
  if (low.dtype() == kBFloat16) return f(__nv_bfloat16{}), true;
  if (low.dtype() == kFloat16) return f(__half{}), true;
  return false;
}

}  // namespace

// ---- the residual add a norm absorbs (kernels.cuh, defer_residual_add)
namespace {

std::atomic<bool> g_residual_fusion{[] {
  const char* e = std::getenv("TG_NORM_RESIDUAL_FUSION");
  return !(e && std::string_view(e) == "0");
}()};
std::atomic<int64_t> g_residual_fusions{0};

// The norm's part of a fused launch: raw pointers only (a Tensor released under the queue's lock
// could free memory, which flushes the queue).
struct FusedNorm {
  const float *w = nullptr, *b = nullptr;
  float *y = nullptr, *mean = nullptr, *rstd = nullptr;
  void* y_low = nullptr;  // of the add's half dtype, or null
  int64_t rows = 0;
  int cols = 0;
  float eps = 0;
  bool rms = false;
  NormPlan p{};
};

class DeferredAdd final : public detail::DeferredCall {
 public:
  DeferredAdd(const backend::ElementwiseIter& it, int device) : it_(it), device_(device) {
    half_ = it.dtypes[1] == DType::Float32 ? 2 : 1;
  }
  void* out() const { return it_.data[0]; }
  int64_t numel() const { return it_.numel; }
  DType half_dtype() const { return it_.dtypes[half_]; }
  bool fused() const { return norm_.has_value(); }
  void fuse(const FusedNorm& n) { norm_ = n; }

  void run(cudaStream_t stream) override {
    if (norm_) {
      if (half_dtype() == DType::BFloat16) return run_fused<__nv_bfloat16>(stream);
      return run_fused<__half>(stream);
    }
    // Alone: the elementwise engine's launch for this add (elementwise_binary.cu), on `stream`.
    const LaunchTarget t{stream, device_, false};
    const AddF<float> f{1.0f};
    const DType a = it_.dtypes[1], b = it_.dtypes[2];
    if (a == DType::Float32 && b == DType::BFloat16) return launch_on<float, float, __nv_bfloat16>(it_, f, t);
    if (a == DType::Float32 && b == DType::Float16) return launch_on<float, float, __half>(it_, f, t);
    if (a == DType::BFloat16) return launch_on<float, __nv_bfloat16, float>(it_, f, t);
    launch_on<float, __half, float>(it_, f, t);
  }

 private:
  template <class R>
  void run_fused(cudaStream_t stream) {
    const FusedNorm& n = *norm_;
    const auto* x = reinterpret_cast<const float*>(it_.data[3 - half_]);
    const auto* res = reinterpret_cast<const R*>(it_.data[half_]);
    auto* sum = reinterpret_cast<float*>(it_.data[0]);
    with_vk<float, 4>(n.p, [&](auto vt, auto kt) {
      constexpr int VV = decltype(vt)::value, KK = decltype(kt)::value;
      if constexpr (VV == 4) {
        const LaunchShape shape{dim3(static_cast<unsigned>(n.p.grid)), dim3(n.p.threads), 0, stream, device_};
        if (n.y_low)
          launch_dependent(norm_fwd_kernel<float, 4, KK, false, R, R>, shape, x, n.w, n.b, n.y, n.mean, n.rstd,
                           n.rows, n.cols, n.eps, n.rms, static_cast<R*>(n.y_low), res, sum);
        else
          launch_dependent(norm_fwd_kernel<float, 4, KK, false, float, R>, shape, x, n.w, n.b, n.y, n.mean, n.rstd,
                           n.rows, n.cols, n.eps, n.rms, static_cast<float*>(nullptr), res, sum);
      }
    });
  }

  backend::ElementwiseIter it_;
  int device_;
  int half_;  // which input (1 or 2) is the float16 / bfloat16 one
  std::optional<FusedNorm> norm_;
};

// norm_forward's first step: whether the queue's last entry is the deferred add whose result is
// a.x, amended to run as the fused kernel (then `a`'s outputs are written at the flush).
bool fuse_into_deferred_add(const backend::NormArgs& a, bool* wrote_twin) {
  if (!g_residual_fusion.load(std::memory_order_relaxed) || !detail::g_launches_pending.load(std::memory_order_acquire))
    return false;
  if (a.x.dtype() != kFloat32 || !a.x.is_contiguous() || a.cols > INT_MAX) return false;
  const int device = a.x.device().index();
  void* x = detail::address_noflush(a.x);
  const auto* w = static_cast<const float*>(detail::address_noflush(a.weight));
  const auto* b = static_cast<const float*>(detail::address_noflush(a.bias));
  auto* y = static_cast<float*>(detail::address_noflush(a.y));
  const bool aligned = aligned16(x) && aligned16(y) && (!w || aligned16(w)) && (!b || aligned16(b));
  FusedNorm n;
  n.p = plan(a.rows, a.cols, 4, aligned, device, /*forward=*/true);
  if (n.p.k == 0 || n.p.warp || n.p.vec != 4) return false;  // the block-mode register kernels only
  n.w = w;
  n.b = b;
  n.y = y;
  n.mean = static_cast<float*>(detail::address_noflush(a.mean));
  n.rstd = static_cast<float*>(detail::address_noflush(a.rstd));
  n.y_low = detail::address_noflush(a.y_low);
  n.rows = a.rows;
  n.cols = static_cast<int>(a.cols);
  n.eps = static_cast<float>(a.eps);
  n.rms = a.rms;
  const bool amended = detail::amend_last_call(detail::current_stream_noflush(device), device, [&](detail::DeferredCall& c) {
    auto* d = dynamic_cast<DeferredAdd*>(&c);
    if (d == nullptr || d->fused() || d->out() != x || d->numel() != a.rows * a.cols) return false;
    if (n.y_low && a.y_low.dtype() != d->half_dtype()) return false;  // a twin of the add's half dtype only
    d->fuse(n);
    return true;
  });
  if (!amended) return false;
  g_residual_fusions.fetch_add(1, std::memory_order_relaxed);
  *wrote_twin = n.y_low != nullptr;
  return true;
}

}  // namespace

void set_norm_residual_fusion(bool on) { g_residual_fusion.store(on, std::memory_order_relaxed); }
int64_t norm_residual_fusions() { return g_residual_fusions.load(std::memory_order_relaxed); }

bool defer_residual_add(const backend::ElementwiseIter& it) {
  if (!g_residual_fusion.load(std::memory_order_relaxed) || !detail::tls_defer_allowed || !it.contiguous ||
      it.noperands != 3 || it.numel <= kDeferMaxNumel || it.numel % 4 != 0 || it.dparams[0] != 1.0 ||
      it.dtypes[0] != DType::Float32)
    return false;
  const DType a = it.dtypes[1], b = it.dtypes[2];
  const bool half_b = a == DType::Float32 && (b == DType::BFloat16 || b == DType::Float16);
  const bool half_a = b == DType::Float32 && (a == DType::BFloat16 || a == DType::Float16);
  if (!half_a && !half_b) return false;
  const int h = half_b ? 2 : 1;
  if (!aligned16(it.data[0]) || !aligned16(it.data[3 - h]) || reinterpret_cast<uintptr_t>(it.data[h]) % 8 != 0)
    return false;
  const int device = it.device.index() < 0 ? 0 : it.device.index();
  const cudaStream_t stream = detail::current_stream_handle(device);  // what came before goes first
  std::unique_ptr<detail::DeferredCall> call = std::make_unique<DeferredAdd>(it, device);
  return detail::defer_call(call, stream, device);
}

bool norm_forward(const backend::NormArgs& a) {
  if (bool twin = false; fuse_into_deferred_add(a, &twin)) return twin;
  const int device = a.x.device().index();
  cudaStream_t stream = detail::current_stream_handle(device);
  const char* op = a.rms ? "rms_norm" : "layer_norm";
  bool wrote = false;
  dispatch<kFloats>(a.x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = nacc_t<T>;
    constexpr int V = 16 / static_cast<int>(sizeof(T));
    const T* x = static_cast<const T*>(a.x.data_ptr());
    const T* w = a.weight.defined() ? static_cast<const T*>(a.weight.data_ptr()) : nullptr;
    const T* b = a.bias.defined() ? static_cast<const T*>(a.bias.data_ptr()) : nullptr;
    T* y = static_cast<T*>(a.y.data_ptr());
    const bool aligned = aligned16(x) && aligned16(y) && (!w || aligned16(w)) && (!b || aligned16(b));
    const NormPlan p = plan(a.rows, a.cols, V, aligned, device, /*forward=*/true);
    A* mean = a.mean.defined() ? static_cast<A*>(a.mean.data_ptr()) : nullptr;
    A* rstd = static_cast<A*>(a.rstd.data_ptr());
    if (p.k == 0) {
      const auto grid = static_cast<unsigned>(p.grid);
      if (p.vec == V)
        launch_dependent(norm_fwd_long_kernel<T, V>, LaunchShape{dim3(grid), dim3(p.threads), 0, stream, device}, x, w,
                         b, y, mean, rstd, a.rows, a.cols, static_cast<A>(a.eps), a.rms);
      else
        launch_dependent(norm_fwd_long_kernel<T, 1>, LaunchShape{dim3(grid), dim3(p.threads), 0, stream, device}, x, w,
                         b, y, mean, rstd, a.rows, a.cols, static_cast<A>(a.eps), a.rms);
      TG_CUDA_CHECK_LAUNCH();
      return;  // no twin from the long-row kernels
    }
    with_vk<T, V>(p, [&](auto vt, auto kt) {
      constexpr int VV = decltype(vt)::value, KK = decltype(kt)::value;
      const auto grid = static_cast<unsigned>(p.grid);
      if constexpr (std::is_same_v<T, float> && VV == V) {
        if (!p.warp) {
          wrote = with_twin(a.y_low, [&](auto ltag) {
            using L = decltype(ltag);
            launch_dependent(norm_fwd_kernel<T, VV, KK, false, L>,
                             LaunchShape{dim3(grid), dim3(p.threads), 0, stream, device}, x, w, b, y, mean, rstd,
                             a.rows, static_cast<int>(a.cols), static_cast<A>(a.eps), a.rms,
                             static_cast<L*>(a.y_low.data_ptr()), nullptr, nullptr);
            TG_CUDA_CHECK_LAUNCH();
          });
          if (wrote) return;
        }
      }
      if (p.warp)
        launch_dependent(norm_fwd_kernel<T, VV, KK, true>, LaunchShape{dim3(grid), dim3(p.threads), 0, stream, device},
                         x, w, b, y, mean, rstd, a.rows, static_cast<int>(a.cols), static_cast<A>(a.eps), a.rms,
                         static_cast<T*>(nullptr), nullptr, nullptr);
      else
        launch_dependent(norm_fwd_kernel<T, VV, KK, false>, LaunchShape{dim3(grid), dim3(p.threads), 0, stream, device},
                         x, w, b, y, mean, rstd, a.rows, static_cast<int>(a.cols), static_cast<A>(a.eps), a.rms,
                         static_cast<T*>(nullptr), nullptr, nullptr);
      TG_CUDA_CHECK_LAUNCH();
    });
  });
  return wrote;
}

bool norm_backward(const backend::NormBackwardArgs& a) {
  const int device = a.x.device().index();
  cudaStream_t stream = detail::current_stream_handle(device);
  const char* op = a.rms ? "rms_norm backward" : "layer_norm backward";
  bool wrote = false;
  dispatch<kFloats>(a.x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = nacc_t<T>;
    constexpr int V = 16 / static_cast<int>(sizeof(T));
    const T* g = static_cast<const T*>(a.grad_out.data_ptr());
    const T* x = static_cast<const T*>(a.x.data_ptr());
    const T* w = a.weight.defined() ? static_cast<const T*>(a.weight.data_ptr()) : nullptr;
    T* dx = a.grad_x.defined() ? static_cast<T*>(a.grad_x.data_ptr()) : nullptr;
    const T* add = a.grad_x_addend.defined() ? static_cast<const T*>(a.grad_x_addend.data_ptr()) : nullptr;
    const bool aligned = aligned16(g) && aligned16(x) && (!w || aligned16(w)) && (!dx || aligned16(dx)) &&
                         (!add || aligned16(add));
    const NormPlan p = plan(a.rows, a.cols, V, aligned, device, /*forward=*/false);
    const A* mean = a.mean.defined() ? static_cast<const A*>(a.mean.data_ptr()) : nullptr;
    const A* rstd = static_cast<const A*>(a.rstd.data_ptr());
    const bool want_w = a.grad_weight.defined(), want_b = a.grad_bias.defined();
    int64_t grid = p.grid;
    if (p.k != 0 && !p.warp) {
      with_vk<T, V>(p, [&](auto vt, auto kt) {
        constexpr int VV = decltype(vt)::value, KK = decltype(kt)::value;
        // One full wave: plan() assumes 2048 threads an SM, but a backward kernel of ~64 registers
        // fits 1024; twice the resident blocks ran as two waves and wrote twice the partial rows.
        const int fit = add ? resident_blocks<norm_bwd_kernel<T, VV, KK, false, true>>(p.threads)
                            : resident_blocks<norm_bwd_kernel<T, VV, KK, false, false>>(p.threads);
        grid = std::min<int64_t>(grid, int64_t{sm_count(device)} * fit);
      });
    }
    // Partial rows of the weight / bias gradients: one per block, or per row chunk for long rows.
    const int64_t chunk_rows = (a.rows + 63) / 64;
    const int64_t parts = p.k == 0 ? (a.rows + chunk_rows - 1) / chunk_rows : grid;
    DataPtr ws;
    A *pw = nullptr, *pb = nullptr;
    const size_t part = static_cast<size_t>(parts) * static_cast<size_t>(a.cols);
    if (want_w || want_b) {
      ws = detail::device_allocate(part * sizeof(A) * ((want_w ? 1 : 0) + (want_b ? 1 : 0)), device);
      A* base = static_cast<A*>(ws.get());
      if (want_w) pw = base;
      if (want_b) pb = base + (want_w ? part : 0);
    }
    const size_t smem = p.warp && (want_w || want_b) ? 2 * static_cast<size_t>(a.cols) * sizeof(A) : 0;
    if (p.k == 0) {
      if (dx) {
        const auto blocks = static_cast<unsigned>(grid);
        if (p.vec == V)
          launch_dependent(norm_bwd_long_kernel<T, V>, LaunchShape{dim3(blocks), dim3(p.threads), 0, stream, device}, g,
                           x, w, mean, rstd, dx, add, a.rows, a.cols, a.rms);
        else
          launch_dependent(norm_bwd_long_kernel<T, 1>, LaunchShape{dim3(blocks), dim3(p.threads), 0, stream, device}, g,
                           x, w, mean, rstd, dx, add, a.rows, a.cols, a.rms);
        TG_CUDA_CHECK_LAUNCH();
      }
      if (want_w || want_b) {
        const dim3 wgrid(static_cast<unsigned>((a.cols + 31) / 32), static_cast<unsigned>(parts)), block(32, 8);
        launch_dependent(norm_wb_long_kernel<T>, LaunchShape{dim3(wgrid), dim3(block), 0, stream, device}, g, x, mean,
                         rstd, pw, pb, a.rows, a.cols, chunk_rows);
        TG_CUDA_CHECK_LAUNCH();
      }
    } else {
      with_vk<T, V>(p, [&](auto vt, auto kt) {
        constexpr int VV = decltype(vt)::value, KK = decltype(kt)::value;
        const auto blocks = static_cast<unsigned>(grid);
        if (p.warp) {
          auto kern = add ? norm_bwd_kernel<T, VV, KK, true, true> : norm_bwd_kernel<T, VV, KK, true, false>;
          if (smem > 48 * 1024)
            TG_CUDA_CHECK(
                cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
          launch_dependent(kern, LaunchShape{dim3(blocks), dim3(p.threads), smem, stream, device}, g, x, w, mean, rstd,
                           dx, add, pw, pb, a.rows, static_cast<int>(a.cols), a.rms, static_cast<T*>(nullptr));
        } else {
          if constexpr (std::is_same_v<T, float> && VV == V) {
            if (dx) {
              wrote = with_twin(a.grad_x_low, [&](auto ltag) {
                using L = decltype(ltag);
                auto tk = add ? norm_bwd_kernel<T, VV, KK, false, true, L> : norm_bwd_kernel<T, VV, KK, false, false, L>;
                launch_dependent(tk, LaunchShape{dim3(blocks), dim3(p.threads), 0, stream, device}, g, x, w, mean, rstd,
                                 dx, add, pw, pb, a.rows, static_cast<int>(a.cols), a.rms,
                                 static_cast<L*>(a.grad_x_low.data_ptr()));
              });
              if (wrote) {
                TG_CUDA_CHECK_LAUNCH();
                return;
              }
            }
          }
          auto kern = add ? norm_bwd_kernel<T, VV, KK, false, true> : norm_bwd_kernel<T, VV, KK, false, false>;
          launch_dependent(kern, LaunchShape{dim3(blocks), dim3(p.threads), 0, stream, device}, g, x, w, mean, rstd, dx,
                           add, pw, pb, a.rows, static_cast<int>(a.cols), a.rms, static_cast<T*>(nullptr));
        }
        TG_CUDA_CHECK_LAUNCH();
      });
    }
    const dim3 rblock(32, 32), rgrid(static_cast<unsigned>((a.cols + 31) / 32));
    if (want_w) {
      launch_dependent(column_sum_kernel<T>, LaunchShape{dim3(rgrid), dim3(rblock), 0, stream, device}, pw, parts,
                       static_cast<int>(a.cols), static_cast<T*>(a.grad_weight.data_ptr()));
      TG_CUDA_CHECK_LAUNCH();
    }
    if (want_b) {
      launch_dependent(column_sum_kernel<T>, LaunchShape{dim3(rgrid), dim3(rblock), 0, stream, device}, pb, parts,
                       static_cast<int>(a.cols), static_cast<T*>(a.grad_bias.data_ptr()));
      TG_CUDA_CHECK_LAUNCH();
    }
  });
  return wrote;
}

namespace {
// Element i keeps when the float32 uniform of counter offset + i is >= p (core/philox.h's
// mapping); one thread per block of 4 counters (offset is a multiple of 4), its 4 elements moved
// as one vector when VEC (x and out aligned to 4 elements).
template <class T, bool VEC>
__global__ void dropout_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t n, float p, double scale,
                               uint64_t seed, uint64_t offset) {
  wait_prior_grids();  // launched dependent (dependent_launch.cuh)
  using A = opmath_t<T>;
  using P = NPack<T, 4>;
  const A s = static_cast<A>(scale);
  const int64_t nblk = (n + 3) / 4;
  for (int64_t bk = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; bk < nblk;
       bk += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const philox::Block r = philox::generate(seed, (offset >> 2) + static_cast<uint64_t>(bk));
    if (VEC && bk * 4 + 4 <= n) {
      const P in = reinterpret_cast<const P*>(x)[bk];
      P o;
#pragma unroll
      for (int l = 0; l < 4; ++l)
        o.v[l] = philox::to_unit_f32(r.w[l]) >= p ? cast<T>(cast<A>(in.v[l]) * s) : cast<T>(A(0));
      reinterpret_cast<P*>(out)[bk] = o;
      continue;
    }
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const int64_t i = bk * 4 + l;
      if (i < n) out[i] = philox::to_unit_f32(r.w[l]) >= p ? cast<T>(cast<A>(x[i]) * s) : cast<T>(A(0));
    }
  }
}
}  // namespace

void dropout(const Tensor& out, const Tensor& x, double p, double scale, uint64_t seed, uint64_t offset) {
  const int device = x.device().index();
  cudaStream_t stream = detail::current_stream_handle(device);
  const int64_t n = x.numel();
  dispatch<kFloats>(x.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t nblk = (n + 3) / 4;
    const auto grid = static_cast<unsigned>(
        std::max<int64_t>(1, std::min<int64_t>((nblk + 255) / 256, int64_t{sm_count(device)} * 16)));
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
    const bool vec = reinterpret_cast<uintptr_t>(xp) % sizeof(NPack<T, 4>) == 0 &&
                     reinterpret_cast<uintptr_t>(op) % sizeof(NPack<T, 4>) == 0;
    if (vec)
      launch_dependent(dropout_kernel<T, true>, LaunchShape{dim3(grid), dim3(256), 0, stream, device}, xp, op, n,
                       static_cast<float>(p), scale, seed, offset);
    else
      launch_dependent(dropout_kernel<T, false>, LaunchShape{dim3(grid), dim3(256), 0, stream, device}, xp, op, n,
                       static_cast<float>(p), scale, seed, offset);
    TG_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace tg::cuda::kern
