// tg::data::Dataset, the samplers and DataLoader<dynamic_extent>: each sampler's order against
// hand-computed or closed-form expectations (DistributedSampler against PyTorch's algorithm written
// out below), batches identical and in order for 0, 1 and 4 workers, early break, a throwing
// get(), mismatched samples, out-of-range sampler indices, custom collation, pinned memory and the
// copy to CUDA (skipped without a GPU), normalize_images against a float64 reference.
#include <gtest/gtest.h>

#include <tapegrad/tapegrad.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/error_of.h"

#if defined(TG_WITH_CUDA)
#include <tapegrad/core/backend/cuda/runtime.h>
#endif

namespace {

using tg::Tensor;
namespace data = tg::data;
using tg::testing::error_of;

// Sample i: x = [i, i + 0.5] (float64), y = -i (0-d int64). Options make a sample throw, take
// another shape or dtype, or take time.
class Numbers : public data::Dataset {
 public:
  explicit Numbers(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  std::vector<Tensor> get(int64_t i) const override {
    gets.fetch_add(1);
    if (delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    if (slow_every > 0 && i % slow_every == 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));
    if (i == throw_at) throw std::runtime_error("bad sample " + std::to_string(i));
    std::vector<double> x{static_cast<double>(i), i + 0.5};
    if (i == wide_at) x.push_back(0);
    Tensor xt = tg::tensor(x, {static_cast<int64_t>(x.size())});
    if (i == float_at) xt = xt.to(tg::kFloat32);
    return {xt, tg::tensor(std::vector<int64_t>{-i}, tg::Shape{})};
  }
  int64_t throw_at = -1, wide_at = -1, float_at = -1;
  int delay_us = 0;
  int64_t slow_every = 0;  // these samples take 3 ms: workers finish batches out of order
  mutable std::atomic<int64_t> gets{0};

 private:
  int64_t n_;
};

// The sample ids of each batch, checking that x and y agree and the batch shapes.
template <typename Loader>
std::vector<std::vector<int64_t>> batches(Loader& loader) {
  std::vector<std::vector<int64_t>> out;
  for (const std::vector<Tensor>& b : loader) {
    EXPECT_EQ(b.size(), 2u);
    const int64_t n = b[0].size(0);
    EXPECT_EQ(b[0].sizes(), tg::Shape({n, 2}));
    EXPECT_EQ(b[1].sizes(), tg::Shape({n}));
    EXPECT_EQ(b[1].dtype(), tg::kInt64);
    auto x = b[0].cpu().to_vector<double>();
    auto y = b[1].cpu().to_vector<int64_t>();
    std::vector<int64_t> ids;
    for (int64_t r = 0; r < n; ++r) {
      EXPECT_EQ(x[2 * r + 1], x[2 * r] + 0.5);
      EXPECT_EQ(y[r], -static_cast<int64_t>(x[2 * r]));
      ids.push_back(static_cast<int64_t>(x[2 * r]));
    }
    out.push_back(ids);
  }
  return out;
}

std::vector<int64_t> flat(const std::vector<std::vector<int64_t>>& bs) {
  std::vector<int64_t> out;
  for (const auto& b : bs) out.insert(out.end(), b.begin(), b.end());
  return out;
}

bool is_permutation_of_range(std::vector<int64_t> v, int64_t n) {
  if (static_cast<int64_t>(v.size()) != n) return false;
  std::sort(v.begin(), v.end());
  for (int64_t i = 0; i < n; ++i)
    if (v[static_cast<size_t>(i)] != i) return false;
  return true;
}

// ---- samplers

TEST(Samplers, Sequential) {
  data::SequentialSampler s(5);
  EXPECT_EQ(s.size(), 5);
  EXPECT_EQ(s.indices(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(s.indices(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(data::SequentialSampler(0).indices().empty());
}

TEST(Samplers, RandomIsANewPermutationEachEpochAndSeeded) {
  data::RandomSampler a(100, false, std::nullopt, 7), b(100, false, std::nullopt, 7), c(100, false, std::nullopt, 8);
  auto a0 = a.indices(), a1 = a.indices();
  EXPECT_TRUE(is_permutation_of_range(a0, 100));
  EXPECT_TRUE(is_permutation_of_range(a1, 100));
  EXPECT_NE(a0, a1);
  EXPECT_EQ(b.indices(), a0);
  EXPECT_EQ(b.indices(), a1);
  EXPECT_NE(c.indices(), a0);
  EXPECT_EQ(a.epoch(), 2u);
  // The same epochs as DataLoader<N>'s seeded shuffle of a TensorDataset.
  data::TensorDataset ds(tg::arange(100).to(tg::kInt64));
  data::DataLoader loader(ds, {.batch_size = 100, .shuffle = true, .seed = 7});
  std::vector<std::vector<int64_t>> epochs;
  for (int e = 0; e < 2; ++e)
    for (auto [xb] : loader) epochs.push_back(xb.to_vector<int64_t>());
  EXPECT_EQ(epochs[0], a0);
  EXPECT_EQ(epochs[1], a1);
}

TEST(Samplers, RandomUnseededFollowsManualSeed) {
  tg::manual_seed(3);
  data::RandomSampler s(50);
  auto first = s.indices(), second = s.indices();
  EXPECT_NE(first, second);
  tg::manual_seed(3);
  data::RandomSampler t(50);
  EXPECT_EQ(t.indices(), first);
  EXPECT_EQ(t.indices(), second);
}

TEST(Samplers, RandomNumSamplesBeyondSizeIsWholePermutationsThenAPrefix) {
  data::RandomSampler s(10, false, 25, 1);
  EXPECT_EQ(s.size(), 25);
  auto v = s.indices();
  ASSERT_EQ(v.size(), 25u);
  EXPECT_TRUE(is_permutation_of_range({v.begin(), v.begin() + 10}, 10));
  EXPECT_TRUE(is_permutation_of_range({v.begin() + 10, v.begin() + 20}, 10));
  std::set<int64_t> tail(v.begin() + 20, v.end());
  EXPECT_EQ(tail.size(), 5u);
  EXPECT_LT(*tail.rbegin(), 10);
  EXPECT_NE(std::vector<int64_t>(v.begin(), v.begin() + 10), std::vector<int64_t>(v.begin() + 10, v.begin() + 20));
  auto shorter = data::RandomSampler(10, false, 4, 1).indices();
  EXPECT_EQ(std::set<int64_t>(shorter.begin(), shorter.end()).size(), 4u);
}

TEST(Samplers, RandomWithReplacementIsUniform) {
  const int64_t n = 5, draws = 50000;
  data::RandomSampler s(n, true, draws, 123);
  auto v = s.indices();
  ASSERT_EQ(static_cast<int64_t>(v.size()), draws);
  std::vector<int64_t> count(n, 0);
  for (int64_t i : v) {
    ASSERT_GE(i, 0);
    ASSERT_LT(i, n);
    ++count[static_cast<size_t>(i)];
  }
  const double expect = draws / 5.0, sigma = std::sqrt(draws * 0.2 * 0.8);
  for (int64_t c : count) EXPECT_NEAR(static_cast<double>(c), expect, 5 * sigma);
  EXPECT_NE(s.indices(), v);  // the next epoch draws again
  EXPECT_THROW(data::RandomSampler(0, true, 3), tg::Error);
}

TEST(Samplers, WeightedWithReplacementFollowsTheWeights) {
  const std::vector<double> w{0, 1, 3, 0, 4};
  const int64_t draws = 80000;
  data::WeightedRandomSampler s(w, draws, true, 9);
  EXPECT_EQ(s.size(), draws);
  std::vector<int64_t> count(w.size(), 0);
  for (int64_t i : s.indices()) ++count[static_cast<size_t>(i)];
  EXPECT_EQ(count[0], 0);
  EXPECT_EQ(count[3], 0);
  for (size_t i : {1u, 2u, 4u}) {
    const double p = w[i] / 8.0;
    EXPECT_NEAR(static_cast<double>(count[i]), draws * p, 5 * std::sqrt(draws * p * (1 - p))) << "index " << i;
  }
}

TEST(Samplers, WeightedWithoutReplacementDrawsInWeightOrder) {
  // Weights 1, 3, 4 at indices 1, 2, 4: P(first = 4) = 4/8, P(order 4, 2, 1) = 4/8 * 3/4.
  data::WeightedRandomSampler s({0, 1, 3, 0, 4}, 3, false, 5);
  const int epochs = 20000;
  std::map<int64_t, int> first;
  int order_421 = 0;
  for (int e = 0; e < epochs; ++e) {
    auto v = s.indices();
    ASSERT_EQ(std::set<int64_t>(v.begin(), v.end()), (std::set<int64_t>{1, 2, 4}));
    ++first[v[0]];
    order_421 += v == std::vector<int64_t>{4, 2, 1};
  }
  auto near = [&](double got, double p) { EXPECT_NEAR(got, epochs * p, 5 * std::sqrt(epochs * p * (1 - p))); };
  near(first[4], 0.5);
  near(first[2], 0.375);
  near(first[1], 0.125);
  near(order_421, 0.375);
  EXPECT_NE(error_of([] { data::WeightedRandomSampler({0, 1, 3}, 3, false); }).find("only 2 of 3"), std::string::npos);
  EXPECT_NE(error_of([] { data::WeightedRandomSampler({1, -1}, 1); }).find("-1"), std::string::npos);
  EXPECT_THROW(data::WeightedRandomSampler(std::vector<double>{0, 0}, 1), tg::Error);
  // A tensor of weights is the same sampler.
  data::WeightedRandomSampler from_tensor(tg::tensor(std::vector<float>{0, 1, 3, 0, 4}), 3, false, 5);
  EXPECT_EQ(from_tensor.weights(), (std::vector<double>{0, 1, 3, 0, 4}));
  data::WeightedRandomSampler again({0, 1, 3, 0, 4}, 3, false, 5);
  EXPECT_EQ(from_tensor.indices(), again.indices());
  EXPECT_NE(error_of([] { data::WeightedRandomSampler(tg::zeros({2, 2}), 1); }).find("1-d"), std::string::npos);
}

// torch.utils.data.DistributedSampler.__iter__, line by line, on a given epoch order.
std::vector<int64_t> torch_distributed(std::vector<int64_t> indices, int64_t num_replicas, int64_t rank,
                                       bool drop_last) {
  const auto n = static_cast<int64_t>(indices.size());
  int64_t num_samples;
  if (drop_last && n % num_replicas != 0)
    num_samples = static_cast<int64_t>(std::ceil(static_cast<double>(n - num_replicas) / num_replicas));
  else
    num_samples = static_cast<int64_t>(std::ceil(static_cast<double>(n) / num_replicas));
  const int64_t total_size = num_samples * num_replicas;
  if (!drop_last) {
    const int64_t padding_size = total_size - n;
    if (padding_size <= n) {
      indices.insert(indices.end(), indices.begin(), indices.begin() + padding_size);
    } else {
      std::vector<int64_t> rep;
      const auto times = static_cast<int64_t>(std::ceil(static_cast<double>(padding_size) / n));
      for (int64_t t = 0; t < times; ++t) rep.insert(rep.end(), indices.begin(), indices.begin() + n);
      indices.insert(indices.end(), rep.begin(), rep.begin() + padding_size);
    }
  } else {
    indices.resize(static_cast<size_t>(total_size));
  }
  EXPECT_EQ(static_cast<int64_t>(indices.size()), total_size);
  std::vector<int64_t> out;
  for (int64_t i = rank; i < total_size; i += num_replicas) out.push_back(indices[static_cast<size_t>(i)]);
  EXPECT_EQ(static_cast<int64_t>(out.size()), num_samples);
  return out;
}

TEST(Samplers, DistributedMatchesPyTorchWithoutShuffle) {
  for (int64_t n : {0, 1, 2, 5, 10, 11, 17})
    for (int64_t r : {1, 2, 3, 4, 7})
      for (bool drop : {false, true})
        for (int64_t rank = 0; rank < r; ++rank) {
          std::vector<int64_t> order(static_cast<size_t>(n));
          std::iota(order.begin(), order.end(), int64_t{0});
          data::DistributedSampler s(n, r, rank, /*shuffle=*/false, 0, drop);
          auto want = torch_distributed(order, r, rank, drop);
          EXPECT_EQ(s.indices(), want) << "n " << n << " replicas " << r << " rank " << rank << " drop_last " << drop;
          EXPECT_EQ(s.size(), static_cast<int64_t>(want.size()));
        }
  // By hand: 10 samples on 3 replicas pad to 12 (0..9, 0, 1); rank 1 takes 1, 4, 7, 0.
  EXPECT_EQ(data::DistributedSampler(10, 3, 1, false).indices(), (std::vector<int64_t>{1, 4, 7, 0}));
  // With drop_last: 9 of them, rank 1 takes 1, 4, 7.
  EXPECT_EQ(data::DistributedSampler(10, 3, 1, false, 0, true).indices(), (std::vector<int64_t>{1, 4, 7}));
  // 2 samples on 7 replicas: the order repeats to 7 (0 1 0 1 0 1 0).
  EXPECT_EQ(data::DistributedSampler(2, 7, 5, false).indices(), (std::vector<int64_t>{1}));
}

TEST(Samplers, DistributedShuffleIsOneSeededPermutationSplitAsPyTorch) {
  for (int64_t n : {1, 5, 11, 17})
    for (uint64_t epoch : {0u, 3u}) {
      // One replica sees the epoch's whole order.
      data::DistributedSampler whole(n, 1, 0, true, 42);
      whole.set_epoch(epoch);
      const auto perm = whole.indices();
      ASSERT_TRUE(is_permutation_of_range(perm, n));
      for (int64_t r : {2, 3, 4, 7})
        for (bool drop : {false, true})
          for (int64_t rank = 0; rank < r; ++rank) {
            data::DistributedSampler s(n, r, rank, true, 42, drop);
            s.set_epoch(epoch);
            EXPECT_EQ(s.indices(), torch_distributed(perm, r, rank, drop))
                << "n " << n << " replicas " << r << " rank " << rank << " drop_last " << drop;
          }
    }
  // The permutation is seeded by seed + epoch, and changes only with set_epoch.
  data::DistributedSampler a(50, 2, 0, true, 5), b(50, 2, 0, true, 4);
  b.set_epoch(1);
  auto a0 = a.indices();
  EXPECT_EQ(a.indices(), a0);
  EXPECT_EQ(b.indices(), a0);
  a.set_epoch(1);
  EXPECT_NE(a.indices(), a0);
  EXPECT_NE(error_of([] { data::DistributedSampler(10, 2, 2); }).find("invalid rank 2"), std::string::npos);
  EXPECT_THROW(data::DistributedSampler(10, 0, 0), tg::Error);
}

// ---- the loader

TEST(DatasetLoader, SequentialBatchesAndDropLast) {
  auto ds = std::make_shared<Numbers>(23);
  data::DataLoader loader(ds, {.batch_size = 5});
  static_assert(std::is_same_v<decltype(loader), data::DataLoader<data::dynamic_extent>>);
  // Deduced from a pointer to const, or to the base class, too; TensorDataset keeps DataLoader<N>.
  std::shared_ptr<const Numbers> cds = ds;
  std::shared_ptr<data::Dataset> base = ds;
  data::DataLoader from_const(cds), from_base(base, {.batch_size = 2});
  static_assert(std::is_same_v<decltype(from_const), data::DataLoader<data::dynamic_extent>>);
  static_assert(std::is_same_v<decltype(from_base), data::DataLoader<data::dynamic_extent>>);
  data::TensorDataset tds(tg::zeros({4, 2}));
  data::DataLoader tensor_loader(tds, {.batch_size = 2});
  static_assert(std::is_same_v<decltype(tensor_loader), data::DataLoader<1>>);
  EXPECT_EQ(loader.size(), 5u);
  auto bs = batches(loader);
  ASSERT_EQ(bs.size(), 5u);
  for (size_t b = 0; b < 5; ++b) {
    std::vector<int64_t> want;
    for (int64_t i = 5 * static_cast<int64_t>(b); i < std::min<int64_t>(23, 5 * static_cast<int64_t>(b) + 5); ++i)
      want.push_back(i);
    EXPECT_EQ(bs[b], want);
  }
  data::DataLoader dropping(ds, {.batch_size = 5, .drop_last = true});
  EXPECT_EQ(dropping.size(), 4u);
  EXPECT_EQ(flat(batches(dropping)).size(), 20u);
  EXPECT_EQ(dropping.epoch(), 1u);
}

TEST(DatasetLoader, WorkersGiveIdenticalBatchesInOrder) {
  auto ds = std::make_shared<Numbers>(103);
  std::vector<std::vector<std::vector<int64_t>>> got;  // [workers][epoch * batches + b]
  for (int64_t workers : {0, 1, 4}) {
    data::DataLoader loader(ds, {.batch_size = 8, .shuffle = true, .num_workers = workers, .seed = 11});
    auto e0 = batches(loader), e1 = batches(loader);
    EXPECT_EQ(e0.size(), 13u);
    EXPECT_TRUE(is_permutation_of_range(flat(e0), 103));
    EXPECT_TRUE(is_permutation_of_range(flat(e1), 103));
    EXPECT_NE(flat(e0), flat(e1));
    e0.insert(e0.end(), e1.begin(), e1.end());
    got.push_back(e0);
  }
  EXPECT_EQ(got[1], got[0]);
  EXPECT_EQ(got[2], got[0]);
  // The order is RandomSampler's with the seed.
  data::RandomSampler s(103, false, std::nullopt, 11);
  EXPECT_EQ(flat({got[0].begin(), got[0].begin() + 13}), s.indices());

  // Batches that take longer than later ones still arrive in order.
  auto slow = std::make_shared<Numbers>(120);
  slow->slow_every = 15;  // one slow sample in every third batch of 5
  data::DataLoader loader(slow, {.batch_size = 5, .num_workers = 4});
  std::vector<int64_t> want(120);
  std::iota(want.begin(), want.end(), int64_t{0});
  EXPECT_EQ(flat(batches(loader)), want);
}

TEST(DatasetLoader, EarlyBreakStopsTheWorkersPromptly) {
  auto ds = std::make_shared<Numbers>(40000);
  ds->delay_us = 1000;  // a whole epoch would take 10 s on 4 workers
  const auto t0 = std::chrono::steady_clock::now();
  {
    data::DataLoader loader(ds, {.batch_size = 10, .num_workers = 4});
    int seen = 0;
    for (const auto& b : loader) {
      EXPECT_EQ(b[0].size(0), 10);
      if (++seen == 3) break;
    }
    EXPECT_EQ(seen, 3);
    // Bounded prefetch: the 3 batches taken, 8 queued ahead (2 per worker) and one in the making per worker.
    EXPECT_LE(ds->gets.load(), (3 + 8 + 4) * 10);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 2.0);
  // An iterator that outlives its loader keeps the epoch (and dataset) alive and still works.
  data::DataLoader<data::dynamic_extent>::Iterator it;
  {
    data::DataLoader loader(ds, {.batch_size = 4, .num_workers = 2});
    it = loader.begin();
  }
  ++it;
  EXPECT_EQ((*it)[1].to_vector<int64_t>(), (std::vector<int64_t>{-4, -5, -6, -7}));
}

TEST(DatasetLoader, ThrowingGetReachesTheLoopAtItsBatch) {
  for (int64_t workers : {0, 1, 4}) {
    auto ds = std::make_shared<Numbers>(50);
    ds->throw_at = 37;
    data::DataLoader loader(ds, {.batch_size = 10, .num_workers = workers});
    for (int epoch = 0; epoch < 2; ++epoch) {  // the loader starts a clean epoch after the failure
      int delivered = 0;
      std::string msg;
      try {
        for (const auto& b : loader) {
          EXPECT_EQ(b[1].to_vector<int64_t>()[0], -10 * delivered);
          ++delivered;
        }
      } catch (const tg::Error& e) {
        msg = e.what();
      }
      EXPECT_EQ(delivered, 3) << workers << " workers";
      EXPECT_NE(msg.find("batch 3"), std::string::npos) << msg;
      EXPECT_NE(msg.find("dataset index 37"), std::string::npos) << msg;
      EXPECT_NE(msg.find("bad sample 37"), std::string::npos) << msg;
      if (workers > 0) {
        EXPECT_NE(msg.find("worker"), std::string::npos) << msg;
      }
    }
  }
}

TEST(DatasetLoader, MismatchedSamplesNameFieldSamplesAndShapes) {
  auto ds = std::make_shared<Numbers>(12);
  ds->wide_at = 6;
  data::DataLoader loader(ds, {.batch_size = 4, .num_workers = 2});
  const std::string msg = error_of([&] { batches(loader); });
  EXPECT_NE(msg.find("batch 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("field 0 of sample 2 (dataset index 6) is [3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("of sample 0 (dataset index 4) it is [2]"), std::string::npos) << msg;

  auto ds2 = std::make_shared<Numbers>(4);
  ds2->float_at = 1;
  data::DataLoader l2(ds2, {.batch_size = 4});
  const std::string m2 = error_of([&] { batches(l2); });
  EXPECT_NE(m2.find("float32"), std::string::npos) << m2;
  EXPECT_NE(m2.find("float64"), std::string::npos) << m2;

  // default_collate called directly: positions only.
  const std::string m3 = error_of([] {
    data::default_collate({{tg::zeros({2})}, {tg::zeros({2}), tg::zeros({1})}});
  });
  EXPECT_NE(m3.find("sample 1 has 2 fields but sample 0 has 1"), std::string::npos) << m3;
}

class ListSampler : public data::Sampler {
 public:
  explicit ListSampler(std::vector<int64_t> v) : v_(std::move(v)) {}
  int64_t size() const override { return static_cast<int64_t>(v_.size()); }
  std::vector<int64_t> indices() override { return v_; }

 private:
  std::vector<int64_t> v_;
};

TEST(DatasetLoader, SamplerIndexOutOfRangeIsAnError) {
  auto ds = std::make_shared<Numbers>(10);
  for (int64_t workers : {0, 2}) {
    for (int64_t bad : {10, -1}) {
      data::DataLoader loader(
          ds, {.batch_size = 2, .num_workers = workers, .sampler = std::make_shared<ListSampler>(std::vector<int64_t>{
                                                            0, 1, 2, bad, 3})});
      const std::string msg = error_of([&] { batches(loader); });
      EXPECT_NE(msg.find("batch 1"), std::string::npos) << msg;
      EXPECT_NE(msg.find("index " + std::to_string(bad) + " but the dataset has size 10"), std::string::npos) << msg;
    }
  }
}

TEST(DatasetLoader, SamplersDriveTheLoader) {
  auto ds = std::make_shared<Numbers>(10);
  // Rank 1 of 3: 1, 4, 7, 0 (see DistributedMatchesPyTorchWithoutShuffle), in batches of 2.
  auto dist = std::make_shared<data::DistributedSampler>(10, 3, 1, false);
  data::DataLoader loader(ds, {.batch_size = 2, .num_workers = 2, .sampler = dist});
  EXPECT_EQ(loader.size(), 2u);
  EXPECT_EQ(batches(loader), (std::vector<std::vector<int64_t>>{{1, 4}, {7, 0}}));
  // A shuffling DistributedSampler's set_epoch reaches the loader's next epoch.
  auto shuf = std::make_shared<data::DistributedSampler>(10, 2, 0, true, 3);
  data::DataLoader l2(ds, {.batch_size = 5, .sampler = shuf});
  auto e0 = flat(batches(l2));
  EXPECT_EQ(flat(batches(l2)), e0);
  shuf->set_epoch(1);
  EXPECT_NE(flat(batches(l2)), e0);
  EXPECT_NE(error_of([&] { data::DataLoader bad(ds, {.shuffle = true, .sampler = dist}); }).find("mutually exclusive"),
            std::string::npos);
}

TEST(DatasetLoader, CustomCollate) {
  auto ds = std::make_shared<Numbers>(9);
  // Each batch -> {sum of the x rows, number of samples}.
  data::CollateFn sum_rows = [](const std::vector<std::vector<Tensor>>& samples) {
    Tensor acc = tg::zeros({2}, tg::kFloat64);
    for (const auto& s : samples) acc = acc + s[0];
    return std::vector<Tensor>{acc, tg::full({}, static_cast<double>(samples.size()))};
  };
  for (int64_t workers : {0, 3}) {
    data::DataLoader loader(ds, {.batch_size = 4, .num_workers = workers, .pin_memory = true, .collate_fn = sum_rows});
    std::vector<std::vector<double>> got;
    for (const auto& b : loader) {
      auto s = b[0].to_vector<double>();
      s.push_back(b[1].item<float>());
      got.push_back(s);
    }
    // 0+1+2+3 = 6, 4+..+7 = 22, 8; the second column adds 0.5 per sample.
    EXPECT_EQ(got, (std::vector<std::vector<double>>{{6, 8, 4}, {22, 24, 4}, {8, 8.5, 1}}));
  }
}

TEST(DatasetLoader, OptionErrors) {
  auto ds = std::make_shared<Numbers>(4);
  EXPECT_NE(error_of([&] { data::DataLoader l(ds, {.batch_size = 0}); }).find("batch_size must be positive, got 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] { data::DataLoader l(ds, {.num_workers = -1}); }).find("num_workers"), std::string::npos);
  EXPECT_NE(error_of([&] { data::DataLoader l(ds, {.num_workers = 1, .prefetch_factor = 0}); }).find("prefetch_factor"),
            std::string::npos);
  EXPECT_THROW(data::DataLoader<data::dynamic_extent>(nullptr), tg::Error);
  if (!tg::cuda::is_available()) {
    EXPECT_NE(error_of([&] { data::DataLoader l(ds, {.device = tg::kCUDA}); }).find("no CUDA device"), std::string::npos);
  }
}

TEST(DatasetLoader, PinMemoryGivesTheSameBatches) {
  auto ds = std::make_shared<Numbers>(37);
  data::DataLoader plain(ds, {.batch_size = 6, .shuffle = true, .seed = 2});
  data::DataLoader pinned(ds, {.batch_size = 6, .shuffle = true, .num_workers = 2, .pin_memory = true, .seed = 2});
  EXPECT_EQ(batches(pinned), batches(plain));
#if defined(TG_WITH_CUDA)
  if (tg::cuda::is_available()) {
    for (const auto& b : pinned)
      for (const Tensor& t : b) {
        EXPECT_TRUE(t.is_cpu());
        EXPECT_TRUE(tg::cuda::detail::is_pinned(t.data_ptr()));
      }
  }
#endif
}

TEST(DatasetLoader, CopiesToCudaOnASideStream) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t n = 5000;
  auto ds = std::make_shared<Numbers>(n);
  data::DataLoader loader(ds, {.batch_size = 64, .shuffle = true, .num_workers = 3, .pin_memory = true,
                               .device = tg::kCUDA, .seed = 4});
  tg::cuda::Stream consumer;
  tg::cuda::StreamGuard guard(consumer);
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::vector<double> sums;
    double ids = 0;
    for (const auto& b : loader) {
      ASSERT_TRUE(b[0].is_cuda());
      ASSERT_TRUE(b[1].is_cuda());
      // Work on the consumer's stream that reads the batch: x0 - x1 + 0.5 == 0 and y + x0 == 0.
      Tensor check = (b[0].select(1, 0) - b[0].select(1, 1) + 0.5).abs().sum() +
                     (b[1].to(tg::kFloat64) + b[0].select(1, 0)).abs().sum();
      sums.push_back(check.item<double>());
      ids += b[0].select(1, 0).sum().item<double>();
    }
    for (double s : sums) EXPECT_EQ(s, 0.0);
    EXPECT_EQ(ids, n * (n - 1) / 2.0);  // every sample once
  }
}

TEST(DatasetLoader, BatchesStayValidWhileTheConsumerStreamIsBusy) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  // The consumer queues slow work (matmuls) before reading each batch, and the batch dies when the
  // next one is taken, long before that work ran; the side stream's next copies must not reuse its
  // memory before the reads end (record_stream on the consumer's stream).
  auto ds = std::make_shared<Numbers>(2048);
  data::DataLoader loader(ds, {.batch_size = 128, .num_workers = 2, .device = tg::kCUDA});
  tg::cuda::Stream consumer;
  tg::cuda::StreamGuard guard(consumer);
  Tensor big = tg::rand({2048, 2048}, tg::kCUDA);
  std::vector<Tensor> results;
  for (int epoch = 0; epoch < 2; ++epoch)
    for (const auto& b : loader) {
      for (int k = 0; k < 8; ++k) big = tg::matmul(big, big) * 1e-3;
      results.push_back(b[0].select(1, 0).sum());
    }
  ASSERT_EQ(results.size(), 32u);
  for (size_t i = 0; i < results.size(); ++i) {
    const double lo = 128.0 * static_cast<double>(i % 16), want = 128 * lo + 127 * 128 / 2.0;
    EXPECT_EQ(results[i].item<double>(), want) << "batch " << i;
  }
}

// ---- normalize_images

TEST(NormalizeImages, MatchesFloat64Reference) {
  for (tg::Device dev : {tg::Device(tg::kCPU), tg::Device(tg::kCUDA)}) {
    if (dev.is_cuda() && !tg::cuda::is_available()) continue;
    const int64_t b = 2, c = 3, h = 4, w = 5;
    std::vector<uint8_t> px(static_cast<size_t>(b * c * h * w));
    for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
    const std::vector<double> mean{0.4914, 0.4822, 0.4465}, stdv{0.2470, 0.2435, 0.2616};
    Tensor x = tg::tensor(px, {b, c, h, w}).to(dev);
    Tensor y = data::normalize_images(x, mean, stdv);
    EXPECT_EQ(y.dtype(), tg::kFloat32);
    EXPECT_EQ(y.device(), x.device());
    EXPECT_EQ(y.sizes(), x.sizes());
    auto got = y.cpu().to_vector<float>();
    for (size_t i = 0; i < px.size(); ++i) {
      const size_t ch = (i / static_cast<size_t>(h * w)) % static_cast<size_t>(c);
      const double want = (px[i] / 255.0 - mean[ch]) / stdv[ch];
      ASSERT_NEAR(got[i], want, 2e-6 * (1 + std::abs(want))) << "element " << i << " on " << dev;
    }
  }
  EXPECT_NE(error_of([] { data::normalize_images(tg::zeros({2, 3, 4, 4}), {0, 0, 0}, {1, 1, 1}); }).find("uint8"),
            std::string::npos);
  auto u8 = tg::zeros({2, 3, 4, 4}).to(tg::kUInt8);
  EXPECT_NE(error_of([&] { data::normalize_images(u8, {0, 0}, {1, 1}); }).find("3 channels"), std::string::npos);
  EXPECT_NE(error_of([&] { data::normalize_images(u8, {0, 0, 0}, {1, 0, 1}); }).find("channel 1"), std::string::npos);
}

}  // namespace
