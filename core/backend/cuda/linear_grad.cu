// CUDA: linear's weight and bias gradients for few outputs in one launch,
//   gw(o, j) = sum_i g(i, o) x(i, j),  gb(o) = sum_i g(i, o),
// where cuBLAS would run the [out, rows] x [rows, in] gemm as split dot products plus a
// second kernel, and the bias gradient as a third. Threads own V adjacent columns of x
// (16-byte loads when aligned) and keep out x V float accumulators; blockIdx.y tiles the
// columns, blockIdx.x the rows. Each block adds its row lanes in shared memory in a fixed
// order and writes a partial; the last block of a column tile to finish (a done counter
// it resets, core/backend/cuda/done_counters.h) adds the partials in a fixed order and
// stores once in the result dtype. No floating-point atomics: bit-reproducible for a
// given input and device.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <tapegrad/core/backend/cuda/done_counters.h>
#include <tapegrad/core/backend/cuda/kernels.cuh>
#include <tapegrad/core/backend/cuda/loops.cuh>
#include <tapegrad/core/backend/cuda/reduce.cuh>

namespace tg::cuda::kern {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxOut = backend::kMaxLinearGradOut;
constexpr int kMaxColThreads = 32;          // column groups per tile
constexpr int kUnroll = 4;                  // rows in flight per thread
constexpr int64_t kMinRowsPerThread = 4;    // before the rows are split over more blocks
constexpr int64_t kFinalizeFloats = 32768;  // partials one finishing block adds, at most
static_assert(backend::kMaxLinearGradIn <= kMaxColThreads * detail::kMaxDoneCounters, "a column tile per done counter");

struct WGradArgs {
  const void* x;
  int64_t xs;  // x(i, j) at x[i * xs + j]
  const void* g;
  int64_t gs0, gs1;  // g(i, o) at g[i * gs0 + o * gs1]
  int64_t rows;
  int64_t in;
  int out;
  void* gw;
  int64_t gw_so, gw_sj;  // gw(o, j) at gw[o * gw_so + j * gw_sj]
  DType gw_dt;
  void* gb;  // null: no bias gradient
  DType gb_dt;
  int cols;            // column groups per tile (threads per row lane)
  int lanes;           // row lanes; blockDim.x = cols * lanes
  int64_t chunk_rows;  // rows per blockIdx.x
  float* partial;      // [tiles][chunks][out][cols * V]
  float* partial_b;    // [chunks][out]
  unsigned* done;      // one per tile
};

template <class S, int V>
struct alignas(sizeof(S) * V) Pack {
  S v[V];
};

template <class S, int OUT, int V>
__global__ void __launch_bounds__(kThreads) linear_wgrad_kernel(WGradArgs a) {
  __shared__ float sm[kThreads * 8];  // a round of the block sums: >= threads * V and lanes * OUT
  __shared__ bool last;
  const int t = threadIdx.x, nthreads = a.cols * a.lanes, c = t % a.cols, r = t / a.cols;
  const int tile_w = a.cols * V;
  const int64_t j0 = (static_cast<int64_t>(blockIdx.y) * a.cols + c) * V;
  const bool active = j0 < a.in;
  const bool bias_lane = a.gb != nullptr && blockIdx.y == 0 && c == 0;  // implies active
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * a.chunk_rows;
  const int64_t row1 = std::min(a.rows, row0 + a.chunk_rows);
  const int64_t R = a.lanes;

  float acc[OUT][V], accb[OUT];
#pragma unroll
  for (int o = 0; o < OUT; ++o) {
    accb[o] = 0.f;
#pragma unroll
    for (int v = 0; v < V; ++v) acc[o][v] = 0.f;
  }
  if (active) {
    const S* x = static_cast<const S*>(a.x) + j0;
    const S* g = static_cast<const S*>(a.g);
    auto load = [&](int64_t i, Pack<S, V>& xv, float(&gv)[OUT]) {
      xv = *reinterpret_cast<const Pack<S, V>*>(x + i * a.xs);
#pragma unroll
      for (int o = 0; o < OUT; ++o) gv[o] = o < a.out ? cast<float>(g[i * a.gs0 + o * a.gs1]) : 0.f;
    };
    auto add = [&](const Pack<S, V>& xv, const float(&gv)[OUT]) {
#pragma unroll
      for (int o = 0; o < OUT; ++o) {
#pragma unroll
        for (int v = 0; v < V; ++v) acc[o][v] = fmaf(gv[o], cast<float>(xv.v[v]), acc[o][v]);
        if (bias_lane) accb[o] += gv[o];
      }
    };
    int64_t i = row0 + r;
    for (; i + (kUnroll - 1) * R < row1; i += kUnroll * R) {
      Pack<S, V> xv[kUnroll];
      float gv[kUnroll][OUT];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) load(i + u * R, xv[u], gv[u]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) add(xv[u], gv[u]);
    }
    for (; i < row1; i += R) {
      Pack<S, V> xv;
      float gv[OUT];
      load(i, xv, gv);
      add(xv, gv);
    }
  }

  // Block sums over the row lanes, one output row o at a time (lane order fixed).
  const bool single = gridDim.x == 1;
  float* part =
      single ? nullptr : a.partial + (static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x) * a.out * tile_w;
#pragma unroll
  for (int o = 0; o < OUT; ++o) {
    if (o >= a.out) break;
#pragma unroll
    for (int v = 0; v < V; ++v) sm[t * V + v] = acc[o][v];  // sm[lane * tile_w + column]
    __syncthreads();
    for (int e = t; e < tile_w; e += nthreads) {
      float s = 0.f;
      for (int q = 0; q < a.lanes; ++q) s += sm[q * tile_w + e];
      const int64_t j = static_cast<int64_t>(blockIdx.y) * tile_w + e;
      if (!single)
        part[o * tile_w + e] = s;
      else if (j < a.in)
        store_value(a.gw, a.gw_dt, o * a.gw_so + j * a.gw_sj, s);
    }
    __syncthreads();
  }
  const bool bias_block = a.gb != nullptr && blockIdx.y == 0;
  if (bias_block) {
    if (c == 0) {
#pragma unroll
      for (int o = 0; o < OUT; ++o) sm[r * OUT + o] = accb[o];
    }
    __syncthreads();
    if (t < a.out) {
      float s = 0.f;
      for (int q = 0; q < a.lanes; ++q) s += sm[q * OUT + t];
      if (single)
        store_value(a.gb, a.gb_dt, t, s);
      else
        a.partial_b[static_cast<int64_t>(blockIdx.x) * a.out + t] = s;
    }
  }
  if (single) return;

  __threadfence();  // this block's partials are visible before the count says so
  __syncthreads();
  if (t == 0) last = atomicAdd(a.done + blockIdx.y, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  // The tile's outputs (out x tile_w, then the bias's in tile 0), each the sum of its chunks'
  // partials in a fixed order; when there are few, p threads share one and add in shared memory.
  const int64_t nchunks = gridDim.x;
  const int stride = a.out * tile_w, nout = stride + (bias_block ? a.out : 0);
  const float* tp = a.partial + static_cast<int64_t>(blockIdx.y) * nchunks * stride;
  auto sum_chunks = [&](int e, int64_t q0, int64_t step) {
    const float* p = e < stride ? tp + e : a.partial_b + (e - stride);
    const int64_t ps = e < stride ? stride : a.out;
    float s = 0.f;
#pragma unroll 8
    for (int64_t q = q0; q < nchunks; q += step) s += __ldcg(p + q * ps);
    return s;
  };
  auto finish = [&](int e, float s) {
    if (e >= stride) {
      store_value(a.gb, a.gb_dt, e - stride, s);
      return;
    }
    const int o = e / tile_w;
    const int64_t j = static_cast<int64_t>(blockIdx.y) * tile_w + (e - o * tile_w);
    if (j < a.in) store_value(a.gw, a.gw_dt, o * a.gw_so + j * a.gw_sj, s);
  };
  if (2 * nout <= nthreads) {
    const int p = nthreads / nout, e = t % nout, k = t / nout;
    sm[t] = k < p ? sum_chunks(e, k, p) : 0.f;
    __syncthreads();
    if (t < nout) {
      float s = 0.f;
      for (int h = 0; h < p; ++h) s += sm[h * nout + t];
      finish(t, s);
    }
  } else {
    for (int e = t; e < nout; e += nthreads) finish(e, sum_chunks(e, 0, 1));
  }
  if (t == 0) a.done[blockIdx.y] = 0;  // ready for the next launch on this stream
}

template <class S, int OUT>
void launch(bool vec, dim3 grid, int threads, cudaStream_t stream, const WGradArgs& a) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(S));
  if (vec)
    linear_wgrad_kernel<S, OUT, kVec><<<grid, threads, 0, stream>>>(a);
  else
    linear_wgrad_kernel<S, OUT, 1><<<grid, threads, 0, stream>>>(a);
  TG_CUDA_CHECK_LAUNCH();
}

}  // namespace

void linear_grad_weight_bias(const Tensor& gw, const Tensor& gb, const Tensor& g, const Tensor& x) {
  const int device = x.device().index();
  cudaStream_t stream = detail::current_stream_handle(device);
  const int64_t rows = x.sizes()[0], in = x.sizes()[1];
  const int out = static_cast<int>(g.sizes()[1]);
  dispatch<kFloats>(x.dtype(), "linear backward", [&](auto tag) {
    using S = typename decltype(tag)::type;
    if constexpr (std::is_same_v<S, double>) {
      TG_ERROR("linear backward: no small-output CUDA kernel for float64");
    } else {
      constexpr int kVec = 16 / static_cast<int>(sizeof(S));
      const int64_t xs = x.strides()[0];
      const bool vec =
          in % kVec == 0 && (rows == 1 || xs % kVec == 0) && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0;
      const int V = vec ? kVec : 1;
      const int64_t groups = (in + V - 1) / V;
      const int64_t tiles = (groups + kMaxColThreads - 1) / kMaxColThreads;
      TG_CHECK(tiles <= detail::kMaxDoneCounters, "linear backward: in_features ", in, " too large for one launch");
      const int cols = static_cast<int>((groups + tiles - 1) / tiles);
      const int lanes = kThreads / cols;
      const int64_t tile_w = int64_t{cols} * V;
      // Enough blocks for about two per SM, a few rows per thread, and a bounded finish.
      int64_t chunks = std::min({(rows + lanes * kMinRowsPerThread - 1) / (lanes * kMinRowsPerThread),
                                 (int64_t{sm_count(device)} * 2 + tiles - 1) / tiles,
                                 std::max<int64_t>(1, kFinalizeFloats / (out * tile_w))});
      chunks = std::max<int64_t>(chunks, 1);
      int64_t chunk_rows = (rows + chunks - 1) / chunks;
      chunk_rows = (chunk_rows + lanes - 1) / lanes * lanes;  // whole rounds of the row lanes
      chunks = (rows + chunk_rows - 1) / chunk_rows;

      WGradArgs a{};
      a.x = x.data_ptr();
      a.xs = xs;
      a.g = g.data_ptr();
      a.gs0 = g.strides()[0];
      a.gs1 = g.strides()[1];
      a.rows = rows;
      a.in = in;
      a.out = out;
      a.gw = gw.data_ptr();
      a.gw_so = gw.strides()[0];
      a.gw_sj = gw.strides()[1];
      a.gw_dt = gw.dtype();
      a.gb = gb.defined() ? gb.data_ptr() : nullptr;
      a.gb_dt = gb.defined() ? gb.dtype() : gw.dtype();
      a.cols = cols;
      a.lanes = lanes;
      a.chunk_rows = chunk_rows;
      DataPtr ws, own_done;
      if (chunks > 1) {
        const int64_t nw = tiles * chunks * out * tile_w, nb = gb.defined() ? chunks * out : 0;
        ws = detail::device_allocate(static_cast<size_t>(nw + nb) * sizeof(float), device);
        a.partial = static_cast<float*>(ws.get());
        a.partial_b = a.partial + nw;
        a.done = detail::done_counters(device, stream, static_cast<int>(tiles), own_done);
      }
      const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(tiles));
      const int threads = cols * lanes;
      if (out <= 1)
        launch<S, 1>(vec, grid, threads, stream, a);
      else if (out <= 2)
        launch<S, 2>(vec, grid, threads, stream, a);
      else if (out <= 4)
        launch<S, 4>(vec, grid, threads, stream, a);
      else
        launch<S, kMaxOut>(vec, grid, threads, stream, a);
      // ws and own_done return to the stream-ordered cache; later work on this stream runs after.
    }
  });
}

}  // namespace tg::cuda::kern
