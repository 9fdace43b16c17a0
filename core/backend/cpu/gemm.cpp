// CPU matrix products: single-threaded Eigen kernels built once per instruction set
// (isa/gemm_eigen.cpp; the widest this CPU runs is chosen at the first product), with C split
// into row or column blocks across our thread pool here, so Eigen never needs OpenMP. float16 /
// bfloat16 operands are widened to float, multiplied in float and narrowed on the store. Batches
// run in parallel when each product is too small to split.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include <tapegrad/core/backend/cpu/cpu.h>
#include <tapegrad/core/backend/cpu/isa/gemm_isa.h>
#include <tapegrad/core/backend/cpu/thread_pool.h>
#include <tapegrad/core/error.h>

namespace tg::cpu {

namespace isa {

namespace {

// The kernels this build carries, narrowest first, with whether this CPU runs them.
struct Entry {
  GemmKernels kernels;
  bool runs;
};

// __builtin_cpu_supports also checks that the OS saves the vector registers (XGETBV).
[[maybe_unused]] bool runs_avx2() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

[[maybe_unused]] bool runs_avx512() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return runs_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

const std::vector<Entry>& entries() {
  static const std::vector<Entry> all = [] {
    std::vector<Entry> v{{{"base", &gemm_f32_base, &gemm_f64_base}, true}};
#ifdef TG_CPU_ISA_AVX2
    v.push_back({{"avx2", &gemm_f32_avx2, &gemm_f64_avx2}, runs_avx2()});
#endif
#ifdef TG_CPU_ISA_AVX512
    v.push_back({{"avx512", &gemm_f32_avx512, &gemm_f64_avx512}, runs_avx512()});
#endif
    return v;
  }();
  return all;
}

const GemmKernels* find(std::string_view name) {
  const GemmKernels* found = nullptr;
  for (const Entry& e : entries())
    if (e.runs && name == e.kernels.name) found = &e.kernels;
  if (found == nullptr) {
    std::string have;
    for (const std::string& n : available_gemm_isas()) have += (have.empty() ? "" : ", ") + n;
    TG_ERROR("cpu gemm: instruction set '", std::string(name), "' is not available (this build on this CPU has: ", have,
             "; set TG_CPU_ISA to one of them or leave it unset)");
  }
  return found;
}

std::atomic<const GemmKernels*>& current() {
  static std::atomic<const GemmKernels*> cur{nullptr};
  return cur;
}

}  // namespace

std::vector<std::string> available_gemm_isas() {
  std::vector<std::string> names;
  for (const Entry& e : entries())
    if (e.runs) names.emplace_back(e.kernels.name);
  return names;
}

const GemmKernels& gemm_kernels() {
  const GemmKernels* k = current().load(std::memory_order_acquire);
  if (k != nullptr) return *k;
  const char* env = std::getenv("TG_CPU_ISA");
  if (env != nullptr && *env != 0) {
    k = find(env);
  } else {
    for (const Entry& e : entries())
      if (e.runs) k = &e.kernels;  // the widest
  }
  current().store(k, std::memory_order_release);
  return *k;
}

void set_gemm_isa(std::string_view name) { current().store(find(name), std::memory_order_release); }

}  // namespace isa

using backend::GemmArgs;

namespace {

// Below this many multiply-adds a product runs on one thread.
constexpr double kMinFlopsPerThread = 1 << 18;

using Geometry = isa::GemmBlock;

template <typename S>
void block_product(const Geometry& g, const S* a, const S* b, S* c) {
  const isa::GemmKernels& k = isa::gemm_kernels();
  if constexpr (std::is_same_v<S, float>)
    k.f32(g, a, b, c);
  else
    k.f64(g, a, b, c);
}

// C = op(A) @ op(B) for float or double, all row-major with leading dimensions: C's rows (or
// columns, when it is wider than tall) in one block per thread.
template <typename S>
void gemm_2d(const Geometry& g, const S* a, const S* b, S* c) {
  const double flops = static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  const int64_t want =
      std::max<int64_t>(1, std::min<int64_t>(get_num_threads(), static_cast<int64_t>(flops / kMinFlopsPerThread)));
  if (want == 1 || g.k == 0) {
    block_product<S>(g, a, b, c);
    return;
  }
  const bool split_rows = g.m >= g.n;
  const int64_t extent = split_rows ? g.m : g.n;
  const int64_t grain = (extent + want - 1) / want;
  parallel(0, extent, grain, [&](int64_t lo, int64_t hi) {
    Geometry part = g;
    if (split_rows) {  // rows lo..hi of op(A) and C
      part.m = hi - lo;
      block_product<S>(part, a + (g.ta ? lo : lo * g.lda), b, c + lo * g.ldc);
    } else {  // columns lo..hi of op(B) and C
      part.n = hi - lo;
      block_product<S>(part, a, b + (g.tb ? lo * g.ldb : lo), c + lo);
    }
  });
}

// The same for float16 / bfloat16: widen op(A), op(B) to dense float, multiply, narrow
// (O = H), or store the float result as it is (O = float: GemmArgs::c_float32).
template <typename H, typename O>
void gemm_2d_half(const Geometry& g, const H* a, const H* b, O* c) {
  std::vector<float> fa(static_cast<size_t>(g.m * g.k)), fb(static_cast<size_t>(g.k * g.n)),
      fc(static_cast<size_t>(g.m * g.n));
  for (int64_t i = 0; i < g.m; ++i)
    for (int64_t p = 0; p < g.k; ++p)
      fa[static_cast<size_t>(i * g.k + p)] = static_cast<float>(g.ta ? a[p * g.lda + i] : a[i * g.lda + p]);
  for (int64_t p = 0; p < g.k; ++p)
    for (int64_t j = 0; j < g.n; ++j)
      fb[static_cast<size_t>(p * g.n + j)] = static_cast<float>(g.tb ? b[j * g.ldb + p] : b[p * g.ldb + j]);
  if constexpr (std::is_same_v<O, float>) {
    gemm_2d<float>({g.m, g.n, g.k, false, false, g.k, g.n, g.ldc}, fa.data(), fb.data(), c);
  } else {
    gemm_2d<float>({g.m, g.n, g.k, false, false, g.k, g.n, g.n}, fa.data(), fb.data(), fc.data());
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) c[i * g.ldc + j] = O(fc[static_cast<size_t>(i * g.n + j)]);
  }
}

template <typename T, typename O = T>
void gemm_typed(const GemmArgs& args) {
  const Geometry g{args.m, args.n, args.k, args.trans_a, args.trans_b, args.lda, args.ldb, args.ldc};
  const T* a = static_cast<const T*>(args.a);
  const T* b = static_cast<const T*>(args.b);
  O* c = static_cast<O*>(args.c);
  auto one = [&](int64_t i) {
    const T* ai = a + i * args.stride_a;
    const T* bi = b + i * args.stride_b;
    O* ci = c + i * args.stride_c;
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      gemm_2d<T>(g, ai, bi, ci);
    } else {
      gemm_2d_half<T, O>(g, ai, bi, ci);
    }
  };
  const double flops = static_cast<double>(args.m) * static_cast<double>(args.n) * static_cast<double>(args.k);
  if (args.batch > 1 && flops < 4 * kMinFlopsPerThread * get_num_threads()) {
    // Small products: one per task (nested parallel calls inside run inline).
    const int64_t grain = std::max<int64_t>(1, static_cast<int64_t>(kMinFlopsPerThread / std::max(flops, 1.0)));
    parallel(0, args.batch, grain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) one(i);
    });
  } else {
    for (int64_t i = 0; i < args.batch; ++i) one(i);
  }
}

}  // namespace

void gemm(const GemmArgs& args) {
  if (args.m == 0 || args.n == 0 || args.batch == 0) return;
  switch (args.dtype) {
    case DType::Float32:
      return gemm_typed<float>(args);
    case DType::Float64:
      return gemm_typed<double>(args);
    case DType::Float16:
      return args.c_float32 ? gemm_typed<Half, float>(args) : gemm_typed<Half>(args);
    case DType::BFloat16:
      return args.c_float32 ? gemm_typed<BFloat16, float>(args) : gemm_typed<BFloat16>(args);
    default:
      TG_ERROR("matmul: dtype ", dtype_name(args.dtype),
               " is not supported on cpu (float32, float64, float16, bfloat16 only)");
  }
}

}  // namespace tg::cpu
