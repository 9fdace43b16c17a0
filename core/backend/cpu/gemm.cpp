// CPU matrix products through Eigen (single-threaded per call; we split C into
// row or column blocks across the thread pool ourselves so Eigen never needs
// OpenMP). float16 / bfloat16 operands are widened to float, multiplied in
// float and narrowed on the store. Batches run in parallel when each product is
// too small to split.
#include <Eigen/Core>
#include <algorithm>
#include <type_traits>
#include <vector>

#include <tapegrad/core/backend/cpu/cpu.h>
#include <tapegrad/core/backend/cpu/thread_pool.h>
#include <tapegrad/core/error.h>

namespace tg::cpu {

using backend::GemmArgs;

namespace {

template <typename S>
using RowMat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename S>
using ConstMap = Eigen::Map<const RowMat<S>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <typename S>
using MutMap = Eigen::Map<RowMat<S>, Eigen::Unaligned, Eigen::OuterStride<>>;

// Below this many multiply-adds a product runs on one thread.
constexpr double kMinFlopsPerThread = 1 << 18;

struct Geometry {
  int64_t m, n, k;
  bool ta, tb;
  int64_t lda, ldb, ldc;
};

// C = op(A) @ op(B) for float or double, all row-major with leading dimensions.
template <typename S>
void gemm_2d(const Geometry& g, const S* a, const S* b, S* c) {
  MutMap<S> C(c, g.m, g.n, Eigen::OuterStride<>(g.ldc));
  if (g.k == 0) {
    C.setZero();
    return;
  }
  ConstMap<S> A(a, g.ta ? g.k : g.m, g.ta ? g.m : g.k, Eigen::OuterStride<>(g.lda));
  ConstMap<S> B(b, g.tb ? g.n : g.k, g.tb ? g.k : g.n, Eigen::OuterStride<>(g.ldb));
  const double flops = static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  const int64_t want =
      std::max<int64_t>(1, std::min<int64_t>(get_num_threads(), static_cast<int64_t>(flops / kMinFlopsPerThread)));
  const bool split_rows = g.m >= g.n;
  const int64_t extent = split_rows ? g.m : g.n;
  const int64_t grain = (extent + want - 1) / want;
  auto run = [&](const auto& lhs, const auto& rhs) {
    parallel(0, extent, grain, [&](int64_t lo, int64_t hi) {
      if (split_rows) {
        C.middleRows(lo, hi - lo).noalias() = lhs.middleRows(lo, hi - lo) * rhs;
      } else {
        C.middleCols(lo, hi - lo).noalias() = lhs * rhs.middleCols(lo, hi - lo);
      }
    });
  };
  if (!g.ta && !g.tb) {
    run(A, B);
  } else if (!g.ta) {
    run(A, B.transpose());
  } else if (!g.tb) {
    run(A.transpose(), B);
  } else {
    run(A.transpose(), B.transpose());
  }
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
