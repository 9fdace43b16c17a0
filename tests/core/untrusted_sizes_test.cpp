// Sizes and values that a crafted file can carry (issue #19's findings 1, 2 and 4): every byte
// count is checked before an allocator sees it, and no conversion is undefined behaviour. Each
// case crashed, hung or tripped UBSan before its fix.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include <tapegrad/tapegrad.h>

namespace {

using tg::Tensor;

// Runs f, which must throw a tg::Error whose message contains every needle.
template <typename F>
void expect_error(F&& f, std::initializer_list<const char*> needles) {
  try {
    f();
    ADD_FAILURE() << "expected a tg::Error";
  } catch (const tg::Error& e) {
    for (const char* n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

TEST(UntrustedSizes, ExpandedViewTooLargeToMaterialize) {
  // [2^62 + 1] float32: the byte count wrapped to 4, and the copy wrote far past a 4-byte block.
  Tensor v = tg::ones({1}).expand({(int64_t{1} << 62) + 1});
  EXPECT_EQ(v.numel(), (int64_t{1} << 62) + 1);  // the view itself is fine, as in PyTorch
  expect_error([&] { v.clone(); }, {"empty", "4611686018427387905", "2^62"});
  expect_error([&] { v.contiguous(); }, {"2^62"});
  expect_error([&] { (v * 2).sum(); }, {"2^62"});
}

TEST(UntrustedSizes, WrappedByteCountDoesNotHang) {
  // 8.4e18 float32 elements: the byte count wrapped, and the host allocator's power-of-two loop
  // never ended. It must now fail at once.
  const auto start = std::chrono::steady_clock::now();
  Tensor v = tg::zeros({1}).expand({int64_t{8400000000000000000}});
  expect_error([&] { v.contiguous(); }, {"2^62"});
  expect_error([&] { tg::empty({int64_t{1} << 61}, tg::kFloat64); }, {"empty", "2^62"});
  expect_error([&] { tg::empty({int64_t{1} << 31, int64_t{1} << 31}, tg::kFloat32); }, {"2^62"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(UntrustedSizes, FromBlobChecksItsSpan) {
  float buf[4] = {1, 2, 3, 4};
  expect_error([&] { tg::from_blob(buf, {int64_t{1} << 62, 4}); }, {"from_blob", "too many elements"});
  expect_error([&] { tg::from_blob(buf, {4}, {-1}, nullptr, nullptr); }, {"from_blob", "negative stride"});
  expect_error([&] { tg::from_blob(buf, {4}, {int64_t{1} << 61}, nullptr, nullptr); }, {"from_blob", "span"});
  Tensor ok = tg::from_blob(buf, {2, 2}, {1, 2}, nullptr, nullptr);
  EXPECT_EQ(ok.contiguous().to_vector<float>(), std::vector<float>({1, 3, 2, 4}));
}

TEST(UntrustedSizes, ZeroElementTensorsWithHugeDims) {
  // contiguous_strides overflowed (UBSan) for [0, 2^62, 4]; the tensor holds nothing and is legal.
  for (tg::Shape shape : {tg::Shape{0, int64_t{1} << 62, 4}, tg::Shape{int64_t{1} << 62, 4, 0}}) {
    Tensor e = tg::empty(shape);
    EXPECT_EQ(e.numel(), 0);
    EXPECT_EQ(e.nbytes(), 0u);
    EXPECT_EQ(e.sizes(), shape);
    EXPECT_EQ((e + 1).numel(), 0);
    EXPECT_EQ(e.sum().item<float>(), 0.f);
  }
  // Reducing over the huge dims of a zero-element tensor (found by fuzz_dlpack).
  Tensor e = tg::empty({0, int64_t{1} << 62, 4});
  EXPECT_EQ(e.sum({1, 2}).sizes(), tg::Shape({0}));
  EXPECT_EQ(e.max({1, 2}).numel(), 0);
  EXPECT_THROW(e.sum(0), tg::Error);  // [2^62, 4] float32 cannot be allocated
}

TEST(UntrustedSizes, ZeroElementHugeDimsSurviveSafetensors) {
  const std::string path = ::testing::TempDir() + "tg_untrusted_zero.safetensors";
  tg::save({{"e", tg::empty({0, int64_t{1} << 62, 4})}}, path);
  auto back = tg::load(path);
  ASSERT_TRUE(back.contains("e"));
  EXPECT_EQ(back.at("e").sizes(), tg::Shape({0, int64_t{1} << 62, 4}));
  EXPECT_EQ(back.at("e").numel(), 0);
}

TEST(UntrustedSizes, ScalarFromNonFiniteDoubles) {
  // Scalar(double) cast ±inf and NaN to int64 (undefined); it saturates now, NaN -> 0.
  constexpr double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(tg::Scalar(inf).to_int(), INT64_MAX);
  EXPECT_EQ(tg::Scalar(-inf).to_int(), INT64_MIN);
  EXPECT_EQ(tg::Scalar(std::nan("")).to_int(), 0);
  EXPECT_EQ(tg::Scalar(1e300).to_int(), INT64_MAX);
  EXPECT_EQ(tg::Scalar(-2.9).to_int(), -2);
  EXPECT_EQ(tg::Scalar(9223372036854774784.0).to_int(), int64_t{9223372036854774784});  // largest double < 2^63
  EXPECT_EQ(tg::Scalar(-inf).to_double(), -inf);
  // Reaching ops: an integer tensor clamped to (-inf, inf) keeps its values.
  Tensor i = tg::tensor(std::vector<int64_t>{-5, 0, 7});
  EXPECT_EQ(i.clamp(-inf, inf).to_vector<int64_t>(), std::vector<int64_t>({-5, 0, 7}));
  EXPECT_EQ(tg::full({}, std::nan(""), tg::kFloat32).item<int64_t>(), 0);
  EXPECT_EQ(tg::full({}, inf, tg::kFloat32).item<int>(), -1);  // INT64_MAX narrowed to int, as a C++ cast
}

TEST(UntrustedSizes, FloatToIntegerCopiesSaturate) {
  // load_state_dict copied NaN into an int64 buffer through a plain cast (undefined).
  constexpr float inf = std::numeric_limits<float>::infinity();
  Tensor f = tg::tensor(std::vector<float>{std::nanf(""), inf, -inf, 1e30f, -1e30f, -2.75f, 3.5f});
  EXPECT_EQ(f.to(tg::kInt64).to_vector<int64_t>(),
            std::vector<int64_t>({0, INT64_MAX, INT64_MIN, INT64_MAX, INT64_MIN, -2, 3}));
  EXPECT_EQ(f.to(tg::kInt32).to_vector<int32_t>(),
            std::vector<int32_t>({0, INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN, -2, 3}));
  Tensor buffer = tg::zeros({2}, tg::kInt64);
  buffer.copy_(tg::tensor(std::vector<double>{std::nan(""), 1e19}));
  EXPECT_EQ(buffer.to_vector<int64_t>(), std::vector<int64_t>({0, INT64_MAX}));
}

TEST(UntrustedSizes, IntegerExtremesWrap) {
  // abs(INT64_MIN) and -INT64_MIN were signed overflow; integer tensor arithmetic wraps, as PyTorch's.
  Tensor m = tg::tensor(std::vector<int64_t>{INT64_MIN, INT64_MAX, -3});
  EXPECT_EQ(m.abs().to_vector<int64_t>(), std::vector<int64_t>({INT64_MIN, INT64_MAX, 3}));
  EXPECT_EQ((-m).to_vector<int64_t>(), std::vector<int64_t>({INT64_MIN, INT64_MIN + 1, 3}));
  EXPECT_EQ((m + 1).to_vector<int64_t>(), std::vector<int64_t>({INT64_MIN + 1, INT64_MIN, -2}));
  Tensor n = m.clone();
  n.sub_(tg::Scalar(static_cast<long long>(INT64_MIN)));
  EXPECT_EQ(n.to_vector<int64_t>(), std::vector<int64_t>({0, -1, INT64_MAX - 2}));
  EXPECT_EQ(m.sum().item<int64_t>(), INT64_MIN + INT64_MAX - 3);
}

}  // namespace
