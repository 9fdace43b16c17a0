// The samplers of data/sampler.h. Permutations come from native::randperm (Philox, the same
// counters layout as DataLoader<N>'s seeded shuffle), uniform draws from philox::uniform_f64.
#include <tapegrad/data/sampler.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <utility>

#include <tapegrad/core/error.h>
#include <tapegrad/core/native.h>
#include <tapegrad/core/philox.h>

namespace tg::data {
namespace {

// Philox (seed, offset) for `count` counters: a seeded sampler's epoch e, part j owns
// [(e * parts + j) * count, ...); an unseeded one reserves them from the CPU generator.
std::pair<uint64_t, uint64_t> stream(const std::optional<uint64_t>& seed, uint64_t count, uint64_t epoch,
                                     uint64_t parts, uint64_t j) {
  count = (count + 3) / 4 * 4;
  if (seed) return {*seed, (epoch * parts + j) * count};
  return native::philox_reserve(Device(kCPU), count);
}

std::vector<int64_t> to_indices(const Tensor& t) { return t.to_vector<int64_t>(); }

std::vector<double> weights_of(const Tensor& w) {
  TG_CHECK(w.defined() && w.dim() == 1, "WeightedRandomSampler: weights must be a 1-d tensor, got ",
           w.defined() ? tg::detail::str_cat("shape ", w.sizes()) : std::string("an undefined tensor"));
  return native::to(w, Device(kCPU), kFloat64, false).contiguous().to_vector<double>();
}

// Counters one randperm of n uses (DataLoader<N>'s epoch span: data/dataloader.cpp).
uint64_t perm_counters(int64_t n) { return philox::counters_for(2 * static_cast<uint64_t>(n), 4); }

}  // namespace

SequentialSampler::SequentialSampler(int64_t size) : size_(size) {
  TG_CHECK(size >= 0, "SequentialSampler: size must be non-negative, got ", size);
}

std::vector<int64_t> SequentialSampler::indices() {
  std::vector<int64_t> out(static_cast<size_t>(size_));
  std::iota(out.begin(), out.end(), int64_t{0});
  return out;
}

RandomSampler::RandomSampler(int64_t size, bool replacement, std::optional<int64_t> num_samples,
                             std::optional<uint64_t> seed)
    : n_(size), num_samples_(num_samples.value_or(size)), replacement_(replacement), seed_(seed) {
  TG_CHECK(size >= 0, "RandomSampler: size must be non-negative, got ", size);
  TG_CHECK(num_samples_ >= 0, "RandomSampler: num_samples must be non-negative, got ", num_samples_);
  TG_CHECK(n_ > 0 || num_samples_ == 0, "RandomSampler: num_samples = ", num_samples_,
           " drawn from an empty dataset (size 0)");
}

std::vector<int64_t> RandomSampler::indices() {
  const uint64_t e = epoch_++;
  std::vector<int64_t> out;
  if (num_samples_ == 0) return out;
  out.reserve(static_cast<size_t>(num_samples_));
  if (replacement_) {
    auto [seed, off] = stream(seed_, philox::counters_for(static_cast<uint64_t>(num_samples_), 8), e, 1, 0);
    for (int64_t i = 0; i < num_samples_; ++i) {
      const double u = philox::uniform_f64(seed, off, static_cast<uint64_t>(i));
      out.push_back(std::min<int64_t>(n_ - 1, static_cast<int64_t>(u * static_cast<double>(n_))));
    }
    return out;
  }
  // num_samples / n whole permutations, then a prefix of one more (PyTorch's order).
  const uint64_t parts = static_cast<uint64_t>((num_samples_ + n_ - 1) / n_);
  for (uint64_t j = 0; j < parts; ++j) {
    auto [seed, off] = stream(seed_, perm_counters(n_), e, parts, j);
    std::vector<int64_t> perm = to_indices(native::randperm(n_, kInt64, Device(kCPU), seed, off));
    const int64_t take = std::min<int64_t>(n_, num_samples_ - static_cast<int64_t>(out.size()));
    out.insert(out.end(), perm.begin(), perm.begin() + take);
  }
  return out;
}

WeightedRandomSampler::WeightedRandomSampler(std::vector<double> weights, int64_t num_samples, bool replacement,
                                             std::optional<uint64_t> seed)
    : weights_(std::move(weights)), num_samples_(num_samples), replacement_(replacement), seed_(seed) {
  TG_CHECK(num_samples >= 0, "WeightedRandomSampler: num_samples must be non-negative, got ", num_samples);
  double sum = 0;
  int64_t positive = 0;
  cumulative_.reserve(weights_.size());
  for (size_t i = 0; i < weights_.size(); ++i) {
    const double w = weights_[i];
    TG_CHECK(std::isfinite(w) && w >= 0, "WeightedRandomSampler: weights must be finite and non-negative, got ", w,
             " at index ", i);
    sum += w;
    positive += w > 0;
    cumulative_.push_back(sum);
  }
  TG_CHECK(num_samples == 0 || (sum > 0 && std::isfinite(sum)),
           "WeightedRandomSampler: the weights must have a positive finite sum, got ", sum, " over ", weights_.size(),
           " weights");
  TG_CHECK(replacement || num_samples <= positive, "WeightedRandomSampler: num_samples = ", num_samples,
           " without replacement but only ", positive, " of ", weights_.size(), " weights are positive");
}

WeightedRandomSampler::WeightedRandomSampler(const Tensor& weights, int64_t num_samples, bool replacement,
                                             std::optional<uint64_t> seed)
    : WeightedRandomSampler(weights_of(weights), num_samples, replacement, seed) {}

std::vector<int64_t> WeightedRandomSampler::indices() {
  const uint64_t e = epoch_++;
  std::vector<int64_t> out;
  if (num_samples_ == 0) return out;
  out.reserve(static_cast<size_t>(num_samples_));
  if (replacement_) {
    // Inverse CDF: the first i with cumulative[i] > u * sum (a zero weight is never chosen).
    auto [seed, off] = stream(seed_, philox::counters_for(static_cast<uint64_t>(num_samples_), 8), e, 1, 0);
    const double total = cumulative_.back();
    for (int64_t i = 0; i < num_samples_; ++i) {
      const double t = philox::uniform_f64(seed, off, static_cast<uint64_t>(i)) * total;
      auto it = std::upper_bound(cumulative_.begin(), cumulative_.end(), t);
      int64_t k = std::min<int64_t>(static_cast<int64_t>(it - cumulative_.begin()),
                                    static_cast<int64_t>(cumulative_.size()) - 1);
      while (weights_[static_cast<size_t>(k)] == 0) --k;  // t rounded onto the end: the last positive weight
      out.push_back(k);
    }
    return out;
  }
  // Without replacement: exponential races (key_i = E_i / w_i, smallest first), the same
  // distribution as drawing one at a time among the indices left.
  auto [seed, off] = stream(seed_, philox::counters_for(weights_.size(), 8), e, 1, 0);
  std::vector<std::pair<double, int64_t>> keys;
  for (size_t i = 0; i < weights_.size(); ++i) {
    if (weights_[i] <= 0) continue;
    const double u = philox::uniform_f64(seed, off, i);
    keys.emplace_back(-std::log1p(-u) / weights_[i], static_cast<int64_t>(i));
  }
  std::partial_sort(keys.begin(), keys.begin() + num_samples_, keys.end());
  for (int64_t i = 0; i < num_samples_; ++i) out.push_back(keys[static_cast<size_t>(i)].second);
  return out;
}

DistributedSampler::DistributedSampler(int64_t size, int64_t num_replicas, int64_t rank, bool shuffle, uint64_t seed,
                                       bool drop_last)
    : n_(size), num_replicas_(num_replicas), rank_(rank), shuffle_(shuffle), seed_(seed), drop_last_(drop_last) {
  TG_CHECK(size >= 0, "DistributedSampler: size must be non-negative, got ", size);
  TG_CHECK(num_replicas >= 1, "DistributedSampler: num_replicas must be positive, got ", num_replicas);
  TG_CHECK(rank >= 0 && rank < num_replicas, "DistributedSampler: invalid rank ", rank, ", rank should be in [0, ",
           num_replicas - 1, "]");
  // PyTorch: ceil((n - R) / R) with drop_last and a remainder (that is floor(n / R)), else ceil(n / R).
  num_samples_ = drop_last && n_ % num_replicas != 0 ? n_ / num_replicas : (n_ + num_replicas - 1) / num_replicas;
}

std::vector<int64_t> DistributedSampler::indices() {
  std::vector<int64_t> order;
  if (shuffle_ && n_ > 0) {
    // torch.Generator().manual_seed(seed + epoch): every rank draws the same permutation.
    order = to_indices(native::randperm(n_, kInt64, Device(kCPU), seed_ + epoch_, 0));
  } else {
    order.resize(static_cast<size_t>(n_));
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  const int64_t total = total_size();
  if (!drop_last_) {
    for (int64_t i = n_; i < total; ++i) order.push_back(order[static_cast<size_t>((i - n_) % n_)]);
  } else {
    order.resize(static_cast<size_t>(total));
  }
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(num_samples_));
  for (int64_t i = rank_; i < total; i += num_replicas_) out.push_back(order[static_cast<size_t>(i)]);
  return out;
}

}  // namespace tg::data
