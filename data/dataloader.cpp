// DataLoader and TensorDataset helpers: validation, the epoch permutation, and
// the per-batch gather (device-side, no host sync).
#include <tapegrad/data/dataloader.h>

#include <vector>

#include <tapegrad/core/native.h>
#include <tapegrad/core/philox.h>

namespace tg::data::detail {

void check_dataset(const Tensor* t, size_t n) {
  for (size_t k = 0; k < n; ++k) {
    TG_CHECK(t[k].defined(), "TensorDataset: tensor ", k, " is undefined");
    TG_CHECK(t[k].dim() >= 1, "TensorDataset: tensor ", k, " is 0-d; every tensor needs a sample dim 0");
    TG_CHECK(t[k].size(0) == t[0].size(0), "TensorDataset: size mismatch on dim 0: tensor 0 has shape ", t[0].sizes(),
             " but tensor ", k, " has shape ", t[k].sizes());
    TG_CHECK(t[k].device() == t[0].device(), "TensorDataset: tensor 0 is on ", t[0].device(), " but tensor ", k,
             " is on ", t[k].device(), "; put all tensors on one device");
  }
}

void check_options(const DataLoaderOptions& o) {
  TG_CHECK(o.batch_size > 0, "DataLoader: batch_size must be positive, got ", o.batch_size);
}

Tensor epoch_permutation(int64_t n, Device device, const DataLoaderOptions& o, uint64_t epoch) {
  if (!o.seed) return native::randperm(n, kInt64, device);
  // Epoch e owns counters [e * span, (e + 1) * span) of the seed's Philox stream.
  const uint64_t span = philox::counters_for(2 * static_cast<uint64_t>(n), 4);
  return native::randperm(n, kInt64, device, *o.seed, epoch * span);
}

Tensor gather_rows(const Tensor& t, const Tensor& perm, int64_t start, int64_t end) {
  if (!perm.defined()) return native::slice(t, 0, start, end, 1);
  // The permutation is known to be in range: skip the bounds check (it would sync).
  return native::index_select(t, 0, native::slice(perm, 0, start, end, 1), /*check_bounds=*/false);
}

void gather_batch(const Tensor* tensors, Tensor* out, size_t n, const Tensor& perm, int64_t start, int64_t end) {
  if (!perm.defined()) {
    for (size_t k = 0; k < n; ++k) out[k] = native::slice(tensors[k], 0, start, end, 1);
    return;
  }
  // The permutation is known to be in range: no bounds check (it would sync).
  std::vector<Tensor> rows = native::index_select_rows(std::vector<Tensor>(tensors, tensors + n),
                                                       native::slice(perm, 0, start, end, 1), /*check_bounds=*/false);
  for (size_t k = 0; k < n; ++k) out[k] = std::move(rows[k]);
}

std::vector<Tensor> gather_rows_checked(const std::vector<Tensor>& tensors, const Tensor& index) {
  return native::index_select_rows(tensors, index, /*check_bounds=*/true);
}

}  // namespace tg::data::detail
