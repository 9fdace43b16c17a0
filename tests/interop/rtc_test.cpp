// Run-time compiled kernels: RawKernel compile and launch against built-in ops,
// NVRTC's log in compile errors, argument checks, the in-memory and disk caches
// (a corrupt cache file is ignored), and ElementwiseKernel with broadcasting,
// dtypes, given outputs and host tensors. Everything but parsing needs a GPU
// (and a build without CUDA throws on construction).
#include <cmath>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.h>

namespace {

using tg::Tensor;
namespace fs = std::filesystem;

std::vector<double> host(const Tensor& t) { return t.to(tg::Device(tg::kCPU), tg::kFloat64).contiguous().to_vector<double>(); }

void expect_near(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << "element " << i;
}

#define TG_REQUIRE_CUDA() \
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

// Points the disk cache at a fresh directory for one test, restoring the old one after.
class CacheDir {
 public:
  CacheDir() {
    const char* old = std::getenv("XDG_CACHE_HOME");
    had_old_ = old != nullptr;
    if (old) old_ = old;
    std::string tmpl = (fs::temp_directory_path() / "tg_rtc_test_XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
    setenv("XDG_CACHE_HOME", dir_.c_str(), 1);
  }
  ~CacheDir() {
    if (had_old_) setenv("XDG_CACHE_HOME", old_.c_str(), 1);
    else unsetenv("XDG_CACHE_HOME");
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::vector<fs::path> files() const {
    std::vector<fs::path> out;
    std::error_code ec;
    if (fs::is_directory(dir_ + "/tapegrad", ec))
      for (const auto& e : fs::directory_iterator(dir_ + "/tapegrad")) out.push_back(e.path());
    return out;
  }

 private:
  std::string dir_, old_;
  bool had_old_ = false;
};

// A unique comment makes a source no earlier run has cached.
std::string fresh(const std::string& source) {
  static int counter = 0;
  return "// test " + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "\n" + source;
}

const char* kAxpy = R"(
extern "C" __global__ void axpy(float a, const float* x, float* y, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
)";

TEST(RawKernel, CompilesAndMatchesBuiltInOps) {
  TG_REQUIRE_CUDA();
  tg::cuda::RawKernel k(kAxpy, "axpy");
  EXPECT_EQ(k.num_params() == -1 || k.num_params() == 4, true);
  const int64_t n = 100'003;
  Tensor x = tg::randn({n}, tg::kCUDA);
  Tensor y = tg::randn({n}, tg::kCUDA);
  Tensor want = x * 2.5 + y;
  k.launch(tg::cuda::Dim3((n + 255) / 256), 256, 2.5f, x, y, static_cast<long long>(n));
  expect_near(host(y), host(want), 1e-6);
}

TEST(RawKernel, TemplatesHalfAndSharedMemory) {
  TG_REQUIRE_CUDA();
  // A C++ template named by its name expression; fp16 headers; dynamic shared memory.
  const char* src = R"(
#include <cuda_fp16.h>
template <typename T>
__global__ void reverse_block(const T* in, float* out) {
  extern __shared__ float buf[];
  int t = threadIdx.x;
  buf[t] = __half2float(in[blockIdx.x * blockDim.x + t]);
  __syncthreads();
  out[blockIdx.x * blockDim.x + t] = buf[blockDim.x - 1 - t];
}
)";
  tg::cuda::RawKernel k(src, "reverse_block<__half>");
  Tensor in = tg::arange(512, tg::kFloat32).to(tg::kCUDA).to(tg::kFloat16);
  Tensor out = tg::empty({512}, tg::kCUDA);
  k.launch(2, 256, 256 * sizeof(float), in, out);
  std::vector<double> want(512);
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 256; ++t) want[b * 256 + t] = b * 256 + 255 - t;
  expect_near(host(out), want, 0);
}

TEST(RawKernel, CompileErrorCarriesNvrtcLog) {
  TG_REQUIRE_CUDA();
  const std::string src = fresh("extern \"C\" __global__ void broken(float* x) { x[0] = undeclared_thing; }\n");
  try {
    tg::cuda::RawKernel k(src, "broken");
    FAIL() << "expected tg::Error";
  } catch (const tg::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("broken"), std::string::npos) << msg;
    EXPECT_NE(msg.find("undeclared_thing"), std::string::npos) << msg;  // from NVRTC's log
    EXPECT_NE(msg.find("error"), std::string::npos) << msg;
  }
}

TEST(RawKernel, ArgumentChecks) {
  TG_REQUIRE_CUDA();
  tg::cuda::RawKernel k(kAxpy, "axpy");
  Tensor x = tg::randn({16}, tg::kCUDA);
  Tensor y = tg::randn({16}, tg::kCUDA);
  // CPU tensor.
  EXPECT_THROW(k.launch(1, 16, 2.5f, x.cpu(), y, static_cast<long long>(16)), tg::Error);
  if (k.num_params() == 4) {
    EXPECT_THROW(k.launch(1, 16, 2.5f, x, y), tg::Error);                           // too few
    EXPECT_THROW(k.launch(1, 16, 2.5, x, y, static_cast<long long>(16)), tg::Error);  // double for float
  }
  EXPECT_THROW(k.launch(1, 4096, 2.5f, x, y, static_cast<long long>(16)), tg::Error);  // block too large
}

TEST(RawKernel, MemoryAndDiskCache) {
  TG_REQUIRE_CUDA();
  CacheDir dir;
  const std::string src = fresh(kAxpy);
  const int64_t c0 = tg::cuda::detail::rtc_compile_count();
  { tg::cuda::RawKernel k(src, "axpy"); }
  EXPECT_EQ(tg::cuda::detail::rtc_compile_count(), c0 + 1);
  ASSERT_EQ(dir.files().size(), 1u) << "one cache file";
  { tg::cuda::RawKernel k(src, "axpy"); }  // in-memory hit
  EXPECT_EQ(tg::cuda::detail::rtc_compile_count(), c0 + 1);

  tg::cuda::detail::rtc_clear_memory_cache();
  tg::cuda::RawKernel again(src, "axpy");  // disk hit, as a new process would see
  EXPECT_EQ(tg::cuda::detail::rtc_compile_count(), c0 + 1);
  Tensor x = tg::ones({8}, tg::kCUDA);
  Tensor y = tg::ones({8}, tg::kCUDA);
  again.launch(1, 8, 3.0f, x, y, static_cast<long long>(8));
  expect_near(host(y), std::vector<double>(8, 4.0), 0);

  // Other options are another entry.
  { tg::cuda::RawKernel k(src, "axpy", {"-DSOMETHING=1"}); }
  EXPECT_EQ(tg::cuda::detail::rtc_compile_count(), c0 + 2);
  EXPECT_EQ(dir.files().size(), 2u);
}

TEST(RawKernel, CorruptCacheFileIsRecompiled) {
  TG_REQUIRE_CUDA();
  CacheDir dir;
  const std::string src = fresh(kAxpy);
  { tg::cuda::RawKernel k(src, "axpy"); }
  auto files = dir.files();
  ASSERT_EQ(files.size(), 1u);
  const auto size = fs::file_size(files[0]);
  {
    std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size / 2));
    f.put('\x5a').put('\xa5').put('\x00');
  }
  tg::cuda::detail::rtc_clear_memory_cache();
  const int64_t c0 = tg::cuda::detail::rtc_compile_count();
  tg::cuda::RawKernel k(src, "axpy");
  EXPECT_EQ(tg::cuda::detail::rtc_compile_count(), c0 + 1);
  Tensor x = tg::ones({4}, tg::kCUDA);
  Tensor y = tg::zeros({4}, tg::kCUDA);
  k.launch(1, 4, 2.0f, x, y, static_cast<long long>(4));
  expect_near(host(y), std::vector<double>(4, 2.0), 0);

  // Truncated file too.
  fs::resize_file(files[0], 10);
  tg::cuda::detail::rtc_clear_memory_cache();
  tg::cuda::RawKernel k2(src, "axpy");
  EXPECT_EQ(tg::cuda::detail::rtc_compile_count(), c0 + 2);
}

TEST(ElementwiseKernel, ParseErrors) {
#ifndef TG_WITH_CUDA
  EXPECT_THROW(tg::cuda::ElementwiseKernel("double a", "double c", "c = a", "k"), tg::Error);
  EXPECT_THROW(tg::cuda::RawKernel("", "k"), tg::Error);
  GTEST_SKIP() << "built without CUDA";
#endif
  // Parsing needs no GPU; the kernel compiles on first call.
  EXPECT_NO_THROW(tg::cuda::ElementwiseKernel("double a, long long b", "float c", "c = a * b", "k"));
  EXPECT_THROW(tg::cuda::ElementwiseKernel("complex a", "double c", "c = a", "k"), tg::Error);
  EXPECT_THROW(tg::cuda::ElementwiseKernel("double a, double a", "double c", "c = a", "k"), tg::Error);
  EXPECT_THROW(tg::cuda::ElementwiseKernel("double", "double c", "c = 1", "k"), tg::Error);
  EXPECT_THROW(tg::cuda::ElementwiseKernel("raw a", "double c", "c = 1", "k"), tg::Error);  // raw needs a type
  tg::cuda::ElementwiseKernel rev("raw double a", "double c", "c = a[a.size() - 1 - i]", "k");
  EXPECT_NE(rev.source().find("_tg_raw<const double> a"), std::string::npos) << rev.source();
  EXPECT_THROW(tg::cuda::ElementwiseKernel("double a", "double c", "c = a", "not a name"), tg::Error);
}

TEST(ElementwiseKernel, MultiplyMatchesBuiltInWithBroadcasting) {
  TG_REQUIRE_CUDA();
  tg::cuda::ElementwiseKernel mul("double a, double b", "double c", "c = a * b", "gpu_mul");
  Tensor a = tg::randn({300, 1}, tg::TensorOptions().dtype(tg::kFloat64).device(tg::kCUDA));
  Tensor b = tg::randn({1, 257}, tg::TensorOptions().dtype(tg::kFloat64).device(tg::kCUDA));
  Tensor c = mul(a, b);
  EXPECT_EQ(c.sizes(), tg::Shape({300, 257}));
  EXPECT_TRUE(c.is_cuda());
  EXPECT_EQ(c.dtype(), tg::kFloat64);
  expect_near(host(c), host(a * b), 0);

  // Non-contiguous input.
  Tensor m = tg::randn({40, 30}, tg::TensorOptions().dtype(tg::kFloat64).device(tg::kCUDA));
  expect_near(host(mul(m.t(), m.t())), host(m.t() * m.t()), 0);

  // Wrong dtype is an error naming both.
  try {
    mul(a.to(tg::kFloat32), b);
    FAIL() << "expected tg::Error";
  } catch (const tg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("float32"), std::string::npos) << e.what();
  }
  EXPECT_THROW(mul(a), tg::Error);
  EXPECT_THROW(mul(tg::randn({3}, tg::TensorOptions().dtype(tg::kFloat64).device(tg::kCUDA)),
                   tg::randn({4}, tg::TensorOptions().dtype(tg::kFloat64).device(tg::kCUDA))),
               tg::Error);
}

TEST(ElementwiseKernel, SeveralOutputsGivenOutputsAndTypes) {
  TG_REQUIRE_CUDA();
  tg::cuda::ElementwiseKernel k("float x, int k, bool m", "float y, long long z",
                                "y = m ? x * k : -x; z = (long long)k * i", "mixed");
  const int64_t n = 1000;
  auto o = tg::TensorOptions().device(tg::kCUDA);
  Tensor x = tg::randn({n}, o);
  Tensor kk = tg::arange(n, o.dtype(tg::kInt32));
  Tensor m = tg::arange(n, o.dtype(tg::kInt64)).lt(500);
  auto outs = k.call({x, kk, m});
  ASSERT_EQ(outs.size(), 2u);
  auto xs = host(x), ys = host(outs[0]), zs = host(outs[1]);
  for (int64_t i = 0; i < n; ++i) {
    double want = i < 500 ? xs[i] * i : -xs[i];
    ASSERT_NEAR(ys[i], want, 1e-5 * (1 + std::abs(want))) << i;
    ASSERT_EQ(zs[i], static_cast<double>(i) * i) << i;
  }
  // Outputs passed in are written in place, including a strided one (through a temporary).
  Tensor y_out = tg::empty({n}, o);
  Tensor z_big = tg::zeros({n, 2}, o.dtype(tg::kInt64));
  Tensor z_view = z_big.select(1, 1);
  auto outs2 = k.call({x, kk, m}, {y_out, z_view});
  EXPECT_TRUE(outs2[0].is_same(y_out));
  expect_near(host(y_out), ys, 0);
  expect_near(host(z_big.select(1, 1)), zs, 0);
  expect_near(host(z_big.select(1, 0)), std::vector<double>(n, 0), 0);
  EXPECT_THROW(k(x, kk, m), tg::Error);  // two outputs: use call()
}

TEST(ElementwiseKernel, HalfAndBFloat16) {
  TG_REQUIRE_CUDA();
  tg::cuda::ElementwiseKernel h("half a, half b", "half c", "c = __float2half(__half2float(a) + 2.0f * __half2float(b))",
                                "h_axpy");
  tg::cuda::ElementwiseKernel bf("bfloat16 a", "float c", "c = __bfloat162float(a) * 0.5f", "bf_half");
  auto o = tg::TensorOptions().device(tg::kCUDA);
  Tensor a = tg::randn({513}, o).to(tg::kFloat16);
  Tensor b = tg::randn({513}, o).to(tg::kFloat16);
  Tensor want = (a.to(tg::kFloat32) + b.to(tg::kFloat32) * 2).to(tg::kFloat16);
  expect_near(host(h(a, b)), host(want), 1e-3);
  Tensor c = tg::randn({77}, o).to(tg::kBFloat16);
  Tensor got = bf(c);
  EXPECT_EQ(got.dtype(), tg::kFloat32);
  expect_near(host(got), host(c.to(tg::kFloat32) * 0.5), 0);
}

TEST(ElementwiseKernel, ScalarInputsArePassedByValue) {
  TG_REQUIRE_CUDA();
  // cupy's saxpy: z = a * x + y with a a scalar.
  tg::cuda::ElementwiseKernel saxpy("float a, float x, float y", "float z", "z = a * x + y", "saxpy");
  auto o = tg::TensorOptions().device(tg::kCUDA);
  Tensor x = tg::randn({1000}, o), y = tg::randn({1000}, o);
  const int64_t compiled = tg::cuda::detail::rtc_compile_count();
  Tensor z = saxpy(2.5f, x, y);
  auto xs = host(x), ys = host(y), zs = host(z);
  for (size_t i = 0; i < xs.size(); ++i) {
    // a float multiply-add: fused (NVRTC contracts a * x + y by default) or rounded twice
    const float xf = static_cast<float>(xs[i]), yf = static_cast<float>(ys[i]), got = static_cast<float>(zs[i]);
    ASSERT_TRUE(got == std::fma(2.5f, xf, yf) || got == 2.5f * xf + yf) << i << ": " << got;
  }
  // The same scalar pattern reuses its kernel; a tensor `a` (0-d, broadcast) is another kernel.
  saxpy(-1.0, x, y);
  Tensor z2 = saxpy(tg::full({}, 2.5, o), x, y);
  expect_near(host(z2), zs, 0);
  EXPECT_LE(tg::cuda::detail::rtc_compile_count() - compiled, 2);
  // Integer parameters take integral scalars only.
  tg::cuda::ElementwiseKernel shift("long long k, long long v", "long long w", "w = v + k * i", "shift");
  Tensor v = tg::arange(10, o.dtype(tg::kInt64));
  auto ws = host(shift(int64_t{3}, v));
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(ws[i], static_cast<double>(i + 3 * i));
  EXPECT_EQ(host(shift(2.0, v))[1], 3.0);
  EXPECT_THROW(shift(2.5, v), tg::Error);
  // Only scalars: the loop size must come from a given output.
  Tensor out = tg::empty({4}, o.dtype(tg::kInt64));
  shift.call({int64_t{1}, int64_t{7}}, {out});
  expect_near(host(out), {7, 8, 9, 10}, 0);
  EXPECT_THROW(shift(int64_t{1}, int64_t{7}), tg::Error);
}

TEST(ElementwiseKernel, RawParametersIndexWholeArrays) {
  TG_REQUIRE_CUDA();
  auto o = tg::TensorOptions().device(tg::kCUDA).dtype(tg::kFloat64);
  // Reverse through a raw input: the loop runs over the given output's shape.
  tg::cuda::ElementwiseKernel rev("raw double x", "double y", "y = x[x.size() - 1 - i]", "reverse");
  Tensor x = tg::randn({37}, o);
  Tensor y = tg::empty({37}, o);
  rev.call({x}, {y});
  auto xs = host(x), ys = host(y);
  for (size_t i = 0; i < xs.size(); ++i) ASSERT_EQ(ys[i], xs[xs.size() - 1 - i]) << i;
  // A non-contiguous raw input is passed dense, in logical order.
  Tensor m = tg::randn({5, 6}, o);
  Tensor mt = m.t();
  Tensor flat = tg::empty({30}, o);
  tg::cuda::ElementwiseKernel copy_raw("raw double s", "double d", "d = s[i]", "copy_raw");
  copy_raw.call({mt}, {flat});
  expect_near(host(flat), host(mt.contiguous().reshape({30})), 0);
  // A gather: non-raw index input broadcast-free, raw table.
  tg::cuda::ElementwiseKernel take("raw double table, long long idx", "double out", "out = table[idx]", "take");
  Tensor table = tg::randn({100}, o);
  Tensor idx = tg::randperm(100, tg::TensorOptions().device(tg::kCUDA).dtype(tg::kInt64)).slice(0, 0, 20);
  Tensor got = take(table, idx);
  expect_near(host(got), host(table.index_select(0, idx)), 0);
  // A raw output (a histogram with atomics); it must be given.
  tg::cuda::ElementwiseKernel hist("int v", "raw int counts", "atomicAdd(&counts[v], 1)", "hist");
  std::vector<int32_t> hv(1000);
  for (int i = 0; i < 1000; ++i) hv[i] = i % 7;
  Tensor vals = tg::tensor(hv).cuda();
  Tensor counts = tg::zeros({7}, tg::TensorOptions().device(tg::kCUDA).dtype(tg::kInt32));
  hist.call({vals}, {counts});
  auto cs = host(counts);
  for (int b = 0; b < 7; ++b) EXPECT_EQ(cs[b], b < 1000 % 7 ? 143 : 142) << b;
  EXPECT_THROW(hist(vals), tg::Error);                     // raw output not given
  EXPECT_THROW(rev.call({x}), tg::Error);                  // no loop size
  EXPECT_THROW(take(2.0, idx), tg::Error);                 // a scalar for a raw input
}

TEST(ElementwiseKernel, HostTensorsRoundTrip) {
  TG_REQUIRE_CUDA();
  tg::cuda::ElementwiseKernel mul("double a, double b", "double c", "c = a * b", "gpu_mul");
  Tensor a = tg::rand({100'000}, tg::kFloat64);
  Tensor b = tg::rand({100'000}, tg::kFloat64);
  Tensor c = mul(a, b);
  EXPECT_TRUE(c.is_cpu());
  auto as = a.to_vector<double>(), bs = b.to_vector<double>(), cs = c.to_vector<double>();
  for (size_t i = 0; i < as.size(); ++i) ASSERT_EQ(cs[i], as[i] * bs[i]) << i;

  // Mixed CPU and CUDA inputs are an error.
  EXPECT_THROW(mul(a, b.cuda()), tg::Error);
  // Empty inputs give an empty output.
  EXPECT_EQ(mul(tg::empty({0}, tg::kFloat64), tg::empty({0}, tg::kFloat64)).numel(), 0);
}

}  // namespace
