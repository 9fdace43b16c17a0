// The CUDA elementwise engine: one launcher, two kernels. A kernel author writes a
// device functor over "opmath" values (float for half/bfloat16); the engine loads,
// converts, applies it and stores narrow.
//  - vec path: a [rows, cols] geometry where every operand's inner stride is 1 or 0
//    (contiguous tensors, a row vector or a column broadcast over a 2-D tensor):
//    16-byte vector loads/stores, each thread handles kUnroll vectors.
//  - strided path: any geometry up to kMaxDims, 32-bit linear index with fast
//    divmod (launches are split so the index fits), 64-bit byte offsets.
#pragma once
#include <limits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cuda/std/tuple>
#include <tuple>
#include <type_traits>
#include <utility>

#include <tapegrad/core/backend/backend.h>
#include <tapegrad/core/backend/cuda/dependent_launch.cuh>
#include <tapegrad/core/backend/cuda/launch_queue.h>
#include <tapegrad/core/backend/cuda/opmath.cuh>
#include <tapegrad/core/backend/cuda/runtime.h>

namespace tg::cuda::kern {

using backend::ElementwiseIter;
using backend::kMaxDims;

// ---- device scalar types and conversions

// tg's storage type -> the CUDA type with the same bits.
template <class T>
struct DevType {
  using type = T;
};
template <>
struct DevType<::tg::Half> {
  using type = __half;
};
template <>
struct DevType<::tg::BFloat16> {
  using type = __nv_bfloat16;
};
template <class T>
using dev_t = typename DevType<T>::type;

template <class T>
inline constexpr bool kIsReduced = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

using ::tg::cuda::opmath_t;

// Conversion between any two dtypes, with the CPU backend's rules: 16-bit floats go through
// float, bool is != 0, a float into an integer narrower than 32 bits truncates toward zero and
// saturates (NaN -> 0; the hardware saturates the 32/64-bit ones itself).
template <class To, class From>
__device__ __forceinline__ To cast(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, __half>) {
    return cast<To>(__half2float(v));
  } else if constexpr (std::is_same_v<From, __nv_bfloat16>) {
    return cast<To>(__bfloat162float(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_same_v<To, __half>) {
    return __float2half_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(v));
  } else if constexpr (std::is_integral_v<To> && sizeof(To) < 4 && std::is_floating_point_v<From>) {
    if (!(v == v)) return To(0);
    if (v <= static_cast<From>(std::numeric_limits<To>::min())) return std::numeric_limits<To>::min();
    if (v >= static_cast<From>(std::numeric_limits<To>::max())) return std::numeric_limits<To>::max();
    return static_cast<To>(static_cast<int>(v));
  } else {
    return static_cast<To>(v);
  }
}

// cast<To> of V consecutive values (a 16-byte pack's elements, say). bfloat16 pairs into float take
// one instruction per element: the upper half of a 32-bit word, masked, is already its float's
// bits, and the lower half is shifted up (cast() of each half alone is a byte permute + a shift).
// Row kernels bound by instruction issue (softmax, cross_entropy over 50k classes) use it.
template <class To, class From, int V>
__device__ __forceinline__ void cast_all(const From (&in)[V], To (&out)[V]) {
  if constexpr (std::is_same_v<From, __nv_bfloat16> && std::is_same_v<To, float> && V % 2 == 0) {
#pragma unroll
    for (int i = 0; i < V / 2; ++i) {
      uint32_t w;
      memcpy(&w, &in[2 * i], sizeof(w));
      out[2 * i] = __uint_as_float(w << 16);
      out[2 * i + 1] = __uint_as_float(w & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) out[e] = cast<To>(in[e]);
  }
}

// ---- fast unsigned division by a runtime constant (Granlund-Montgomery), valid for n < 2^31.
struct IntDivider {
  uint32_t divisor = 1;
  uint32_t m1 = 1;
  uint32_t shift = 0;
  IntDivider() = default;
  explicit IntDivider(uint32_t d) : divisor(d) {
    shift = 0;
    while (shift < 31 && (1u << shift) < d) ++shift;
    uint64_t one = 1;
    m1 = static_cast<uint32_t>(((one << 32) * ((one << shift) - d)) / d + 1);
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const {
    uint32_t t = __umulhi(n, m1);
    return (t + n) >> shift;
  }
};

inline constexpr int kBlock = 128;
inline constexpr int kUnroll = 4;

// Launches up to this many elements may be deferred and batched (launch_queue.h): their GPU
// time (a few µs at most) is below the host cost of a launch of their own.
inline constexpr int64_t kDeferMaxNumel = int64_t{1} << 18;

// Where a launch goes: the stream (looked up without flushing when `defer`), its device, and
// whether the launch may wait in the launch queue.
struct LaunchTarget {
  cudaStream_t stream;
  int device;
  bool defer;
};

template <class... P, size_t... I>
void launch_tuple(void (*kernel)(P...), dim3 grid, dim3 block, const LaunchTarget& t, std::tuple<P...>& vals,
                  std::index_sequence<I...>) {
  void* args[] = {static_cast<void*>(&std::get<I>(vals))...};
  const size_t sizes[] = {sizeof(P)...};
  const void* fn = reinterpret_cast<const void*>(kernel);
  if (t.defer && detail::defer_launch(fn, grid, block, t.stream, t.device, args, sizes, sizeof...(P))) return;
  launch_dependent_args(fn, LaunchShape{grid, block, 0, t.stream, t.device}, args);
}

// kernel<<<grid, block, 0, t.stream>>>(a...) as a dependent launch (the kernel follows
// dependent_launch.cuh's rule), or recorded for a batched launch.
template <class... P, class... A>
void launch_kernel(void (*kernel)(P...), dim3 grid, dim3 block, const LaunchTarget& t, const A&... a) {
  static_assert(sizeof...(P) == sizeof...(A), "launch_kernel: argument count");
  std::tuple<P...> vals(a...);
  launch_tuple(kernel, grid, block, t, vals, std::index_sequence_for<P...>{});
}

// ---- geometry shared by both paths (host side): dims innermost first, byte strides.
template <int N>
struct Geometry {
  int ndim = 0;
  int64_t numel = 0;
  int64_t shape[kMaxDims];
  int64_t stride[kMaxDims][N];  // bytes
  char* data[N];
};

// Drops size-1 dims and merges dims that are contiguous for every operand.
template <int N>
Geometry<N> make_geometry(const ElementwiseIter& it, const int* elem_size) {
  Geometry<N> g;
  g.numel = it.numel;
  for (int k = 0; k < N; ++k) g.data[k] = it.data[k];
  for (int d = it.ndim - 1; d >= 0; --d) {  // innermost first
    if (it.shape[d] == 1) continue;
    if (g.ndim > 0) {
      int p = g.ndim - 1;
      bool merge = true;
      for (int k = 0; k < N; ++k)
        if (it.strides[k][d] * elem_size[k] != g.stride[p][k] * g.shape[p]) merge = false;
      if (merge) {
        g.shape[p] *= it.shape[d];
        continue;
      }
    }
    g.shape[g.ndim] = it.shape[d];
    for (int k = 0; k < N; ++k) g.stride[g.ndim][k] = it.strides[k][d] * elem_size[k];
    ++g.ndim;
  }
  return g;
}

// ---- strided path

template <int N>
struct OffsetCalc {
  int ndim;
  IntDivider div[kMaxDims];
  int64_t stride[kMaxDims][N];
  __device__ __forceinline__ void get(uint32_t idx, int64_t* off) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
#pragma unroll
    for (int d = 0; d < kMaxDims; ++d) {
      if (d == ndim) break;
      uint32_t q = d == ndim - 1 ? 0u : div[d].div(idx);
      uint32_t r = idx - q * div[d].divisor;
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += static_cast<int64_t>(r) * stride[d][k];
      idx = q;
    }
  }
};

template <int N>
struct Ptrs {
  char* p[N];
};

template <class... In, class F, size_t... I>
__device__ __forceinline__ auto apply_loaded(const F& f, char* const* base, const int64_t* off,
                                             std::index_sequence<I...>) {
  return f(cast<opmath_t<In>>(*reinterpret_cast<const In*>(base[I + 1] + off[I + 1]))...);
}

template <class F, class Out, class... In>
__global__ void __launch_bounds__(kBlock) strided_kernel(OffsetCalc<1 + sizeof...(In)> oc,
                                                         Ptrs<1 + sizeof...(In)> ptrs, uint32_t numel, F f) {
  wait_prior_grids();  // launch_kernel launches dependent
  constexpr int N = 1 + sizeof...(In);
  uint32_t base = blockIdx.x * (kBlock * kUnroll) + threadIdx.x;
  int64_t off[kUnroll][N];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    uint32_t idx = base + u * kBlock;
    if (idx < numel) oc.get(idx, off[u]);
  }
  // Loads of all elements are issued before any store (memory-level parallelism).
  using R = decltype(apply_loaded<In...>(f, ptrs.p, off[0], std::index_sequence_for<In...>{}));
  R res[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
    if (base + u * kBlock < numel) res[u] = apply_loaded<In...>(f, ptrs.p, off[u], std::index_sequence_for<In...>{});
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
    if (base + u * kBlock < numel) *reinterpret_cast<Out*>(ptrs.p[0] + off[u][0]) = cast<Out>(res[u]);
}

template <class Out, class... In, class F>
void launch_strided(const Geometry<1 + sizeof...(In)>& g, const F& f, const LaunchTarget& stream) {
  constexpr int N = 1 + sizeof...(In);
  constexpr int64_t kMaxIndex = int64_t{1} << 31;
  if (g.numel < kMaxIndex) {
    OffsetCalc<N> oc;
    oc.ndim = g.ndim;
    for (int d = 0; d < g.ndim; ++d) {
      oc.div[d] = IntDivider(static_cast<uint32_t>(g.shape[d]));
      for (int k = 0; k < N; ++k) oc.stride[d][k] = g.stride[d][k];
    }
    Ptrs<N> ptrs;
    for (int k = 0; k < N; ++k) ptrs.p[k] = g.data[k];
    auto n = static_cast<uint32_t>(g.numel);
    unsigned grid = (n + kBlock * kUnroll - 1) / (kBlock * kUnroll);
    launch_kernel(strided_kernel<F, Out, In...>, dim3(grid), dim3(kBlock), stream, oc, ptrs, n, f);
    return;
  }
  // Too many elements for a 32-bit index: split along the outermost dim.
  int od = g.ndim - 1;
  int64_t inner = g.numel / g.shape[od];
  if (inner >= kMaxIndex) {
    Geometry<N> sub = g;
    sub.ndim = od;
    sub.numel = inner;
    for (int64_t i = 0; i < g.shape[od]; ++i) {
      for (int k = 0; k < N; ++k) sub.data[k] = g.data[k] + i * g.stride[od][k];
      launch_strided<Out, In...>(sub, f, stream);
    }
    return;
  }
  int64_t chunk = (kMaxIndex - 1) / inner;
  for (int64_t s = 0; s < g.shape[od]; s += chunk) {
    Geometry<N> sub = g;
    sub.shape[od] = std::min(chunk, g.shape[od] - s);
    sub.numel = sub.shape[od] * inner;
    for (int k = 0; k < N; ++k) sub.data[k] = g.data[k] + s * g.stride[od][k];
    launch_strided<Out, In...>(sub, f, stream);
  }
}

// ---- vec path

template <class T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

template <int N>
struct VecArgs {
  char* p[N];
  int64_t row_stride[N];  // bytes
  bool bcast[N];          // inner stride 0: one value per row
};

template <class T, int V>
__device__ __forceinline__ Vec<opmath_t<T>, V> load_vec(const char* p, bool bcast) {
  Vec<opmath_t<T>, V> r;
  if (bcast) {
    opmath_t<T> x = cast<opmath_t<T>>(*reinterpret_cast<const T*>(p));
#pragma unroll
    for (int e = 0; e < V; ++e) r.v[e] = x;
  } else {
    Vec<T, V> raw = *reinterpret_cast<const Vec<T, V>*>(p);
#pragma unroll
    for (int e = 0; e < V; ++e) r.v[e] = cast<opmath_t<T>>(raw.v[e]);
  }
  return r;
}

template <int V, class F, class Tuple, size_t... I>
__device__ __forceinline__ auto apply_vec(const F& f, const Tuple& t, int e, std::index_sequence<I...>) {
  return f(::cuda::std::get<I>(t).v[e]...);
}

template <int V, class... In, int N, size_t... I>
__device__ __forceinline__ ::cuda::std::tuple<Vec<opmath_t<In>, V>...> load_all(const VecArgs<N>& a, uint32_t row,
                                                                               uint32_t col,
                                                                               std::index_sequence<I...>) {
  return ::cuda::std::tuple<Vec<opmath_t<In>, V>...>(load_vec<In, V>(
      a.p[I + 1] + row * a.row_stride[I + 1] + (a.bcast[I + 1] ? 0 : int64_t{col} * V * int64_t{sizeof(In)}),
      a.bcast[I + 1])...);
}

template <class... In, int N, size_t... I>
__device__ __forceinline__ void tail_offsets(const VecArgs<N>& a, uint32_t e, int64_t* off, std::index_sequence<I...>) {
  ((off[I + 1] = a.bcast[I + 1] ? 0 : int64_t{e} * int64_t{sizeof(In)}), ...);
}

template <int V, class F, class Out, class... In>
__global__ void __launch_bounds__(kBlock) vec_kernel(VecArgs<1 + sizeof...(In)> a, IntDivider upr, uint32_t units,
                                                     uint32_t tail_begin, uint32_t tail, F f) {
  wait_prior_grids();  // launch_kernel launches dependent
  constexpr int N = 1 + sizeof...(In);
  using Idx = std::index_sequence_for<In...>;
  uint32_t base = blockIdx.x * (kBlock * kUnroll) + threadIdx.x;
  ::cuda::std::tuple<Vec<opmath_t<In>, V>...> vals[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    uint32_t unit = base + u * kBlock;
    if (unit < units) {
      uint32_t row = upr.div(unit);
      uint32_t col = unit - row * upr.divisor;
      vals[u] = load_all<V, In...>(a, row, col, Idx{});
    }
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    uint32_t unit = base + u * kBlock;
    if (unit < units) {
      uint32_t row = upr.div(unit);
      uint32_t col = unit - row * upr.divisor;
      Vec<Out, V> o;
#pragma unroll
      for (int e = 0; e < V; ++e) o.v[e] = cast<Out>(apply_vec<V>(f, vals[u], e, Idx{}));
      *reinterpret_cast<Vec<Out, V>*>(a.p[0] + row * a.row_stride[0] + int64_t{col} * V * sizeof(Out)) = o;
    }
  }
  // The last few elements of a single-row (contiguous) launch that do not fill a vector.
  if (blockIdx.x == 0 && threadIdx.x < tail) {
    uint32_t e = tail_begin + threadIdx.x;
    int64_t off[N];
    tail_offsets<In...>(a, e, off, Idx{});
    off[0] = int64_t{e} * sizeof(Out);
    *reinterpret_cast<Out*>(a.p[0] + off[0]) = cast<Out>(apply_loaded<In...>(f, a.p, off, Idx{}));
  }
}

template <class... T>
constexpr int max_size() {
  int m = 1;
  ((m = static_cast<int>(sizeof(T)) > m ? static_cast<int>(sizeof(T)) : m), ...);
  return m;
}

// Tries the vectorised path; false when the geometry does not allow it.
template <class Out, class... In, class F>
bool try_vec(const Geometry<1 + sizeof...(In)>& g, const F& f, const LaunchTarget& stream) {
  constexpr int N = 1 + sizeof...(In);
  constexpr int V = 16 / max_size<Out, In...>();
  constexpr int kSize[N] = {static_cast<int>(sizeof(Out)), static_cast<int>(sizeof(In))...};
  if (g.ndim > 2) return false;
  int64_t rows = g.ndim == 2 ? g.shape[1] : 1;
  int64_t cols = g.ndim >= 1 ? g.shape[0] : 1;
  VecArgs<N> a;
  for (int k = 0; k < N; ++k) {
    int64_t inner = g.ndim >= 1 ? g.stride[0][k] : kSize[k];
    if (inner != 0 && inner != kSize[k]) return false;
    if (k == 0 && inner == 0) return false;
    a.p[k] = g.data[k];
    a.bcast[k] = inner == 0;
    a.row_stride[k] = g.ndim == 2 ? g.stride[1][k] : 0;
    if (!a.bcast[k]) {
      int64_t vbytes = int64_t{V} * kSize[k];
      if (reinterpret_cast<uintptr_t>(g.data[k]) % vbytes != 0) return false;
      if (rows > 1 && a.row_stride[k] % vbytes != 0) return false;
    }
  }
  if (rows > 1 && cols % V != 0) return false;
  int64_t upr = cols / V;
  int64_t units = upr * rows;
  if (units >= (int64_t{1} << 31) - kBlock * kUnroll || cols >= (int64_t{1} << 31)) return false;
  uint32_t tail = rows == 1 ? static_cast<uint32_t>(cols % V) : 0;
  unsigned grid = static_cast<unsigned>((units + kBlock * kUnroll - 1) / (kBlock * kUnroll));
  if (grid == 0) grid = 1;
  launch_kernel(vec_kernel<V, F, Out, In...>, dim3(grid), dim3(kBlock), stream, a,
                IntDivider(static_cast<uint32_t>(upr > 0 ? upr : 1)), static_cast<uint32_t>(units),
                static_cast<uint32_t>(upr * V), tail, f);
  return true;
}

// Runs `f` over the iter on `t`: Out is the output's device type, In the inputs'.
template <class Out, class... In, class F>
void launch_on(const ElementwiseIter& it, const F& f, const LaunchTarget& t) {
  constexpr int N = 1 + sizeof...(In);
  if (it.numel == 0) return;
  const int sizes[N] = {static_cast<int>(sizeof(Out)), static_cast<int>(sizeof(In))...};
  Geometry<N> g = make_geometry<N>(it, sizes);
  if (try_vec<Out, In...>(g, f, t)) return;
  launch_strided<Out, In...>(g, f, t);
}
// The same on the device's current stream (small launches may wait in the launch queue).
template <class Out, class... In, class F>
void launch(const ElementwiseIter& it, const F& f) {
  if (it.numel == 0) return;
  const int device = it.device.index();
  const bool defer = it.numel <= kDeferMaxNumel && detail::tls_defer_allowed;
  launch_on<Out, In...>(
      it, f,
      LaunchTarget{defer ? detail::current_stream_noflush(device) : detail::current_stream_handle(device), device, defer});
}

// ---- dtype dispatch helpers for the op files

// dispatch<set>(dtype, op, fn) calls fn(TypeTag<device type>{}) for the dtypes in set, else throws naming op.
template <class T>
struct TypeTag {
  using type = T;
};

enum DTypeSet : unsigned {
  kFloats = 1u << 0,
  kInts = 1u << 1,
  kBoolSet = 1u << 2,
};

template <unsigned kAllowed, class Fn>
void dispatch(DType dt, const char* op, Fn&& fn) {
  switch (dt) {
    case DType::Float32:
      if constexpr ((kAllowed & kFloats) != 0) return fn(TypeTag<float>{});
      break;
    case DType::Float64:
      if constexpr ((kAllowed & kFloats) != 0) return fn(TypeTag<double>{});
      break;
    case DType::Float16:
      if constexpr ((kAllowed & kFloats) != 0) return fn(TypeTag<__half>{});
      break;
    case DType::BFloat16:
      if constexpr ((kAllowed & kFloats) != 0) return fn(TypeTag<__nv_bfloat16>{});
      break;
    case DType::Int64:
      if constexpr ((kAllowed & kInts) != 0) return fn(TypeTag<int64_t>{});
      break;
    case DType::Int32:
      if constexpr ((kAllowed & kInts) != 0) return fn(TypeTag<int32_t>{});
      break;
    case DType::Bool:
      if constexpr ((kAllowed & kBoolSet) != 0) return fn(TypeTag<bool>{});
      break;
    case DType::UInt8:
      if constexpr ((kAllowed & kInts) != 0) return fn(TypeTag<uint8_t>{});
      break;
    case DType::Int8:
      if constexpr ((kAllowed & kInts) != 0) return fn(TypeTag<int8_t>{});
      break;
    case DType::Int16:
      if constexpr ((kAllowed & kInts) != 0) return fn(TypeTag<int16_t>{});
      break;
  }
  TG_ERROR(op, ": dtype ", dtype_name(dt), " is not supported on CUDA");
}

// A scalar parameter of the iter in compute type T (iparams for integers, dparams for floats).
template <class T>
inline T param(const ElementwiseIter& it, int i) {
  if constexpr (std::is_same_v<T, bool>) return it.iparams[i] != 0 || it.dparams[i] != 0;
  else if constexpr (std::is_integral_v<T>) return static_cast<T>(it.iparams[i]);
  else return static_cast<T>(it.dparams[i]);
}

}  // namespace tg::cuda::kern
