// tg::data::TensorDataset: N tensors indexed together along dim 0 (sample i is
// row i of each). `TensorDataset ds(x, y)` deduces TensorDataset<2>.
// tg::data::Dataset: the map-style dataset users derive from (PyTorch's Dataset), read by
// DataLoader<dynamic_extent> (data/dataset_loader.h).
#pragma once
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <tapegrad/core/tensor.h>

namespace tg::data {

// A map-style dataset: `size()` samples, sample i is `get(i)`, a list of tensors (its fields,
// e.g. {image, label}), the same number, shapes and dtypes for every i when the loader's default
// collation stacks them. With DataLoader's num_workers > 0, get() is called from several worker
// threads at once: it must be thread-safe (reading immutable members is).
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual std::vector<Tensor> get(int64_t index) const = 0;
};

namespace detail {
// All defined, at least 1-d, the same size on dim 0 and on one device; tg::Error otherwise.
void check_dataset(const Tensor* tensors, size_t n);
}  // namespace detail

template <size_t N>
class TensorDataset {
  static_assert(N > 0, "TensorDataset needs at least one tensor");

 public:
  template <typename... Ts>
  requires(sizeof...(Ts) == N &&
           (std::convertible_to<const Ts&, Tensor> && ...)) explicit TensorDataset(const Ts&... tensors)
      : tensors_{Tensor(tensors)...} {
    detail::check_dataset(tensors_.data(), N);
  }
  explicit TensorDataset(std::array<Tensor, N> tensors) : tensors_(std::move(tensors)) {
    detail::check_dataset(tensors_.data(), N);
  }

  int64_t size() const { return tensors_[0].size(0); }
  Device device() const { return tensors_[0].device(); }
  // Sample i: row i of each tensor (views).
  std::array<Tensor, N> get(int64_t i) const {
    std::array<Tensor, N> out;
    for (size_t k = 0; k < N; ++k) out[k] = tensors_[k].select(0, i);
    return out;
  }
  std::array<Tensor, N> operator[](int64_t i) const { return get(i); }
  const std::array<Tensor, N>& tensors() const { return tensors_; }

 private:
  std::array<Tensor, N> tensors_;
};

template <typename... Ts>
TensorDataset(const Ts&...) -> TensorDataset<sizeof...(Ts)>;

}  // namespace tg::data
