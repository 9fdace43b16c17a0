// Bad input becomes a tg::Error whose message starts with the op's name and
// names the offending shapes / dtypes / devices; what PyTorch accepts (slice
// bounds out of range are clamped) must not throw.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.h>

namespace {

using tg::Tensor;

// Runs fn, expects a tg::Error whose message contains every one of `parts`.
::testing::AssertionResult throws_with(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const tg::Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts)
      if (msg.find(p) == std::string::npos)
        return ::testing::AssertionFailure() << "message lacks \"" << p << "\": " << msg;
    return ::testing::AssertionSuccess() << msg;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-tg::Error: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

TEST(Errors, ErrorIsRuntimeError) {
  try {
    (void)tg::matmul(tg::zeros({2, 3}), tg::zeros({4, 5}));
    FAIL() << "matmul of [2, 3] and [4, 5] did not throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(dynamic_cast<const tg::Error*>(&e), nullptr);
  }
}

TEST(Errors, MatmulShapeMismatch) {
  EXPECT_TRUE(throws_with(
      [] {
        (void)tg::matmul(tg::zeros({2, 3}), tg::zeros({4, 5}));
      },
      {"matmul", "[2, 3]", "[4, 5]"}));
  EXPECT_TRUE(throws_with([] { (void)tg::zeros({3}).matmul(tg::zeros({4})); }, {"matmul", "[3]", "[4]"}));
  EXPECT_TRUE(throws_with(
      [] {
        (void)tg::matmul(tg::zeros({2, 2, 3}), tg::zeros({3, 3, 4}));
      },
      {"matmul", "[2, 2, 3]", "[3, 3, 4]"}));
  EXPECT_TRUE(throws_with([] { (void)tg::matmul(tg::zeros({}), tg::zeros({3})); }, {"matmul"}));
  EXPECT_TRUE(throws_with(
      [] {
        (void)tg::matmul(tg::zeros({2, 3}), tg::zeros({3, 2}, tg::kFloat64));
      },
      {"matmul", "float32", "float64"}));
}

TEST(Errors, BroadcastMismatch) {
  EXPECT_TRUE(throws_with([] { (void)(tg::zeros({2, 3}) + tg::zeros({4})); }, {"add", "[2, 3]", "[4]"}));
  EXPECT_TRUE(throws_with([] { (void)(tg::zeros({2, 3}) * tg::zeros({3, 2})); }, {"mul", "[2, 3]", "[3, 2]"}));
  EXPECT_TRUE(
      throws_with([] { (void)tg::where(tg::zeros({2}, tg::kBool), tg::zeros({3}), tg::zeros({3})); }, {"where"}));
  // In place cannot broadcast self.
  EXPECT_TRUE(throws_with([] { tg::zeros({3}).add_(tg::zeros({2, 3})); }, {"add", "[3]", "[2, 3]"}));
}

TEST(Errors, MixedDevices) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  EXPECT_TRUE(throws_with([] { (void)(tg::zeros({3}) + tg::zeros({3}, tg::kCUDA)); }, {"add", "cpu", "cuda"}));
  EXPECT_TRUE(throws_with(
      [] {
        (void)tg::matmul(tg::zeros({2, 2}, tg::kCUDA), tg::zeros({2, 2}));
      },
      {"matmul", "cpu", "cuda"}));
  EXPECT_TRUE(throws_with([] { (void)tg::zeros({3}, tg::kCUDA).index_select(0, tg::zeros({1}, tg::kInt64)); },
                          {"index_select"}));
  EXPECT_TRUE(throws_with([] { (void)tg::zeros({2}, tg::kCUDA).accessor<float, 1>(); }, {"accessor"}));
  // copy_ between devices is allowed
  Tensor g = tg::zeros({3}, tg::kCUDA);
  EXPECT_NO_THROW(g.copy_(tg::ones({3})));
  EXPECT_EQ(g.to_vector<float>(), std::vector<float>(3, 1.f));
}

TEST(Errors, WrongElementType) {
  Tensor x = tg::zeros({3});
  EXPECT_TRUE(throws_with([&] { (void)x.data_ptr<double>(); }, {"data_ptr", "float64", "float32"}));
  EXPECT_TRUE(throws_with([&] { (void)x.data_ptr<int32_t>(); }, {"data_ptr", "int32", "float32"}));
  EXPECT_TRUE(throws_with([&] { (void)x.to_vector<int64_t>(); }, {"to_vector", "int64", "float32"}));
  EXPECT_TRUE(throws_with([&] { (void)x.accessor<double, 1>(); }, {"float64", "float32"}));
  EXPECT_NO_THROW((void)x.data_ptr<float>());
}

TEST(Errors, DimOutOfRange) {
  Tensor x = tg::zeros({2, 3});
  EXPECT_TRUE(throws_with([&] { (void)x.sum(2); }, {"sum", "2"}));
  EXPECT_TRUE(throws_with([&] { (void)x.sum({0, -3}); }, {"sum", "-3"}));
  EXPECT_TRUE(throws_with([&] { (void)x.mean(5); }, {"mean"}));
  EXPECT_TRUE(throws_with([&] { (void)x.transpose(0, 2); }, {"transpose", "2"}));
  EXPECT_TRUE(throws_with([&] { (void)x.unsqueeze(4); }, {"unsqueeze", "4"}));
  EXPECT_TRUE(throws_with([&] { (void)x.unsqueeze(-4); }, {"unsqueeze"}));
  EXPECT_NO_THROW((void)x.unsqueeze(2));   // dim() is a valid insertion point
  EXPECT_NO_THROW((void)x.unsqueeze(-3));  // wraps to 0
  EXPECT_TRUE(throws_with([&] { (void)x.select(1, 3); }, {"select", "3"}));
  EXPECT_TRUE(throws_with([&] { (void)x.argmax(2); }, {"argmax"}));
  EXPECT_TRUE(throws_with([&] { (void)x.permute({0, 0}); }, {"permute"}));
  EXPECT_TRUE(throws_with([&] { (void)x.permute({0}); }, {"permute"}));
  EXPECT_TRUE(throws_with([&] { (void)x.size(2); }, {"2"}));
}

TEST(Errors, ViewErrors) {
  Tensor x = tg::zeros({2, 3});
  EXPECT_TRUE(throws_with([&] { (void)x.view({4, 2}); }, {"view", "[4, 2]", "[2, 3]"}));
  EXPECT_TRUE(throws_with([&] { (void)x.view({-1, 4}); }, {"view"}));
  EXPECT_TRUE(throws_with([&] { (void)x.view({-1, -1}); }, {"view"}));
  EXPECT_TRUE(throws_with([&] { (void)x.reshape({7}); }, {"reshape", "[7]"}));
  // A transposed tensor cannot be flattened without a copy: view refuses, reshape copies.
  EXPECT_TRUE(throws_with([&] { (void)x.t().view({6}); }, {"view"}));
  EXPECT_NO_THROW((void)x.t().reshape({6}));
  EXPECT_TRUE(throws_with([&] { (void)x.expand({3, 3}); }, {"expand", "[2, 3]", "[3, 3]"}));
  EXPECT_TRUE(throws_with([&] { (void)x.expand({3}); }, {"expand"}));  // fewer dims than the tensor
  EXPECT_EQ(x.squeeze(1).sizes(), tg::Shape({2, 3})) << "squeeze of a dim that is not 1 is a no-op, not an error";
  EXPECT_TRUE(throws_with([&] { (void)x.slice(0, 0, 2, 0); }, {"slice", "step"}));
  EXPECT_TRUE(throws_with([&] { (void)x.slice(0, 0, 2, -1); }, {"slice", "step"}));
}

TEST(Errors, SliceBoundsAreClamped) {
  Tensor x = tg::arange(10, tg::kFloat32);
  EXPECT_EQ(x.slice(0, 5, 100).sizes(), tg::Shape({5}));
  EXPECT_EQ(x.slice(0, -100, 3).sizes(), tg::Shape({3}));
  EXPECT_EQ(x.slice(0, 20, 30).sizes(), tg::Shape({0}));
  EXPECT_EQ(x.slice(0, 7, 2).sizes(), tg::Shape({0}));  // end before start: empty
  EXPECT_EQ(x.slice(0, 1, 100, 3).to_vector<float>(), (std::vector<float>{1, 4, 7}));
  EXPECT_EQ(x.slice(0, -3, 10).to_vector<float>(), (std::vector<float>{7, 8, 9}));
}

TEST(Errors, ItemOnManyElements) {
  EXPECT_TRUE(throws_with([] { (void)tg::zeros({2, 3}).item(); }, {"item", "6"}));
  EXPECT_TRUE(throws_with([] { (void)tg::zeros({0}).item<float>(); }, {"item"}));
  EXPECT_NO_THROW((void)tg::zeros({1, 1, 1}).item<float>());
}

TEST(Errors, NegativeSizesInFactories) {
  EXPECT_TRUE(throws_with([] { (void)tg::zeros({2, -1}); }, {"[2, -1]"}));
  EXPECT_TRUE(throws_with([] { (void)tg::empty({-3}); }, {"-3"}));
  EXPECT_TRUE(throws_with([] { (void)tg::rand({-1}); }, {"-1"}));
  EXPECT_TRUE(throws_with([] { (void)tg::full({-2}, 1.0); }, {"-2"}));
  EXPECT_TRUE(throws_with([] { (void)tg::randperm(-1); }, {"randperm", "-1"}));
  EXPECT_TRUE(throws_with([] { (void)tg::arange(0.0, 1.0, 0.0); }, {"arange"}));
  EXPECT_TRUE(throws_with([] { (void)tg::arange(5.0, 1.0, 1.0); }, {"arange"}));
  EXPECT_TRUE(throws_with([] { (void)tg::tensor(std::vector<float>{1, 2, 3}, {2, 2}); }, {"tensor", "[2, 2]"}));
}

TEST(Errors, IndexSelect) {
  Tensor x = tg::zeros({3, 4});
  EXPECT_TRUE(throws_with(
      [&] {
        (void)x.index_select(0, tg::tensor(std::vector<int64_t>{0, 3}));
      },
      {"index_select", "3"}));
  EXPECT_TRUE(throws_with([&] { (void)x.index_select(1, tg::tensor(std::vector<int64_t>{-1})); }, {"index_select"}));
  EXPECT_TRUE(throws_with([&] { (void)x.index_select(0, tg::zeros({1})); }, {"index_select", "float32"}));
  EXPECT_TRUE(throws_with([&] { (void)x.index_select(0, tg::zeros({1, 1}, tg::kInt64)); }, {"index_select"}));
  EXPECT_TRUE(throws_with([&] { (void)x.index_select(2, tg::zeros({1}, tg::kInt64)); }, {"index_select"}));
}

TEST(Errors, ReductionsOverEmpty) {
  Tensor e = tg::zeros({0, 3});
  EXPECT_TRUE(throws_with([&] { (void)e.max(); }, {"max"}));
  EXPECT_TRUE(throws_with([&] { (void)e.max(0); }, {"max"}));
  EXPECT_TRUE(throws_with([&] { (void)e.min(0); }, {"min"}));
  EXPECT_TRUE(throws_with([&] { (void)e.argmax(); }, {"argmax"}));
  EXPECT_NO_THROW((void)e.max(1));  // the reduced dim is not empty
  EXPECT_NO_THROW((void)e.sum(0));  // a sum over nothing is 0
}

TEST(Errors, InPlaceDtypeRules) {
  // PyTorch refuses an in-place op whose result type cannot be cast to self's
  // dtype (float result into an integer tensor).
  EXPECT_TRUE(throws_with([] { tg::zeros({2}, tg::kInt64).add_(tg::ones({2})); }, {"add", "int64", "float32"}));
  EXPECT_TRUE(throws_with([] { tg::zeros({2}, tg::kInt64).mul_(2.5); }, {"mul", "int64", "float32"}));
  EXPECT_TRUE(throws_with([] { tg::zeros({2}).copy_(tg::zeros({3})); }, {"copy_", "[2]", "[3]"}));
}

TEST(Errors, UndefinedTensor) {
  Tensor u;
  EXPECT_TRUE(throws_with([&] { (void)u.sizes(); }, {"undefined"}));
}

TEST(Errors, MessageCarriesFileAndLine) {
  try {
    (void)tg::zeros({2, 3}).view({5});
    FAIL() << "did not throw";
  } catch (const tg::Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind("view", 0), 0u) << "message should start with the op name: " << msg;
    bool has_loc = msg.size() > 2 && msg.back() == ')' && msg.find(':', msg.rfind('(')) != std::string::npos;
    EXPECT_TRUE(has_loc) << "message should end with (file:line): " << msg;
  }
}

}  // namespace

TEST(Errors, InPlaceRandomFills) {
  for (tg::Device dev : {tg::Device(tg::kCPU), tg::Device(tg::kCUDA)}) {
    if (dev.is_cuda() && !tg::cuda::is_available()) continue;
    SCOPED_TRACE(dev.str());
    Tensor i = tg::zeros({4}, tg::TensorOptions().dtype(tg::kInt64).device(dev));
    EXPECT_TRUE(throws_with([&] { i.normal_(); }, {"normal_", "int64", "[4]"}));
    Tensor f = tg::zeros({4}, dev);
    EXPECT_TRUE(throws_with([&] { f.normal_(0.0, -1.0); }, {"normal_", "std >= 0", "-1"}));
    EXPECT_TRUE(throws_with([&] { f.uniform_(2.0, 1.0); }, {"uniform_", "from <= to"}));
    EXPECT_TRUE(throws_with([&] { f.uniform_(0.0, INFINITY); }, {"uniform_", "finite"}));
    Tensor w = tg::zeros({4}, tg::TensorOptions().device(dev).requires_grad(true));
    EXPECT_TRUE(throws_with([&] { w.uniform_(); }, {"uniform_", "requires grad"}));
    tg::NoGradGuard ng;
    w.uniform_(0.5, 0.75);
    for (float v : w.to_vector<float>()) EXPECT_TRUE(v >= 0.5f && v < 0.75f) << v;
  }
}
