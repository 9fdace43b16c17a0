// The multi-tensor row gather (native::index_select_rows) behind the DataLoader's
// batches: equal to index_select per tensor on the CPU and CUDA for mixed dtypes
// and row sizes (float32 + int64 + float16, odd byte widths), strided sources via
// the per-tensor fallback, more tensors than one launch takes, bounds errors; and
// a shuffled DataLoader over three tensors of different dtypes that yields every
// sample exactly once with its rows paired, in one dispatch per batch.
#include <gtest/gtest.h>

#include <tapegrad/tapegrad.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include <tapegrad/core/backend/backend.h>
#include <tapegrad/core/native.h>

namespace {

using tg::Tensor;
namespace data = tg::data;

class GatherRows : public ::testing::TestWithParam<tg::DeviceType> {
 protected:
  tg::Device dev() const { return tg::Device(GetParam()); }
  void SetUp() override {
    if (dev().is_cuda() && !tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }
};

// Element-for-element equality of two tensors of any dtype (compared as float64 on the host,
// exact for these values).
void expect_same(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.sizes(), want.sizes());
  ASSERT_EQ(got.dtype(), want.dtype());
  ASSERT_EQ(got.device(), want.device());
  EXPECT_TRUE(got.is_contiguous());
  EXPECT_EQ(got.cpu().to(tg::kFloat64).contiguous().to_vector<double>(),
            want.cpu().to(tg::kFloat64).contiguous().to_vector<double>());
}

Tensor values(tg::Shape shape, tg::DType dtype, tg::Device dev, int64_t offset) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  // Small integers: exact in every dtype used here (0 / 1 for bool).
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = dtype == tg::kBool ? static_cast<double>(i % 3 == 0) : i % 200 + offset;
  return tg::tensor(v, shape).to(dev, dtype);
}

TEST_P(GatherRows, EqualsIndexSelectPerTensor) {
  const int64_t rows = 257;
  std::vector<Tensor> ts = {
      values({rows, 64}, tg::kFloat32, dev(), 0),  // 256-byte rows: 16-byte words
      values({rows}, tg::kInt64, dev(), 1),        // 8-byte rows
      values({rows, 3}, tg::kFloat16, dev(), 2),   // 6-byte rows: 2-byte words
      values({rows, 2, 5}, tg::kInt32, dev(), 3),  // 40-byte rows: 8-byte words
      values({rows, 1}, tg::kBool, dev(), 0),      // 1-byte rows
      values({rows, 7}, tg::kBFloat16, dev(), 4),  // 14-byte rows
  };
  for (tg::DType idx_dtype : {tg::kInt64, tg::kInt32}) {
    Tensor perm = tg::randperm(rows, tg::TensorOptions().dtype(idx_dtype).device(dev()));
    Tensor idx = perm.slice(0, 10, 200);  // a view into the permutation, as the DataLoader takes
    const uint64_t c0 = tg::backend::dispatch_count();
    std::vector<Tensor> got = tg::native::index_select_rows(ts, idx, /*check_bounds=*/false);
    EXPECT_EQ(tg::backend::dispatch_count() - c0, 1u) << "one gather for all contiguous tensors";
    ASSERT_EQ(got.size(), ts.size());
    for (size_t k = 0; k < ts.size(); ++k) {
      SCOPED_TRACE(k);
      expect_same(got[k], ts[k].index_select(0, idx));
    }
  }
}

TEST_P(GatherRows, PublicGatherRowsChecksBounds) {
  const int64_t rows = 50;
  Tensor x = values({rows, 4}, tg::kFloat32, dev(), 0);
  Tensor y = values({rows}, tg::kInt64, dev(), 7);
  Tensor idx = tg::tensor(std::vector<int64_t>{49, 0, 3, 3}).to(dev());
  auto [xb, yb] = data::gather_rows<2>({x, y}, idx);
  expect_same(xb, x.index_select(0, idx));
  expect_same(yb, y.index_select(0, idx));
  for (int64_t bad : {int64_t{50}, int64_t{-1}}) {
    Tensor b = tg::tensor(std::vector<int64_t>{0, bad}).to(dev());
    try {
      data::gather_rows<2>({x, y}, b);
      ADD_FAILURE() << "expected tg::Error for index " << bad;
    } catch (const tg::Error& e) {
      EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
    }
  }
}

TEST_P(GatherRows, StridedSourcesAndManyTensors) {
  const int64_t rows = 50;
  Tensor base = values({6, rows}, tg::kFloat32, dev(), 0);
  Tensor strided = base.t();  // [rows, 6], not contiguous: per-tensor fallback
  Tensor offset = values({rows + 1, 3}, tg::kFloat16, dev(), 5).slice(0, 1, rows + 1);  // contiguous, offset 6 bytes
  ASSERT_FALSE(strided.is_contiguous());
  ASSERT_TRUE(offset.is_contiguous());
  std::vector<Tensor> ts = {strided, offset};
  for (int k = 0; k < 2 * tg::backend::kMaxGatherRows + 1; ++k)
    ts.push_back(values({rows, k % 4 + 1}, k % 2 ? tg::kInt64 : tg::kFloat32, dev(), k));
  Tensor idx = tg::randperm(rows, tg::TensorOptions().dtype(tg::kInt64).device(dev()));
  std::vector<Tensor> got = tg::native::index_select_rows(ts, idx);
  ASSERT_EQ(got.size(), ts.size());
  for (size_t k = 0; k < ts.size(); ++k) {
    SCOPED_TRACE(k);
    expect_same(got[k], ts[k].index_select(0, idx));
  }
  // Empty index and zero-width rows.
  Tensor none = tg::zeros({0}, tg::TensorOptions().dtype(tg::kInt64).device(dev()));
  auto empty = tg::native::index_select_rows({ts[2], values({rows, 0}, tg::kFloat32, dev(), 0)}, none);
  EXPECT_EQ(empty[0].sizes(), (tg::Shape{0, ts[2].size(1)}));
  auto zero_width = tg::native::index_select_rows({values({rows, 0}, tg::kFloat32, dev(), 0), ts[2]}, idx);
  EXPECT_EQ(zero_width[0].sizes(), (tg::Shape{rows, 0}));
  expect_same(zero_width[1], ts[2].index_select(0, idx));
}

TEST_P(GatherRows, Errors) {
  auto i64 = tg::TensorOptions().dtype(tg::kInt64).device(dev());
  Tensor x = values({4, 2}, tg::kFloat32, dev(), 0), y = values({3}, tg::kFloat32, dev(), 0);
  // Checked against the smallest dim 0 of all tensors.
  EXPECT_THROW(tg::native::index_select_rows({x, y}, tg::arange(0, 4, 1, i64)), tg::Error);
  EXPECT_NO_THROW(tg::native::index_select_rows({x, y}, tg::arange(0, 3, 1, i64)));
  EXPECT_THROW(tg::native::index_select_rows({x}, tg::full({1}, -1, i64)), tg::Error);
  EXPECT_THROW(tg::native::index_select_rows({x}, tg::zeros({2}, tg::TensorOptions().device(dev()))), tg::Error);
  EXPECT_THROW(tg::native::index_select_rows({x}, tg::zeros({1, 1}, i64)), tg::Error);
  EXPECT_THROW(
      tg::native::index_select_rows({x, tg::full({}, 1.0, tg::TensorOptions().device(dev()))}, tg::zeros({1}, i64)),
      tg::Error);
  EXPECT_THROW(tg::native::index_select_rows({x, Tensor()}, tg::zeros({1}, i64)), tg::Error);
  if (tg::cuda::is_available())
    EXPECT_THROW(tg::native::index_select_rows({x.to(dev().is_cuda() ? tg::Device(tg::kCPU) : tg::Device(tg::kCUDA))},
                                               tg::zeros({1}, i64)),
                 tg::Error);
}

// float32 features, int64 labels and float16 weights: every sample once per epoch, the
// rows of one sample together, each batch equal to index_select and one dispatch.
TEST_P(GatherRows, DataLoaderMixedDtypes) {
  const int64_t n = 1000;
  std::vector<double> xs, ws;
  std::vector<int64_t> ls;
  for (int64_t i = 0; i < n; ++i) {
    xs.push_back(static_cast<double>(i));
    xs.push_back(i + 0.5);
    xs.push_back(-static_cast<double>(i));
    ls.push_back(3 * i + 1);
    ws.push_back(static_cast<double>(i % 512) / 4);  // exact in float16
  }
  Tensor x = tg::tensor(xs, {n, 3}).to(dev(), tg::kFloat32);
  Tensor l = tg::tensor(ls, {n}).to(dev());
  Tensor w = tg::tensor(ws, {n, 1}).to(dev(), tg::kFloat16);
  data::TensorDataset ds(x, l, w);
  data::DataLoader loader(ds, {.batch_size = 96, .shuffle = true, .seed = 5});
  std::vector<int64_t> seen;
  for (auto it = loader.begin(); !(it == loader.end()); ++it) {
    const uint64_t c0 = tg::backend::dispatch_count();
    auto [xb, lb, wb] = *it;
    EXPECT_EQ(tg::backend::dispatch_count() - c0, 1u) << "one gather per batch";
    EXPECT_EQ(xb.dtype(), tg::kFloat32);
    EXPECT_EQ(lb.dtype(), tg::kInt64);
    EXPECT_EQ(wb.dtype(), tg::kFloat16);
    EXPECT_EQ(xb.device().type(), dev().type());
    auto X = xb.cpu().to_vector<float>();
    auto L = lb.cpu().to_vector<int64_t>();
    auto W = wb.cpu().to(tg::kFloat64).to_vector<double>();
    ASSERT_EQ(L.size(), W.size());
    for (size_t r = 0; r < L.size(); ++r) {
      const int64_t id = static_cast<int64_t>(X[3 * r]);
      EXPECT_EQ(X[3 * r + 1], static_cast<float>(id + 0.5));
      EXPECT_EQ(X[3 * r + 2], -static_cast<float>(id));
      EXPECT_EQ(L[r], 3 * id + 1) << "rows not paired";
      EXPECT_EQ(W[r], static_cast<double>(id % 512) / 4) << "rows not paired";
      seen.push_back(id);
    }
  }
  ASSERT_EQ(seen.size(), static_cast<size_t>(n));
  std::vector<int64_t> sorted = seen;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(sorted[i], i);
  std::vector<int64_t> identity(sorted);
  EXPECT_NE(seen, identity);
}

// A strided dataset tensor still works (it takes index_select alone).
TEST_P(GatherRows, DataLoaderStridedTensor) {
  const int64_t n = 40;
  Tensor xt = values({2, n}, tg::kFloat32, dev(), 0).t();  // [n, 2], row i = (i, n + i)
  Tensor y = values({n}, tg::kInt64, dev(), 0);            // row i = i
  data::DataLoader loader(data::TensorDataset(xt, y), {.batch_size = 16, .shuffle = true});
  int64_t count = 0;
  for (auto [xb, yb] : loader) {
    auto X = xb.cpu().contiguous().to_vector<float>();
    auto Y = yb.cpu().to_vector<int64_t>();
    for (size_t r = 0; r < Y.size(); ++r) {
      EXPECT_EQ(X[2 * r], static_cast<float>(Y[r]));
      EXPECT_EQ(X[2 * r + 1], static_cast<float>(n + Y[r]));
    }
    count += static_cast<int64_t>(Y.size());
  }
  EXPECT_EQ(count, n);
}

INSTANTIATE_TEST_SUITE_P(Devices, GatherRows, ::testing::Values(tg::kCPU, tg::kCUDA),
                         [](const auto& info) { return info.param == tg::kCPU ? "cpu" : "cuda"; });

}  // namespace
