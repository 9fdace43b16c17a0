// CPU index_select: gathers slices of `in` along `dim` into a contiguous `out`.
// A contiguous input copies whole inner rows with memcpy; any other layout
// walks the output with an index counter, by element size (the gather only
// moves bytes, so dtype does not matter).
#include <algorithm>
#include <cstring>
#include <vector>

#include <tapegrad/core/backend/cpu/cpu.h>
#include <tapegrad/core/backend/cpu/thread_pool.h>
#include <tapegrad/core/error.h>

namespace tg::cpu {

namespace {

// Reads index[j] whatever its integer dtype.
struct IndexReader {
  const void* data;
  bool is64;
  int64_t operator[](int64_t j) const {
    return is64 ? static_cast<const int64_t*>(data)[j] : static_cast<const int32_t*>(data)[j];
  }
};

template <typename E>
void gather_strided(const Tensor& out, const Tensor& in, int64_t dim, IndexReader index) {
  E* dst = static_cast<E*>(out.data_ptr());
  const E* src = static_cast<const E*>(in.data_ptr());
  const int nd = static_cast<int>(in.dim());
  const std::vector<int64_t> shape(out.sizes().begin(), out.sizes().end());
  const std::vector<int64_t> st(in.strides().begin(), in.strides().end());
  parallel(0, out.numel(), kGrain, [&](int64_t lo, int64_t hi) {
    std::vector<int64_t> idx(static_cast<size_t>(nd));
    int64_t base = 0;  // offset from every dim except `dim`
    int64_t rem = lo;
    for (int d = nd - 1; d >= 0; --d) {
      idx[d] = rem % shape[d];
      rem /= shape[d];
      if (d != dim) base += idx[d] * st[d];
    }
    for (int64_t e = lo; e < hi; ++e) {
      dst[e] = src[base + index[idx[dim]] * st[dim]];
      for (int d = nd - 1; d >= 0; --d) {
        ++idx[d];
        if (d != dim) base += st[d];
        if (idx[d] < shape[d]) break;
        if (d != dim) base -= shape[d] * st[d];
        idx[d] = 0;
      }
    }
  });
}

}  // namespace

void index_select(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index) {
  TG_CHECK(index.dtype() == kInt64 || index.dtype() == kInt32, "index_select: index must be int64 or int32, got ",
           dtype_name(index.dtype()));
  TG_CHECK(out.dtype() == in.dtype(), "index_select: output dtype ", dtype_name(out.dtype()), " differs from input ",
           dtype_name(in.dtype()));
  const IndexReader idx{index.data_ptr(), index.dtype() == kInt64};
  const int64_t nidx = index.numel();
  const size_t es = element_size(in.dtype());
  if (out.numel() == 0) return;
  if (in.dim() == 0) {  // a scalar: every selected element is the one value
    for (int64_t j = 0; j < out.numel(); ++j)
      std::memcpy(static_cast<char*>(out.data_ptr()) + j * es, in.data_ptr(), es);
    return;
  }
  if (in.is_contiguous()) {
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= in.sizes()[d];
    for (int64_t d = dim + 1; d < in.dim(); ++d) inner *= in.sizes()[d];
    const int64_t size = in.sizes()[dim];
    const size_t row = static_cast<size_t>(inner) * es;
    char* dst = static_cast<char*>(out.data_ptr());
    const char* src = static_cast<const char*>(in.data_ptr());
    parallel(0, outer * nidx, std::max<int64_t>(1, kGrain / std::max<int64_t>(inner, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t o = r / nidx, j = r % nidx;
        std::memcpy(dst + static_cast<size_t>(r) * row, src + static_cast<size_t>(o * size + idx[j]) * row, row);
      }
    });
    return;
  }
  switch (es) {
    case 1:
      return gather_strided<uint8_t>(out, in, dim, idx);
    case 2:
      return gather_strided<uint16_t>(out, in, dim, idx);
    case 4:
      return gather_strided<uint32_t>(out, in, dim, idx);
    default:
      return gather_strided<uint64_t>(out, in, dim, idx);
  }
}

}  // namespace tg::cpu
