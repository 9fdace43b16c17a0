// uint8, int8 and int16 (#15): names and sizes, torch.promote_types' table, casts to and from
// every dtype (float -> integer truncates toward zero and saturates, integer -> narrower integer
// wraps, as a C++20 cast), arithmetic wrapping in the storage type, comparisons against scalars
// outside the type's range, reductions, indexing, printing, DLPack and safetensors. Each case runs
// on the CPU against hand-computed values and on CUDA (when present) against the same values.
#include <gtest/gtest.h>

#include <cmath>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "../autograd/common.h"

namespace {

using tg::DType;
using tg::Tensor;
using tg::testing::Dev;
using tg::testing::host;

constexpr DType kSmall[] = {tg::kUInt8, tg::kInt8, tg::kInt16};
constexpr DType kAll[] = {tg::kFloat32, tg::kFloat16, tg::kBFloat16, tg::kFloat64, tg::kInt64,
                          tg::kInt32,   tg::kBool,    tg::kUInt8,    tg::kInt8,    tg::kInt16};

TEST(SmallIntDTypes, NamesSizesAndKinds) {
  EXPECT_STREQ(tg::dtype_name(tg::kUInt8), "uint8");
  EXPECT_STREQ(tg::dtype_name(tg::kInt8), "int8");
  EXPECT_STREQ(tg::dtype_name(tg::kInt16), "int16");
  EXPECT_EQ(tg::element_size(tg::kUInt8), 1u);
  EXPECT_EQ(tg::element_size(tg::kInt8), 1u);
  EXPECT_EQ(tg::element_size(tg::kInt16), 2u);
  EXPECT_EQ(tg::kByte, tg::kUInt8);
  EXPECT_EQ(tg::kChar, tg::kInt8);
  EXPECT_EQ(tg::kShort, tg::kInt16);
  for (DType t : kSmall) {
    EXPECT_TRUE(tg::is_integral(t));
    EXPECT_FALSE(tg::is_floating(t));
  }
  EXPECT_EQ(tg::dtype_of<uint8_t>, tg::kUInt8);
  EXPECT_EQ(tg::dtype_of<int8_t>, tg::kInt8);
  EXPECT_EQ(tg::dtype_of<int16_t>, tg::kInt16);
  EXPECT_EQ(tg::kNumDTypes, 10);
}

TEST(SmallIntDTypes, PromotionFollowsTorch) {
  // torch.promote_types for every pair involving the new dtypes.
  struct Case {
    DType a, b, want;
  };
  const Case cases[] = {
      {tg::kUInt8, tg::kUInt8, tg::kUInt8},     {tg::kUInt8, tg::kInt8, tg::kInt16},
      {tg::kUInt8, tg::kInt16, tg::kInt16},     {tg::kUInt8, tg::kInt32, tg::kInt32},
      {tg::kUInt8, tg::kInt64, tg::kInt64},     {tg::kUInt8, tg::kBool, tg::kUInt8},
      {tg::kUInt8, tg::kFloat16, tg::kFloat16}, {tg::kUInt8, tg::kBFloat16, tg::kBFloat16},
      {tg::kInt8, tg::kInt16, tg::kInt16},      {tg::kInt8, tg::kInt32, tg::kInt32},
      {tg::kInt8, tg::kBool, tg::kInt8},        {tg::kInt8, tg::kFloat32, tg::kFloat32},
      {tg::kInt16, tg::kInt32, tg::kInt32},     {tg::kInt16, tg::kInt64, tg::kInt64},
      {tg::kInt16, tg::kFloat64, tg::kFloat64}, {tg::kInt32, tg::kInt64, tg::kInt64},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(tg::promote_types(c.a, c.b), c.want) << c.a << " " << c.b;
    EXPECT_EQ(tg::promote_types(c.b, c.a), c.want) << c.b << " " << c.a;
  }
}

class SmallInt : public ::testing::TestWithParam<Dev> {
 protected:
  tg::Device dev() const { return tg::testing::to_device(GetParam()); }
  // A tensor of `values` (exactly representable in float64) with dtype `dt` on the device.
  Tensor make(const std::vector<double>& values, DType dt) const {
    return tg::tensor(values).to(dt).to(dev());
  }
};

TEST_P(SmallInt, CastsFromFloatTruncateAndSaturate) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> in = {-1e9, -300.0, -128.5, -1.7, -0.5, 0.0, 0.9, 126.9, 254.9, 300.0, 1e9, nan};
  const std::vector<double> want_u8 = {0, 0, 0, 0, 0, 0, 0, 126, 254, 255, 255, 0};
  const std::vector<double> want_i8 = {-128, -128, -128, -1, 0, 0, 0, 126, 127, 127, 127, 0};
  const std::vector<double> want_i16 = {-32768, -300, -128, -1, 0, 0, 0, 126, 254, 300, 32767, 0};
  for (DType from : {tg::kFloat64, tg::kFloat32}) {
    const Tensor x = tg::tensor(in).to(from).to(dev());
    EXPECT_EQ(host(x.to(tg::kUInt8)), want_u8) << from;
    EXPECT_EQ(host(x.to(tg::kInt8)), want_i8) << from;
    EXPECT_EQ(host(x.to(tg::kInt16)), want_i16) << from;
  }
  // float16 / bfloat16 go through float: 254.9 is 255 in float16 and 255 in bfloat16.
  const Tensor h = tg::tensor(std::vector<double>{-3.0, 2.5, 100.0, 70000.0}).to(dev());
  EXPECT_EQ(host(h.to(tg::kFloat16).to(tg::kInt8)), (std::vector<double>{-3, 2, 100, 127}));
  EXPECT_EQ(host(h.to(tg::kBFloat16).to(tg::kUInt8)), (std::vector<double>{0, 2, 100, 255}));
}

TEST_P(SmallInt, CastsBetweenIntegersWrapAndEveryPairRoundTrips) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  // Narrowing integer casts keep the low bits (two's complement), as torch's .to().
  const Tensor w = make({200, -1, 256, 70000, -32769}, tg::kInt32);
  EXPECT_EQ(host(w.to(tg::kUInt8)), (std::vector<double>{200, 255, 0, 112, 255}));
  EXPECT_EQ(host(w.to(tg::kInt8)), (std::vector<double>{-56, -1, 0, 112, -1}));
  EXPECT_EQ(host(w.to(tg::kInt16)), (std::vector<double>{200, -1, 256, 4464, 32767}));
  EXPECT_EQ(host(make({0, 255, 128}, tg::kUInt8).to(tg::kInt8)), (std::vector<double>{0, -1, -128}));
  // Values every dtype holds exactly: through each pair of dtypes and back.
  const std::vector<double> small = {0, 1, 7, 100, 0, 3};
  for (DType a : kAll)
    for (DType b : kAll) {
      if (a == tg::kBool || b == tg::kBool) continue;
      const Tensor t = make(small, a).to(b);
      EXPECT_EQ(t.dtype(), b);
      EXPECT_EQ(host(t.to(a)), small) << a << " -> " << b;
    }
  // To and from bool: nonzero is true.
  EXPECT_EQ(host(make({0, 5, 0, 255}, tg::kUInt8).to(tg::kBool)), (std::vector<double>{0, 1, 0, 1}));
  EXPECT_EQ(host(make({0, -5}, tg::kInt8).to(tg::kBool).to(tg::kInt16)), (std::vector<double>{0, 1}));
  // Non-contiguous sources and destinations.
  const Tensor m = tg::arange(0, 12, 1, tg::kInt64).reshape({3, 4}).to(dev()).to(tg::kUInt8).t();
  EXPECT_EQ(host(m.to(tg::kInt16)), host(tg::arange(0, 12, 1, tg::kInt64).reshape({3, 4}).t()));
}

TEST_P(SmallInt, ArithmeticWrapsInTheStorageType) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Tensor a = make({200, 10, 255, 0}, tg::kUInt8), b = make({100, 5, 1, 1}, tg::kUInt8);
  Tensor s = a + b;
  EXPECT_EQ(s.dtype(), tg::kUInt8);
  EXPECT_EQ(host(s), (std::vector<double>{44, 15, 0, 1}));
  EXPECT_EQ(host(a - b), (std::vector<double>{100, 5, 254, 255}));
  EXPECT_EQ(host(a * b), (std::vector<double>{32, 50, 255, 0}));  // 20000 mod 256 = 32
  EXPECT_EQ(host(a * 2), (std::vector<double>{144, 20, 254, 0}));
  EXPECT_EQ(host(-b), (std::vector<double>{156, 251, 255, 255}));
  // Mixed integer dtypes promote (uint8 with int8 -> int16); floats and true division go to float.
  const Tensor c = make({-100, 5, -1, 127}, tg::kInt8);
  Tensor m = a + c;
  EXPECT_EQ(m.dtype(), tg::kInt16);
  EXPECT_EQ(host(m), (std::vector<double>{100, 15, 254, 127}));
  EXPECT_EQ((a + 1.5).dtype(), tg::kFloat32);
  EXPECT_EQ(host(a + 1.5), (std::vector<double>{201.5, 11.5, 256.5, 1.5}));
  Tensor q = b / make({8, 2, 4, 4}, tg::kUInt8);
  EXPECT_EQ(q.dtype(), tg::kFloat32);
  EXPECT_EQ(host(q), (std::vector<double>{12.5, 2.5, 0.25, 0.25}));
  // int8: -128 negates to itself; abs, relu, clamp in the type.
  const Tensor i8 = make({-128, -3, 0, 127}, tg::kInt8);
  EXPECT_EQ(host(-i8), (std::vector<double>{-128, 3, 0, -127}));
  EXPECT_EQ(host(tg::abs(i8)), (std::vector<double>{-128, 3, 0, 127}));
  EXPECT_EQ(host(tg::relu(i8)), (std::vector<double>{0, 0, 0, 127}));
  EXPECT_EQ(host(tg::clamp(i8, -5, 100)), (std::vector<double>{-5, -3, 0, 100}));
  EXPECT_EQ(host(tg::clamp(a, 0, 300)), host(a));  // bounds outside uint8's range are not wrapped
  const Tensor i16 = make({30000, -30000, 7}, tg::kInt16);
  EXPECT_EQ(host(i16 + i16), (std::vector<double>{-5536, 5536, 14}));
  EXPECT_EQ(host(i16 + 5), (std::vector<double>{30005, -29995, 12}));
  // In place keeps the dtype.
  Tensor ip = a.clone();
  ip.add_(b);
  EXPECT_EQ(ip.dtype(), tg::kUInt8);
  EXPECT_EQ(host(ip), (std::vector<double>{44, 15, 0, 1}));
}

TEST_P(SmallInt, ComparisonsAndWhere) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Tensor a = make({0, 100, 200, 255}, tg::kUInt8);
  EXPECT_EQ(host(a > 150), (std::vector<double>{0, 0, 1, 1}));
  EXPECT_EQ(host(a == 255), (std::vector<double>{0, 0, 0, 1}));
  // Scalars outside the type's range compare by value, not wrapped (300 is not 44).
  EXPECT_EQ(host(a < 300), (std::vector<double>{1, 1, 1, 1}));
  EXPECT_EQ(host(a == 256 + 100), (std::vector<double>{0, 0, 0, 0}));
  EXPECT_EQ(host(a > -1), (std::vector<double>{1, 1, 1, 1}));
  const Tensor b = make({-128, -1, 0, 127}, tg::kInt8);
  EXPECT_EQ(host(b < 0), (std::vector<double>{1, 1, 0, 0}));
  EXPECT_EQ(host(b >= -200), (std::vector<double>{1, 1, 1, 1}));
  EXPECT_EQ(host(b != -1), (std::vector<double>{1, 0, 1, 1}));
  EXPECT_EQ(host(b <= 0.5), (std::vector<double>{1, 1, 1, 0}));
  // Tensor-tensor across dtypes: uint8 255 vs int8 -1 compare as values (in int16).
  EXPECT_EQ(host(a.eq(make({0, 100, -56, -1}, tg::kInt8))), (std::vector<double>{1, 1, 0, 0}));
  EXPECT_EQ(host(a.gt(b)), (std::vector<double>{1, 1, 1, 1}));
  const Tensor w = tg::where(b < 0, make({1, 2, 3, 4}, tg::kInt16), b);
  EXPECT_EQ(w.dtype(), tg::kInt16);
  EXPECT_EQ(host(w), (std::vector<double>{1, 2, 0, 127}));
}

TEST_P(SmallInt, Reductions) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Tensor a = make({200, 100, 255, 1, 0, 7}, tg::kUInt8).reshape({2, 3});
  const Tensor s = a.sum();
  EXPECT_EQ(s.dtype(), tg::kInt64);  // integer sums widen to int64, as torch.sum
  EXPECT_EQ(s.item<int64_t>(), 563);
  EXPECT_EQ(host(a.sum(1)), (std::vector<double>{555, 8}));
  const Tensor b = make({-5, 100, -128, 3}, tg::kInt8);
  EXPECT_EQ(b.sum().item<int64_t>(), -30);
  EXPECT_EQ(host(tg::amax(b)), (std::vector<double>{100}));
  EXPECT_EQ(tg::amax(b).dtype(), tg::kInt8);
  EXPECT_EQ(host(tg::amin(b)), (std::vector<double>{-128}));
  EXPECT_EQ(tg::argmax(a.reshape({6})).item<int64_t>(), 2);
  EXPECT_EQ(host(tg::argmax(a, 1)), (std::vector<double>{2, 2}));
  EXPECT_EQ(make({-32768, 32767, 1}, tg::kInt16).sum().item<int64_t>(), 0);
  EXPECT_EQ(make({250}, tg::kUInt8).item<int64_t>(), 250);
  EXPECT_EQ(make({-7}, tg::kInt8).item<int>(), -7);
}

TEST_P(SmallInt, IndexingWithSmallIntData) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  for (DType dt : kSmall) {
    SCOPED_TRACE(tg::dtype_name(dt));
    const Tensor x = tg::arange(0, 12, 1, tg::kInt64).reshape({4, 3}).to(dt).to(dev());
    const Tensor idx = tg::tensor(std::vector<int64_t>{3, 0, 3}).to(dev());
    Tensor r = tg::index_select(x, 0, idx);
    EXPECT_EQ(r.dtype(), dt);
    EXPECT_EQ(host(r), (std::vector<double>{9, 10, 11, 0, 1, 2, 9, 10, 11}));
    r = tg::index_select(x, 1, tg::tensor(std::vector<int32_t>{2, 0}).to(dev()));
    EXPECT_EQ(host(r), (std::vector<double>{2, 0, 5, 3, 8, 6, 11, 9}));
    // The DataLoader's row gather, with float features beside small-int labels.
    const Tensor feat = tg::arange(0, 8, 1, tg::kFloat32).reshape({4, 2}).to(dev());
    const auto rows = tg::data::gather_rows(std::array<Tensor, 2>{feat, x}, idx);
    EXPECT_EQ(rows[1].dtype(), dt);
    EXPECT_EQ(host(rows[1]), (std::vector<double>{9, 10, 11, 0, 1, 2, 9, 10, 11}));
    EXPECT_EQ(host(rows[0]), (std::vector<double>{6, 7, 0, 1, 6, 7}));
    // Indices of a small-int dtype are refused, naming the op and the dtype.
    try {
      (void)tg::index_select(x, 0, idx.to(dt));
      ADD_FAILURE() << "no error";
    } catch (const tg::Error& e) {
      EXPECT_NE(std::string(e.what()).find("index_select"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(tg::dtype_name(dt)), std::string::npos) << e.what();
    }
  }
}

// scatter_add into 1- and 2-byte integers: on CUDA a compare-and-swap on the 32-bit word holding
// each element (neighbours in one word are written by other threads at once); sums wrap.
TEST_P(SmallInt, ScatterAddAccumulatesAndWraps) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  for (DType dt : kSmall) {
    SCOPED_TRACE(tg::dtype_name(dt));
    // 4000 ones into 8 adjacent slots (index i % 8): 500 each, which wraps for the 8-bit types.
    const int64_t n = 4000;
    std::vector<int64_t> idx(n);
    for (int64_t i = 0; i < n; ++i) idx[static_cast<size_t>(i)] = i % 8;
    const Tensor index = tg::tensor(idx).to(dev());
    const Tensor src = tg::ones({n}, tg::TensorOptions().dtype(dt).device(dev()));
    const Tensor out = tg::scatter_add(tg::zeros({8}, tg::TensorOptions().dtype(dt).device(dev())), 0, index, src);
    const double want = dt == tg::kInt16 ? 500 : dt == tg::kUInt8 ? 500 - 256 : 500 - 512;  // 244 / -12
    EXPECT_EQ(host(out), std::vector<double>(8, want));
  }
}

TEST_P(SmallInt, PrintsValuesAndDtype) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  std::ostringstream s;
  s << make({0, 200, 255}, tg::kUInt8);
  EXPECT_NE(s.str().find("[  0, 200, 255]"), std::string::npos) << s.str();
  EXPECT_NE(s.str().find("dtype=uint8"), std::string::npos) << s.str();
  std::ostringstream t;
  t << make({-128, 5}, tg::kInt8) << make({-300}, tg::kInt16);
  EXPECT_NE(t.str().find("[-128,    5]"), std::string::npos) << t.str();
  EXPECT_NE(t.str().find("dtype=int8"), std::string::npos) << t.str();
  EXPECT_NE(t.str().find("[-300]"), std::string::npos) << t.str();
  EXPECT_NE(t.str().find("dtype=int16"), std::string::npos) << t.str();
}

TEST_P(SmallInt, DLPackCodesAndRoundTrip) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  struct Want {
    DType dt;
    uint8_t code, bits;
  };
  for (const Want& w : {Want{tg::kUInt8, kDLUInt, 8}, Want{tg::kInt8, kDLInt, 8}, Want{tg::kInt16, kDLInt, 16}}) {
    const Tensor x = make({1, 2, 3, 4, 5, 6}, w.dt).reshape({2, 3});
    DLManagedTensorVersioned* dl = tg::to_dlpack(x);
    EXPECT_EQ(dl->dl_tensor.dtype.code, w.code) << w.dt;
    EXPECT_EQ(dl->dl_tensor.dtype.bits, w.bits) << w.dt;
    EXPECT_EQ(dl->dl_tensor.dtype.lanes, 1) << w.dt;
    const Tensor back = tg::from_dlpack(dl);
    EXPECT_EQ(back.dtype(), w.dt);
    EXPECT_EQ(back.data_ptr(), x.data_ptr());  // no copy
    EXPECT_EQ(host(back), host(x));
  }
}

TEST_P(SmallInt, SafetensorsRoundTripAndNames) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("tg_small_int_" + std::to_string(::getpid()) + ".safetensors"))
                               .string();
  tg::nn::StateDict sd;
  sd.insert("u", make({0, 255, 17}, tg::kUInt8));
  sd.insert("i", make({-128, 127}, tg::kInt8).reshape({1, 2}));
  sd.insert("s", make({-32768, 32767, 0, 5}, tg::kInt16).reshape({2, 2}).t());  // non-contiguous
  tg::save(sd, path);
  std::ifstream f(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(bytes.find("\"U8\""), std::string::npos);
  EXPECT_NE(bytes.find("\"I8\""), std::string::npos);
  EXPECT_NE(bytes.find("\"I16\""), std::string::npos);
  const tg::nn::StateDict back = tg::load(path, dev());
  std::filesystem::remove(path);
  for (const char* k : {"u", "i", "s"}) {
    EXPECT_EQ(back.at(k).dtype(), sd.at(k).dtype()) << k;
    EXPECT_EQ(back.at(k).sizes(), sd.at(k).sizes()) << k;
    EXPECT_EQ(back.at(k).device().type(), dev().type()) << k;
    EXPECT_EQ(host(back.at(k)), host(sd.at(k))) << k;
  }
}

TEST_P(SmallInt, FactoriesAndFill) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const auto opts = [&](DType dt) { return tg::TensorOptions().dtype(dt).device(dev()); };
  EXPECT_EQ(host(tg::full({3}, 7, opts(tg::kUInt8))), (std::vector<double>{7, 7, 7}));
  EXPECT_EQ(host(tg::full({2}, -9, opts(tg::kInt8))), (std::vector<double>{-9, -9}));
  EXPECT_EQ(host(tg::zeros({2}, opts(tg::kInt16))), (std::vector<double>{0, 0}));
  EXPECT_EQ(host(tg::ones({2}, opts(tg::kInt8))), (std::vector<double>{1, 1}));
  EXPECT_EQ(host(tg::arange(0, 250, 100, opts(tg::kUInt8))), (std::vector<double>{0, 100, 200}));
  Tensor t = tg::zeros({2}, opts(tg::kUInt8));
  t.fill_(3);
  EXPECT_EQ(host(t), (std::vector<double>{3, 3}));
}

INSTANTIATE_TEST_SUITE_P(Dev, SmallInt, ::testing::Values(Dev::CPU, Dev::CUDA), tg::testing::dev_name);

}  // namespace
