// CUDA gather / scatter / scatter_add along a dim (issue 15). Hand-written: each thread takes
// one position of the index and addresses the other operands through their own strides, so
// strided views and broadcast values need no copies; no library has these ops (PyTorch's are
// its own ScatterGatherKernel.cu too). Gather and scatter move opaque words of the element
// size (every dtype); scatter_add accumulates with atomicAdd (float16 / bfloat16 natively on
// sm_80+), so repeated indices add up in an unspecified order, as PyTorch's CUDA scatter_add.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <tapegrad/core/backend/cuda/kernels.cuh>
#include <tapegrad/core/backend/cuda/loops.cuh>

namespace tg::cuda::kern {
namespace {

constexpr int kThreads = 256;

// Index geometry: the index's sizes and the strides (elements) of the index, operand a and
// operand b over those positions. dim's stride of b is where the looked-up index lands.
struct Geom {
  int nd;
  int64_t sizes[backend::kMaxDims];
  int64_t idx_st[backend::kMaxDims];
  int64_t a_st[backend::kMaxDims];
  int64_t b_st[backend::kMaxDims];
};

Geom make_geom(const Tensor& index, const Tensor& a, const Tensor& b, int64_t dim, const char* op) {
  TG_CHECK(index.dim() <= backend::kMaxDims, op, ": at most ", backend::kMaxDims, " dims on CUDA, got shape ",
           index.sizes());
  Geom g{};
  g.nd = static_cast<int>(index.dim());
  for (int d = 0; d < g.nd; ++d) {
    g.sizes[d] = index.sizes()[d];
    g.idx_st[d] = index.strides()[d];
    g.a_st[d] = a.strides()[d];
    g.b_st[d] = d == dim ? 0 : b.strides()[d];  // dim's coordinate comes from the index
  }
  return g;
}

// Offsets of flat position i: into the index, operand a and operand b (without dim's term).
__device__ __forceinline__ void offsets(const Geom& g, int64_t i, int64_t& oi, int64_t& oa, int64_t& ob) {
  oi = oa = ob = 0;
  for (int d = g.nd - 1; d >= 0; --d) {
    const int64_t c = i % g.sizes[d];
    i /= g.sizes[d];
    oi += c * g.idx_st[d];
    oa += c * g.a_st[d];
    ob += c * g.b_st[d];
  }
}

// out (contiguous, index's shape; operand a) = in (operand b) at the index along dim.
template <class W>
__global__ void gather_kernel(W* out, const W* in, const int64_t* index, Geom g, int64_t in_dim_stride, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t oi, oa, ob;
    offsets(g, i, oi, oa, ob);
    out[oa] = in[ob + index[oi] * in_dim_stride];
  }
}

// *addr += val for a 1- or 2-byte integer (uint8 / int8 / int16: no native atomicAdd): a CAS loop
// on the aligned 32-bit word holding it (allocations are 512-byte rounded, so the word is ours).
template <class T>
__device__ __forceinline__ void atomic_add_narrow(T* addr, T val) {
  using U = std::make_unsigned_t<T>;
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  auto* word = reinterpret_cast<unsigned int*>(a & ~uintptr_t{3});
  const unsigned shift = static_cast<unsigned>(a & 3) * 8;
  const unsigned mask = static_cast<unsigned>(static_cast<U>(~U{0})) << shift;
  unsigned old = *word, assumed;
  do {
    assumed = old;
    const T cur = static_cast<T>(static_cast<U>((assumed & mask) >> shift));
    const unsigned sum = static_cast<unsigned>(static_cast<U>(static_cast<T>(cur + val))) << shift;
    old = atomicCAS(word, assumed, (assumed & ~mask) | sum);
  } while (assumed != old);
}

// out (operand b) at the index along dim = src (operand a), or += with kAdd.
template <class W, bool kAdd>
__global__ void scatter_kernel(W* out, const W* src, const int64_t* index, Geom g, int64_t out_dim_stride,
                               int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t oi, oa, ob;
    offsets(g, i, oi, oa, ob);
    W* dst = out + ob + index[oi] * out_dim_stride;
    if constexpr (kAdd) {
      if constexpr (std::is_same_v<W, int64_t>) {
        atomicAdd(reinterpret_cast<unsigned long long*>(dst), static_cast<unsigned long long>(src[oa]));
      } else if constexpr (std::is_integral_v<W> && sizeof(W) < 4) {
        atomic_add_narrow(dst, src[oa]);
      } else {
        atomicAdd(dst, src[oa]);
      }
    } else {
      *dst = src[oa];
    }
  }
}

unsigned grid_for(int64_t total) {
  return static_cast<unsigned>(std::min<int64_t>((total + kThreads - 1) / kThreads, 65535LL * 8));
}

// Calls f(W{}) with an opaque word of the element size.
template <class F>
void by_size(size_t es, const char* op, F&& f) {
  switch (es) {
    case 1:
      return f(uint8_t{});
    case 2:
      return f(uint16_t{});
    case 4:
      return f(uint32_t{});
    case 8:
      return f(uint64_t{});
    default:
      TG_ERROR(op, ": no CUDA kernel for elements of ", es, " bytes");
  }
}

}  // namespace

void gather(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index) {
  cudaStream_t stream = detail::current_stream_handle(out.device().index());
  const Geom g = make_geom(index, out, in, dim, "gather");
  const int64_t total = index.numel();
  by_size(in.element_size(), "gather", [&](auto word) {
    using W = decltype(word);
    gather_kernel<W><<<grid_for(total), kThreads, 0, stream>>>(
        static_cast<W*>(out.data_ptr()), static_cast<const W*>(in.data_ptr()),
        static_cast<const int64_t*>(index.data_ptr()), g, in.dim() > 0 ? in.strides()[dim] : 1, total);
    TG_CUDA_CHECK_LAUNCH();
  });
}

void scatter(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate) {
  cudaStream_t stream = detail::current_stream_handle(out.device().index());
  const Geom g = make_geom(index, src, out, dim, accumulate ? "scatter_add" : "scatter");
  const int64_t total = index.numel(), dim_stride = out.dim() > 0 ? out.strides()[dim] : 1;
  const auto* idx = static_cast<const int64_t*>(index.data_ptr());
  if (!accumulate) {
    by_size(out.element_size(), "scatter", [&](auto word) {
      using W = decltype(word);
      scatter_kernel<W, false><<<grid_for(total), kThreads, 0, stream>>>(
          static_cast<W*>(out.data_ptr()), static_cast<const W*>(src.data_ptr()), idx, g, dim_stride, total);
      TG_CUDA_CHECK_LAUNCH();
    });
    return;
  }
  dispatch<kFloats | kInts>(out.dtype(), "scatter_add", [&](auto tag) {
    using S = typename decltype(tag)::type;
    scatter_kernel<S, true><<<grid_for(total), kThreads, 0, stream>>>(
        static_cast<S*>(out.data_ptr()), static_cast<const S*>(src.data_ptr()), idx, g, dim_stride, total);
    TG_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace tg::cuda::kern
