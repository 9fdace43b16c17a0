// TensorDataset and DataLoader: every sample exactly once per epoch, rows stay
// paired, a new order each epoch, seeded reproducibility, drop_last and the
// short last batch; on the CPU and (when present) on CUDA.
#include <gtest/gtest.h>

#include <tapegrad/tapegrad.h>

#include <algorithm>
#include <set>
#include <vector>

namespace {

using tg::Tensor;
namespace data = tg::data;

bool skip(tg::Device d) { return d.is_cuda() && !tg::cuda::is_available(); }

class Loader : public ::testing::TestWithParam<tg::DeviceType> {
 protected:
  tg::Device dev() const { return tg::Device(GetParam()); }
};

// x row i = [i, i + 0.5], y row i = -i: pairing is checkable from values.
std::pair<Tensor, Tensor> make(int64_t n, tg::Device d) {
  std::vector<double> xs, ys;
  for (int64_t i = 0; i < n; ++i) {
    xs.push_back(static_cast<double>(i));
    xs.push_back(i + 0.5);
    ys.push_back(-static_cast<double>(i));
  }
  return {tg::tensor(xs, {n, 2}).to(d), tg::tensor(ys, {n, 1}).to(d)};
}

// The sample ids of one epoch, checking pairing and batch shapes along the way.
template <typename L>
std::vector<int64_t> epoch_ids(L& loader, std::vector<int64_t>* batch_sizes = nullptr) {
  std::vector<int64_t> ids;
  for (auto [xb, yb] : loader) {
    EXPECT_EQ(xb.device(), loader.dataset().device());
    EXPECT_EQ(xb.size(0), yb.size(0));
    EXPECT_EQ(xb.size(1), 2);
    if (batch_sizes) batch_sizes->push_back(xb.size(0));
    auto x = xb.cpu().contiguous().template to_vector<double>();
    auto y = yb.cpu().contiguous().template to_vector<double>();
    for (int64_t r = 0; r < xb.size(0); ++r) {
      EXPECT_EQ(x[2 * r + 1], x[2 * r] + 0.5);
      EXPECT_EQ(y[r], -x[2 * r]) << "rows not paired";
      ids.push_back(static_cast<int64_t>(x[2 * r]));
    }
  }
  return ids;
}

TEST_P(Loader, EverySampleOncePerEpochNewOrder) {
  if (skip(dev())) GTEST_SKIP() << "no CUDA device";
  auto [x, y] = make(1000, dev());
  data::TensorDataset ds(x, y);
  static_assert(std::is_same_v<decltype(ds), data::TensorDataset<2>>);
  data::DataLoader loader(ds, {.batch_size = 64, .shuffle = true});
  EXPECT_EQ(loader.size(), 16u);
  std::vector<int64_t> sizes;
  auto e0 = epoch_ids(loader, &sizes);
  auto e1 = epoch_ids(loader);
  ASSERT_EQ(e0.size(), 1000u);
  EXPECT_EQ(sizes.size(), 16u);
  EXPECT_EQ(sizes.back(), 1000 - 15 * 64);  // the short last batch
  EXPECT_NE(e0, e1);
  std::vector<int64_t> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  std::sort(e1.begin(), e1.end());
  EXPECT_EQ(e1, sorted);
  std::vector<int64_t> identity(1000);
  for (int64_t i = 0; i < 1000; ++i) identity[i] = i;
  EXPECT_NE(e0, identity);
  EXPECT_EQ(loader.epoch(), 2u);
}

TEST_P(Loader, SeededIsReproducible) {
  if (skip(dev())) GTEST_SKIP() << "no CUDA device";
  auto [x, y] = make(300, dev());
  data::TensorDataset ds(x, y);
  data::DataLoader a(ds, {.batch_size = 32, .shuffle = true, .seed = 42});
  data::DataLoader b(ds, {.batch_size = 32, .shuffle = true, .seed = 42});
  data::DataLoader c(ds, {.batch_size = 32, .shuffle = true, .seed = 43});
  auto a0 = epoch_ids(a);
  (void)tg::rand({10}, dev());  // the global generator does not affect a seeded loader
  auto b0 = epoch_ids(b);
  EXPECT_EQ(a0, b0);
  EXPECT_NE(a0, epoch_ids(c));
  auto a1 = epoch_ids(a), b1 = epoch_ids(b);
  EXPECT_EQ(a1, b1);
  EXPECT_NE(a0, a1);
  // Unseeded loaders follow tg::manual_seed.
  data::DataLoader u(ds, {.batch_size = 32, .shuffle = true});
  tg::manual_seed(7);
  auto u0 = epoch_ids(u);
  tg::manual_seed(7);
  data::DataLoader v(ds, {.batch_size = 32, .shuffle = true});
  EXPECT_EQ(epoch_ids(v), u0);
}

TEST_P(Loader, DropLastAndUnshuffled) {
  if (skip(dev())) GTEST_SKIP() << "no CUDA device";
  auto [x, y] = make(10, dev());
  data::TensorDataset ds(x, y);
  data::DataLoader keep(ds, {.batch_size = 4});
  std::vector<int64_t> sizes;
  auto ids = epoch_ids(keep, &sizes);
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 2}));
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(ids[i], i);  // in order when not shuffled
  data::DataLoader drop(ds, {.batch_size = 4, .shuffle = true, .drop_last = true});
  EXPECT_EQ(drop.size(), 2u);
  sizes.clear();
  auto dids = epoch_ids(drop, &sizes);
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(std::set<int64_t>(dids.begin(), dids.end()).size(), 8u);
  data::DataLoader big(ds, {.batch_size = 64, .drop_last = true});
  EXPECT_EQ(big.size(), 0u);
  EXPECT_TRUE(epoch_ids(big).empty());
  data::DataLoader whole(ds, {.batch_size = 64});
  sizes.clear();
  epoch_ids(whole, &sizes);
  EXPECT_EQ(sizes, (std::vector<int64_t>{10}));
}

INSTANTIATE_TEST_SUITE_P(Devices, Loader, ::testing::Values(tg::kCPU, tg::kCUDA),
                         [](const auto& info) { return info.param == tg::kCPU ? "cpu" : "cuda"; });

TEST(TensorDataset, ThreeTensorsAndErrors) {
  Tensor a = tg::arange(6).reshape({3, 2}), b = tg::zeros({3}), c = tg::ones({3, 4, 5});
  data::TensorDataset ds(a, b, c);
  static_assert(std::is_same_v<decltype(ds), data::TensorDataset<3>>);
  EXPECT_EQ(ds.size(), 3);
  auto [s0, s1, s2] = ds[1];
  EXPECT_EQ(s0.to_vector<int64_t>(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(s2.sizes(), (tg::Shape{4, 5}));
  data::DataLoader loader(ds, {.batch_size = 2});
  int batches = 0;
  for (auto [xa, xb, xc] : loader) {
    EXPECT_EQ(xc.size(1), 4);
    ++batches;
  }
  EXPECT_EQ(batches, 2);
  EXPECT_THROW(data::TensorDataset(a, tg::zeros({4})), tg::Error);
  EXPECT_THROW(data::TensorDataset(a, tg::full({}, 1.0)), tg::Error);
  EXPECT_THROW(data::TensorDataset(a, Tensor()), tg::Error);
  EXPECT_THROW(data::DataLoader(ds, {.batch_size = 0}), tg::Error);
  if (tg::cuda::is_available()) EXPECT_THROW(data::TensorDataset(a, b.cuda()), tg::Error);
}

}  // namespace
