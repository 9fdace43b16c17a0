// CUDA arange and index_select. index_select gathers whole rows of a contiguous
// input ([outer, dim, inner] -> [outer, n_index, inner]) with the widest aligned
// vector (16 bytes for float32 rows of 4k elements, the DataLoader case).
#include <algorithm>
#include <type_traits>

#include <tapegrad/core/backend/cuda/kernels.cuh>
#include <tapegrad/core/backend/cuda/loops.cuh>
#include <tapegrad/core/backend/cuda/reduce.cuh>

namespace tg::cuda::kern {
namespace {

constexpr int kThreads = 256;

template <class S>
__global__ void arange_kernel(S* out, int64_t n, double start, double step) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  double v = start + static_cast<double>(i) * step;
  if constexpr (std::is_same_v<S, double>) out[i] = v;
  else if constexpr (std::is_integral_v<S>) out[i] = static_cast<S>(v);
  else out[i] = cast<S>(static_cast<float>(v));
}

// W: an opaque word of 16, 8, 4, 2 or 1 bytes; a row is `upr` words.
template <class W, class I>
__global__ void gather_rows_kernel(W* out, const W* in, const I* index, int64_t total, int64_t upr, int64_t nidx,
                                   int64_t in_dim) {
  int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (u >= total) return;
  int64_t r = u / upr, c = u - r * upr;
  int64_t o = r / nidx, j = r - o * nidx;
  int64_t src_row = o * in_dim + static_cast<int64_t>(index[j]);
  out[u] = in[src_row * upr + c];
}

template <class I>
void gather(const Tensor& out, const char* in, const Tensor& index, int64_t outer, int64_t in_dim, int64_t row_bytes,
            cudaStream_t stream) {
  char* dst = static_cast<char*>(out.data_ptr());
  const I* idx = static_cast<const I*>(index.data_ptr());
  int64_t nidx = index.numel();
  auto aligned = [&](int64_t w) {
    return row_bytes % w == 0 && reinterpret_cast<uintptr_t>(dst) % w == 0 && reinterpret_cast<uintptr_t>(in) % w == 0;
  };
  auto go = [&](auto word) {
    using W = decltype(word);
    int64_t upr = row_bytes / static_cast<int64_t>(sizeof(W));
    int64_t total = outer * nidx * upr;
    unsigned grid = static_cast<unsigned>((total + kThreads - 1) / kThreads);
    gather_rows_kernel<W, I><<<grid, kThreads, 0, stream>>>(reinterpret_cast<W*>(dst), reinterpret_cast<const W*>(in),
                                                            idx, total, upr, nidx, in_dim);
    TG_CUDA_CHECK_LAUNCH();
  };
  if (aligned(16)) go(uint4{});
  else if (aligned(8)) go(uint2{});
  else if (aligned(4)) go(uint32_t{});
  else if (aligned(2)) go(uint16_t{});
  else go(uint8_t{});
}

}  // namespace

void arange(const Tensor& out, double start, double step) {
  TG_CHECK(out.is_contiguous(), "arange: output must be contiguous");
  cudaStream_t stream = detail::current_stream_handle(out.device().index());
  int64_t n = out.numel();
  dispatch<kFloats | kInts>(out.dtype(), "arange", [&](auto tag) {
    using S = typename decltype(tag)::type;
    unsigned grid = static_cast<unsigned>((n + kThreads - 1) / kThreads);
    arange_kernel<S><<<grid, kThreads, 0, stream>>>(static_cast<S*>(out.data_ptr()), n, start, step);
    TG_CUDA_CHECK_LAUNCH();
  });
}

void index_select(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index) {
  TG_CHECK(out.is_contiguous(), "index_select: output must be contiguous");
  TG_CHECK(index.dtype() == DType::Int64 || index.dtype() == DType::Int32,
           "index_select: index must be int64 or int32, got ", dtype_name(index.dtype()));
  int device = out.device().index();
  cudaStream_t stream = detail::current_stream_handle(device);
  size_t esize = element_size(in.dtype());
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= in.sizes()[d];
  for (int64_t d = dim + 1; d < in.dim(); ++d) inner *= in.sizes()[d];
  int64_t in_dim = in.dim() == 0 ? 1 : in.sizes()[dim];
  const char* src = static_cast<const char*>(in.data_ptr());
  DataPtr tmp;
  if (!in.is_contiguous() && in.numel() > 0) {
    // A strided input is first made contiguous with the Copy kernel.
    TG_CHECK(in.dim() <= backend::kMaxDims, "index_select: too many dims ", in.sizes());
    tmp = detail::device_allocate(static_cast<size_t>(in.numel()) * esize, device);
    backend::ElementwiseIter it;
    it.noperands = 2;
    it.numel = in.numel();
    it.ndim = static_cast<int>(in.dim());
    int64_t stride = 1;
    for (int d = it.ndim - 1; d >= 0; --d) {
      it.shape[d] = in.sizes()[d];
      it.strides[0][d] = stride;
      it.strides[1][d] = in.strides()[d];
      stride *= in.sizes()[d];
    }
    it.data[0] = static_cast<char*>(tmp.get());
    it.data[1] = const_cast<char*>(src);
    it.dtypes[0] = it.dtypes[1] = in.dtype();
    it.device = in.device();
    elementwise(backend::ElemOp::Copy, it);
    src = static_cast<const char*>(tmp.get());
  }
  int64_t row_bytes = inner * static_cast<int64_t>(esize);
  if (index.dtype() == DType::Int64) gather<int64_t>(out, src, index, outer, in_dim, row_bytes, stream);
  else gather<int32_t>(out, src, index, outer, in_dim, row_bytes, stream);
}

}  // namespace tg::cuda::kern

// ---- index_add: out[o, index[j], i] += src[o, j, i]; repeated indices add up with atomics.
namespace tg::cuda::kern {
namespace {
template <class S, class I>
__global__ void index_add_kernel(S* out, const S* src, const I* index, int64_t total, int64_t n, int64_t inner,
                                 int64_t out_dim) {
  int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (u >= total) return;
  int64_t i = u % inner, r = u / inner;
  int64_t j = r % n, o = r / n;
  atomicAdd(out + (o * out_dim + static_cast<int64_t>(index[j])) * inner + i, src[u]);
}
}  // namespace

void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  TG_CHECK(out.dtype() == src.dtype(), "index_add: dtypes ", dtype_name(out.dtype()), " and ", dtype_name(src.dtype()));
  cudaStream_t stream = detail::current_stream_handle(out.device().index());
  int64_t inner = 1;
  for (int64_t d = dim + 1; d < out.dim(); ++d) inner *= out.sizes()[d];
  const int64_t out_dim = out.dim() > 0 ? out.sizes()[dim] : 1, n = index.numel(), total = src.numel();
  if (total == 0) return;
  dispatch<kFloats>(out.dtype(), "index_add", [&](auto tag) {
    using S = typename decltype(tag)::type;
    unsigned grid = static_cast<unsigned>((total + kThreads - 1) / kThreads);
    auto go = [&](auto* idx) {
      index_add_kernel<<<grid, kThreads, 0, stream>>>(static_cast<S*>(out.data_ptr()),
                                                      static_cast<const S*>(src.data_ptr()), idx, total, n, inner,
                                                      out_dim);
      TG_CUDA_CHECK_LAUNCH();
    };
    if (index.dtype() == DType::Int64) go(static_cast<const int64_t*>(index.data_ptr()));
    else go(static_cast<const int32_t*>(index.data_ptr()));
  });
}
}  // namespace tg::cuda::kern

// ---- add_n: out = sum of up to kMaxAddN same-shaped contiguous tensors, one launch.
namespace tg::cuda::kern {
namespace {
template <class S>
struct AddNArgs {
  const S* in[backend::kMaxAddN];
  int n;
};
// 16-byte loads where every pointer is aligned (V elements per vector), scalar otherwise and for
// the tail: a gradient sum is a pure stream (n reads, one write), so it runs at DRAM speed only
// with wide accesses and enough bytes in flight.
template <class S, int V>
__global__ void add_n_kernel(S* out, AddNArgs<S> a, int64_t numel) {
  using Acc = std::conditional_t<std::is_same_v<S, double>, double, float>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t nvec = V > 1 ? numel / V : 0;
  for (int64_t i = first; i < nvec; i += stride) {
    Acc acc[V] = {};
#pragma unroll 4
    for (int k = 0; k < a.n; ++k) {
      const Vec<S, V> x = reinterpret_cast<const Vec<S, V>*>(a.in[k])[i];
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] += cast<Acc>(x.v[j]);
    }
    Vec<S, V> y;
#pragma unroll
    for (int j = 0; j < V; ++j) y.v[j] = cast<S>(acc[j]);
    reinterpret_cast<Vec<S, V>*>(out)[i] = y;
  }
  for (int64_t i = nvec * V + first; i < numel; i += stride) {
    Acc acc = 0;
    for (int k = 0; k < a.n; ++k) acc += cast<Acc>(a.in[k][i]);
    out[i] = cast<S>(acc);
  }
}
}  // namespace

void add_n(const Tensor& out, const std::vector<Tensor>& inputs) {
  TG_CHECK(inputs.size() >= 1 && inputs.size() <= static_cast<size_t>(backend::kMaxAddN), "add_n: ", inputs.size(),
           " inputs (1 to ", backend::kMaxAddN, " per launch)");
  cudaStream_t stream = detail::current_stream_handle(out.device().index());
  const int64_t numel = out.numel();
  dispatch<kFloats>(out.dtype(), "add_n", [&](auto tag) {
    using S = typename decltype(tag)::type;
    AddNArgs<S> a{};
    a.n = static_cast<int>(inputs.size());
    for (int k = 0; k < a.n; ++k) a.in[k] = static_cast<const S*>(inputs[k].data_ptr());
    constexpr int V = 16 / sizeof(S);
    bool aligned = reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0;
    for (int k = 0; k < a.n; ++k) aligned = aligned && reinterpret_cast<uintptr_t>(a.in[k]) % 16 == 0;
    const int64_t work = aligned ? numel / V + numel % V : numel;
    // Up to 8 blocks of kThreads per SM resident (a grid-stride loop past that).
    const int64_t cap = 8LL * sm_count(out.device().index());
    unsigned grid = static_cast<unsigned>(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, cap));
    if (aligned) add_n_kernel<S, V><<<grid, kThreads, 0, stream>>>(static_cast<S*>(out.data_ptr()), a, numel);
    else add_n_kernel<S, 1><<<grid, kThreads, 0, stream>>>(static_cast<S*>(out.data_ptr()), a, numel);
    TG_CUDA_CHECK_LAUNCH();
  });
}
}  // namespace tg::cuda::kern
