// .npy files (data/npy.h): round trip of every dtype numpy has, layouts and shapes; files numpy
// writes (Fortran order, big-endian, version 2.0) and numpy reading ours, when python3 with numpy
// is present; corrupt and hostile files are each a tg::Error naming the file; a failed save
// leaves the old file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
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

bool have_numpy() { return std::system("python3 -c 'import numpy' >/dev/null 2>&1") == 0; }

class Npy : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tg_npy_" + std::to_string(::getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
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
  // A version 1.0 file with this header dict and these data bytes.
  static std::string v1(const std::string& dict, const std::string& data) {
    std::string h = "\x93NUMPY";
    h.push_back(1);
    h.push_back(0);
    h.push_back(static_cast<char>(dict.size() & 0xff));
    h.push_back(static_cast<char>(dict.size() >> 8));
    return h + dict + data;
  }
  void expect_error(const std::string& p, const std::string& needle) {
    try {
      (void)tg::load_npy(p);
      ADD_FAILURE() << "no error for " << p << " (wanted '" << needle << "')";
    } catch (const tg::Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("tg::load_npy('" + p + "')"), std::string::npos) << what;
      EXPECT_NE(what.find(needle), std::string::npos) << what;
    }
  }
  fs::path dir_;
};

TEST_F(Npy, RoundTripsEveryDtypeShapeAndLayout) {
  tg::manual_seed(3);
  const Tensor base = tg::randn({3, 4}) * 7;
  for (tg::DType dt : {tg::kFloat32, tg::kFloat64, tg::kFloat16, tg::kInt64, tg::kInt32, tg::kBool, tg::kUInt8,
                       tg::kInt8, tg::kInt16}) {
    for (const Tensor& t : {base.to(dt), base.to(dt).t(), base.to(dt).slice(1, 1, 3), base.to(dt).reshape({12}),
                            base.to(dt).select(0, 1).select(0, 2), base.to(dt).slice(0, 0, 0)}) {
      SCOPED_TRACE(std::string(tg::dtype_name(dt)) + " " + ::testing::PrintToString(t.sizes()));
      const std::string p = path("t.npy");
      tg::save_npy(t, p);
      const Tensor back = tg::load_npy(p);
      EXPECT_EQ(back.dtype(), dt);
      EXPECT_EQ(back.sizes(), t.sizes());
      EXPECT_TRUE(back.is_contiguous());
      EXPECT_EQ(host(back), host(t));
      EXPECT_EQ(slurp(p).size() % 64, (t.nbytes() % 64));  // the data starts on a 64-byte boundary
    }
  }
}

TEST_F(Npy, TheBytesNumpyWrites) {
  // np.save of np.arange(6, dtype='<i4').reshape(2, 3), byte for byte.
  const Tensor t = tg::arange(0, 6, 1, tg::kInt32).reshape({2, 3});
  const std::string p = path("a.npy");
  tg::save_npy(t, p);
  const std::string bytes = slurp(p);
  std::string dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }";
  dict.append(128 - 10 - dict.size() - 1, ' ');
  dict.push_back('\n');
  std::string want = v1(dict, "");
  for (int i = 0; i < 6; ++i) want += std::string(reinterpret_cast<const char*>(&i), 4);
  EXPECT_EQ(bytes, want);
}

TEST_F(Npy, SmallIntegerDescrs) {
  // numpy's descrs for uint8 / int8 / int16, written and read; '>i2' is byte-swapped.
  const struct {
    tg::DType dt;
    const char* descr;
  } cases[] = {{tg::kUInt8, "'|u1'"}, {tg::kInt8, "'|i1'"}, {tg::kInt16, "'<i2'"}};
  for (const auto& c : cases) {
    tg::save_npy(tg::tensor(std::vector<double>{1, 2, 3}).to(c.dt), path("s.npy"));
    EXPECT_NE(slurp(path("s.npy")).find(c.descr), std::string::npos) << c.descr;
  }
  const Tensor t = tg::load_npy(write("be.npy", v1("{'descr': '>i2', 'fortran_order': False, 'shape': (2,), }\n",
                                                   std::string("\xff\xfe\x01\x00", 4))));
  EXPECT_EQ(t.dtype(), tg::kInt16);
  EXPECT_EQ(host(t), (std::vector<double>{-2, 256}));
}

TEST_F(Npy, BFloat16IsAnErrorAndTheOldFileStays) {
  const std::string p = path("keep.npy");
  tg::save_npy(tg::ones({2}), p);
  const std::string before = slurp(p);
  try {
    tg::save_npy(tg::ones({2}).to(tg::kBFloat16), p);
    ADD_FAILURE() << "no error";
  } catch (const tg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bfloat16"), std::string::npos) << e.what();
  }
  EXPECT_EQ(slurp(p), before);
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

TEST_F(Npy, FortranOrderBigEndianAndVersion2) {
  // [[1, 2, 3], [4, 5, 6]] as float32 in Fortran order: 1 4 2 5 3 6.
  std::string data;
  for (float v : {1.f, 4.f, 2.f, 5.f, 3.f, 6.f}) data += std::string(reinterpret_cast<const char*>(&v), 4);
  Tensor t = tg::load_npy(write("f.npy", v1("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }\n", data)));
  EXPECT_EQ(host(t), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  // Big-endian int64 7 and -2.
  std::string be;
  for (int64_t v : {int64_t{7}, int64_t{-2}})
    for (int i = 7; i >= 0; --i) be.push_back(static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff));
  t = tg::load_npy(write("be.npy", v1("{'descr': '>i8', 'fortran_order': False, 'shape': (2,), }\n", be)));
  EXPECT_EQ(t.dtype(), tg::kInt64);
  EXPECT_EQ(host(t), (std::vector<double>{7, -2}));
  // Version 2.0: a 4-byte header length.
  const std::string dict = "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }\n";
  std::string v2 = "\x93NUMPY";
  v2.push_back(2);
  v2.push_back(0);
  for (int i = 0; i < 4; ++i) v2.push_back(static_cast<char>((dict.size() >> (8 * i)) & 0xff));
  t = tg::load_npy(write("v2.npy", v2 + dict + std::string("\x00\x05\x01", 3)));
  EXPECT_EQ(t.dtype(), tg::kBool);
  EXPECT_EQ(host(t), (std::vector<double>{0, 1, 1}));  // any nonzero byte is true
  EXPECT_EQ(static_cast<const uint8_t*>(t.data_ptr())[1], 1);  // stored canonically
}

TEST_F(Npy, CorruptAndHostileFilesAreErrors) {
  const std::string good = v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", std::string(24, '\0'));
  ASSERT_NO_THROW(tg::load_npy(write("good.npy", good)));
  for (size_t cut = 0; cut < good.size(); ++cut) {
    SCOPED_TRACE(cut);
    EXPECT_THROW(tg::load_npy(write("cut.npy", good.substr(0, cut))), tg::Error);
  }
  expect_error(write("extra.npy", good + "x"), "needs 24 bytes of data but the file has 25");
  expect_error(write("magic.npy", "\x93NUMPZ" + good.substr(6)), "magic");
  std::string v9 = good;
  v9[6] = 9;
  expect_error(write("v9.npy", v9), "format version 9");
  auto with = [&](const std::string& dict, size_t data) { return write("h.npy", v1(dict, std::string(data, '\0'))); };
  expect_error(with("{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }", 4), "dtype '<u2'");
  expect_error(with("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", 4), "non-negative integer");
  expect_error(with("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (1,), }", 4), "True or False");
  expect_error(with("{'descr': '<f4', 'shape': (1,), }", 4), "needs 'descr', 'fortran_order' and 'shape'");
  expect_error(with("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4), "repeated key");
  expect_error(with("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), } junk", 4), "text after the dict");
  expect_error(with("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 4), "int64");
  // Dimensions whose product overflows, or asks for far more than the file has: refused before
  // any allocation.
  expect_error(with("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }", 8), "");
  expect_error(with("{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000,), }", 8), "needs");
  // A header length past the end of the file.
  std::string lie = good;
  lie[8] = '\xff';
  lie[9] = '\x7f';
  expect_error(write("lie.npy", lie), "the header claims");
  expect_error(path("missing.npy"), "cannot open");
}

TEST_F(Npy, NumpyReadsOursAndWeReadNumpys) {
  if (!have_numpy()) GTEST_SKIP() << "python3 with numpy not available";
  tg::manual_seed(5);
  const Tensor a = tg::randn({3, 5});
  tg::save_npy(a, path("ours.npy"));
  tg::save_npy(a.to(tg::kFloat16).t(), path("ours16.npy"));
  tg::save_npy(tg::tensor(std::vector<int64_t>{-5, 0, 9}, tg::Shape{3}), path("ours_i8.npy"));
  const std::string script = path("check.py");
  std::ofstream(script) << "import sys, numpy as np\n"
                           "d = sys.argv[1]\n"
                           "a = np.load(d + '/ours.npy'); assert a.dtype == np.float32 and a.shape == (3, 5)\n"
                           "b = np.load(d + '/ours16.npy'); assert b.dtype == np.float16 and b.shape == (5, 3)\n"
                           "assert np.array_equal(b, a.astype(np.float16).T)\n"
                           "assert np.load(d + '/ours_i8.npy').tolist() == [-5, 0, 9]\n"
                           "np.save(d + '/theirs_f.npy', np.asfortranarray(a.astype(np.float64) * 2))\n"
                           "np.save(d + '/theirs_be.npy', np.arange(4, dtype='>i4'))\n"
                           "np.save(d + '/theirs_bool.npy', np.array([[True, False], [False, True]]))\n"
                           "np.save(d + '/theirs_0d.npy', np.float32(2.5))\n";
  ASSERT_EQ(std::system(("python3 " + script + " " + dir_.string()).c_str()), 0);
  std::vector<double> twice = host(a);
  for (double& v : twice) v *= 2;
  const Tensor f = tg::load_npy(path("theirs_f.npy"));
  EXPECT_EQ(f.dtype(), tg::kFloat64);
  EXPECT_EQ(f.sizes(), (tg::Shape{3, 5}));
  EXPECT_EQ(host(f), twice);
  EXPECT_EQ(host(tg::load_npy(path("theirs_be.npy"))), (std::vector<double>{0, 1, 2, 3}));
  EXPECT_EQ(host(tg::load_npy(path("theirs_bool.npy"))), (std::vector<double>{1, 0, 0, 1}));
  const Tensor z = tg::load_npy(path("theirs_0d.npy"));
  EXPECT_EQ(z.dim(), 0);
  EXPECT_EQ(z.item<double>(), 2.5);
}

TEST_F(Npy, LoadsOntoADevice) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  tg::save_npy(tg::ones({4}), path("d.npy"));
  const Tensor t = tg::load_npy(path("d.npy"), tg::Device(tg::kCUDA));
  EXPECT_TRUE(t.is_cuda());
  EXPECT_EQ(host(t), (std::vector<double>(4, 1.0)));
}

}  // namespace
