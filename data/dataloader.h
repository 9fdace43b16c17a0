// tg::data::DataLoader: batches of a TensorDataset, shuffled and gathered on
// the tensors' device with no host synchronisation. Each epoch (each begin())
// draws a new device-side randperm; each batch gathers the rows of all tensors
// together (one launch on CUDA for up to 8 contiguous tensors).
// Unshuffled batches are views (slices) of the dataset's tensors.
//
//   tg::data::DataLoader loader(ds, {.batch_size = 4096, .shuffle = true});
//   for (auto [xb, yb] : loader) { ... }
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <iterator>
#include <optional>
#include <vector>

#include <tapegrad/data/dataset.h>

namespace tg::data {

struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;
  bool drop_last = false;
  // Seeds the shuffle with its own Philox stream (epoch e uses its own counters),
  // independent of tg::manual_seed and of other random calls. Without a seed the
  // device's global generator is used.
  std::optional<uint64_t> seed;
};

namespace detail {
void check_options(const DataLoaderOptions& o);
// The epoch's order on `device`: a seeded or global randperm of n (int64).
Tensor epoch_permutation(int64_t n, Device device, const DataLoaderOptions& o, uint64_t epoch);
// Rows [start, end) of t, in the order perm[start:end) when perm is defined.
Tensor gather_rows(const Tensor& t, const Tensor& perm, int64_t start, int64_t end);
// The same for n tensors at once into out[0, n): one multi-tensor gather (native::index_select_rows).
void gather_batch(const Tensor* tensors, Tensor* out, size_t n, const Tensor& perm, int64_t start, int64_t end);
std::vector<Tensor> gather_rows_checked(const std::vector<Tensor>& tensors, const Tensor& index);
}  // namespace detail

// The rows `index` (1-d int64/int32, on the tensors' device) of every tensor, in
// one launch on CUDA for up to 8 contiguous tensors: what a DataLoader batch does,
// for loops that keep their own order tensor (e.g. an epoch captured into a
// tg::cuda::Graph). Indices are bounds-checked (one host read-back), except while
// a CUDA graph is capturing.
template <size_t N>
std::array<Tensor, N> gather_rows(const std::array<Tensor, N>& tensors, const Tensor& index) {
  std::vector<Tensor> rows = detail::gather_rows_checked(std::vector<Tensor>(tensors.begin(), tensors.end()), index);
  std::array<Tensor, N> out;
  for (size_t k = 0; k < N; ++k) out[k] = std::move(rows[k]);
  return out;
}

template <size_t N>
class DataLoader {
 public:
  using Batch = std::array<Tensor, N>;

  DataLoader(TensorDataset<N> dataset, DataLoaderOptions options = {})
      : dataset_(std::move(dataset)), options_(options) {
    detail::check_options(options_);
  }

  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;

    Iterator() = default;
    Batch operator*() const {
      const int64_t n = loader_->dataset_.size(), bs = loader_->options_.batch_size;
      const int64_t start = batch_ * bs, end = std::min(n, start + bs);
      Batch out;
      detail::gather_batch(loader_->dataset_.tensors().data(), out.data(), N, perm_, start, end);
      return out;
    }
    Iterator& operator++() {
      ++batch_;
      return *this;
    }
    void operator++(int) { ++batch_; }
    bool operator==(const Iterator& o) const { return batch_ == o.batch_; }

   private:
    friend class DataLoader;
    Iterator(const DataLoader* loader, Tensor perm, int64_t batch)
        : loader_(loader), perm_(std::move(perm)), batch_(batch) {}
    const DataLoader* loader_ = nullptr;
    Tensor perm_;  // undefined when not shuffling
    int64_t batch_ = 0;
  };

  // Starts an epoch: a new order when shuffling.
  Iterator begin() {
    Tensor perm;
    if (options_.shuffle) perm = detail::epoch_permutation(dataset_.size(), dataset_.device(), options_, epoch_);
    ++epoch_;
    return Iterator(this, std::move(perm), 0);
  }
  Iterator end() const { return Iterator(this, Tensor(), static_cast<int64_t>(size())); }

  // Batches per epoch.
  size_t size() const {
    const int64_t n = dataset_.size(), bs = options_.batch_size;
    return static_cast<size_t>(options_.drop_last ? n / bs : (n + bs - 1) / bs);
  }
  uint64_t epoch() const { return epoch_; }  // epochs started so far
  const TensorDataset<N>& dataset() const { return dataset_; }
  const DataLoaderOptions& options() const { return options_; }

 private:
  TensorDataset<N> dataset_;
  DataLoaderOptions options_;
  uint64_t epoch_ = 0;
};

template <size_t N>
DataLoader(TensorDataset<N>, DataLoaderOptions) -> DataLoader<N>;
template <size_t N>
DataLoader(TensorDataset<N>) -> DataLoader<N>;

}  // namespace tg::data

// DataLoader<dynamic_extent>: the loader over a std::shared_ptr<Dataset>, with samplers and workers.
#include <tapegrad/data/dataset_loader.h>
