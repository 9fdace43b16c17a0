// Tests of the CUDA runtime layer: the caching device allocator (reuse, streams,
// splitting, counters, out-of-memory), streams and events, pinned host memory,
// host<->device copies, and the cuBLAS / cuBLASLt gemm against a float64 host
// reference. Without a GPU only the "no device" behaviour is checked.
#include <gtest/gtest.h>

#include <cstdlib>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <tapegrad/core/cuda.h>
#include <tapegrad/core/error.h>
#include <tapegrad/core/half.h>

#ifdef TG_WITH_CUDA
#include <tapegrad/core/backend/cuda/blas.h>
#include <tapegrad/core/backend/cuda/runtime.h>
#endif

namespace {

#define TG_SKIP_WITHOUT_GPU() \
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

TEST(CudaRuntimeNoGpu, ReportsUnavailableAndThrows) {
  if (tg::cuda::is_available()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_EQ(tg::cuda::device_count(), 0);
  EXPECT_THROW(tg::cuda::Stream(), tg::Error);
  EXPECT_EQ(tg::cuda::memory_allocated(), 0u);
  EXPECT_EQ(tg::cuda::memory_reserved(), 0u);
  EXPECT_NO_THROW(tg::cuda::empty_cache());
}

#ifdef TG_WITH_CUDA
namespace cd = tg::cuda::detail;

constexpr size_t kMiB = size_t{1} << 20;

// Keeps `s` busy for a few milliseconds (large memsets on a scratch buffer).
void keep_busy(const tg::cuda::Stream& s, tg::DataPtr& scratch, size_t bytes) {
  for (int i = 0; i < 20; ++i)
    TG_CUDA_CHECK(cudaMemsetAsync(scratch.get(), i, bytes, static_cast<cudaStream_t>(s.handle())));
}

TEST(CudaRuntime, DeviceQueries) {
  TG_SKIP_WITHOUT_GPU();
  EXPECT_GT(tg::cuda::device_count(), 0);
  EXPECT_GE(tg::cuda::runtime_version(), 12000);
  EXPECT_EQ(tg::cuda::current_device(), 0);
  EXPECT_THROW(tg::cuda::set_device(tg::cuda::device_count()), tg::Error);
}

TEST(CudaRuntime, ErrorMessageNamesCallAndError) {
  TG_SKIP_WITHOUT_GPU();
  try {
    TG_CUDA_CHECK(cudaSetDevice(12345));
    FAIL() << "expected a tg::Error";
  } catch (const tg::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cudaSetDevice(12345)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cudaErrorInvalidDevice"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cuda_runtime_test.cpp:"), std::string::npos) << msg;
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // the error was cleared
}

TEST(CachingAllocator, ReusesOnSameStreamOnly) {
  if (std::getenv("TG_NO_CUDA_MEMORY_CACHING")) GTEST_SKIP() << "needs the caching allocator (TG_NO_CUDA_MEMORY_CACHING is set)";
  TG_SKIP_WITHOUT_GPU();
  tg::cuda::empty_cache();
  tg::DataPtr p = cd::device_allocate(1000, 0);
  ASSERT_NE(p.get(), nullptr);
  EXPECT_EQ(p.device(), tg::Device(tg::kCUDA, 0));
  void* raw = p.get();
  p.reset();
  tg::DataPtr q = cd::device_allocate(1000, 0);
  EXPECT_EQ(q.get(), raw);
  q.reset();
  tg::cuda::Stream s;
  tg::cuda::StreamGuard g(s);
  tg::DataPtr r = cd::device_allocate(1000, 0);
  EXPECT_NE(r.get(), raw);  // the cached block belongs to the default stream
}

TEST(CachingAllocator, ZeroBytesGivesNull) {
  TG_SKIP_WITHOUT_GPU();
  tg::DataPtr p = cd::device_allocate(0, 0);
  EXPECT_EQ(p.get(), nullptr);
}

TEST(CachingAllocator, SplitsAFreedBlock) {
  if (std::getenv("TG_NO_CUDA_MEMORY_CACHING")) GTEST_SKIP() << "needs the caching allocator (TG_NO_CUDA_MEMORY_CACHING is set)";
  TG_SKIP_WITHOUT_GPU();
  tg::cuda::empty_cache();
  // A fresh stream has no cached blocks, whatever other tests left behind.
  tg::cuda::Stream fresh;
  tg::cuda::StreamGuard guard(fresh);
  const size_t reserved0 = tg::cuda::memory_reserved();
  // Large pool: a 4 MiB request gets a 20 MiB segment; 2 MiB is then carved from it.
  tg::DataPtr big = cd::device_allocate(4 * kMiB, 0);
  void* base = big.get();
  EXPECT_EQ(tg::cuda::memory_reserved(), reserved0 + 20 * kMiB);
  big.reset();
  tg::DataPtr part = cd::device_allocate(2 * kMiB, 0);
  EXPECT_EQ(part.get(), base);
  tg::DataPtr second = cd::device_allocate(3 * kMiB, 0);  // the remainder, right after
  EXPECT_EQ(static_cast<char*>(second.get()), static_cast<char*>(base) + 2 * kMiB);
  EXPECT_EQ(tg::cuda::memory_reserved(), reserved0 + 20 * kMiB);
  // Small pool: 512-byte rounding, consecutive blocks of one 2 MiB segment.
  tg::DataPtr s1 = cd::device_allocate(100, 0);
  tg::DataPtr s2 = cd::device_allocate(600, 0);
  tg::DataPtr s3 = cd::device_allocate(1, 0);
  EXPECT_EQ(static_cast<char*>(s2.get()), static_cast<char*>(s1.get()) + 512);
  EXPECT_EQ(static_cast<char*>(s3.get()), static_cast<char*>(s2.get()) + 1024);
  // Freeing the middle one, then the others, merges the segment back whole.
  void* seg = s1.get();
  s2.reset();
  s1.reset();
  s3.reset();
  tg::DataPtr whole = cd::device_allocate(kMiB, 0);
  EXPECT_EQ(whole.get(), seg);
}

TEST(CachingAllocator, Counters) {
  if (std::getenv("TG_NO_CUDA_MEMORY_CACHING")) GTEST_SKIP() << "needs the caching allocator (TG_NO_CUDA_MEMORY_CACHING is set)";
  TG_SKIP_WITHOUT_GPU();
  tg::cuda::empty_cache();
  tg::cuda::Stream fresh;
  tg::cuda::StreamGuard guard(fresh);
  const size_t alloc0 = tg::cuda::memory_allocated();
  const size_t reserved0 = tg::cuda::memory_reserved();
  tg::cuda::reset_peak_memory_stats();
  EXPECT_EQ(tg::cuda::max_memory_allocated(), alloc0);

  tg::DataPtr a = cd::device_allocate(1000, 0);  // rounds to 1024, small pool
  EXPECT_EQ(tg::cuda::memory_allocated(), alloc0 + 1024);
  EXPECT_EQ(tg::cuda::memory_reserved(), reserved0 + 2 * kMiB);
  tg::DataPtr b = cd::device_allocate(30 * kMiB + 1, 0);  // large: 30 MiB + 512, segment 32 MiB
  EXPECT_EQ(tg::cuda::memory_allocated(), alloc0 + 1024 + 30 * kMiB + 512);
  EXPECT_EQ(tg::cuda::memory_reserved(), reserved0 + 2 * kMiB + 32 * kMiB);
  const size_t peak = tg::cuda::max_memory_allocated();
  EXPECT_EQ(peak, alloc0 + 1024 + 30 * kMiB + 512);

  b.reset();
  EXPECT_EQ(tg::cuda::memory_allocated(), alloc0 + 1024);
  EXPECT_EQ(tg::cuda::max_memory_allocated(), peak);
  EXPECT_EQ(tg::cuda::memory_reserved(), reserved0 + 34 * kMiB);  // still cached
  tg::cuda::empty_cache();
  EXPECT_EQ(tg::cuda::memory_reserved(), reserved0 + 2 * kMiB);  // a's segment is in use
  a.reset();
  tg::cuda::empty_cache();
  EXPECT_EQ(tg::cuda::memory_reserved(), reserved0);
  EXPECT_EQ(tg::cuda::memory_allocated(), alloc0);
  tg::cuda::reset_peak_memory_stats();
  EXPECT_EQ(tg::cuda::max_memory_allocated(), alloc0);
}

TEST(CachingAllocator, OutOfMemoryThrowsAndRecovers) {
  TG_SKIP_WITHOUT_GPU();
  size_t free_b = 0, total_b = 0;
  TG_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  try {
    tg::DataPtr huge = cd::device_allocate(total_b * 2, 0);
    FAIL() << "expected out of memory";
  } catch (const tg::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("out of memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(total_b * 2)), std::string::npos) << msg;
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  tg::DataPtr small = cd::device_allocate(4096, 0);
  EXPECT_NE(small.get(), nullptr);
}

TEST(CachingAllocator, RecordStreamDelaysReuse) {
  if (std::getenv("TG_NO_CUDA_MEMORY_CACHING")) GTEST_SKIP() << "needs the caching allocator (TG_NO_CUDA_MEMORY_CACHING is set)";
  TG_SKIP_WITHOUT_GPU();
  tg::cuda::empty_cache();
  tg::cuda::Stream side;
  tg::DataPtr scratch = cd::device_allocate(512 * kMiB, 0);
  tg::DataPtr p = cd::device_allocate(1000, 0);
  void* raw = p.get();
  cd::record_stream(p, static_cast<cudaStream_t>(side.handle()));
  keep_busy(side, scratch, 512 * kMiB);
  p.reset();  // side is still busy: the block must wait for it
  tg::DataPtr q = cd::device_allocate(1000, 0);
  EXPECT_NE(q.get(), raw);
  q.reset();
  side.synchronize();
  tg::DataPtr r = cd::device_allocate(1000, 0);
  EXPECT_EQ(r.get(), raw);
  tg::cuda::synchronize();
}

TEST(CudaRuntime, StreamsAndEvents) {
  TG_SKIP_WITHOUT_GPU();
  void* before = tg::cuda::current_stream().handle();
  tg::cuda::Stream s;
  EXPECT_NE(s.handle(), nullptr);
  EXPECT_EQ(s.device(), 0);
  tg::DataPtr scratch = cd::device_allocate(256 * kMiB, 0);
  tg::cuda::Event start, end;
  {
    tg::cuda::StreamGuard g(s);
    EXPECT_EQ(tg::cuda::current_stream().handle(), s.handle());
    EXPECT_EQ(cd::current_stream_handle(0), s.handle());
    start.record();
    keep_busy(s, scratch, 256 * kMiB);
    end.record();
  }
  EXPECT_EQ(tg::cuda::current_stream().handle(), before);
  end.synchronize();
  EXPECT_TRUE(end.query());
  EXPECT_TRUE(s.query());
  EXPECT_GT(start.elapsed_ms(end), 0.f);

  tg::cuda::Stream moved = std::move(s);
  EXPECT_EQ(s.handle(), nullptr);
  EXPECT_NE(moved.handle(), nullptr);
  tg::cuda::Event unrecorded;
  EXPECT_THROW((void)unrecorded.elapsed_ms(end), tg::Error);
}

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    v[i] = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

TEST(CudaCopy, PinnedHostMemory) {
  TG_SKIP_WITHOUT_GPU();
  tg::DataPtr h = cd::host_allocate(1 << 16);
  ASSERT_NE(h.get(), nullptr);
  EXPECT_TRUE(cd::is_pinned(h.get()));
  EXPECT_TRUE(cd::is_pinned(static_cast<char*>(h.get()) + 100));
  std::vector<char> pageable(1024);
  EXPECT_FALSE(cd::is_pinned(pageable.data()));
  void* raw = h.get();
  h.reset();
  tg::DataPtr again = cd::host_allocate(1 << 16);
  EXPECT_EQ(again.get(), raw);  // cached
  EXPECT_EQ(cd::host_allocate(0).get(), nullptr);
}

class CudaCopySizes : public ::testing::TestWithParam<size_t> {};

TEST_P(CudaCopySizes, PageableRoundTrip) {
  TG_SKIP_WITHOUT_GPU();
  const size_t n = GetParam();
  const std::vector<uint8_t> src = pattern(n, 7);
  std::vector<uint8_t> back(n, 0xAB);
  tg::DataPtr d = cd::device_allocate(n, 0);
  tg::DataPtr d2 = cd::device_allocate(n, 0);
  cd::copy_h2d(d.get(), src.data(), n, 0);
  cd::copy_d2d(d2.get(), 0, d.get(), 0, n);
  cd::copy_d2h(back.data(), d2.get(), n, 0);
  EXPECT_TRUE(n == 0 || std::memcmp(src.data(), back.data(), n) == 0);
}

TEST_P(CudaCopySizes, PinnedRoundTrip) {
  TG_SKIP_WITHOUT_GPU();
  const size_t n = GetParam();
  const std::vector<uint8_t> ref = pattern(n, 11);
  tg::DataPtr src = cd::host_allocate(n);
  tg::DataPtr back = cd::host_allocate(n);
  if (n) {
    std::memcpy(src.get(), ref.data(), n);
    std::memset(back.get(), 0xCD, n);
  }
  tg::DataPtr d = cd::device_allocate(n, 0);
  tg::cuda::Stream s;
  tg::cuda::StreamGuard g(s);
  cd::copy_h2d(d.get(), src.get(), n, 0, /*non_blocking=*/true);
  cd::copy_d2h(back.get(), d.get(), n, 0, /*non_blocking=*/true);
  s.synchronize();
  EXPECT_TRUE(n == 0 || std::memcmp(ref.data(), back.get(), n) == 0);
}

TEST_P(CudaCopySizes, NonBlockingPageableOnSideStream) {
  TG_SKIP_WITHOUT_GPU();
  const size_t n = GetParam();
  const std::vector<uint8_t> src = pattern(n, 13);
  std::vector<uint8_t> back(n, 0);
  tg::DataPtr d = cd::device_allocate(n, 0);
  tg::cuda::Stream s;
  tg::cuda::StreamGuard g(s);
  cd::copy_h2d(d.get(), src.data(), n, 0, /*non_blocking=*/true);   // pageable: source consumed on return
  cd::copy_d2h(back.data(), d.get(), n, 0, /*non_blocking=*/true);  // pageable: blocks
  EXPECT_TRUE(n == 0 || std::memcmp(src.data(), back.data(), n) == 0);
}

INSTANTIATE_TEST_SUITE_P(Sizes, CudaCopySizes,
                         ::testing::Values(size_t{0}, size_t{1}, size_t{4097}, size_t{300001},
                                           size_t{100} * 1000 * 1000 + 3));

// ---- gemm against a float64 host reference

template <typename T>
void run_gemm_case(tg::DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb, bool broadcast_b,
                   double tol) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  const int64_t a_elems = batch * m * k, b_elems = (broadcast_b ? 1 : batch) * k * n;
  std::vector<T> a(a_elems), b(b_elems), c(batch * m * n);
  for (auto& x : a) x = T(dist(rng));
  for (auto& x : b) x = T(dist(rng));
  tg::DataPtr da = cd::device_allocate(a.size() * sizeof(T), 0);
  tg::DataPtr db = cd::device_allocate(b.size() * sizeof(T), 0);
  tg::DataPtr dc = cd::device_allocate(c.size() * sizeof(T), 0);
  cd::copy_h2d(da.get(), a.data(), a.size() * sizeof(T), 0);
  cd::copy_h2d(db.get(), b.data(), b.size() * sizeof(T), 0);
  if (!c.empty()) TG_CUDA_CHECK(cudaMemset(dc.get(), 0x7f, c.size() * sizeof(T)));  // garbage to be overwritten

  tg::backend::GemmArgs g{};
  g.dtype = dtype;
  g.m = m, g.n = n, g.k = k, g.batch = batch;
  g.a = da.get(), g.b = db.get(), g.c = dc.get();
  g.trans_a = ta, g.trans_b = tb;
  g.lda = ta ? m : k;  // A stored k x m when transposed
  g.ldb = tb ? k : n;
  g.ldc = n;
  g.stride_a = m * k, g.stride_b = broadcast_b ? 0 : k * n, g.stride_c = m * n;
  g.device = tg::Device(tg::kCUDA, 0);
  cd::gemm(g);
  cd::copy_d2h(c.data(), dc.get(), c.size() * sizeof(T), 0);

  double max_err = 0;
  for (int64_t bi = 0; bi < batch; ++bi) {
    const T* pa = a.data() + bi * g.stride_a;
    const T* pb = b.data() + bi * g.stride_b;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double ref = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double av = static_cast<double>(ta ? pa[p * g.lda + i] : pa[i * g.lda + p]);
          const double bv = static_cast<double>(tb ? pb[j * g.ldb + p] : pb[p * g.ldb + j]);
          ref += av * bv;
        }
        const double got = static_cast<double>(c[bi * m * n + i * n + j]);
        max_err = std::max(max_err, std::abs(got - ref));
      }
  }
  EXPECT_LE(max_err, tol) << "dtype " << tg::dtype_name(dtype) << " b" << batch << " m" << m << " n" << n << " k" << k
                          << " ta" << ta << " tb" << tb;
}

TEST(CudaGemm, Float32AndFloat64) {
  TG_SKIP_WITHOUT_GPU();
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      run_gemm_case<float>(tg::kFloat32, 1, 33, 17, 65, ta, tb, false, 1e-4);
      run_gemm_case<float>(tg::kFloat32, 3, 8, 5, 7, ta, tb, false, 1e-5);
      run_gemm_case<double>(tg::kFloat64, 1, 31, 19, 40, ta, tb, false, 1e-12);
      run_gemm_case<double>(tg::kFloat64, 4, 6, 9, 11, ta, tb, true, 1e-12);
    }
}

TEST(CudaGemm, HalfTypes) {
  TG_SKIP_WITHOUT_GPU();
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      run_gemm_case<tg::Half>(tg::kFloat16, 1, 64, 32, 128, ta, tb, false, 0.05);
      run_gemm_case<tg::Half>(tg::kFloat16, 2, 16, 24, 40, ta, tb, true, 0.05);
      run_gemm_case<tg::BFloat16>(tg::kBFloat16, 3, 16, 8, 32, ta, tb, false, 0.2);
    }
}

TEST(CudaGemm, EmptyDims) {
  TG_SKIP_WITHOUT_GPU();
  run_gemm_case<float>(tg::kFloat32, 2, 4, 3, 0, false, false, false, 0.0);  // k == 0: zeros
  run_gemm_case<float>(tg::kFloat32, 1, 0, 3, 5, false, false, false, 0.0);  // nothing to do
}
#endif  // TG_WITH_CUDA

}  // namespace
