// The CPU backend's own machinery: the thread pool, the caching host allocator,
// gemm (every transpose, padded leading dims, batches, 16-bit types) and the
// elementwise engine driven directly through the kernel table, large reductions
// that take the parallel paths, random fills against core/philox.h, and
// index_select on strided inputs. References are float64 host loops.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <tapegrad/tapegrad.h>

#include <tapegrad/core/backend/backend.h>
#include <tapegrad/core/backend/cpu/cpu.h>
#include <tapegrad/core/backend/cpu/isa/gemm_isa.h>
#include <tapegrad/core/philox.h>

namespace {

using tg::Tensor;
using tg::backend::ElementwiseIter;
using tg::backend::ElemOp;
using tg::backend::GemmArgs;

std::vector<double> random_values(size_t n, uint32_t seed, double lo = -1, double hi = 1) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = u(gen);
  return v;
}

// Restores the thread count a test changes.
struct ThreadCountGuard {
  int saved = tg::get_num_threads();
  ~ThreadCountGuard() { tg::set_num_threads(saved); }
};

// ---------------------------------------------------------------- thread pool

TEST(CpuThreadPool, CoversRangeOnceInChunksOfAtLeastGrain) {
  ThreadCountGuard guard;
  for (int threads : {1, 2, 4}) {
    tg::set_num_threads(threads);
    EXPECT_EQ(tg::get_num_threads(), threads);
    for (int64_t n : {0, 1, 99, 100, 101, 12345}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::atomic<int64_t> short_chunks{0};
      tg::parallel_for(0, n, 100, [&](int64_t lo, int64_t hi) {
        if (hi - lo < 100 && hi != n) ++short_chunks;
        for (int64_t i = lo; i < hi; ++i) ++hits[static_cast<size_t>(i)];
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "n " << n << " i " << i;
      EXPECT_EQ(short_chunks.load(), 0);
    }
  }
}

TEST(CpuThreadPool, ExceptionsReachTheCaller) {
  ThreadCountGuard guard;
  tg::set_num_threads(4);
  EXPECT_THROW(tg::parallel_for(0, 1000, 10,
                                [](int64_t lo, int64_t) {
                                  if (lo >= 500) throw std::runtime_error("chunk failed");
                                }),
               std::runtime_error);
  // The pool still works afterwards.
  std::atomic<int64_t> sum{0};
  tg::parallel_for(0, 1000, 10, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 999 * 1000 / 2);
}

TEST(CpuThreadPool, NestedCallsRunInline) {
  ThreadCountGuard guard;
  tg::set_num_threads(4);
  std::atomic<int64_t> inner_total{0}, inner_calls{0};
  tg::parallel_for(0, 8, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      tg::parallel_for(0, 1000, 1, [&](int64_t a, int64_t b) {
        ++inner_calls;
        inner_total += b - a;
      });
    }
  });
  EXPECT_EQ(inner_total.load(), 8 * 1000);
  EXPECT_EQ(inner_calls.load(), 8) << "a nested parallel_for must run as one inline call";
}

TEST(CpuThreadPool, ConcurrentCallersAndBadThreadCount) {
  ThreadCountGuard guard;
  tg::set_num_threads(3);
  std::vector<std::thread> callers;
  std::atomic<int64_t> total{0};
  callers.reserve(4);
  for (int t = 0; t < 4; ++t)
    callers.emplace_back([&] {
      for (int rep = 0; rep < 20; ++rep)
        tg::parallel_for(0, 10000, 64, [&](int64_t lo, int64_t hi) { total += hi - lo; });
    });
  for (auto& c : callers) c.join();
  EXPECT_EQ(total.load(), 4 * 20 * 10000);
  EXPECT_THROW(tg::set_num_threads(0), tg::Error);
}

// ---------------------------------------------------------------- host allocator

TEST(CpuHostAllocator, AlignedAndReusesFreedBlocks) {
  tg::Allocator* a = tg::cpu::host_allocator();
  ASSERT_NE(a, nullptr);
  void* first = nullptr;
  {
    tg::DataPtr p = a->allocate(1000003);
    ASSERT_NE(p.get(), nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p.get()) % 64, 0u);
    EXPECT_TRUE(p.device().is_cpu());
    std::fill_n(static_cast<char*>(p.get()), 1000003, 7);  // the whole block is writable
    first = p.get();
  }
  EXPECT_GE(tg::cpu::cached_bytes(), 1000003u);
  tg::DataPtr q = a->allocate(1000003);
  EXPECT_EQ(q.get(), first) << "a freed block of the same size must be reused";
  tg::DataPtr z = a->allocate(0);
  EXPECT_NE(z.get(), nullptr);
  for (size_t n : {1u, 63u, 64u, 65u, 4097u, 123457u}) {
    tg::DataPtr p = a->allocate(n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p.get()) % 64, 0u) << n;
  }
  q.reset();
  tg::cpu::release_cached();
  EXPECT_EQ(tg::cpu::cached_bytes(), 0u);
}

TEST(CpuHostAllocator, ThreadSafe) {
  tg::Allocator* a = tg::cpu::host_allocator();
  size_t before = tg::cpu::allocated_bytes();
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  threads.reserve(4);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        size_t n = static_cast<size_t>(64 + (i * 37 + t * 101) % 5000);
        tg::DataPtr p = a->allocate(n);
        auto* c = static_cast<unsigned char*>(p.get());
        c[0] = static_cast<unsigned char>(t);
        c[n - 1] = static_cast<unsigned char>(t);
        if (c[0] != t || c[n - 1] != t) ++bad;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(tg::cpu::allocated_bytes(), before);
}

TEST(CpuHostAllocator, CacheLimitIsHonoured) {
  tg::cpu::release_cached();
  tg::cpu::set_cache_limit(1 << 20);
  { tg::DataPtr big = tg::cpu::host_allocator()->allocate(4 << 20); }
  EXPECT_EQ(tg::cpu::cached_bytes(), 0u) << "a block over the cap goes back to the system";
  tg::cpu::set_cache_limit(size_t{1} << 30);
}

// get_allocator reads the registry each backend fills when it is set up (core/storage.h).
TEST(CpuHostAllocator, IsTheRegisteredAllocatorOfTheCpu) {
  EXPECT_EQ(tg::get_allocator(tg::Device(tg::kCPU)), tg::cpu::host_allocator());
#ifdef TG_WITH_CUDA
  tg::Allocator* a = tg::get_allocator(tg::Device(tg::kCUDA, 0));
  EXPECT_NE(a, nullptr);
  EXPECT_EQ(tg::get_allocator(tg::Device(tg::kCUDA, 0)), a) << "one allocator object per device";
  EXPECT_NE(tg::get_allocator(tg::Device(tg::kCUDA, 1)), a);
  EXPECT_THROW(tg::get_allocator(tg::Device(tg::kCUDA, 64)), tg::Error);
#else
  try {
    tg::get_allocator(tg::Device(tg::kCUDA, 0));
    ADD_FAILURE() << "a CUDA allocator without CUDA";
  } catch (const tg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tapegrad was built without CUDA"), std::string::npos) << e.what();
  }
#endif
}

// ---------------------------------------------------------------- gemm

// Naive float64 C = op(A) op(B) over the same strided storage gemm reads.
template <typename T>
std::vector<double> naive_gemm(const GemmArgs& g, const std::vector<T>& a, const std::vector<T>& b, int64_t batch_i) {
  std::vector<double> c(static_cast<size_t>(g.m * g.n));
  const T* ab = a.data() + batch_i * g.stride_a;
  const T* bb = b.data() + batch_i * g.stride_b;
  for (int64_t i = 0; i < g.m; ++i)
    for (int64_t j = 0; j < g.n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < g.k; ++p) {
        double x = static_cast<float>(g.trans_a ? ab[p * g.lda + i] : ab[i * g.lda + p]);
        double y = static_cast<float>(g.trans_b ? bb[j * g.ldb + p] : bb[p * g.ldb + j]);
        if constexpr (std::is_same_v<T, double>) {
          x = g.trans_a ? ab[p * g.lda + i] : ab[i * g.lda + p];
          y = g.trans_b ? bb[j * g.ldb + p] : bb[p * g.ldb + j];
        }
        s += x * y;
      }
      c[static_cast<size_t>(i * g.n + j)] = s;
    }
  return c;
}

template <typename T>
void check_gemm(int64_t m, int64_t n, int64_t k, bool ta, bool tb, int64_t batch, bool broadcast_b, double rtol) {
  SCOPED_TRACE(::testing::Message() << tg::dtype_name(tg::dtype_of<T>) << " m" << m << " n" << n << " k" << k << " ta"
                                    << ta << " tb" << tb << " batch" << batch << " bcastB" << broadcast_b);
  GemmArgs g{};
  g.dtype = tg::dtype_of<T>;
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = batch;
  g.trans_a = ta;
  g.trans_b = tb;
  g.lda = (ta ? m : k) + 3;  // padded rows
  g.ldb = (tb ? k : n) + 5;
  g.ldc = n;
  g.stride_a = (ta ? k : m) * g.lda;
  g.stride_b = broadcast_b ? 0 : (tb ? n : k) * g.ldb;
  g.stride_c = m * n;
  auto av = random_values(static_cast<size_t>(std::max<int64_t>(1, g.stride_a * batch)), 1);
  auto bv =
      random_values(static_cast<size_t>(std::max<int64_t>(1, (tb ? n : k) * g.ldb * (broadcast_b ? 1 : batch))), 2);
  std::vector<T> a(av.begin(), av.end()), b(bv.begin(), bv.end()), c(static_cast<size_t>(m * n * batch), T(-99.0f));
  if constexpr (!std::is_same_v<T, float> && !std::is_same_v<T, double>) {
    for (size_t i = 0; i < av.size(); ++i) a[i] = T(static_cast<float>(av[i]));
    for (size_t i = 0; i < bv.size(); ++i) b[i] = T(static_cast<float>(bv[i]));
  }
  g.a = a.data();
  g.b = b.data();
  g.c = c.data();
  tg::backend::cpu().gemm(g);
  for (int64_t bi = 0; bi < batch; ++bi) {
    auto want = naive_gemm(g, a, b, bi);
    int bad = 0;
    for (int64_t i = 0; i < m * n; ++i) {
      double got = static_cast<double>(static_cast<float>(c[static_cast<size_t>(bi * m * n + i)]));
      if constexpr (std::is_same_v<T, double>) got = c[static_cast<size_t>(bi * m * n + i)];
      double w = want[static_cast<size_t>(i)];
      // Error of a k-term dot product of values in [-1, 1] grows like sqrt(k).
      if (std::abs(got - w) > rtol * (1 + std::sqrt(static_cast<double>(k)))) {
        if (bad++ < 3) ADD_FAILURE() << "batch " << bi << " elem " << i << ": got " << got << " want " << w;
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

TEST(CpuGemm, AllTransposesAndShapes) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_gemm<float>(5, 7, 3, ta, tb, 1, false, 1e-6);
      check_gemm<double>(17, 9, 33, ta, tb, 1, false, 1e-13);
      check_gemm<float>(1, 300, 64, ta, tb, 1, false, 1e-6);     // split over columns
      check_gemm<float>(257, 129, 200, ta, tb, 1, false, 1e-6);  // split over rows
      check_gemm<double>(64, 513, 65, ta, tb, 1, false, 1e-13);
    }
}

// Every instruction set this build carries and this CPU runs (base, avx2, avx512 on x86-64)
// against the float64 reference, whichever the library would choose by itself.
TEST(CpuGemm, EveryInstructionSetMatchesTheReference) {
  namespace isa = tg::cpu::isa;
  const std::string chosen = isa::gemm_kernels().name;
  const std::vector<std::string> names = isa::available_gemm_isas();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "base");
  if (std::getenv("TG_CPU_ISA") == nullptr)
    EXPECT_EQ(chosen, names.back()) << "the widest available set is the default";
  for (const std::string& n : names) {
    SCOPED_TRACE(n);
    isa::set_gemm_isa(n);
    EXPECT_EQ(std::string(isa::gemm_kernels().name), n);
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        check_gemm<float>(37, 45, 29, ta, tb, 1, false, 1e-6);
        check_gemm<float>(257, 129, 200, ta, tb, 1, false, 1e-6);  // split over threads
        check_gemm<double>(64, 513, 65, ta, tb, 1, false, 1e-13);
      }
    check_gemm<float>(8, 6, 5, true, false, 37, true, 1e-6);
  }
  isa::set_gemm_isa(chosen);
  try {
    isa::set_gemm_isa("sse9");
    ADD_FAILURE() << "an unknown instruction set must throw";
  } catch (const tg::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("sse9"), std::string::npos) << msg;
    EXPECT_NE(msg.find("base"), std::string::npos) << msg;
  }
  EXPECT_EQ(std::string(isa::gemm_kernels().name), chosen);
}

TEST(CpuGemm, BatchedAndBroadcast) {
  check_gemm<float>(8, 6, 5, false, false, 37, false, 1e-6);
  check_gemm<float>(8, 6, 5, true, false, 37, true, 1e-6);
  check_gemm<double>(100, 90, 80, false, true, 3, false, 1e-13);
  check_gemm<double>(100, 90, 80, true, true, 3, true, 1e-13);
}

TEST(CpuGemm, HalfTypesComputeInFloat) {
  // Inputs are exact in the narrow type; the result is rounded once.
  check_gemm<tg::Half>(33, 17, 40, false, false, 2, false, 1e-3);
  check_gemm<tg::Half>(33, 17, 40, true, true, 1, false, 1e-3);
  check_gemm<tg::BFloat16>(20, 31, 50, false, true, 2, true, 8e-3);
}

TEST(CpuGemm, EmptyInnerDimGivesZerosAndIntsThrow) {
  std::vector<float> c(12, 5.f);
  float dummy = 0;
  GemmArgs g{tg::kFloat32, 3, 4, 0, 1, &dummy, &dummy, c.data(), false, false, 1, 4, 4, 0, 0, 12, tg::Device()};
  tg::backend::cpu().gemm(g);
  for (float v : c) EXPECT_EQ(v, 0.f);
  g.dtype = tg::kInt64;
  g.k = 1;
  try {
    tg::backend::cpu().gemm(g);
    ADD_FAILURE() << "int64 gemm must throw";
  } catch (const tg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("int64"), std::string::npos) << e.what();
  }
}

TEST(CpuGemm, MatmulThroughThePublicApi) {
  auto av = random_values(300 * 200, 3), bv = random_values(200 * 100, 4);
  std::vector<float> af(av.begin(), av.end()), bf(bv.begin(), bv.end());
  Tensor a = tg::tensor(af, {300, 200}), b = tg::tensor(bf, {200, 100});
  std::vector<float> got = tg::matmul(a, b).to_vector<float>();
  // A transposed view of A goes through trans_a instead of a copy; same result.
  std::vector<float> got_t = tg::matmul(a.t().contiguous().t(), b).to_vector<float>();
  ASSERT_EQ(got_t.size(), got.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got_t[i], got[i], 1e-5) << i;
  ASSERT_EQ(got.size(), 300u * 100u);
  for (int64_t i = 0; i < 300; i += 7)
    for (int64_t j = 0; j < 100; j += 3) {
      double s = 0;
      for (int64_t p = 0; p < 200; ++p) s += double(af[i * 200 + p]) * double(bf[p * 100 + j]);
      EXPECT_NEAR(got[i * 100 + j], s, 1e-4) << i << "," << j;
    }
}

// ---------------------------------------------------------------- elementwise engine

// A 2-D iter over raw buffers: out[i, j] (row-major, contiguous) = op(a[i, j], b[i, j])
// with a read transposed (a's storage is [cols, rows]) and b broadcast along rows.
TEST(CpuElementwise, StridedParallelPathMatchesScalarFormula) {
  const int64_t rows = 301, cols = 257;  // 77K elements: several chunks that start mid-row
  auto av = random_values(static_cast<size_t>(rows * cols), 5), bv = random_values(static_cast<size_t>(cols), 6);
  std::vector<float> a(av.begin(), av.end()), b(bv.begin(), bv.end()), out(static_cast<size_t>(rows * cols));
  ElementwiseIter it;
  it.ndim = 2;
  it.noperands = 3;
  it.numel = rows * cols;
  it.shape[0] = rows;
  it.shape[1] = cols;
  it.strides[0][0] = cols;
  it.strides[0][1] = 1;
  it.strides[1][0] = 1;
  it.strides[1][1] = rows;
  it.strides[2][0] = 0;
  it.strides[2][1] = 1;
  it.data[0] = reinterpret_cast<char*>(out.data());
  it.data[1] = reinterpret_cast<char*>(a.data());
  it.data[2] = reinterpret_cast<char*>(b.data());
  for (int k = 0; k < 3; ++k) it.dtypes[k] = tg::kFloat32;
  it.dparams[0] = 0.5;  // alpha
  it.iparams[0] = 0;
  tg::backend::cpu().elementwise(ElemOp::Sub, it);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      float want = a[static_cast<size_t>(j * rows + i)] - 0.5f * b[static_cast<size_t>(j)];
      ASSERT_EQ(out[static_cast<size_t>(i * cols + j)], want) << i << "," << j;
    }
  // Maximum propagates NaN from either side.
  a[0] = std::numeric_limits<float>::quiet_NaN();
  b[1] = std::numeric_limits<float>::quiet_NaN();
  tg::backend::cpu().elementwise(ElemOp::Maximum, it);
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_TRUE(std::isnan(out[static_cast<size_t>(5 * cols + 1)]));
  EXPECT_EQ(out[2], std::max(a[static_cast<size_t>(2 * rows)], b[2]));
}

// A contiguous 1-D iter over raw buffers of one dtype.
template <typename Out, typename In>
ElementwiseIter flat_iter(std::vector<Out>& out, std::vector<In>& a) {
  ElementwiseIter it;
  it.ndim = 1;
  it.noperands = 2;
  it.numel = static_cast<int64_t>(out.size());
  it.shape[0] = it.numel;
  it.strides[0][0] = it.strides[1][0] = 1;
  it.data[0] = reinterpret_cast<char*>(out.data());
  it.data[1] = reinterpret_cast<char*>(a.data());
  it.dtypes[0] = tg::dtype_of<Out>;
  it.dtypes[1] = tg::dtype_of<In>;
  it.contiguous = true;
  return it;
}

TEST(CpuElementwise, UnaryFormulasInEachFloatType) {
  auto xv = random_values(100000, 7, -4, 4);
  std::vector<double> x(xv), y(x.size());
  auto it = flat_iter(y, x);
  struct Case {
    ElemOp op;
    double (*f)(double);
  };
  const Case cases[] = {
      {ElemOp::Exp, [](double v) { return std::exp(v); }},
      {ElemOp::Tanh, [](double v) { return std::tanh(v); }},
      {ElemOp::Sigmoid, [](double v) { return 1 / (1 + std::exp(-v)); }},
      {ElemOp::Gelu, [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }},
      {ElemOp::Abs, [](double v) { return std::abs(v); }},
      {ElemOp::Relu, [](double v) { return v > 0 ? v : 0.0; }},
      {ElemOp::Neg, [](double v) { return -v; }},
  };
  for (const Case& c : cases) {
    tg::backend::cpu().elementwise(c.op, it);
    for (size_t i = 0; i < x.size(); i += 97)
      ASSERT_NEAR(y[i], c.f(x[i]), 1e-14 * (1 + std::abs(c.f(x[i])))) << tg::cpu::op_name(c.op);
  }
  // float16: computed in float, rounded once.
  std::vector<tg::Half> hx(x.size()), hy(x.size());
  for (size_t i = 0; i < x.size(); ++i) hx[i] = tg::Half(static_cast<float>(x[i]));
  auto hit = flat_iter(hy, hx);
  hit.dparams[0] = 2.0;
  tg::backend::cpu().elementwise(ElemOp::PowScalar, hit);
  for (size_t i = 0; i < x.size(); i += 101) {
    double h = static_cast<float>(hx[i]);
    ASSERT_NEAR(static_cast<float>(hy[i]), h * h, 1e-3 * h * h + 1e-6);
  }
  hit.dparams[0] = -1.5;
  hit.dparams[1] = 0.25;
  tg::backend::cpu().elementwise(ElemOp::Clamp, hit);
  for (size_t i = 0; i < x.size(); i += 101) {
    double h = static_cast<float>(hx[i]);
    ASSERT_EQ(static_cast<float>(hy[i]), static_cast<float>(std::min(std::max(h, -1.5), 0.25)));
  }
}

TEST(CpuElementwise, IntegerOpsAndDtypeErrors) {
  std::vector<int32_t> x(70000), y(70000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<int32_t>(i) - 35000;
  auto it = flat_iter(y, x);
  it.iparams[0] = 3;
  it.dparams[0] = 3;
  tg::backend::cpu().elementwise(ElemOp::MulScalar, it);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], x[i] * 3);
  tg::backend::cpu().elementwise(ElemOp::Relu, it);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], std::max(x[i], 0));
  try {
    tg::backend::cpu().elementwise(ElemOp::Exp, it);
    ADD_FAILURE() << "Exp on int32 must throw";
  } catch (const tg::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("Exp"), std::string::npos) << msg;
    EXPECT_NE(msg.find("int32"), std::string::npos) << msg;
  }
  // Comparisons write bool.
  std::vector<int32_t> mask_storage(x.size());  // reused as bytes
  auto* mask = reinterpret_cast<uint8_t*>(mask_storage.data());
  ElementwiseIter cit = flat_iter(mask_storage, x);
  cit.dtypes[0] = tg::kBool;
  cit.iparams[0] = 10;
  tg::backend::cpu().elementwise(ElemOp::GeScalar, cit);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(mask[i] != 0, x[i] >= 10);
}

TEST(CpuElementwise, CopyConvertsEveryPair) {
  const double vals[] = {0, 1, -2, 3.75, -0.5, 100};
  for (tg::DType from : {tg::kFloat32, tg::kFloat16, tg::kBFloat16, tg::kFloat64, tg::kInt64, tg::kInt32, tg::kBool})
    for (tg::DType to : {tg::kFloat32, tg::kFloat16, tg::kBFloat16, tg::kFloat64, tg::kInt64, tg::kInt32, tg::kBool}) {
      std::vector<double> src_d(std::begin(vals), std::end(vals));
      Tensor src = tg::tensor(src_d).to(from);  // via the library's own conversion
      Tensor dst = src.to(to);
      std::vector<double> want;
      for (double v : src_d) {
        double s = tg::is_integral(from) ? std::trunc(v) : v;
        if (from == tg::kBool) s = v != 0;
        double t = to == tg::kBool ? (s != 0) : (tg::is_integral(to) ? std::trunc(s) : s);
        want.push_back(t);
      }
      Tensor back = dst.to(tg::kFloat64);
      EXPECT_EQ(back.to_vector<double>(), want) << tg::dtype_name(from) << " -> " << tg::dtype_name(to);
    }
}

// ---------------------------------------------------------------- reductions

// Reference reduction of a row-major [r, c] matrix over rows (dim 0) or cols (dim 1).
TEST(CpuReduce, LargeReductionsTakeTheParallelPaths) {
  const int64_t r = 1000, c = 301;
  auto v = random_values(static_cast<size_t>(r * c), 8, -3, 3);
  std::vector<float> f(v.begin(), v.end());
  Tensor x = tg::tensor(f, {r, c});
  for (int dim : {0, 1}) {
    const int64_t nout = dim == 0 ? c : r, nred = dim == 0 ? r : c;
    std::vector<double> sum(static_cast<size_t>(nout)), sq(static_cast<size_t>(nout)),
        mx(static_cast<size_t>(nout), -1e300);
    std::vector<int64_t> am(static_cast<size_t>(nout));
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) {
        double e = f[static_cast<size_t>(i * c + j)];
        int64_t o = dim == 0 ? j : i, ri = dim == 0 ? i : j;
        sum[static_cast<size_t>(o)] += e;
        if (e > mx[static_cast<size_t>(o)]) {
          mx[static_cast<size_t>(o)] = e;
          am[static_cast<size_t>(o)] = ri;
        }
      }
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) {
        int64_t o = dim == 0 ? j : i;
        double d = f[static_cast<size_t>(i * c + j)] - sum[static_cast<size_t>(o)] / static_cast<double>(nred);
        sq[static_cast<size_t>(o)] += d * d;
      }
    for (const Tensor& in : {x, x.t().contiguous().t()}) {  // same values, other memory order
      auto s = in.sum(dim).to_vector<float>();
      auto var = in.var(dim).to_vector<float>();
      auto m = in.max(dim).to_vector<float>();
      auto a = in.argmax(dim).to_vector<int64_t>();
      ASSERT_EQ(static_cast<int64_t>(s.size()), nout);
      for (int64_t o = 0; o < nout; ++o) {
        size_t k = static_cast<size_t>(o);
        ASSERT_NEAR(s[k], sum[k], 1e-5 * (1 + std::abs(sum[k]))) << "dim " << dim << " out " << o;
        ASSERT_NEAR(var[k], sq[k] / static_cast<double>(nred - 1), 1e-5) << "dim " << dim << " out " << o;
        ASSERT_EQ(m[k], static_cast<float>(mx[k]));
        ASSERT_EQ(a[k], am[k]);
      }
    }
  }
  // Full reductions of a large tensor.
  double total = 0;
  for (float e : f) total += e;
  EXPECT_NEAR(x.sum().item<double>(), total, 1e-3);
  EXPECT_NEAR(x.mean().item<double>(), total / static_cast<double>(r * c), 1e-8);
  EXPECT_EQ(x.argmax().item<int64_t>(), std::max_element(f.begin(), f.end()) - f.begin());
}

TEST(CpuReduce, NaNPropagatesAndArgmaxPicksFirstNaN) {
  std::vector<float> v(100000, 1.f);
  v[70001] = std::numeric_limits<float>::quiet_NaN();
  v[90000] = std::numeric_limits<float>::quiet_NaN();
  v[5] = 2.f;
  Tensor x = tg::tensor(v);
  EXPECT_TRUE(std::isnan(x.max().item<float>()));
  EXPECT_TRUE(std::isnan(x.min().item<float>()));
  EXPECT_TRUE(std::isnan(x.sum().item<float>()));
  EXPECT_EQ(x.argmax().item<int64_t>(), 70001);
  v[70001] = v[90000] = 1.f;
  v[80000] = 2.f;
  EXPECT_EQ(tg::tensor(v).argmax().item<int64_t>(), 5) << "first occurrence of the maximum";
}

TEST(CpuReduce, VarCorrectionEdgeAndIntSums) {
  Tensor one = tg::tensor(std::vector<double>{3.0});
  EXPECT_TRUE(std::isnan(one.var().item<double>())) << "N - correction == 0 gives NaN";
  EXPECT_DOUBLE_EQ(one.var({0}, false, 0).item<double>(), 0.0);
  std::vector<int32_t> iv(100000);
  std::iota(iv.begin(), iv.end(), 0);
  Tensor xi = tg::tensor(iv);
  Tensor s = xi.sum();
  EXPECT_EQ(s.dtype(), tg::kInt64);
  EXPECT_EQ(s.item<int64_t>(), int64_t{99999} * 100000 / 2);
  EXPECT_EQ(xi.max().item<int64_t>(), 99999);
  EXPECT_EQ(xi.min().item<int64_t>(), 0);
}

// ---------------------------------------------------------------- random, arange, index_select

TEST(CpuRandom, FillsFollowThePhiloxMapping) {
  const uint64_t seed = 0x1234567890abcdefULL;
  for (uint64_t offset : {uint64_t{0}, uint64_t{4}, uint64_t{1} << 40}) {
    Tensor u = tg::empty({70001});
    tg::backend::cpu().uniform(u, seed, offset, -2.0, 3.0);
    auto uv = u.to_vector<float>();
    for (size_t i = 0; i < uv.size(); i += 13) {
      float want = tg::philox::uniform_f32(seed, offset, i) * 5.0f + -2.0f;
      ASSERT_EQ(uv[i], want) << i;
    }
    Tensor n = tg::empty({70001});
    tg::backend::cpu().normal(n, seed, offset, 1.0, 2.0);
    auto nv = n.to_vector<float>();
    for (size_t i = 0; i < nv.size(); i += 13)
      ASSERT_EQ(nv[i], tg::philox::normal_f32(seed, offset, i) * 2.0f + 1.0f) << i;
    Tensor d = tg::empty({30001}, tg::kFloat64);
    tg::backend::cpu().normal(d, seed, offset, 0.0, 1.0);
    auto dv = d.to_vector<double>();
    for (size_t i = 0; i < dv.size(); i += 13) ASSERT_EQ(dv[i], tg::philox::normal_f64(seed, offset, i)) << i;
    tg::backend::cpu().uniform(d, seed, offset, 0.0, 1.0);
    dv = d.to_vector<double>();
    for (size_t i = 0; i < dv.size(); i += 13) ASSERT_EQ(dv[i], tg::philox::uniform_f64(seed, offset, i)) << i;
  }
}

TEST(CpuRandom, HalfUniformStaysBelowHi) {
  for (tg::DType dt : {tg::kFloat16, tg::kBFloat16}) {
    Tensor h = tg::empty({200000}, dt);
    tg::backend::cpu().uniform(h, 99, 0, 0.0, 1.0);
    auto v = h.to(tg::kFloat64).to_vector<double>();
    EXPECT_LT(*std::max_element(v.begin(), v.end()), 1.0) << tg::dtype_name(dt);
    EXPECT_GE(*std::min_element(v.begin(), v.end()), 0.0) << tg::dtype_name(dt);
  }
}

TEST(CpuRandom, RandpermIsAPermutationThatDependsOnlyOnSeedAndOffset) {
  for (tg::DType dt : {tg::kInt64, tg::kInt32}) {
    Tensor p = tg::empty({5000}, dt), q = tg::empty({5000}, dt), r = tg::empty({5000}, dt);
    tg::backend::cpu().randperm(p, 11, 8);
    tg::backend::cpu().randperm(q, 11, 8);
    tg::backend::cpu().randperm(r, 11, 8 + 2 * 5000);
    auto pv = p.to(tg::kInt64).to_vector<int64_t>(), qv = q.to(tg::kInt64).to_vector<int64_t>(),
         rv = r.to(tg::kInt64).to_vector<int64_t>();
    EXPECT_EQ(pv, qv);
    EXPECT_NE(pv, rv);
    std::vector<int64_t> sorted = pv, want(5000);
    std::sort(sorted.begin(), sorted.end());
    std::iota(want.begin(), want.end(), 0);
    EXPECT_EQ(sorted, want);
    // Each value lands in the first half about half the time.
    int64_t first_half = 0;
    for (size_t i = 0; i < 2500; ++i) first_half += pv[i] < 2500;
    EXPECT_NEAR(static_cast<double>(first_half), 1250, 150);
  }
}

TEST(CpuRandom, ArangeInEveryDtype) {
  for (tg::DType dt : {tg::kFloat32, tg::kFloat64, tg::kInt64, tg::kInt32, tg::kFloat16}) {
    Tensor a = tg::empty({50000}, dt);
    tg::backend::cpu().arange(a, -3.0, 2.0);
    auto v = a.to(tg::kFloat64).to_vector<double>();
    for (size_t i = 0; i < v.size(); i += 999) {
      double want = -3.0 + 2.0 * static_cast<double>(i);
      if (dt == tg::kFloat16) want = static_cast<float>(tg::Half(static_cast<float>(want)));
      ASSERT_EQ(v[i], want) << tg::dtype_name(dt) << " " << i;
    }
  }
  Tensor big = tg::empty({3}, tg::kInt64);
  tg::backend::cpu().arange(big, 9007199254740994.0, 1.0);  // 2^53 + 2: beyond 2^53 only int math is exact
  EXPECT_EQ(big.to_vector<int64_t>(), (std::vector<int64_t>{9007199254740994, 9007199254740995, 9007199254740996}));
}

TEST(CpuIndexSelect, ContiguousAndStridedInputs) {
  std::vector<float> v(4 * 50 * 30);
  std::iota(v.begin(), v.end(), 0.f);
  Tensor x = tg::tensor(v, {4, 50, 30});
  std::vector<int64_t> idx{49, 0, 7, 7, 21};
  for (const Tensor& in : {x, x.transpose(0, 2).contiguous().transpose(0, 2), x.slice(2, 0, 30, 2)}) {
    for (int64_t dim = 0; dim < 3; ++dim) {
      std::vector<int64_t> ix;
      ix.reserve(idx.size());
      for (int64_t i : idx) ix.push_back(i % in.size(dim));
      for (tg::DType it : {tg::kInt64, tg::kInt32}) {
        Tensor index = tg::tensor(ix).to(it);
        Tensor out = in.index_select(dim, index);
        auto ov = out.to_vector<float>();
        tg::Shape os = out.sizes();
        ASSERT_EQ(os[static_cast<size_t>(dim)], static_cast<int64_t>(ix.size()));
        auto at = [&](int64_t a, int64_t b, int64_t c) {
          return v[static_cast<size_t>(a * 1500 + b * 30 + c * (in.size(2) == 15 ? 2 : 1))];
        };
        for (int64_t a = 0; a < os[0]; ++a)
          for (int64_t b = 0; b < os[1]; ++b)
            for (int64_t c = 0; c < os[2]; ++c) {
              int64_t s[3] = {a, b, c};
              s[dim] = ix[static_cast<size_t>(s[dim])];
              ASSERT_EQ(ov[static_cast<size_t>((a * os[1] + b) * os[2] + c)], at(s[0], s[1], s[2]))
                  << "dim " << dim << " at " << a << "," << b << "," << c;
            }
      }
    }
  }
}

}  // namespace
