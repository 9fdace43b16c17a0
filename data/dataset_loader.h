// DataLoader<dynamic_extent>: batches of a map-style tg::data::Dataset (data/dataset.h), the
// PyTorch DataLoader. A sampler gives each epoch's indices, consecutive runs of batch_size of them
// are batches (PyTorch's BatchSampler), a collate function turns the samples into a batch.
// num_workers threads prepare batches ahead (at most prefetch_factor per worker) and the loop
// receives them in order; with pin_memory the batch is collated into pinned host memory, and with
// a CUDA `device` copied there on a side stream that the consumer's stream waits on (no host sync).
//
//   auto ds = std::make_shared<MyDataset>(...);
//   tg::data::DataLoader loader(ds, {.batch_size = 512, .shuffle = true, .num_workers = 4,
//                                    .pin_memory = true, .device = tg::kCUDA});
//   for (const std::vector<tg::Tensor>& batch : loader) { ... }
//
// The deduction guide picks this loader for a std::shared_ptr to a Dataset and DataLoader<N>
// (data/dataloader.h) for a TensorDataset<N>, as std::span picks dynamic_extent.
#pragma once
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include <tapegrad/data/dataloader.h>
#include <tapegrad/data/dataset.h>
#include <tapegrad/data/sampler.h>

namespace tg::data {

inline constexpr size_t dynamic_extent = std::numeric_limits<size_t>::max();

// Turns a batch's samples (each a Dataset::get result) into the batch's tensors.
using CollateFn = std::function<std::vector<Tensor>(const std::vector<std::vector<Tensor>>& samples)>;

// PyTorch's default_collate for tensor fields: field k of the batch is stack(sample[k], 0) over
// the samples. Every sample needs the same number of fields, and field k the same shape, dtype and
// device in every sample (tg::Error naming the field, the samples and their shapes otherwise).
// CPU fields are copied with one memcpy per contiguous sample.
std::vector<Tensor> default_collate(const std::vector<std::vector<Tensor>>& samples);

struct DatasetLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;    // a RandomSampler (seeded by `seed`); exclusive with `sampler`
  bool drop_last = false;  // drop the last batch when it is short
  int64_t num_workers = 0;  // 0: batches are made in the iterating thread when it asks
  bool pin_memory = false;  // collate CPU batches into pinned memory (when a GPU is present)
  // Copy each batch there: on CUDA from pinned memory on the loader's side stream; the batch's
  // first use on the consumer's current stream waits for the copy on the GPU, not the host.
  std::optional<Device> device;
  int64_t prefetch_factor = 2;  // batches prepared ahead per worker
  std::optional<uint64_t> seed;  // the shuffle's seed (see RandomSampler)
  std::shared_ptr<Sampler> sampler;  // the indices of each epoch (default: sequential or shuffled)
  CollateFn collate_fn;              // default: default_collate
};

namespace detail {
class LoaderEpoch;  // one epoch's workers and queue (data/dataset_loader.cpp)
struct LoaderShared;
}  // namespace detail

template <>
class DataLoader<dynamic_extent> {
 public:
  using Batch = std::vector<Tensor>;

  explicit DataLoader(std::shared_ptr<const Dataset> dataset, DatasetLoaderOptions options = {});
  ~DataLoader();
  DataLoader(DataLoader&&) noexcept;
  DataLoader& operator=(DataLoader&&) noexcept;

  // Holds its epoch: the last iterator of an epoch to die (the loop's, when a range-for ends or
  // breaks) stops that epoch's workers and joins them. One thread reads an epoch, in order.
  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;

    Iterator() = default;
    // Waits for the batch; an exception thrown while making it (in Dataset::get, the sampler's
    // indices, the collation) is rethrown here as a tg::Error naming the batch and worker, and
    // stops the epoch.
    Batch operator*() const;
    Iterator& operator++() {
      ++batch_;
      return *this;
    }
    void operator++(int) { ++batch_; }
    bool operator==(const Iterator& o) const { return batch_ == o.batch_; }

   private:
    friend class DataLoader;
    Iterator(std::shared_ptr<detail::LoaderEpoch> epoch, int64_t batch) : epoch_(std::move(epoch)), batch_(batch) {}
    std::shared_ptr<detail::LoaderEpoch> epoch_;
    int64_t batch_ = 0;
  };

  // Starts an epoch: the sampler's next indices, and the workers.
  Iterator begin();
  Iterator end() const;  // compares equal once the started epoch's batches are consumed

  size_t size() const;  // batches per epoch
  uint64_t epoch() const { return epoch_; }  // epochs started so far
  const std::shared_ptr<const Dataset>& dataset() const { return dataset_; }
  const DatasetLoaderOptions& options() const { return options_; }
  const std::shared_ptr<Sampler>& sampler() const { return sampler_; }

 private:
  std::shared_ptr<const Dataset> dataset_;
  DatasetLoaderOptions options_;
  std::shared_ptr<Sampler> sampler_;
  std::shared_ptr<detail::LoaderShared> shared_;  // the CUDA side stream, made on first use
  uint64_t epoch_ = 0;
  int64_t last_batches_ = 0;  // batches of the last started epoch (end())
};

template <typename D>
requires std::derived_from<std::remove_cv_t<D>, Dataset>
DataLoader(std::shared_ptr<D>, DatasetLoaderOptions) -> DataLoader<dynamic_extent>;
template <typename D>
requires std::derived_from<std::remove_cv_t<D>, Dataset>
DataLoader(std::shared_ptr<D>) -> DataLoader<dynamic_extent>;

// Image batches [..., C, H, W] of uint8 (0..255) to float32 (x / 255 - mean[c]) / std[c] on the
// batch's device (torchvision's ToTensor + Normalize), as one cast and two in-place elementwise ops.
// mean and std have C entries, std > 0.
Tensor normalize_images(const Tensor& images, const std::vector<double>& mean, const std::vector<double>& std);

}  // namespace tg::data
