// CUDA float32 gemms of few output tiles (core/backend/cuda/small_gemm.cu, split over K with a
// fixed-order finish): matmul and linear (forward with the bias fused, backward with the bias
// gradient fused as A's row sums or B's column sums) against a float64 host reference over
// split and unsplit shapes, tile edges, every transpose and padded leading dimensions; the
// same bits on every run and on a CUDA graph's replays; and the cuBLAS path agrees.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <tapegrad/core/cuda.h>
#include <tapegrad/core/cuda_graph.h>
#include <tapegrad/core/native.h>
#include "core/reference.h"
#include "tests/autograd/common.h"

#ifdef TG_WITH_CUDA
#include <tapegrad/core/backend/cuda/blas.h>

namespace tg::testing {
namespace {

#define TG_SKIP_WITHOUT_GPU() \
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

struct Shape3 {
  int64_t m, n, k;
};
// MNIST-MLP layers and gradients (split K), tile edges, K not a multiple of the 16-wide step,
// 16 splits of 16 steps (the most the kernel takes: 5 x 7 x 4096), one step more (cuBLAS),
// more tiles than the SMs hold twice (unsplit), one element, and the 2^19-output limit.
const std::vector<Shape3>& shapes() {
  static const std::vector<Shape3> s = {{128, 512, 784}, {128, 10, 512}, {128, 512, 10}, {512, 784, 128},
                                        {65, 63, 1000},  {1, 1, 1},      {5, 7, 4096},   {5, 7, 4097},
                                        {3, 700, 5001},  {700, 700, 33}, {64, 8192, 40}, {17, 29, 31}};
  return s;
}

// A [rows, cols] float32 view in one of three layouts of its storage: dense, the transpose of
// a dense [cols, rows], or a column slice of a wider dense matrix (leading dimension > cols).
Tensor operand(int64_t rows, int64_t cols, int layout, uint64_t seed) {
  auto opts = TensorOptions().device(Device(kCUDA));
  tg::manual_seed(seed);
  switch (layout) {
    case 1:
      return tg::randn({cols, rows}, opts).t();
    case 2:
      return tg::randn({rows, cols + 5}, opts).slice(1, 2, cols + 2);
    default:
      return tg::randn({rows, cols}, opts);
  }
}

// |got - want| <= rel * sum |terms| per element, from the float32 values the operands hold.
::testing::AssertionResult matches_reference(const Tensor& c, const Tensor& a, const Tensor& b, double rel) {
  RefTensor A = RefTensor::from(a), B = RefTensor::from(b), C = RefTensor::from(c);
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, scale = 0;
      for (int64_t p = 0; p < k; ++p) {
        s += A.v[i * k + p] * B.v[p * n + j];
        scale += std::abs(A.v[i * k + p] * B.v[p * n + j]);
      }
      const double got = C.v[i * n + j];
      if (!(std::abs(got - s) <= rel * scale + 1e-30))
        return ::testing::AssertionFailure() << "C(" << i << ", " << j << ") = " << got << ", want " << s
                                             << " (sum |terms| " << scale << ")";
    }
  return ::testing::AssertionSuccess();
}

// The worst |got(r, c) - want| / scale over r < rows, c < cols, where want = base(c) + sum_p
// term(r, c, p) and scale = |base(c)| + sum_p |term(r, c, p)| (p < len), in float64.
template <class Got, class Term, class Base>
double worst_rel(int64_t rows, int64_t cols, int64_t len, Got got, Term term, Base base) {
  double worst = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      double want = base(c), scale = std::abs(want);
      for (int64_t p = 0; p < len; ++p) {
        const double v = term(r, c, p);
        want += v;
        scale += std::abs(v);
      }
      worst = std::max(worst, std::abs(got(r, c) - want) / scale);
    }
  return worst;
}

bool same_bits(const Tensor& x, const Tensor& y) {
  std::vector<double> a = host(x), b = host(y);
  return a == b;
}

TEST(SmallSgemm, MatmulMatchesFloat64InEveryLayout) {
  TG_SKIP_WITHOUT_GPU();
  const bool tf32 = tg::allow_tf32();
  tg::set_allow_tf32(false);
  for (const Shape3& s : shapes())
    for (int la = 0; la < 3; ++la)
      for (int lb = 0; lb < 3; ++lb) {
        if (s.m * s.n * s.k > (int64_t{1} << 26) && (la != 0 || lb != 1)) continue;  // large: one layout
        SCOPED_TRACE("m " + std::to_string(s.m) + " n " + std::to_string(s.n) + " k " + std::to_string(s.k) +
                     " layouts " + std::to_string(la) + std::to_string(lb));
        Tensor a = operand(s.m, s.k, la, 1), b = operand(s.k, s.n, lb, 2);
        Tensor c = tg::matmul(a, b);
        EXPECT_TRUE(matches_reference(c, a, b, 2e-6));
        EXPECT_TRUE(same_bits(c, tg::matmul(a, b))) << "two runs differ";
        cuda::detail::set_small_sgemm(false);
        Tensor lib = tg::matmul(a, b);
        cuda::detail::set_small_sgemm(true);
        EXPECT_TRUE(matches_reference(lib, a, b, 2e-6)) << "cuBLAS";
      }
  tg::set_allow_tf32(tf32);
}

// linear forward (bias fused) and backward (weight gradient with the bias gradient fused: A's
// row sums for a row-major weight, B's column sums for a column-major one) at the MNIST MLP's
// shapes, against float64.
TEST(SmallSgemm, LinearForwardAndBackwardAtMlpShapes) {
  TG_SKIP_WITHOUT_GPU();
  const bool fuse = native::fuse_bias_grad();
  native::set_fuse_bias_grad(true);
  auto opts = TensorOptions().device(Device(kCUDA));
  struct L {
    int64_t rows, in, out;
  };
  for (L l : {L{128, 784, 512}, L{128, 512, 512}, L{128, 512, 10}, L{100, 300, 70}})
    for (bool w_col_major : {false, true}) {
      SCOPED_TRACE(std::to_string(l.in) + " -> " + std::to_string(l.out) + (w_col_major ? " (w column-major)" : ""));
      tg::manual_seed(7);
      Tensor x = tg::randn({l.rows, l.in}, opts).requires_grad_();
      Tensor wl = (w_col_major ? tg::randn({l.in, l.out}, opts) : tg::randn({l.out, l.in}, opts)).requires_grad_();
      Tensor w = w_col_major ? wl.t() : wl;
      Tensor b = tg::randn({l.out}, opts).requires_grad_();
      Tensor g = tg::randn({l.rows, l.out}, opts);
      Tensor y = tg::linear(x, w, b);
      auto grads = tg::autograd::grad({y}, {x, w, b}, {g});
      RefTensor X = RefTensor::from(x), W = RefTensor::from(w), B = RefTensor::from(b), G = RefTensor::from(g);
      RefTensor Y = RefTensor::from(y), GX = RefTensor::from(grads[0]), GW = RefTensor::from(grads[1]),
                GB = RefTensor::from(grads[2]);
      const int64_t R = l.rows, I = l.in, O = l.out;
      auto zero = [](int64_t) { return 0.0; };
      const double worst_y = worst_rel(
          R, O, I, [&](int64_t i, int64_t o) { return Y.v[i * O + o]; },
          [&](int64_t i, int64_t o, int64_t p) { return X.v[i * I + p] * W.v[o * I + p]; },
          [&](int64_t o) { return B.v[o]; });
      const double worst_gx = worst_rel(
          R, I, O, [&](int64_t i, int64_t p) { return GX.v[i * I + p]; },
          [&](int64_t i, int64_t p, int64_t o) { return G.v[i * O + o] * W.v[o * I + p]; }, zero);
      const double worst_gw = worst_rel(
          O, I, R, [&](int64_t o, int64_t p) { return GW.v[o * I + p]; },
          [&](int64_t o, int64_t p, int64_t i) { return G.v[i * O + o] * X.v[i * I + p]; }, zero);
      const double worst_gb = worst_rel(
          1, O, R, [&](int64_t, int64_t o) { return GB.v[o]; },
          [&](int64_t, int64_t o, int64_t i) { return G.v[i * O + o]; }, zero);
      EXPECT_LT(worst_y, 2e-6) << "y";
      EXPECT_LT(worst_gx, 2e-6) << "grad x";
      EXPECT_LT(worst_gw, 2e-6) << "grad w";
      EXPECT_LT(worst_gb, 2e-6) << "grad b";
    }
  native::set_fuse_bias_grad(fuse);
}

// Split-K finishes in a fixed order: a graph's replays give the eager bits, on another stream.
TEST(SmallSgemm, GraphReplaysGiveTheEagerBits) {
  TG_SKIP_WITHOUT_GPU();
  auto opts = TensorOptions().device(Device(kCUDA));
  tg::manual_seed(3);
  Tensor x = tg::randn({128, 784}, opts), w = tg::randn({512, 784}, opts), b = tg::randn({512}, opts);
  Tensor eager = tg::linear(x, w, b);
  Tensor y;
  tg::cuda::Stream side;
  {
    tg::cuda::StreamGuard guard(side);
    tg::cuda::Graph graph;
    graph.capture([&] { y = tg::linear(x, w, b); });
    for (int i = 0; i < 3; ++i) {
      graph.replay();
      side.synchronize();
      EXPECT_TRUE(same_bits(y, eager)) << "replay " << i;
    }
  }
}

}  // namespace
}  // namespace tg::testing

#endif  // TG_WITH_CUDA
