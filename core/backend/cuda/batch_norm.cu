// CUDA kernels of batch_norm (issue 17) on contiguous [n, c, s] (element (o, ch, i) at
// (o * c + ch) * s + i): row-major NCHW is [N, C, H * W], channels-last NHWC is [N * H * W, C, 1].
//
// Why hand-written: cuDNN's batch norm is reachable only through cudnn-frontend norm graphs (a
// graph per shape, layout and mode, built and cached as conv's), while these are plain per-channel
// reductions and elementwise passes that need no library.
//
// Statistics and gradient sums: a fixed partition of each channel's elements into `splits`
// ranges (from the sizes and the SM count only), one block per (channel group, split) writing a
// partial state to a scratch tensor (caching allocator: stream-ordered, capture-safe), then a
// finalize kernel (one thread per channel) combining the splits in order: bit-reproducible run to
// run. Partials are Welford states (count, mean, m2) merged with Chan's formula for the
// statistics, plain sums for the gradients; float (double for float64).
//   s > 1: grid (c, splits) of 256-thread blocks, each walking a range of its channel's n * s
//     elements; a thread's (o, i) is decomposed once and advanced incrementally (no per-element
//     64-bit division).
//   s == 1: blocks of 32 channel lanes x 8 row lanes (coalesced along the channels), grid
//     (ceil(c / 32), splits over the rows); the 8 row lanes are folded in shared memory.
// Each thread loads kUnroll elements before combining them (memory-level parallelism; one
// division per Welford merge of kUnroll values). Blocks fold their threads in shared memory by a
// fixed tree.
// Elementwise passes: one thread per element (or per 16-byte vector when the channel layout
// allows), grid-stride, the channel tracked incrementally from a stride decomposed once.
// batch_norm + ReLU (fused): the forward pass clamps at 0 as it writes; backward reads the ReLU's
// output beside dy and counts dy only where it is > 0, in both the sums and the dx pass.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <tapegrad/core/backend/cuda/runtime.h>
#include <tapegrad/core/native.h>
#include <tapegrad/core/backend/cuda/kernels.cuh>
#include <tapegrad/core/backend/cuda/loops.cuh>

namespace tg::cuda::kern {

int sm_count(int device);  // reduce.cu

namespace {

template <class T>
using bacc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

constexpr int kPlaneThreads = 256;         // s > 1 partial kernels: 1-d blocks
constexpr int kLanes = 32, kRowLanes = 8;  // s == 1 partial kernels: 32 channels x 8 rows
constexpr int kUnroll = 4;                 // loads in flight per thread before combining
constexpr int64_t kMinPerBlock = 4096;     // elements per partial block, at least
constexpr int kBlocksPerSm = 2;            // partial blocks per SM aimed at
constexpr int kFinalizeThreads = 128;

template <class A>
__device__ __forceinline__ A fast_div(A a, A b) {
  if constexpr (std::is_same_v<A, float>)
    return __fdividef(a, b);
  else
    return a / b;
}

// ---- per-thread states: Welford (count, mean, m2) for the statistics, two sums for the gradients

template <class T>
struct StatsOp {
  using A = bacc_t<T>;
  static constexpr int kFields = 3;  // count, mean, m2
  struct State {
    A v[kFields];
  };
  using Val = A;
  const T* __restrict__ x;

  __device__ __forceinline__ static State zero() { return {{A(0), A(0), A(0)}}; }
  __device__ __forceinline__ Val load(int64_t off, int64_t) const { return cast<A>(x[off]); }
  // Chan et al.: merging (na, ma, m2a) and (nb, mb, m2b).
  __device__ __forceinline__ static State combine(const State& a, const State& b) {
    const A n = a.v[0] + b.v[0];
    if (b.v[0] == A(0)) return a;
    if (a.v[0] == A(0)) return b;
    const A r = fast_div(b.v[0], n), d = b.v[1] - a.v[1];
    return {{n, a.v[1] + d * r, a.v[2] + b.v[2] + d * d * a.v[0] * r}};
  }
  // k values as one state: two passes over registers.
  template <int K>
  __device__ __forceinline__ static State batch(const Val (&v)[K]) {
    A sum = 0;
#pragma unroll
    for (int u = 0; u < K; ++u) sum += v[u];
    const A mean = sum * (A(1) / A(K));
    A m2 = 0;
#pragma unroll
    for (int u = 0; u < K; ++u) m2 += (v[u] - mean) * (v[u] - mean);
    return {{A(K), mean, m2}};
  }
};

template <class T>
struct GradOp {
  using A = bacc_t<T>;
  static constexpr int kFields = 2;  // sum dy, sum dy * (x - mean)
  struct State {
    A v[kFields];
  };
  struct Val {
    A g, xc;
  };
  const T* __restrict__ dy;
  const T* __restrict__ x;
  const A* __restrict__ mean;
  const T* __restrict__ relu_out;  // or null

  __device__ __forceinline__ static State zero() { return {{A(0), A(0)}}; }
  __device__ __forceinline__ Val load(int64_t off, int64_t ch) const {
    const A g = relu_out == nullptr || cast<A>(relu_out[off]) > A(0) ? cast<A>(dy[off]) : A(0);
    return {g, cast<A>(x[off]) - mean[ch]};
  }
  __device__ __forceinline__ static State combine(const State& a, const State& b) {
    return {{a.v[0] + b.v[0], a.v[1] + b.v[1]}};
  }
  template <int K>
  __device__ __forceinline__ static State batch(const Val (&v)[K]) {
    State s = zero();
#pragma unroll
    for (int u = 0; u < K; ++u) {
      s.v[0] += v[u].g;
      s.v[1] += v[u].g * v[u].xc;
    }
    return s;
  }
};

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

// Folds the block's states, seen as `rows` x `width` (linear thread index t = row * width + lane,
// `rows` a power of two), over the rows by a fixed tree in shared memory; lane l's result is
// returned to thread t = l.
template <class Op>
__device__ __forceinline__ typename Op::State fold_rows(const typename Op::State& st, int width, int rows) {
  using A = typename Op::A;
  constexpr int kMax = kPlaneThreads > kLanes * kRowLanes ? kPlaneThreads : kLanes * kRowLanes;
  __shared__ A sh[Op::kFields][kMax];
  const int t = threadIdx.y * blockDim.x + threadIdx.x;
#pragma unroll
  for (int f = 0; f < Op::kFields; ++f) sh[f][t] = st.v[f];
  for (int w = rows / 2; w > 0; w >>= 1) {
    __syncthreads();
    if (t < w * width) {
      typename Op::State a, b;
#pragma unroll
      for (int f = 0; f < Op::kFields; ++f) a.v[f] = sh[f][t], b.v[f] = sh[f][t + w * width];
      a = Op::combine(a, b);
#pragma unroll
      for (int f = 0; f < Op::kFields; ++f) sh[f][t] = a.v[f];
    }
  }
  __syncthreads();
  typename Op::State r;
#pragma unroll
  for (int f = 0; f < Op::kFields; ++f) r.v[f] = sh[f][t % width];
  return r;
}

// Partial state of channel blockIdx.x over elements [split * chunk, min(m, (split + 1) * chunk))
// of its m = n * s (s > 1). part: kFields arrays of [splits, c].
template <class Op>
__global__ void __launch_bounds__(kPlaneThreads)
    bn_partial_plane_kernel(Op op, int64_t c, int64_t s, int64_t m, int64_t chunk, typename Op::A* __restrict__ part) {
  using State = typename Op::State;
  const int64_t ch = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
  const int64_t j1 = imin(m, (split + 1) * chunk);
  int64_t j = split * chunk + threadIdx.x;
  // (o, i) of j once; advancing by kPlaneThreads: i += step_i, o += step_o, carry when i >= s.
  int64_t i = j % s, off = ((j / s) * c + ch) * s + i;
  const int64_t step_i = kPlaneThreads % s, jump = (kPlaneThreads / s) * c * s + step_i, wrap = c * s - s;
  State st = Op::zero();
  for (; j + (kUnroll - 1) * kPlaneThreads < j1; j += kUnroll * kPlaneThreads) {
    typename Op::Val v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      v[u] = op.load(off, ch);
      off += jump;
      i += step_i;
      if (i >= s) i -= s, off += wrap;
    }
    st = Op::combine(st, Op::batch(v));
  }
  for (; j < j1; j += kPlaneThreads) {
    const typename Op::Val v[1] = {op.load(off, ch)};
    st = Op::combine(st, Op::batch(v));
    off += jump;
    i += step_i;
    if (i >= s) i -= s, off += wrap;
  }
  st = fold_rows<Op>(st, 1, kPlaneThreads);
  if (threadIdx.x == 0)
#pragma unroll
    for (int f = 0; f < Op::kFields; ++f) part[(f * splits + split) * c + ch] = st.v[f];
}

// Partial states of channels blockIdx.x * 32 + lane over rows [split * chunk, ...) of n (s == 1).
template <class Op>
__global__ void __launch_bounds__(kLanes* kRowLanes)
    bn_partial_rows_kernel(Op op, int64_t n, int64_t c, int64_t chunk, typename Op::A* __restrict__ part) {
  using State = typename Op::State;
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * kLanes + threadIdx.x, split = blockIdx.y, splits = gridDim.y;
  const int64_t r1 = imin(n, (split + 1) * chunk);
  State st = Op::zero();
  if (ch < c) {
    int64_t r = split * chunk + threadIdx.y, off = r * c + ch;
    const int64_t step = kRowLanes * c;
    for (; r + (kUnroll - 1) * kRowLanes < r1; r += kUnroll * kRowLanes) {
      typename Op::Val v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = op.load(off + u * step, ch);
      off += kUnroll * step;
      st = Op::combine(st, Op::batch(v));
    }
    for (; r < r1; r += kRowLanes, off += step) {
      const typename Op::Val v[1] = {op.load(off, ch)};
      st = Op::combine(st, Op::batch(v));
    }
  }
  st = fold_rows<Op>(st, kLanes, kRowLanes);
  if (threadIdx.y == 0 && ch < c)
#pragma unroll
    for (int f = 0; f < Op::kFields; ++f) part[(f * splits + split) * c + ch] = st.v[f];
}

template <class T>
__global__ void bn_stats_finalize_kernel(const bacc_t<T>* __restrict__ part, int64_t splits, int64_t c,
                                         bacc_t<T>* __restrict__ mean, bacc_t<T>* __restrict__ var) {
  using Op = StatsOp<T>;
  const int64_t ch = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (ch >= c) return;
  typename Op::State st = Op::zero();
  for (int64_t k = 0; k < splits; ++k) {
    typename Op::State b;
#pragma unroll
    for (int f = 0; f < Op::kFields; ++f) b.v[f] = part[(f * splits + k) * c + ch];
    st = Op::combine(st, b);
  }
  mean[ch] = st.v[1];
  var[ch] = st.v[2] / st.v[0];
}

template <class T>
__global__ void bn_grad_finalize_kernel(const bacc_t<T>* __restrict__ part, int64_t splits, int64_t c,
                                        const bacc_t<T>* __restrict__ invstd, bacc_t<T>* __restrict__ sum_dy,
                                        bacc_t<T>* __restrict__ sum_dy_xhat) {
  using A = bacc_t<T>;
  const int64_t ch = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (ch >= c) return;
  A s1 = 0, s2 = 0;
  for (int64_t k = 0; k < splits; ++k) {
    s1 += part[k * c + ch];
    s2 += part[(splits + k) * c + ch];
  }
  sum_dy[ch] = s1;
  sum_dy_xhat[ch] = s2 * invstd[ch];
}

// ---- elementwise passes

template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// The geometry the elementwise kernels walk, in units of V-element vectors: [*, cv, sv] with a
// vector's channels ch * V + u (kChanVec: s == 1, c % V == 0) or all ch (s % V == 0).
// The grid stride, decomposed once: stride = q * sv + r, q % cv = qc.
struct Walk {
  int64_t total, cv, sv, stride, r, qc;
};
Walk make_walk(int64_t total, int64_t cv, int64_t sv, int64_t stride) {
  return {total, cv, sv, stride, stride % sv, (stride / sv) % cv};
}

// (k, ch) of the flat vector index, advanced by the grid stride without division.
struct Cursor {
  int64_t k, ch;
  __device__ __forceinline__ Cursor(int64_t i, const Walk& w) : k(i % w.sv), ch((i / w.sv) % w.cv) {}
  __device__ __forceinline__ void advance(const Walk& w) {
    k += w.r;
    ch += w.qc;
    if (k >= w.sv) k -= w.sv, ++ch;
    if (ch >= w.cv) ch -= w.cv;
    if (ch >= w.cv) ch -= w.cv;
  }
};

template <class T, int V, bool kChanVec, bool kRelu>
__global__ void bn_elemt_kernel(T* __restrict__ y, const T* __restrict__ x, Walk w, const bacc_t<T>* __restrict__ mean,
                                const bacc_t<T>* __restrict__ scale, const bacc_t<T>* __restrict__ shift) {
  using A = bacc_t<T>;
  using P = Pack<T, V>;
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  Cursor cur(i, w);
  for (; i < w.total; i += w.stride, cur.advance(w)) {
    const P xv = reinterpret_cast<const P*>(x)[i];
    P yv;
#pragma unroll
    for (int u = 0; u < V; ++u) {
      const int64_t ch = kChanVec ? cur.ch * V + u : cur.ch;
      A v = (cast<A>(xv.v[u]) - mean[ch]) * scale[ch] + (shift ? shift[ch] : A(0));
      if constexpr (kRelu) v = v > A(0) || v != v ? v : A(0);  // NaN stays, as relu
      yv.v[u] = cast<T>(v);
    }
    reinterpret_cast<P*>(y)[i] = yv;
  }
}

template <class T, int V, bool kChanVec, bool kRelu>
__global__ void bn_backward_elemt_kernel(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ x, Walk w,
                                         const bacc_t<T>* __restrict__ mean, const bacc_t<T>* __restrict__ invstd,
                                         const bacc_t<T>* __restrict__ scale, const bacc_t<T>* __restrict__ mean_dy,
                                         const bacc_t<T>* __restrict__ mean_dy_xhat, const T* __restrict__ relu_out) {
  using A = bacc_t<T>;
  using P = Pack<T, V>;
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  Cursor cur(i, w);
  for (; i < w.total; i += w.stride, cur.advance(w)) {
    const P xv = reinterpret_cast<const P*>(x)[i], gv = reinterpret_cast<const P*>(dy)[i];
    P rv;
    if constexpr (kRelu) rv = reinterpret_cast<const P*>(relu_out)[i];
    P ov;
#pragma unroll
    for (int u = 0; u < V; ++u) {
      const int64_t ch = kChanVec ? cur.ch * V + u : cur.ch;
      A g = cast<A>(gv.v[u]);
      if constexpr (kRelu) g = cast<A>(rv.v[u]) > A(0) ? g : A(0);
      ov.v[u] = cast<T>((g - mean_dy[ch] - (cast<A>(xv.v[u]) - mean[ch]) * invstd[ch] * mean_dy_xhat[ch]) * scale[ch]);
    }
    reinterpret_cast<P*>(dx)[i] = ov;
  }
}

// ---- host side

template <class A>
const A* vptr(const Tensor& t) {
  return t.defined() ? static_cast<const A*>(t.data_ptr()) : nullptr;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The partition of a partial pass: `splits` ranges of `chunk` (elements for s > 1, rows for s == 1).
struct Partition {
  int64_t splits, chunk;
};
Partition partition(int device, int64_t n, int64_t c, int64_t s) {
  const int64_t target = int64_t{kBlocksPerSm} * sm_count(device);
  // range length along the split dimension, blocks along the other, elements per unit of range
  const int64_t len = s == 1 ? n : n * s, groups = s == 1 ? ceil_div(c, kLanes) : c,
                per_unit = s == 1 ? std::min<int64_t>(c, kLanes) : 1;
  const int64_t by_size = std::max<int64_t>(1, len * per_unit / kMinPerBlock);
  int64_t splits = std::clamp<int64_t>(ceil_div(target, groups), 1, std::min<int64_t>(by_size, 65535));
  const int64_t chunk = ceil_div(len, splits);
  return {ceil_div(len, chunk), chunk};
}

// Runs the partial kernel of op over [n, c, s] into a fresh scratch of kFields * splits * c.
template <class Op>
Tensor run_partials(const Op& op, const Tensor& x, int64_t n, int64_t c, int64_t s, cudaStream_t stream,
                    int64_t& splits) {
  const Partition p = partition(x.device().index(), n, c, s);
  splits = p.splits;
  const int64_t len = int64_t{Op::kFields} * p.splits * c;
  Tensor part = native::empty(Shape{len}, x.dtype() == kFloat64 ? kFloat64 : kFloat32, x.device());
  auto* pp = static_cast<typename Op::A*>(part.data_ptr());
  if (s == 1) {
    const dim3 grid(static_cast<unsigned>(ceil_div(c, kLanes)), static_cast<unsigned>(p.splits));
    bn_partial_rows_kernel<Op><<<grid, dim3(kLanes, kRowLanes), 0, stream>>>(op, n, c, p.chunk, pp);
  } else {
    const dim3 grid(static_cast<unsigned>(c), static_cast<unsigned>(p.splits));
    bn_partial_plane_kernel<Op><<<grid, kPlaneThreads, 0, stream>>>(op, c, s, n * s, p.chunk, pp);
  }
  TG_CUDA_CHECK_LAUNCH();
  return part;
}

unsigned finalize_grid(int64_t c) { return static_cast<unsigned>(ceil_div(c, kFinalizeThreads)); }

unsigned elemt_grid(int64_t total) {
  const int64_t blocks = (total + 255) / 256;
  return static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
}

bool aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// Calls launch(V, kChanVec-tag, walk) with the widest vector the geometry and pointers allow.
template <class T, class Launch>
void elemt_launch(int64_t n, int64_t c, int64_t s, std::initializer_list<const Tensor*> ptrs, Launch&& launch) {
  constexpr int V = 16 / sizeof(T);
  bool vec = true;
  for (const Tensor* t : ptrs) vec = vec && aligned16(*t);
  const int64_t total = n * c * s;
  if (vec && s == 1 && c % V == 0) {
    const int64_t tv = total / V;
    const unsigned grid = elemt_grid(tv);
    launch(std::integral_constant<int, V>{}, std::true_type{}, grid, make_walk(tv, c / V, 1, int64_t{grid} * 256));
  } else if (vec && s % V == 0) {
    const int64_t tv = total / V;
    const unsigned grid = elemt_grid(tv);
    launch(std::integral_constant<int, V>{}, std::false_type{}, grid, make_walk(tv, c, s / V, int64_t{grid} * 256));
  } else {
    const unsigned grid = elemt_grid(total);
    launch(std::integral_constant<int, 1>{}, std::false_type{}, grid, make_walk(total, c, s, int64_t{grid} * 256));
  }
}

}  // namespace

void batch_norm_stats(const Tensor& x, int64_t n, int64_t c, int64_t s, const Tensor& mean, const Tensor& var) {
  cudaStream_t stream = detail::current_stream_handle(x.device().index());
  dispatch<kFloats>(x.dtype(), "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = bacc_t<T>;
    int64_t splits = 0;
    const Tensor part = run_partials(StatsOp<T>{static_cast<const T*>(x.data_ptr())}, x, n, c, s, stream, splits);
    bn_stats_finalize_kernel<T><<<finalize_grid(c), kFinalizeThreads, 0, stream>>>(
        static_cast<const A*>(part.data_ptr()), splits, c, static_cast<A*>(mean.data_ptr()),
        static_cast<A*>(var.data_ptr()));
    TG_CUDA_CHECK_LAUNCH();
  });
}

void batch_norm_elemt(const Tensor& y, const Tensor& x, int64_t n, int64_t c, int64_t s, const Tensor& mean,
                      const Tensor& scale, const Tensor& shift, bool relu) {
  cudaStream_t stream = detail::current_stream_handle(x.device().index());
  dispatch<kFloats>(x.dtype(), "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = bacc_t<T>;
    elemt_launch<T>(n, c, s, {&y, &x}, [&](auto v, auto chan_vec, unsigned grid, const Walk& w) {
      auto go = [&](auto kernel) {
        kernel<<<grid, 256, 0, stream>>>(static_cast<T*>(y.data_ptr()), static_cast<const T*>(x.data_ptr()), w,
                                         vptr<A>(mean), vptr<A>(scale), vptr<A>(shift));
        TG_CUDA_CHECK_LAUNCH();
      };
      if (relu)
        go(bn_elemt_kernel<T, decltype(v)::value, decltype(chan_vec)::value, true>);
      else
        go(bn_elemt_kernel<T, decltype(v)::value, decltype(chan_vec)::value, false>);
    });
  });
}

void batch_norm_reduce(const Tensor& dy, const Tensor& x, int64_t n, int64_t c, int64_t s, const Tensor& mean,
                       const Tensor& invstd, const Tensor& sum_dy, const Tensor& sum_dy_xhat, const Tensor& relu_out) {
  cudaStream_t stream = detail::current_stream_handle(x.device().index());
  dispatch<kFloats>(x.dtype(), "batch_norm backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = bacc_t<T>;
    int64_t splits = 0;
    const GradOp<T> op{static_cast<const T*>(dy.data_ptr()), static_cast<const T*>(x.data_ptr()), vptr<A>(mean),
                       vptr<T>(relu_out)};
    const Tensor part = run_partials(op, x, n, c, s, stream, splits);
    bn_grad_finalize_kernel<T><<<finalize_grid(c), kFinalizeThreads, 0, stream>>>(
        static_cast<const A*>(part.data_ptr()), splits, c, vptr<A>(invstd), static_cast<A*>(sum_dy.data_ptr()),
        static_cast<A*>(sum_dy_xhat.data_ptr()));
    TG_CUDA_CHECK_LAUNCH();
  });
}

void batch_norm_backward_elemt(const Tensor& dx, const Tensor& dy, const Tensor& x, int64_t n, int64_t c, int64_t s,
                               const Tensor& mean, const Tensor& invstd, const Tensor& scale, const Tensor& mean_dy,
                               const Tensor& mean_dy_xhat, const Tensor& relu_out) {
  cudaStream_t stream = detail::current_stream_handle(x.device().index());
  dispatch<kFloats>(x.dtype(), "batch_norm backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = bacc_t<T>;
    // relu_out is in x's layout; an undefined one stands in as x for the alignment test.
    const Tensor& r = relu_out.defined() ? relu_out : x;
    elemt_launch<T>(n, c, s, {&dx, &dy, &x, &r}, [&](auto v, auto chan_vec, unsigned grid, const Walk& w) {
      auto go = [&](auto kernel) {
        kernel<<<grid, 256, 0, stream>>>(static_cast<T*>(dx.data_ptr()), static_cast<const T*>(dy.data_ptr()),
                                         static_cast<const T*>(x.data_ptr()), w, vptr<A>(mean), vptr<A>(invstd),
                                         vptr<A>(scale), vptr<A>(mean_dy), vptr<A>(mean_dy_xhat), vptr<T>(relu_out));
        TG_CUDA_CHECK_LAUNCH();
      };
      if (relu_out.defined())
        go(bn_backward_elemt_kernel<T, decltype(v)::value, decltype(chan_vec)::value, true>);
      else
        go(bn_backward_elemt_kernel<T, decltype(v)::value, decltype(chan_vec)::value, false>);
    });
  });
}

}  // namespace tg::cuda::kern
