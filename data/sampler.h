// Samplers: the order in which a DataLoader over a Dataset visits sample indices, one list
// per epoch (PyTorch's torch.utils.data samplers). Random samplers draw from Philox: with a
// seed, epoch e (the e-th indices() call) is a function of (seed, e) only; without one, each
// epoch reserves counters of the CPU generator (reproducible under tg::manual_seed).
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include <tapegrad/core/tensor.h>

namespace tg::data {

class Sampler {
 public:
  virtual ~Sampler() = default;
  // Indices per epoch (len(sampler)).
  virtual int64_t size() const = 0;
  // The next epoch's indices, in order (one __iter__ of the PyTorch sampler).
  virtual std::vector<int64_t> indices() = 0;
};

// 0, 1, ..., size - 1.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t size);
  int64_t size() const override { return size_; }
  std::vector<int64_t> indices() override;

 private:
  int64_t size_;
};

// PyTorch's RandomSampler over `size` samples: without replacement, num_samples / size whole
// random permutations then the first num_samples % size of one more; with replacement,
// num_samples uniform draws from [0, size). num_samples defaults to size. Seeded without
// replacement and num_samples == size, epoch e is the permutation DataLoader<N> (data/dataloader.h)
// uses with the same seed.
class RandomSampler : public Sampler {
 public:
  explicit RandomSampler(int64_t size, bool replacement = false, std::optional<int64_t> num_samples = std::nullopt,
                         std::optional<uint64_t> seed = std::nullopt);
  int64_t size() const override { return num_samples_; }
  std::vector<int64_t> indices() override;
  uint64_t epoch() const { return epoch_; }  // indices() calls so far

 private:
  int64_t n_, num_samples_;
  bool replacement_;
  std::optional<uint64_t> seed_;
  uint64_t epoch_ = 0;
};

// torch.multinomial(weights, num_samples, replacement) per epoch: index i with probability
// weights[i] / sum(weights); without replacement, each draw among the indices not drawn yet
// (num_samples <= the number of positive weights). Weights: finite, >= 0, positive sum.
class WeightedRandomSampler : public Sampler {
 public:
  WeightedRandomSampler(std::vector<double> weights, int64_t num_samples, bool replacement = true,
                        std::optional<uint64_t> seed = std::nullopt);
  // The same from a 1-d tensor of weights (any device, any real dtype).
  WeightedRandomSampler(const Tensor& weights, int64_t num_samples, bool replacement = true,
                        std::optional<uint64_t> seed = std::nullopt);
  int64_t size() const override { return num_samples_; }
  std::vector<int64_t> indices() override;
  const std::vector<double>& weights() const { return weights_; }

 private:
  std::vector<double> weights_, cumulative_;
  int64_t num_samples_;
  bool replacement_;
  std::optional<uint64_t> seed_;
  uint64_t epoch_ = 0;
};

// PyTorch's DistributedSampler for a dataset of `size` samples: the epoch's order (a permutation
// seeded by seed + epoch when shuffling, the same on every rank; 0..size-1 otherwise) is padded by
// wrapping around to a multiple of num_replicas (or, with drop_last, cut to one), and rank r takes
// positions r, r + num_replicas, ... Each rank gets size() = ceil(size / num_replicas) indices
// (floor with drop_last). The epoch changes only through set_epoch, as in PyTorch.
class DistributedSampler : public Sampler {
 public:
  DistributedSampler(int64_t size, int64_t num_replicas, int64_t rank, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false);
  int64_t size() const override { return num_samples_; }
  std::vector<int64_t> indices() override;
  void set_epoch(uint64_t epoch) { epoch_ = epoch; }
  uint64_t epoch() const { return epoch_; }
  int64_t num_replicas() const { return num_replicas_; }
  int64_t rank() const { return rank_; }
  int64_t total_size() const { return num_samples_ * num_replicas_; }

 private:
  int64_t n_, num_replicas_, rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t num_samples_;
  uint64_t epoch_ = 0;
};

}  // namespace tg::data
