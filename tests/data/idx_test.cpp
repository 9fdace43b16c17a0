// IDX files (data/idx.h): the bytes of MNIST's format written by hand and read back, round trips
// of every IDX type and layout, and crafted bad files (truncated at every byte, trailing bytes,
// unknown type bytes, 0 dims, dims whose product overflows or asks for more than the file has),
// each a tg::Error naming the file before anything sized from it is allocated; a failed save
// leaves the old file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.h>

namespace {

using tg::Tensor;
namespace fs = std::filesystem;

std::vector<double> host(const Tensor& t) { return t.to(tg::Device(tg::kCPU), tg::kFloat64).contiguous().to_vector<double>(); }

std::string be32(uint32_t v) {
  std::string s;
  for (int i = 24; i >= 0; i -= 8) s.push_back(static_cast<char>((v >> i) & 0xff));
  return s;
}

// An IDX header: type byte, dims.
std::string header(uint8_t type, const std::vector<uint32_t>& dims) {
  std::string s;
  s.push_back(0);
  s.push_back(0);
  s.push_back(static_cast<char>(type));
  s.push_back(static_cast<char>(dims.size()));
  for (uint32_t d : dims) s += be32(d);
  return s;
}

class Idx : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tg_idx_" + std::to_string(::getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string p = path(name);
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  static std::string slurp(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    std::ostringstream s;
    s << f.rdbuf();
    return s.str();
  }
  void expect_error(const std::string& p, const std::string& needle) {
    try {
      (void)tg::load_idx(p);
      ADD_FAILURE() << "no error for " << p << " (wanted '" << needle << "')";
    } catch (const tg::Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("tg::load_idx('" + p + "')"), std::string::npos) << what;
      EXPECT_NE(what.find(needle), std::string::npos) << what;
    }
  }
  fs::path dir_;
};

TEST_F(Idx, ReadsTheMnistLayoutByteForByte) {
  // An MNIST-style images file: uint8 [2, 2, 3], and a labels file uint8 [2].
  std::string img = header(0x08, {2, 2, 3});
  for (int i = 0; i < 12; ++i) img.push_back(static_cast<char>(i * 20));
  Tensor t = tg::load_idx(write("img", img));
  EXPECT_EQ(t.dtype(), tg::kUInt8);
  EXPECT_EQ(t.sizes(), (tg::Shape{2, 2, 3}));
  std::vector<double> want;
  for (int i = 0; i < 12; ++i) want.push_back(i * 20);
  EXPECT_EQ(host(t), want);
  // Big-endian int16, int32, float32 and float64 elements.
  std::string i16 = header(0x0B, {2});
  i16 += std::string("\xff\xfe\x01\x00", 4);  // -2, 256
  EXPECT_EQ(host(tg::load_idx(write("i16", i16))), (std::vector<double>{-2, 256}));
  std::string i32 = header(0x0C, {1}) + std::string("\xff\xff\xff\xf9", 4);  // -7
  t = tg::load_idx(write("i32", i32));
  EXPECT_EQ(t.dtype(), tg::kInt32);
  EXPECT_EQ(host(t), (std::vector<double>{-7}));
  std::string f32 = header(0x0D, {1, 1}) + std::string("\x3f\xc0\x00\x00", 4);  // 1.5
  t = tg::load_idx(write("f32", f32));
  EXPECT_EQ(t.dtype(), tg::kFloat32);
  EXPECT_EQ(t.sizes(), (tg::Shape{1, 1}));
  EXPECT_EQ(host(t), (std::vector<double>{1.5}));
  std::string f64 = header(0x0E, {1}) + std::string("\xc0\x04\x00\x00\x00\x00\x00\x00", 8);  // -2.5
  EXPECT_EQ(host(tg::load_idx(write("f64", f64))), (std::vector<double>{-2.5}));
  std::string i8 = header(0x09, {3}) + std::string("\x80\x7f\x00", 3);
  t = tg::load_idx(write("i8", i8));
  EXPECT_EQ(t.dtype(), tg::kInt8);
  EXPECT_EQ(host(t), (std::vector<double>{-128, 127, 0}));
}

TEST_F(Idx, WritesTheBytesItReads) {
  const Tensor t = tg::tensor(std::vector<int16_t>{-2, 256, 3}, tg::Shape{3, 1});
  const std::string p = path("w.idx");
  tg::save_idx(t, p);
  EXPECT_EQ(slurp(p), header(0x0B, {3, 1}) + std::string("\xff\xfe\x01\x00\x00\x03", 6));
  EXPECT_EQ(host(t), (std::vector<double>{-2, 256, 3}));  // the caller's bytes are not swapped
}

TEST_F(Idx, RoundTripsEveryTypeAndLayout) {
  tg::manual_seed(7);
  const Tensor base = tg::randn({3, 4}) * 50;
  for (tg::DType dt : {tg::kUInt8, tg::kInt8, tg::kInt16, tg::kInt32, tg::kFloat32, tg::kFloat64}) {
    for (const Tensor& t : {base.to(dt), base.to(dt).t(), base.to(dt).slice(1, 1, 3), base.to(dt).reshape({12}),
                            base.to(dt).slice(0, 0, 0), base.to(dt).reshape({2, 1, 3, 2})}) {
      SCOPED_TRACE(std::string(tg::dtype_name(dt)) + " " + ::testing::PrintToString(t.sizes()));
      const std::string p = path("t.idx");
      tg::save_idx(t, p);
      const Tensor back = tg::load_idx(p);
      EXPECT_EQ(back.dtype(), dt);
      EXPECT_EQ(back.sizes(), t.sizes());
      EXPECT_TRUE(back.is_contiguous());
      EXPECT_EQ(host(back), host(t));
      EXPECT_EQ(slurp(p).size(), 4 + 4 * t.dim() + t.nbytes());
    }
  }
  if (tg::cuda::is_available()) {
    const Tensor c = base.to(tg::kUInt8).to(tg::kCUDA);
    tg::save_idx(c.t(), path("c.idx"));
    const Tensor back = tg::load_idx(path("c.idx"), tg::Device(tg::kCUDA));
    EXPECT_TRUE(back.device().is_cuda());
    EXPECT_EQ(host(back), host(c.t()));
  }
}

TEST_F(Idx, UnwritableTensorsAreErrorsAndTheOldFileStays) {
  const std::string p = path("keep.idx");
  tg::save_idx(tg::ones({2}), p);
  const std::string before = slurp(p);
  auto expect_save_error = [&](const Tensor& t, const std::string& needle) {
    try {
      tg::save_idx(t, p);
      ADD_FAILURE() << "no error (wanted '" << needle << "')";
    } catch (const tg::Error& e) {
      EXPECT_NE(std::string(e.what()).find("tg::save_idx('" + p + "')"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_save_error(tg::ones({2}, tg::kBFloat16), "bfloat16");
  expect_save_error(tg::ones({2}, tg::kInt64), "int64");
  expect_save_error(tg::ones({2}, tg::kBool), "bool");
  expect_save_error(tg::full({}, 3.0), "0-d");
  EXPECT_EQ(slurp(p), before);
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

TEST_F(Idx, CorruptAndHostileFilesAreErrors) {
  const std::string good = header(0x0D, {2, 3}) + std::string(24, '\0');
  ASSERT_NO_THROW(tg::load_idx(write("good", good)));
  for (size_t cut = 0; cut < good.size(); ++cut) {
    SCOPED_TRACE(cut);
    EXPECT_THROW(tg::load_idx(write("cut", good.substr(0, cut))), tg::Error);
  }
  expect_error(write("short", good.substr(0, 3)), "too short");
  expect_error(write("trunc", good.substr(0, good.size() - 1)), "needs 24 bytes of data but the file has 23 (truncated)");
  expect_error(write("extra", good + "x"), "needs 24 bytes of data but the file has 25 (trailing bytes)");
  expect_error(write("hdr", good.substr(0, 9)), "declares 2 dims (12 header bytes) but the file has only 9");
  std::string magic = good;
  magic[1] = 8;
  expect_error(write("magic", magic), "not an IDX file");
  std::string type = good;
  type[2] = 0x0A;
  expect_error(write("type", type), "unknown IDX type byte 0x0A");
  expect_error(write("zero", header(0x08, {}) + "x"), "0 dims");
  // Dims whose product overflows int64, or whose bytes pass the storage cap, or that ask for far
  // more than the file holds: refused before any allocation.
  expect_error(write("overflow", header(0x0E, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}) + std::string(8, '\0')), "");
  expect_error(write("huge", header(0x0E, {0xFFFFFFFF, 4}) + std::string(8, '\0')), "needs 137438953440 bytes");
  expect_error(write("big", header(0x08, {60000, 28, 28}) + std::string(100, '\0')), "needs 47040000 bytes");
  std::vector<uint32_t> many(255, 2);
  expect_error(write("many", header(0x08, many)), "");
  // An empty dim makes a valid empty tensor however large the others are.
  Tensor e = tg::load_idx(write("empty", header(0x0C, {0, 0xFFFFFFFF})));
  EXPECT_EQ(e.sizes(), (tg::Shape{0, 0xFFFFFFFF}));
  expect_error(path("missing"), "cannot open");
}

}  // namespace
