// CUDA gather_rows: rows `index` along dim 0 of up to kMaxGatherRows contiguous
// tensors in one launch (a DataLoader batch: features and targets together).
// Each tensor moves its rows in the widest word (16 down to 1 byte) that its row
// size and pointers allow; a thread copies one word of one tensor's row.
#include <algorithm>
#include <cstdint>

#include <tapegrad/core/backend/cuda/dependent_launch.cuh>
#include <tapegrad/core/backend/cuda/kernels.cuh>
#include <tapegrad/core/backend/cuda/loops.cuh>

namespace tg::cuda::kern {
namespace {

constexpr int kThreads = 256;
constexpr int kMax = backend::kMaxGatherRows;

struct GatherRowsArgs {
  const char* src[kMax];
  char* dst[kMax];
  int64_t words_per_row[kMax];
  int64_t begin[kMax + 1];  // first thread of tensor k; begin[count] = all threads
  int width_log2[kMax];     // word = 2^width_log2 bytes
  int count;
};

template <class W>
__device__ __forceinline__ void copy_word(const GatherRowsArgs& a, int k, int64_t dst_word, int64_t src_word) {
  reinterpret_cast<W*>(a.dst[k])[dst_word] = reinterpret_cast<const W*>(a.src[k])[src_word];
}

template <class I>
__global__ void __launch_bounds__(kThreads) gather_rows_multi_kernel(GatherRowsArgs a, const I* index) {
  wait_prior_grids();  // launched dependent (dependent_launch.cuh)
  const int64_t u = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (u >= a.begin[a.count]) return;
  int k = 0;
  while (u >= a.begin[k + 1]) ++k;
  const int64_t local = u - a.begin[k], wpr = a.words_per_row[k];
  const int64_t row = local / wpr, col = local - row * wpr;
  const int64_t src_word = static_cast<int64_t>(index[row]) * wpr + col;
  switch (a.width_log2[k]) {
    case 4:
      copy_word<uint4>(a, k, local, src_word);
      break;
    case 3:
      copy_word<uint2>(a, k, local, src_word);
      break;
    case 2:
      copy_word<uint32_t>(a, k, local, src_word);
      break;
    case 1:
      copy_word<uint16_t>(a, k, local, src_word);
      break;
    default:
      copy_word<uint8_t>(a, k, local, src_word);
      break;
  }
}

}  // namespace

void gather_rows(const std::vector<Tensor>& outs, const std::vector<Tensor>& ins, const Tensor& index) {
  TG_CHECK(!ins.empty() && ins.size() <= static_cast<size_t>(kMax) && outs.size() == ins.size(),
           "gather_rows: ", ins.size(), " inputs and ", outs.size(), " outputs (1 to ", kMax, " per launch)");
  TG_CHECK(index.dtype() == DType::Int64 || index.dtype() == DType::Int32,
           "gather_rows: index must be int64 or int32, got ", dtype_name(index.dtype()));
  const int64_t nidx = index.numel();
  GatherRowsArgs a{};
  a.count = static_cast<int>(ins.size());
  int64_t total = 0;
  for (int k = 0; k < a.count; ++k) {
    const Tensor& in = ins[static_cast<size_t>(k)];
    const Tensor& out = outs[static_cast<size_t>(k)];
    TG_CHECK(in.is_contiguous() && out.is_contiguous() && in.dim() >= 1, "gather_rows: tensor ", k,
             " must be contiguous and at least 1-d");
    const int64_t row_bytes =
        in.numel() / std::max<int64_t>(in.size(0), 1) * static_cast<int64_t>(element_size(in.dtype()));
    a.src[k] = static_cast<const char*>(in.data_ptr());
    a.dst[k] = static_cast<char*>(out.data_ptr());
    int w = 4;
    while (w > 0 && (row_bytes % (int64_t{1} << w) != 0 || reinterpret_cast<uintptr_t>(a.src[k]) % (1u << w) != 0 ||
                     reinterpret_cast<uintptr_t>(a.dst[k]) % (1u << w) != 0))
      --w;
    a.width_log2[k] = w;
    a.words_per_row[k] = std::max<int64_t>(row_bytes >> w, 1);
    a.begin[k] = total;
    total += row_bytes == 0 ? 0 : nidx * a.words_per_row[k];
  }
  a.begin[a.count] = total;
  if (total == 0) return;
  const int device = index.device().index();
  const LaunchShape shape{dim3(static_cast<unsigned>((total + kThreads - 1) / kThreads)), dim3(kThreads), 0,
                          detail::current_stream_handle(device), device};
  if (index.dtype() == DType::Int64)
    launch_dependent(gather_rows_multi_kernel<int64_t>, shape, a, static_cast<const int64_t*>(index.data_ptr()));
  else
    launch_dependent(gather_rows_multi_kernel<int32_t>, shape, a, static_cast<const int32_t*>(index.data_ptr()));
}

}  // namespace tg::cuda::kern
