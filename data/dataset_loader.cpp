// DataLoader<dynamic_extent>: the epoch's worker threads and bounded, ordered prefetch queue,
// default collation (one memcpy per contiguous CPU sample, into pinned memory when asked), the
// side-stream copy to a CUDA device, and normalize_images.
//
// Queue: batch b lives in slot b % capacity (capacity = prefetch_factor * num_workers); a worker
// may claim batch b only once batch b - capacity was taken, so slots never collide and at most
// `capacity` batches are prepared ahead. Workers claim batches in order from one counter; the
// consumer takes them in order.
//
// CUDA: a worker collates into pinned memory (the caching host allocator), copies it on the
// loader's side stream and records an event there. When the consumer takes the batch, its current
// stream waits for that event and the device blocks are marked as used on it (record_stream), so
// the caching allocator does not hand them to the side stream's next copy before the consumer's
// work on them ends; the pinned buffer is kept from reuse until its copy ends (record_host_use,
// called by the non-blocking copy).
#include <tapegrad/data/dataset_loader.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include <tapegrad/core/backend/backend.h>
#include <tapegrad/core/cuda.h>
#include <tapegrad/core/error.h>
#include <tapegrad/core/native.h>
#include <tapegrad/core/shape.h>

#if defined(TG_WITH_CUDA)
#include <tapegrad/core/backend/cuda/runtime.h>
#endif

namespace tg::data {
namespace detail {
namespace {

// Uninitialised contiguous CPU memory; pinned (page-locked) when asked and a GPU is present.
Tensor host_empty(const Shape& sizes, DType dtype, bool pinned) {
#if defined(TG_WITH_CUDA)
  if (pinned && cuda::is_available()) {
    const size_t nbytes = tg::detail::storage_nbytes(sizes, element_size(dtype), "DataLoader");
    auto storage = std::make_shared<Storage>(cuda::detail::host_allocate(nbytes), nbytes, Device(kCPU));
    return Tensor(std::make_shared<TensorImpl>(std::move(storage), sizes, tg::detail::contiguous_strides(sizes), 0,
                                               dtype));
  }
#else
  (void)pinned;
#endif
  return native::empty(sizes, dtype, Device(kCPU));
}

bool is_pinned(const Tensor& t) {
#if defined(TG_WITH_CUDA)
  return t.is_cpu() && t.numel() > 0 && cuda::is_available() && cuda::detail::is_pinned(t.impl().storage->data());
#else
  (void)t;
  return false;
#endif
}

// A CPU tensor in pinned memory (itself when it already is).
Tensor pin(const Tensor& t) {
  if (!t.defined() || !t.is_cpu() || is_pinned(t)) return t;
  Tensor out = host_empty(t.sizes(), t.dtype(), true);
  native::copy_(out, t);
  return out;
}

std::string describe(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return tg::detail::str_cat(t.sizes(), " ", t.dtype(), " on ", t.device());
}

// default_collate into pinned memory or not; ids (may be null) are the samples' dataset indices.
std::vector<Tensor> collate(const std::vector<std::vector<Tensor>>& samples, const int64_t* ids, bool pinned) {
  TG_CHECK(!samples.empty(), "default_collate: no samples");
  auto name = [&](size_t j) {
    return ids ? tg::detail::str_cat("sample ", j, " (dataset index ", ids[j], ")") : tg::detail::str_cat("sample ", j);
  };
  const size_t nfields = samples[0].size();
  for (size_t j = 1; j < samples.size(); ++j)
    TG_CHECK(samples[j].size() == nfields, "default_collate: ", name(j), " has ", samples[j].size(), " fields but ",
             name(0), " has ", nfields);
  const auto b = static_cast<int64_t>(samples.size());
  std::vector<Tensor> out(nfields);
  for (size_t k = 0; k < nfields; ++k) {
    const Tensor& first = samples[0][k];
    TG_CHECK(first.defined(), "default_collate: field ", k, " of ", name(0), " is undefined");
    for (size_t j = 1; j < samples.size(); ++j) {
      const Tensor& t = samples[j][k];
      TG_CHECK(t.defined() && t.sizes() == first.sizes() && t.dtype() == first.dtype() && t.device() == first.device(),
               "default_collate: field ", k, " of ", name(j), " is ", describe(t), " but of ", name(0), " it is ",
               describe(first), "; every sample's field must have one shape, dtype and device to be stacked");
    }
    if (!first.is_cpu()) {
      std::vector<Tensor> column;
      column.reserve(samples.size());
      for (const auto& s : samples) column.push_back(s[k]);
      out[k] = native::stack(column, 0);
      continue;
    }
    Shape shape{b};
    shape.insert(shape.end(), first.sizes().begin(), first.sizes().end());
    Tensor batch = host_empty(shape, first.dtype(), pinned);
    const size_t bytes = first.nbytes();
    if (bytes > 0) {
      char* dst = static_cast<char*>(batch.data_ptr());
      for (size_t j = 0; j < samples.size(); ++j) {
        const Tensor& t = samples[j][k];
        if (t.is_contiguous())
          std::memcpy(dst + j * bytes, t.data_ptr(), bytes);
        else
          native::copy_(native::select(batch, 0, static_cast<int64_t>(j)), t);
      }
    }
    out[k] = std::move(batch);
  }
  return out;
}

}  // namespace

// What a loader's epochs share: the side stream of its CUDA device, made on first use.
struct LoaderShared {
  std::mutex mu;
  std::unique_ptr<cuda::Stream> side;
  cuda::Stream& side_stream(int device) {
    std::lock_guard<std::mutex> lock(mu);
    if (!side) side = std::make_unique<cuda::Stream>(device);
    return *side;
  }
};

namespace {

struct Slot {
  bool ready = false;
  std::vector<Tensor> batch;
  std::string error;                    // non-empty: making the batch failed
  std::unique_ptr<cuda::Event> copied;  // recorded on the side stream after the copies
};

}  // namespace

class LoaderEpoch {
 public:
  LoaderEpoch(std::shared_ptr<const Dataset> dataset, const DatasetLoaderOptions& o,
              std::shared_ptr<LoaderShared> shared, std::vector<int64_t> indices)
      : dataset_(std::move(dataset)),
        options_(o),
        shared_(std::move(shared)),
        indices_(std::move(indices)),
        size_(dataset_->size()) {
    const auto n = static_cast<int64_t>(indices_.size()), bs = o.batch_size;
    nbatches_ = o.drop_last ? n / bs : (n + bs - 1) / bs;
    transfer_ = o.device && o.device->is_cuda();
    pinned_ = o.pin_memory || transfer_;
    workers_ = static_cast<int>(o.num_workers);
    capacity_ = std::max<int64_t>(1, o.prefetch_factor * o.num_workers);
  }

  ~LoaderEpoch() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  LoaderEpoch(const LoaderEpoch&) = delete;
  LoaderEpoch& operator=(const LoaderEpoch&) = delete;

  void start() {
    if (workers_ == 0) return;
    slots_.resize(static_cast<size_t>(capacity_));
    threads_.reserve(static_cast<size_t>(workers_));
    for (int w = 0; w < workers_; ++w) threads_.emplace_back([this, w] { work(w); });
  }

  int64_t num_batches() const { return nbatches_; }

  // Batch b for the consumer (b only grows; skipped batches are taken and dropped).
  std::vector<Tensor> batch(int64_t b) {
    if (!failed_.empty())
      TG_ERROR("DataLoader: this epoch stopped after an error; the error was: ", failed_);
    if (b == current_index_) return current_;
    TG_CHECK(b > current_index_ && b < nbatches_, "DataLoader: batch ", b, " of an epoch of ", nbatches_,
             " batches is not available (the epoch is at batch ", current_index_, "; an epoch is read once, in order)");
    Slot s;
    while (next_take_ <= b) {
      s = take(next_take_++);
      if (!s.error.empty()) {
        failed_ = s.error;
        {
          std::lock_guard<std::mutex> lock(mu_);
          stop_ = true;
        }
        work_cv_.notify_all();
        throw Error(s.error);
      }
    }
    hand_over(s);
    current_ = std::move(s.batch);
    current_index_ = b;
    return current_;
  }

 private:
  void work(int w) {
    for (;;) {
      int64_t b = 0;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_cv_.wait(lock, [&] { return stop_ || next_claim_ >= nbatches_ || next_claim_ < consumed_ + capacity_; });
        if (stop_ || next_claim_ >= nbatches_) return;
        b = next_claim_++;
      }
      Slot s = produce(b, w);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) return;  // nobody will take it
        slots_[static_cast<size_t>(b % capacity_)] = std::move(s);
      }
      ready_cv_.notify_all();
    }
  }

  Slot take(int64_t b) {
    if (workers_ == 0) return produce(b, -1);
    std::unique_lock<std::mutex> lock(mu_);
    Slot& slot = slots_[static_cast<size_t>(b % capacity_)];
    ready_cv_.wait(lock, [&] { return slot.ready; });
    Slot s = std::move(slot);
    slot = Slot{};
    ++consumed_;
    lock.unlock();
    work_cv_.notify_all();
    return s;
  }

  Slot produce(int64_t b, int worker) {
    Slot s;
    s.ready = true;
    int64_t index = -1;
    try {
      const int64_t lo = b * options_.batch_size;
      const int64_t hi = std::min<int64_t>(static_cast<int64_t>(indices_.size()), lo + options_.batch_size);
      std::vector<std::vector<Tensor>> samples;
      samples.reserve(static_cast<size_t>(hi - lo));
      for (int64_t i = lo; i < hi; ++i) {
        if (stop_.load(std::memory_order_relaxed)) return s;  // the epoch is being torn down: nobody reads this
        index = indices_[static_cast<size_t>(i)];
        TG_CHECK(index >= 0 && index < size_, "DataLoader: the sampler gave index ", index, " but the dataset has size ",
                 size_);
        samples.push_back(dataset_->get(index));
      }
      index = -1;
      if (options_.collate_fn) {
        s.batch = options_.collate_fn(samples);
        if (pinned_)
          for (Tensor& t : s.batch) t = pin(t);
      } else {
        s.batch = collate(samples, indices_.data() + lo, pinned_);
      }
      if (options_.device) to_device(s);
    } catch (const std::exception& e) {
      s.batch.clear();
      s.error = tg::detail::str_cat("DataLoader: batch ", b,
                                    worker >= 0 ? tg::detail::str_cat(" (worker ", worker, ")") : std::string(),
                                    index >= 0 ? tg::detail::str_cat(", dataset index ", index) : std::string(), ": ",
                                    e.what());
    } catch (...) {
      s.batch.clear();
      s.error = tg::detail::str_cat("DataLoader: batch ", b, ": an exception that is not a std::exception");
    }
    return s;
  }

  void to_device(Slot& s) {
    const Device target = *options_.device;
    if (!transfer_) {
      for (Tensor& t : s.batch)
        if (t.defined()) t = native::to(t, target, t.dtype(), false);
      return;
    }
    cuda::Stream& side = shared_->side_stream(target.index());
    cuda::StreamGuard guard(side);
    for (Tensor& t : s.batch)
      if (t.defined()) t = native::to(t, target, t.dtype(), /*non_blocking=*/true);
    s.copied = std::make_unique<cuda::Event>();
    s.copied->record(side);
  }

  // In the consumer's thread: its current stream waits for the copies (on the GPU).
  void hand_over(const Slot& s) {
    if (!s.copied) return;
    cuda::Stream consumer = cuda::current_stream(options_.device->index());
    s.copied->wait(consumer);
#if defined(TG_WITH_CUDA)
    auto handle = static_cast<cudaStream_t>(consumer.handle());
    for (const Tensor& t : s.batch)
      if (t.defined() && t.is_cuda()) cuda::detail::record_stream(t.impl().storage->data_ptr(), handle);
#endif
  }

  std::shared_ptr<const Dataset> dataset_;
  DatasetLoaderOptions options_;
  std::shared_ptr<LoaderShared> shared_;
  std::vector<int64_t> indices_;
  int64_t size_;
  int64_t nbatches_ = 0;
  bool transfer_ = false, pinned_ = false;
  int workers_ = 0;
  int64_t capacity_ = 1;

  std::mutex mu_;
  std::condition_variable work_cv_, ready_cv_;
  std::atomic<bool> stop_{false};  // written under mu_; produce() reads it without
  int64_t next_claim_ = 0, consumed_ = 0;
  std::vector<Slot> slots_;
  std::vector<std::thread> threads_;

  // Consumer side.
  int64_t next_take_ = 0, current_index_ = -1;
  std::vector<Tensor> current_;
  std::string failed_;
};

}  // namespace detail

std::vector<Tensor> default_collate(const std::vector<std::vector<Tensor>>& samples) {
  return detail::collate(samples, nullptr, false);
}

DataLoader<dynamic_extent>::DataLoader(std::shared_ptr<const Dataset> dataset, DatasetLoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)), shared_(std::make_shared<detail::LoaderShared>()) {
  TG_CHECK(dataset_ != nullptr, "DataLoader: the dataset is null");
  TG_CHECK(options_.batch_size > 0, "DataLoader: batch_size must be positive, got ", options_.batch_size);
  TG_CHECK(options_.num_workers >= 0, "DataLoader: num_workers must be non-negative, got ", options_.num_workers);
  TG_CHECK(options_.num_workers <= 1024, "DataLoader: num_workers = ", options_.num_workers, " is more than 1024");
  TG_CHECK(options_.prefetch_factor >= 1, "DataLoader: prefetch_factor must be positive, got ",
           options_.prefetch_factor);
  TG_CHECK(!(options_.sampler && options_.shuffle),
           "DataLoader: sampler option is mutually exclusive with shuffle (shuffle in the sampler instead)");
  const int64_t n = dataset_->size();
  TG_CHECK(n >= 0, "DataLoader: the dataset's size() is negative: ", n);
  if (options_.device && options_.device->is_cuda()) {
    TG_CHECK(cuda::is_available(), "DataLoader: device ", *options_.device, " asked for but no CUDA device is available");
    if (options_.device->index() < 0) options_.device = Device(kCUDA, cuda::current_device());
  }
  sampler_ = options_.sampler;
  if (!sampler_) {
    if (options_.shuffle)
      sampler_ = std::make_shared<RandomSampler>(n, false, std::nullopt, options_.seed);
    else
      sampler_ = std::make_shared<SequentialSampler>(n);
  }
}

DataLoader<dynamic_extent>::~DataLoader() = default;
DataLoader<dynamic_extent>::DataLoader(DataLoader&&) noexcept = default;
DataLoader<dynamic_extent>& DataLoader<dynamic_extent>::operator=(DataLoader&&) noexcept = default;

DataLoader<dynamic_extent>::Iterator DataLoader<dynamic_extent>::begin() {
  auto epoch = std::make_shared<detail::LoaderEpoch>(dataset_, options_, shared_, sampler_->indices());
  ++epoch_;
  last_batches_ = epoch->num_batches();
  epoch->start();
  return Iterator(std::move(epoch), 0);
}

DataLoader<dynamic_extent>::Iterator DataLoader<dynamic_extent>::end() const { return Iterator(nullptr, last_batches_); }

DataLoader<dynamic_extent>::Batch DataLoader<dynamic_extent>::Iterator::operator*() const {
  TG_CHECK(epoch_ != nullptr, "DataLoader: dereferencing an iterator without an epoch (end() or default)");
  return epoch_->batch(batch_);
}

size_t DataLoader<dynamic_extent>::size() const {
  const int64_t n = sampler_->size(), bs = options_.batch_size;
  return static_cast<size_t>(options_.drop_last ? n / bs : (n + bs - 1) / bs);
}

Tensor normalize_images(const Tensor& images, const std::vector<double>& mean, const std::vector<double>& std) {
  TG_CHECK(images.defined(), "normalize_images: the images tensor is undefined");
  TG_CHECK(images.dtype() == kUInt8, "normalize_images: images must be uint8 (0..255), got ", images.dtype(),
           " of shape ", images.sizes());
  TG_CHECK(images.dim() >= 3, "normalize_images: images must be [..., C, H, W], got shape ", images.sizes());
  const int64_t c = images.size(-3);
  TG_CHECK(static_cast<int64_t>(mean.size()) == c && static_cast<int64_t>(std.size()) == c,
           "normalize_images: ", c, " channels (shape ", images.sizes(), ") but mean has ", mean.size(),
           " and std has ", std.size(), " entries");
  // y = x * scale + shift with scale = 1 / (255 std), shift = -mean / std, per channel.
  std::vector<float> coef(static_cast<size_t>(2 * c));
  for (int64_t k = 0; k < c; ++k) {
    const double s = std[static_cast<size_t>(k)], m = mean[static_cast<size_t>(k)];
    TG_CHECK(std::isfinite(s) && s > 0 && std::isfinite(m), "normalize_images: channel ", k,
             " needs a finite mean and a positive finite std, got mean ", m, " and std ", s);
    coef[static_cast<size_t>(k)] = static_cast<float>(1.0 / (255.0 * s));
    coef[static_cast<size_t>(c + k)] = static_cast<float>(-m / s);
  }
  // A small pageable copy does not block the host (the driver stages it).
  Tensor params = tg::tensor(coef, {2, c, 1, 1}).to(images.device(), /*non_blocking=*/true);
  Tensor out = native::to(images, images.device(), kFloat32, false);
  native::binary_out(backend::ElemOp::Mul, out, out, native::select(params, 0, 0));
  native::binary_out(backend::ElemOp::Add, out, out, native::select(params, 0, 1));
  return out;
}

}  // namespace tg::data
