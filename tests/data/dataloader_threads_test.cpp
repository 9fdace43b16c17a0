// DataLoaders used from several threads at once (CPU): each thread's loader, seeded, gives the
// same epochs as when it runs alone; unseeded loaders share the global generator, and every
// epoch is still a permutation with rows kept paired. The CI runs this file under
// ThreadSanitizer (scripts/test).
#include <gtest/gtest.h>

#include <tapegrad/tapegrad.h>

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace {

using tg::Tensor;
namespace data = tg::data;

// x row i = [i, 2i] (float64), y row i = -i; large enough (40000 rows) that the batch gather
// runs on the thread pool.
std::pair<Tensor, Tensor> make(int64_t n) {
  std::vector<double> xs, ys;
  for (int64_t i = 0; i < n; ++i) {
    xs.push_back(static_cast<double>(i));
    xs.push_back(2.0 * i);
    ys.push_back(-static_cast<double>(i));
  }
  return {tg::tensor(xs, {n, 2}), tg::tensor(ys, {n, 1})};
}

// Sample ids of `epochs` epochs, in order; -1 marks a row whose x and y disagree.
std::vector<int64_t> run(data::DataLoader<2>& loader, int epochs) {
  std::vector<int64_t> ids;
  for (int e = 0; e < epochs; ++e) {
    for (auto [xb, yb] : loader) {
      auto x = xb.contiguous().to_vector<double>();
      auto y = yb.contiguous().to_vector<double>();
      for (size_t r = 0; r < y.size(); ++r) {
        const bool paired = x[2 * r + 1] == 2 * x[2 * r] && y[r] == -x[2 * r];
        ids.push_back(paired ? static_cast<int64_t>(x[2 * r]) : -1);
      }
    }
  }
  return ids;
}

TEST(DataLoaderThreads, SeededLoadersInThreadsMatchEachAlone) {
  const int64_t n = 40000;
  auto [x, y] = make(n);
  data::TensorDataset ds(x, y);
  std::vector<std::vector<int64_t>> alone, together(4);
  for (uint64_t s = 0; s < 4; ++s) {
    data::DataLoader loader(ds, {.batch_size = 20000, .shuffle = true, .seed = 100 + s});
    alone.push_back(run(loader, 2));
  }
  std::vector<std::thread> ts;
  for (uint64_t s = 0; s < 4; ++s)
    ts.emplace_back([&, s] {
      data::DataLoader loader(ds, {.batch_size = 20000, .shuffle = true, .seed = 100 + s});
      together[s] = run(loader, 2);
    });
  for (auto& t : ts) t.join();
  for (size_t s = 0; s < 4; ++s) {
    ASSERT_EQ(together[s].size(), static_cast<size_t>(2 * n));
    EXPECT_EQ(together[s], alone[s]) << "seed " << 100 + s;
  }
  EXPECT_NE(alone[0], alone[1]);
}

TEST(DataLoaderThreads, UnseededLoadersShareTheGeneratorSafely) {
  const int64_t n = 40000;
  auto [x, y] = make(n);
  data::TensorDataset ds(x, y);
  std::vector<std::vector<int64_t>> got(3);
  std::vector<std::thread> ts;
  for (size_t k = 0; k < got.size(); ++k)
    ts.emplace_back([&, k] {
      data::DataLoader loader(ds, {.batch_size = 16384, .shuffle = true});
      got[k] = run(loader, 2);
    });
  for (auto& t : ts) t.join();
  for (const auto& ids : got) {
    ASSERT_EQ(ids.size(), static_cast<size_t>(2 * n));
    for (int e = 0; e < 2; ++e) {
      std::vector<int64_t> epoch(ids.begin() + e * n, ids.begin() + (e + 1) * n);
      std::sort(epoch.begin(), epoch.end());
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(epoch[i], i) << "epoch " << e;
    }
  }
  // Each loader reserved its own generator counters: no two share an order.
  EXPECT_NE(got[0], got[1]);
  EXPECT_NE(got[1], got[2]);
}

}  // namespace
