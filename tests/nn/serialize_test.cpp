// safetensors checkpoints: round trip of every dtype, metadata, atomic writes,
// corrupt files (each a tg::Error), and interop with Python's safetensors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <tapegrad/tapegrad.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

using tg::Tensor;
namespace fs = std::filesystem;

std::vector<double> host(const Tensor& t) {
  return t.to(tg::Device(tg::kCPU), tg::kFloat64).contiguous().to_vector<double>();
}

class Serialize : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tg_serialize_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A file with an explicit header length, header text and data bytes.
  std::string raw(const std::string& name, uint64_t len, const std::string& header, size_t data_bytes) {
    std::string p = path(name);
    std::ofstream f(p, std::ios::binary);
    for (int i = 0; i < 8; ++i) f.put(static_cast<char>(len >> (8 * i)));
    f << header << std::string(data_bytes, '\x01');
    return p;
  }
  std::string raw(const std::string& name, const std::string& header, size_t data_bytes) {
    return raw(name, header.size(), header, data_bytes);
  }
  void expect_error(const std::string& p, const std::string& needle) {
    try {
      tg::load(p);
      ADD_FAILURE() << "expected tg::Error containing '" << needle << "' for " << p;
    } catch (const tg::Error& e) {
      std::string m = e.what();
      EXPECT_NE(m.find(needle), std::string::npos) << m;
      EXPECT_NE(m.find(p), std::string::npos) << "message should name the file: " << m;
    }
  }
  fs::path dir_;
};

tg::nn::StateDict every_dtype() {
  tg::manual_seed(9);
  tg::nn::StateDict sd;
  sd.insert("f32", tg::randn({3, 4}));
  sd.insert("f16", tg::randn({5}).to(tg::kFloat16));
  sd.insert("bf16", tg::randn({2, 3}).to(tg::kBFloat16));
  sd.insert("f64", tg::randn({2, 2, 2}, tg::kFloat64));
  sd.insert("i64", tg::tensor(std::vector<int64_t>{-5, 0, 1LL << 40}));
  sd.insert("i32", tg::tensor(std::vector<int32_t>{7, -8, 9, 10}, {2, 2}));
  sd.insert("bool", tg::tensor(std::vector<bool>{true, false, true}));
  sd.insert("scalar", tg::full({}, 3.5));
  sd.insert("empty", tg::zeros({0, 4}));
  sd.insert("strided", tg::randn({4, 3}).t());  // non-contiguous source
  return sd;
}

TEST_F(Serialize, RoundTripEveryDType) {
  auto sd = every_dtype();
  tg::save(sd, path("a.safetensors"), {{"format", "pt"}, {"note", "tg"}});
  auto back = tg::load(path("a.safetensors"));
  EXPECT_EQ(back.keys(), sd.keys());  // order kept
  for (const auto& [n, t] : sd) {
    const Tensor& b = back[n];
    EXPECT_EQ(b.dtype(), t.dtype()) << n;
    EXPECT_EQ(b.sizes(), t.sizes()) << n;
    EXPECT_TRUE(b.is_cpu());
    EXPECT_EQ(host(b), host(t)) << n;
  }
  auto meta = tg::load_metadata(path("a.safetensors"));
  EXPECT_EQ(meta.at("format"), "pt");
  EXPECT_EQ(meta.size(), 2u);
  // The data section starts 8-byte aligned.
  std::ifstream f(path("a.safetensors"), std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
}

TEST_F(Serialize, ModuleCheckpoint) {
  tg::nn::Sequential net(tg::nn::Linear(6, 4), tg::nn::ReLU(), tg::nn::Linear(4, 1));
  tg::save(net.state_dict(), path("net.safetensors"));
  tg::nn::Sequential other(tg::nn::Linear(6, 4), tg::nn::ReLU(), tg::nn::Linear(4, 1));
  other.load_state_dict(tg::load(path("net.safetensors")));
  Tensor x = tg::randn({3, 6});
  EXPECT_EQ(host(net(x)), host(other(x)));
}

TEST_F(Serialize, AtomicOverwrite) {
  std::string p = path("c.safetensors");
  tg::save({{"a", tg::ones({2})}}, p);
  tg::save({{"b", tg::zeros({3})}}, p);
  auto back = tg::load(p);
  EXPECT_EQ(back.keys(), std::vector<std::string>{"b"});
  for (const auto& e : fs::directory_iterator(dir_))  // no temporary left behind
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  // A failed save (undefined tensor) leaves the old file intact and no temporary.
  EXPECT_THROW(tg::save({{"x", tg::ones({1})}, {"bad", Tensor()}}, p), tg::Error);
  EXPECT_EQ(tg::load(p).keys(), std::vector<std::string>{"b"});
  EXPECT_THROW(tg::save({{"x", tg::ones({1})}}, path("no/such/dir/x.safetensors")), tg::Error);
}

TEST_F(Serialize, LoadToDevice) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto sd = every_dtype();
  tg::nn::StateDict on_gpu;
  for (const auto& [n, t] : sd) on_gpu.insert(n, t.cuda());
  tg::save(on_gpu, path("g.safetensors"));
  auto back = tg::load(path("g.safetensors"), tg::Device(tg::kCUDA));
  for (const auto& [n, t] : sd) {
    EXPECT_TRUE(back[n].is_cuda()) << n;
    EXPECT_EQ(host(back[n]), host(t)) << n;
  }
}

TEST_F(Serialize, CorruptFiles) {
  const std::string ok = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_NO_THROW(tg::load(raw("ok", ok, 8)));
  expect_error(path("missing"), "cannot open");
  {
    std::ofstream(path("empty"), std::ios::binary).flush();
    expect_error(path("empty"), "too short");
  }
  expect_error(raw("zero_len", 0, "", 0), "not valid JSON");
  {
    std::ofstream(path("short"), std::ios::binary) << "abc";
    expect_error(path("short"), "too short");
  }
  expect_error(raw("truncated", ok, 4), "past the data");  // data cut short
  expect_error(raw("hdr_past_end", 1000, ok, 8), "past the end");
  expect_error(raw("hdr_huge", ~0ull - 3, ok, 8), "past the end");  // near 2^64: no overflow, no allocation
  expect_error(raw("hdr_2_63", 1ull << 63, ok, 8), "past the end");
  expect_error(raw("bad_json", R"({"t":{"dtype":"F32",)", 8), "not valid JSON");
  expect_error(raw("not_object", "[1,2]", 8), "JSON object");
  expect_error(raw("bad_dtype", R"({"t":{"dtype":"F8","shape":[2],"data_offsets":[0,8]}})", 8), "unknown");
  expect_error(raw("reversed", R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), "reversed");
  expect_error(raw("past_data", R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8), "past the data");
  expect_error(
      raw("overlap",
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
          12),
      "overlap");
  expect_error(raw("gap", R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), "gap");
  expect_error(raw("uncovered", R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8), "cover");
  expect_error(raw("size_mismatch", R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "needs 12 bytes");
  expect_error(raw("negative", R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "non-negative");
  expect_error(raw("float_dim", R"({"t":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8), "integers");
  expect_error(raw("huge_shape", R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
               "overflows");
  expect_error(raw("huge_dim", R"({"t":{"dtype":"F64","shape":[9223372036854775807],"data_offsets":[0,8]}})", 8),
               "overflows");
  expect_error(raw("too_big_dim", R"({"t":{"dtype":"BOOL","shape":[18446744073709551615],"data_offsets":[0,8]}})", 8),
               "too large");
  expect_error(raw("no_shape", R"({"t":{"dtype":"F32","data_offsets":[0,8]}})", 8), "missing 'shape'");
  expect_error(raw("bad_offsets", R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8), "data_offsets");
  expect_error(raw("bad_meta", R"({"__metadata__":{"a":1},"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
               "__metadata__");
  expect_error(raw("entry_not_object", R"({"t":5})", 8), "object");
}

// ---- Python interop (CI installs safetensors and numpy)
bool have_python_safetensors() { return std::system("python3 -c 'import safetensors, numpy' >/dev/null 2>&1") == 0; }

TEST_F(Serialize, PythonReadsOurFile) {
  if (!have_python_safetensors()) GTEST_SKIP() << "python3 with safetensors and numpy not available";
  tg::nn::StateDict sd;
  sd.insert("0.weight", tg::tensor(std::vector<float>{1.5f, -2.25f, 3.f, 0.125f}, {2, 2}));
  sd.insert("half", tg::tensor(std::vector<float>{0.5f, -1.f, 65504.f}).to(tg::kFloat16));
  sd.insert("f64", tg::tensor(std::vector<double>{1e-300, -2.5}));
  sd.insert("i64", tg::tensor(std::vector<int64_t>{-3, 1LL << 50}));
  sd.insert("i32", tg::tensor(std::vector<int32_t>{-7, 8, 9}));
  sd.insert("flags", tg::tensor(std::vector<bool>{true, false}));
  std::string p = path("ours.safetensors");
  tg::save(sd, p, {{"producer", "tapegrad"}});
  std::string script = path("check.py");
  std::ofstream(script) << R"(import sys, json, numpy as np
from safetensors.numpy import load_file
from safetensors import safe_open
d = load_file(sys.argv[1])
exp = {
  "0.weight": np.array([[1.5, -2.25], [3.0, 0.125]], np.float32),
  "half": np.array([0.5, -1.0, 65504.0], np.float16),
  "f64": np.array([1e-300, -2.5], np.float64),
  "i64": np.array([-3, 1 << 50], np.int64),
  "i32": np.array([-7, 8, 9], np.int32),
  "flags": np.array([True, False], np.bool_),
}
assert sorted(d) == sorted(exp), sorted(d)
for k, v in exp.items():
    assert d[k].dtype == v.dtype, (k, d[k].dtype)
    assert d[k].shape == v.shape, (k, d[k].shape)
    assert np.array_equal(d[k], v), (k, d[k])
with safe_open(sys.argv[1], "np") as f:
    assert f.metadata() == {"producer": "tapegrad"}, f.metadata()
)";
  EXPECT_EQ(std::system(("python3 " + script + " " + p).c_str()), 0);
}

TEST_F(Serialize, WeReadPythonFile) {
  if (!have_python_safetensors()) GTEST_SKIP() << "python3 with safetensors and numpy not available";
  std::string p = path("theirs.safetensors"), script = path("write.py");
  std::ofstream(script) << R"(import sys, numpy as np
from safetensors.numpy import save_file
save_file({
  "linear.weight": np.arange(6, dtype=np.float32).reshape(2, 3) / 4,
  "linear.bias": np.array([-1.0, 2.0], np.float32),
  "h": np.array([1.0, -0.5], np.float16),
  "d": np.array([[3.25]], np.float64),
  "l": np.array([-(1 << 40), 7], np.int64),
  "i": np.array([1, 2, 3], np.int32),
  "b": np.array([False, True, True], np.bool_),
  "e": np.zeros((0, 3), np.float32),
}, sys.argv[1], metadata={"format": "np"})
)";
  ASSERT_EQ(std::system(("python3 " + script + " " + p).c_str()), 0);
  auto sd = tg::load(p);
  EXPECT_EQ(sd.size(), 8u);
  EXPECT_EQ(sd["linear.weight"].dtype(), tg::kFloat32);
  EXPECT_EQ(sd["linear.weight"].sizes(), (tg::Shape{2, 3}));
  EXPECT_EQ(host(sd["linear.weight"]), (std::vector<double>{0, 0.25, 0.5, 0.75, 1.0, 1.25}));
  EXPECT_EQ(host(sd["linear.bias"]), (std::vector<double>{-1, 2}));
  EXPECT_EQ(sd["h"].dtype(), tg::kFloat16);
  EXPECT_EQ(host(sd["h"]), (std::vector<double>{1, -0.5}));
  EXPECT_EQ(host(sd["d"]), (std::vector<double>{3.25}));
  EXPECT_EQ(sd["l"].to_vector<int64_t>(), (std::vector<int64_t>{-(1LL << 40), 7}));
  EXPECT_EQ(sd["i"].to_vector<int32_t>(), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(sd["b"].dtype(), tg::kBool);
  EXPECT_EQ(host(sd["b"]), (std::vector<double>{0, 1, 1}));
  EXPECT_EQ(sd["e"].sizes(), (tg::Shape{0, 3}));
  EXPECT_EQ(tg::load_metadata(p).at("format"), "np");
}

}  // namespace
