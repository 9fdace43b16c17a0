// CUDA embedding backward (issue 15): grad_weight[index[j]] += grad[j].
//
// Deterministic (the default, tg::are_deterministic_algorithms_enabled()): the indices are sorted
// with their positions (CUB radix sort over only the bits num_embeddings needs, stable), then
// blocks of 32 sorted positions sum the gradient rows of each index in float (double for float64)
// in position order; a run of one index that crosses a block edge is finished by a second kernel
// that adds its blocks' partial rows in order. A fixed order, no atomics, each output row written
// once, and a frequent index spread over many blocks. Why not index_add: its kernel adds
// with atomics (order-dependent rounding, and float16 atomics round every step).
// Non-deterministic (opted into): float32 / float64 add with atomicAdd straight into the table.
#include <cub/device/device_radix_sort.cuh>
#include <type_traits>

#include <tapegrad/core/backend/cuda/kernels.cuh>
#include <tapegrad/core/backend/cuda/loops.cuh>
#include <tapegrad/core/backend/cuda/reduce.cuh>

namespace tg::cuda::kern {
namespace {

constexpr int kThreads = 128;

template <class I>
__global__ void iota_kernel(I* pos, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    pos[i] = static_cast<I>(i);
}

constexpr int64_t kChunk = 32;  // sorted positions per block of chunk_sum_kernel

// Block j sums the sorted positions [j * kChunk, (j + 1) * kChunk), piece by piece (a piece: the
// positions of one index inside the chunk). A piece that is a whole run (its index starts and
// ends inside the chunk) is written to its output row at once; a run crossing a chunk edge leaves
// its pieces as float partial rows: the chunk's first piece in slot 2j, its last in slot 2j + 1.
// So a frequent index is spread over many blocks, not summed by one.
template <class T, class K, class I>
__global__ void chunk_sum_kernel(const K* __restrict__ keys, const I* __restrict__ pos, const T* __restrict__ grad,
                                 T* __restrict__ out,
                                 std::conditional_t<std::is_same_v<T, double>, double, float>* partial, int64_t n,
                                 int64_t dim, int64_t padding_idx) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const int64_t j = blockIdx.x, lo = j * kChunk, hi = lo + kChunk < n ? lo + kChunk : n;
  for (int64_t i = lo; i < hi;) {
    const K key = keys[i];
    int64_t e = i + 1;
    while (e < hi && keys[e] == key) ++e;
    const bool before = i == lo && lo > 0 && keys[lo - 1] == key;
    const bool after = e == hi && hi < n && keys[hi] == key;
    if (static_cast<int64_t>(key) != padding_idx) {
      A* slot = before || after ? partial + (i == lo ? 2 * j : 2 * j + 1) * dim : nullptr;
      T* dst = out + static_cast<int64_t>(key) * dim;
      for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
        A acc = 0;
        for (int64_t r = i; r < e; ++r) acc += cast<A>(grad[static_cast<int64_t>(pos[r]) * dim + c]);
        if (slot)
          slot[c] = acc;
        else
          dst[c] = cast<T>(acc);
      }
    }
    i = e;
  }
}

// Block b, when b starts a run that crosses a chunk edge: adds the run's partial rows chunk by
// chunk (a fixed order) and writes its output row.
template <class T, class K>
__global__ void run_finish_kernel(const K* __restrict__ keys,
                                  const std::conditional_t<std::is_same_v<T, double>, double, float>* partial,
                                  T* __restrict__ out, int64_t n, int64_t dim, int64_t padding_idx) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  for (int64_t b = blockIdx.x; b < n; b += gridDim.x) {
    const K key = keys[b];
    if ((b > 0 && keys[b - 1] == key) || static_cast<int64_t>(key) == padding_idx) continue;
    const int64_t first = b / kChunk;
    // The run crosses an edge exactly when the chunk's last position (or the next) has its key.
    const int64_t edge = (first + 1) * kChunk;
    if (edge >= n || keys[edge] != key) continue;
    int64_t e = edge + 1;
    while (e < n && keys[e] == key) ++e;
    const int64_t last = (e - 1) / kChunk;
    T* dst = out + static_cast<int64_t>(key) * dim;
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
      A acc = 0;
      for (int64_t ch = first; ch <= last; ++ch) {
        const int64_t slot = ch == first && b != first * kChunk ? 2 * ch + 1 : 2 * ch;
        acc += partial[slot * dim + c];
      }
      dst[c] = cast<T>(acc);
    }
  }
}

template <class T, class K>
__global__ void atomic_kernel(const K* __restrict__ index, const T* __restrict__ grad, T* __restrict__ out, int64_t n,
                              int64_t dim, int64_t padding_idx) {
  const int64_t total = n * dim;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = i / dim, c = i - j * dim;
    const int64_t r = static_cast<int64_t>(index[j]);
    if (r != padding_idx) atomicAdd(out + r * dim + c, grad[i]);
  }
}

int bits_for(int64_t num) {
  int b = 1;
  while (b < 63 && (int64_t{1} << b) < num) ++b;
  return b;
}

template <class T, class K>
void sorted_backward(const Tensor& gw, const Tensor& grad, const Tensor& index, int64_t padding_idx, int device,
                     cudaStream_t stream) {
  using I = int32_t;  // positions (n < 2^31 checked by the caller)
  const int64_t n = index.numel(), dim = grad.sizes()[1], num = gw.sizes()[0];
  const K* keys_in = static_cast<const K*>(index.data_ptr());
  size_t temp_bytes = 0;
  const int end_bit = bits_for(num);
  TG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, static_cast<K*>(nullptr),
                                                static_cast<const I*>(nullptr), static_cast<I*>(nullptr),
                                                static_cast<int>(n), 0, end_bit, stream));
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const size_t kb = (static_cast<size_t>(n) * sizeof(K) + 255) / 256 * 256;
  const size_t pb = (static_cast<size_t>(n) * sizeof(I) + 255) / 256 * 256;
  const size_t sb = static_cast<size_t>(2 * chunks) * static_cast<size_t>(dim) * sizeof(A);  // partial rows
  DataPtr ws = detail::device_allocate(sb + kb + 2 * pb + temp_bytes, device);
  char* base = static_cast<char*>(ws.get());
  A* partial = reinterpret_cast<A*>(base);
  K* keys_out = reinterpret_cast<K*>(base + sb);
  I* pos_in = reinterpret_cast<I*>(base + sb + kb);
  I* pos_out = reinterpret_cast<I*>(base + sb + kb + pb);
  void* temp = base + sb + kb + 2 * pb;
  const auto grid = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, int64_t{sm_count(device)} * 8));
  iota_kernel<I><<<grid, 256, 0, stream>>>(pos_in, n);
  TG_CUDA_CHECK_LAUNCH();
  TG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, pos_in, pos_out,
                                                static_cast<int>(n), 0, end_bit, stream));
  T* out = static_cast<T*>(gw.data_ptr());
  chunk_sum_kernel<T, K, I><<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(
      keys_out, pos_out, static_cast<const T*>(grad.data_ptr()), out, partial, n, dim, padding_idx);
  TG_CUDA_CHECK_LAUNCH();
  const auto fgrid = static_cast<unsigned>(std::min<int64_t>(n, int64_t{sm_count(device)} * 32));
  run_finish_kernel<T, K><<<fgrid, kThreads, 0, stream>>>(keys_out, partial, out, n, dim, padding_idx);
  TG_CUDA_CHECK_LAUNCH();
}

}  // namespace

void embedding_backward(const Tensor& gw, const Tensor& grad, const Tensor& index, int64_t padding_idx,
                        bool deterministic) {
  const int device = gw.device().index();
  cudaStream_t stream = detail::current_stream_handle(device);
  const int64_t n = index.numel(), dim = grad.sizes()[1];
  TG_CHECK(n < (int64_t{1} << 31), "embedding backward: at most 2^31 - 1 indices on CUDA, got ", n);
  const bool is64 = index.dtype() == kInt64;
  dispatch<kFloats>(grad.dtype(), "embedding backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      if (!deterministic) {
        const int64_t total = n * dim;
        const auto grid = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, int64_t{sm_count(device)} * 16));
        if (is64)
          atomic_kernel<T, int64_t><<<grid, 256, 0, stream>>>(static_cast<const int64_t*>(index.data_ptr()),
                                                              static_cast<const T*>(grad.data_ptr()),
                                                              static_cast<T*>(gw.data_ptr()), n, dim, padding_idx);
        else
          atomic_kernel<T, int32_t><<<grid, 256, 0, stream>>>(static_cast<const int32_t*>(index.data_ptr()),
                                                              static_cast<const T*>(grad.data_ptr()),
                                                              static_cast<T*>(gw.data_ptr()), n, dim, padding_idx);
        TG_CUDA_CHECK_LAUNCH();
        return;
      }
    }
    if (is64)
      sorted_backward<T, int64_t>(gw, grad, index, padding_idx, device, stream);
    else
      sorted_backward<T, int32_t>(gw, grad, index, padding_idx, device, stream);
  });
}

}  // namespace tg::cuda::kern
