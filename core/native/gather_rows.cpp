// index_select_rows: the rows `index` of several tensors along dim 0 with one
// index (a DataLoader batch), kMaxGatherRows contiguous tensors per launch.
#include <algorithm>

#include <tapegrad/core/native.h>
#include <tapegrad/core/cuda_graph.h>

namespace tg::native {

std::vector<Tensor> index_select_rows(const std::vector<Tensor>& ts, const Tensor& index, bool check_bounds) {
  TG_CHECK(index.defined(), "index_select_rows: index is undefined");
  TG_CHECK(index.dtype() == kInt64 || index.dtype() == kInt32, "index_select_rows: index must be int64 or int32, got ",
           index.dtype());
  TG_CHECK(index.dim() == 1, "index_select_rows: index must be 1-d, got shape ", index.sizes());
  int64_t min_rows = -1;
  for (size_t k = 0; k < ts.size(); ++k) {
    const Tensor& t = ts[k];
    TG_CHECK(t.defined(), "index_select_rows: tensor ", k, " is undefined");
    TG_CHECK(t.dim() >= 1, "index_select_rows: tensor ", k, " is 0-d; rows are taken along dim 0");
    TG_CHECK(t.device() == index.device(), "index_select_rows: tensor ", k, " on ", t.device(), " but index on ",
             index.device());
    min_rows = min_rows < 0 ? t.size(0) : std::min(min_rows, t.size(0));
  }
  std::vector<Tensor> out(ts.size());
  if (ts.empty()) return out;
  Tensor idx = contiguous(index);
  // Under CUDA-graph capture nothing may wait for the device (as index_select).
  if (check_bounds && idx.is_cuda() && cuda::detail::stream_capturing(idx.device().index())) check_bounds = false;
  if (check_bounds && idx.numel() > 0) {
    const int64_t lo = reduce(backend::ReduceOp::Min, idx, DimList(), false).item<int64_t>();
    const int64_t hi = reduce(backend::ReduceOp::Max, idx, DimList(), false).item<int64_t>();
    TG_CHECK(lo >= 0 && hi < min_rows, "index_select_rows: index out of range: values in [", lo, ", ", hi,
             "] for dim 0 of size ", min_rows);
  }
  // Contiguous, non-empty tensors share launches; the rest take index_select one by one.
  std::vector<Tensor> ins, outs;
  auto flush = [&] {
    if (ins.empty()) return;
    backend::get(idx.device().type()).gather_rows(outs, ins, idx);
    ins.clear();
    outs.clear();
  };
  for (size_t k = 0; k < ts.size(); ++k) {
    const Tensor& t = ts[k];
    if (!t.is_contiguous()) {
      out[k] = index_select(t, 0, idx, /*check_bounds=*/false);
      continue;
    }
    Shape sz = t.sizes();
    sz[0] = idx.numel();
    out[k] = empty(sz, t.dtype(), t.device());
    if (out[k].numel() == 0) continue;
    ins.push_back(t);
    outs.push_back(out[k]);
    if (ins.size() == static_cast<size_t>(backend::kMaxGatherRows)) flush();
  }
  flush();
  return out;
}

}  // namespace tg::native
