// CUDA cumsum and the row sort behind sort / argsort / topk (issue 15).
// cumsum: one row is the whole problem -> cub::DeviceScan::InclusiveSum; many rows -> one block
// per row scanning tiles with cub::BlockScan and a running carry (CUB has no segmented scan),
// accumulating in float for float16 / bfloat16 (double for float64, int64 for integers).
// sort: cub::DeviceSegmentedRadixSort over the rows (stable, so ties keep their order; a
// positive NaN sorts after +inf, i.e. as the largest value, as PyTorch's).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>

#include <tapegrad/core/backend/cuda/runtime.h>
#include <tapegrad/core/backend/cuda/kernels.cuh>
#include <tapegrad/core/backend/cuda/loops.cuh>

namespace tg::cuda::kern {
namespace {

constexpr int kThreads = 256;

template <class S, class O, class Acc>
__global__ void cumsum_rows_kernel(O* out, const S* in, int64_t n) {
  using BlockScan = cub::BlockScan<Acc, kThreads>;
  __shared__ typename BlockScan::TempStorage temp;
  const S* x = in + static_cast<int64_t>(blockIdx.x) * n;
  O* y = out + static_cast<int64_t>(blockIdx.x) * n;
  Acc carry = Acc(0);
  for (int64_t base = 0; base < n; base += kThreads) {
    const int64_t j = base + threadIdx.x;
    Acc v = j < n ? cast<Acc>(x[j]) : Acc(0);
    Acc incl, total;
    BlockScan(temp).InclusiveSum(v, incl, total);
    if (j < n) y[j] = cast<O>(carry + incl);
    carry += total;
    __syncthreads();  // temp is reused by the next tile
  }
}

template <class S, class O, class Acc>
void cumsum_impl(const Tensor& out, const Tensor& in, cudaStream_t stream) {
  const int64_t rows = in.sizes()[0], n = in.sizes()[1];
  const auto* x = static_cast<const S*>(in.data_ptr());
  auto* y = static_cast<O*>(out.data_ptr());
  if constexpr (std::is_same_v<S, O> && std::is_same_v<S, Acc>) {
    if (rows == 1 && n > 4 * kThreads && n <= INT32_MAX) {
      size_t temp_bytes = 0;
      TG_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, temp_bytes, x, y, static_cast<int>(n), stream));
      DataPtr temp = detail::device_allocate(std::max<size_t>(temp_bytes, 1), out.device().index());
      TG_CUDA_CHECK(cub::DeviceScan::InclusiveSum(temp.get(), temp_bytes, x, y, static_cast<int>(n), stream));
      return;
    }
  }
  TG_CHECK(rows <= INT32_MAX, "cumsum: too many rows (", rows, ") for one launch");
  cumsum_rows_kernel<S, O, Acc><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(y, x, n);
  TG_CUDA_CHECK_LAUNCH();
}

__global__ void iota_rows_kernel(int64_t* idx, int64_t* offsets, int64_t rows, int64_t n) {
  const int64_t total = rows * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    idx[i] = i % n;
    if (i % n == 0) offsets[i / n] = i;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) offsets[rows] = total;
}

}  // namespace

void cumsum(const Tensor& out, const Tensor& in) {
  cudaStream_t stream = detail::current_stream_handle(out.device().index());
  switch (in.dtype()) {
    case DType::Int64:
      return cumsum_impl<int64_t, int64_t, int64_t>(out, in, stream);
    case DType::Int32:
      return cumsum_impl<int32_t, int64_t, int64_t>(out, in, stream);
    case DType::Bool:
      return cumsum_impl<bool, int64_t, int64_t>(out, in, stream);
    case DType::UInt8:
      return cumsum_impl<uint8_t, int64_t, int64_t>(out, in, stream);
    case DType::Int8:
      return cumsum_impl<int8_t, int64_t, int64_t>(out, in, stream);
    case DType::Int16:
      return cumsum_impl<int16_t, int64_t, int64_t>(out, in, stream);
    default:
      break;
  }
  dispatch<kFloats>(in.dtype(), "cumsum", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using Acc = std::conditional_t<std::is_same_v<S, double>, double, float>;
    cumsum_impl<S, S, Acc>(out, in, stream);
  });
}

void sort(const Tensor& values, const Tensor& indices, const Tensor& in, bool descending) {
  const int device = in.device().index();
  cudaStream_t stream = detail::current_stream_handle(device);
  const int64_t rows = in.sizes()[0], n = in.sizes()[1], total = rows * n;
  TG_CHECK(total <= INT32_MAX && rows < INT32_MAX, "sort: ", total, " elements in ", rows,
           " rows is more than one CUB segmented sort takes (2^31 - 1)");
  dispatch<kFloats | kInts | kBoolSet>(in.dtype(), "sort", [&](auto tag) {
    using S = typename decltype(tag)::type;
    // Workspace: the row offsets, the index input, then CUB's temp storage.
    const size_t ob = (static_cast<size_t>(rows + 1) * sizeof(int64_t) + 255) / 256 * 256;
    const size_t ib = (static_cast<size_t>(total) * sizeof(int64_t) + 255) / 256 * 256;
    const auto* keys_in = static_cast<const S*>(in.data_ptr());
    auto* keys_out = static_cast<S*>(values.data_ptr());
    auto* vals_out = static_cast<int64_t*>(indices.data_ptr());
    auto run = [&](void* temp, size_t& temp_bytes, const int64_t* vals_in, const int64_t* offsets) {
      const int items = static_cast<int>(total), segs = static_cast<int>(rows);
      if (descending)
        return cub::DeviceSegmentedRadixSort::SortPairsDescending(temp, temp_bytes, keys_in, keys_out, vals_in,
                                                                  vals_out, items, segs, offsets, offsets + 1, 0,
                                                                  static_cast<int>(sizeof(S) * 8), stream);
      return cub::DeviceSegmentedRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, vals_in, vals_out, items,
                                                      segs, offsets, offsets + 1, 0, static_cast<int>(sizeof(S) * 8),
                                                      stream);
    };
    size_t temp_bytes = 0;
    TG_CUDA_CHECK(run(nullptr, temp_bytes, nullptr, nullptr));
    DataPtr ws = detail::device_allocate(ob + ib + std::max<size_t>(temp_bytes, 1), device);
    char* base = static_cast<char*>(ws.get());
    auto* offsets = reinterpret_cast<int64_t*>(base);
    auto* vals_in = reinterpret_cast<int64_t*>(base + ob);
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>((total + kThreads - 1) / kThreads, 65535LL * 8));
    iota_rows_kernel<<<std::max(grid, 1u), kThreads, 0, stream>>>(vals_in, offsets, rows, n);
    TG_CUDA_CHECK_LAUNCH();
    TG_CUDA_CHECK(run(base + ob + ib, temp_bytes, vals_in, offsets));
  });
}

}  // namespace tg::cuda::kern
