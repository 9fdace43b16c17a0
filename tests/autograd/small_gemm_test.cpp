// CUDA float32 gemms of few output tiles (core/backend/cuda/small_gemm.cu, split over K with a
// fixed-order finish): matmul and linear (forward with the bias fused, backward with the bias
// gradient fused as A's row sums or B's column sums) against a float64 host reference over
// split and unsplit shapes, tile edges, every transpose and padded leading dimensions; the
// same bits on every run and on a CUDA graph's replays; and the cuBLAS path agrees. Independent
// problems waiting in the launch queue join one launch (SmallSgemmGroup): their own values, none
// joined where one writes what another touches, and a two-layer MLP's backward; the join rule
// itself on byte ranges alone (runs without a GPU).
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
#include <tapegrad/core/backend/backend.h>
#include <tapegrad/core/backend/cuda/blas.h>
#include <tapegrad/core/backend/cuda/launch_queue.h>

namespace tg::testing {
namespace {

#define TG_SKIP_WITHOUT_GPU() \
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

// float32 without TF32 for a test's scope (restored even when an ASSERT leaves early).
struct NoTf32 {
  bool was = tg::allow_tf32();
  NoTf32() { tg::set_allow_tf32(false); }
  ~NoTf32() { tg::set_allow_tf32(was); }
};

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
  NoTf32 no_tf32;
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

// An inf in a row of A and a NaN in a column of B reach only that row and that column of C
// (a split block's partial sums and the fixed-order finish keep them there); every other
// element is the exact sum.
TEST(SmallSgemm, NonFiniteOperandsStayNonFiniteInTheirRowAndColumnOnly) {
  TG_SKIP_WITHOUT_GPU();
  NoTf32 no_tf32;
  std::vector<float> ha(128 * 784, 0.5f), hb(784 * 512, 0.25f);
  ha[3 * 784 + 100] = INFINITY;  // row 3 of A
  hb[200 * 512 + 7] = NAN;       // column 7 of B
  Tensor a = tg::from_blob(ha.data(), {128, 784}).to(Device(kCUDA));
  Tensor b = tg::from_blob(hb.data(), {784, 512}).to(Device(kCUDA));
  std::vector<double> c = host(tg::matmul(a, b));
  for (int64_t i = 0; i < 128; ++i)
    for (int64_t j = 0; j < 512; ++j) {
      const double v = c[i * 512 + j];
      if (j == 7) {
        EXPECT_TRUE(std::isnan(v)) << i << ", " << j;
      } else if (i == 3) {
        EXPECT_TRUE(std::isinf(v) && v > 0) << i << ", " << j;
      } else {
        ASSERT_EQ(v, 784 * 0.125) << i << ", " << j;
      }
    }
}

// ---- independent gemms in one launch (blas.cpp join_deferred_gemm, small_gemm.cu's group kernel)

// GemmArgs of C = op(A) op(B) over float32 tensors, deferrable, holding its operands; addresses
// taken without flushing the launch queue (data_ptr() would send a waiting gemm first).
backend::GemmArgs deferrable_gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c) {
  backend::GemmArgs g{};
  g.dtype = kFloat32;
  g.m = c.size(0);
  g.n = c.size(1);
  g.k = ta ? a.size(0) : a.size(1);
  g.batch = 1;
  g.a = cuda::detail::address_noflush(a);
  g.b = cuda::detail::address_noflush(b);
  g.c = cuda::detail::address_noflush(c);
  g.trans_a = ta;
  g.trans_b = tb;
  g.lda = a.size(1);
  g.ldb = b.size(1);
  g.ldc = c.size(1);
  g.device = c.device();
  g.deferrable = true;
  g.operands[0] = &a;
  g.operands[1] = &b;
  return g;
}

// op(A) op(B) against float64, C already computed.
::testing::AssertionResult product_matches(const Tensor& c, const Tensor& a, bool ta, const Tensor& b, bool tb) {
  return matches_reference(c, ta ? a.t() : a, tb ? b.t() : b, 2e-6);
}

// The join rule on addresses alone (no GPU needed): which byte ranges a gemm reads and writes.
backend::GemmArgs fake_gemm(uintptr_t a, uintptr_t b, uintptr_t c, int64_t m, int64_t n, int64_t k) {
  backend::GemmArgs g{};
  g.dtype = kFloat32;
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = 1;
  g.a = reinterpret_cast<const void*>(a);
  g.b = reinterpret_cast<const void*>(b);
  g.c = reinterpret_cast<void*>(c);
  g.lda = k;
  g.ldb = n;
  g.ldc = n;
  return g;
}

TEST(SmallSgemmGroup, IndependenceIsJudgedByTheBytesEachTouches) {
  using E = backend::GemmEpilogue;
  constexpr uintptr_t kA = 0x100000, kB = 0x200000, kC = 0x300000, kFar = 0x900000;
  const auto x = fake_gemm(kA, kB, kC, 4, 4, 8);  // reads [kA, kA + 128), [kB, kB + 128); writes [kC, kC + 64)
  auto indep = [](const backend::GemmArgs& p, const backend::GemmArgs& q) {
    return cuda::detail::gemms_independent(p, q);
  };
  EXPECT_TRUE(indep(x, fake_gemm(kFar, kFar + 0x1000, kFar + 0x2000, 4, 4, 8))) << "disjoint";
  EXPECT_TRUE(indep(x, fake_gemm(kA, kB, kFar, 4, 4, 8))) << "both only read A and B";
  EXPECT_FALSE(indep(x, fake_gemm(kC, kFar, kFar + 0x1000, 4, 4, 8))) << "reads what x writes";
  EXPECT_FALSE(indep(x, fake_gemm(kFar, kFar + 0x1000, kB + 124, 4, 4, 8))) << "writes x's B's last element";
  EXPECT_TRUE(indep(x, fake_gemm(kFar, kFar + 0x1000, kB + 128, 4, 4, 8))) << "writes just past x's B";
  EXPECT_FALSE(indep(x, fake_gemm(kFar, kFar + 0x1000, kC, 1, 1, 1))) << "writes what x writes";
  // Leading dimensions and transposes: op(A) = A^T with A stored [k = 10, m = 3], lda 5, spans
  // (9 * 5 + 3) floats = 192 bytes.
  auto t = fake_gemm(kA, kB, kC, 3, 4, 10);
  t.trans_a = true;
  t.lda = 5;
  EXPECT_FALSE(indep(t, fake_gemm(kFar, kFar + 0x1000, kA + 188, 1, 1, 1)));
  EXPECT_TRUE(indep(t, fake_gemm(kFar, kFar + 0x1000, kA + 192, 1, 1, 1)));
  // C with ldc 8 (a column slice): rows 0-3 of 4 columns span (3 * 8 + 4) floats; the gaps between
  // rows count as written (conservative), past the last row does not.
  auto s4 = fake_gemm(kA, kB, kC, 4, 4, 8);
  s4.ldc = 8;
  EXPECT_FALSE(indep(s4, fake_gemm(kC + 16, kFar, kFar + 0x1000, 1, 1, 1))) << "reads a gap of x's C";
  EXPECT_TRUE(indep(s4, fake_gemm(kC + 112, kFar, kFar + 0x1000, 1, 1, 1))) << "reads past x's C";
  // Epilogue vectors: a bias gradient written (RowSumsA: m floats), a bias read (n floats), a
  // saved ReLU output read (m x n).
  auto rs = x;
  rs.epilogue = E::RowSumsA;
  rs.epilogue_ptr = reinterpret_cast<void*>(kFar);
  auto bias = fake_gemm(kFar + 0x1000, kFar + 0x2000, kFar + 0x3000, 4, 4, 8);
  bias.epilogue = E::Bias;
  bias.epilogue_ptr = reinterpret_cast<void*>(kFar + 12);
  EXPECT_FALSE(indep(rs, bias)) << "reads the bias gradient x writes";
  bias.epilogue_ptr = reinterpret_cast<void*>(kFar + 16);
  EXPECT_TRUE(indep(rs, bias));
  auto rb = x;
  rb.epilogue = E::ReluBackward;
  rb.epilogue_ptr = reinterpret_cast<void*>(kFar);
  EXPECT_FALSE(indep(rb, fake_gemm(kFar + 0x1000, kFar + 0x2000, kFar + 60, 1, 1, 1))) << "writes x's mask";
  EXPECT_TRUE(indep(rb, fake_gemm(kFar + 0x1000, kFar + 0x2000, kFar + 64, 1, 1, 1)));
  // Outside small_gemm.cu's problems: never judged independent.
  auto half = fake_gemm(kFar, kFar + 0x1000, kFar + 0x2000, 4, 4, 8);
  half.dtype = kBFloat16;
  EXPECT_FALSE(indep(x, half));
  auto gelu = fake_gemm(kFar, kFar + 0x1000, kFar + 0x2000, 4, 4, 8);
  gelu.epilogue = E::GeluTanhBackward;
  EXPECT_FALSE(indep(gelu, x));
}

TEST(SmallSgemmGroup, IndependentGemmsJoinOneLaunchWithTheirOwnValues) {
  TG_SKIP_WITHOUT_GPU();
  auto opts = TensorOptions().device(Device(kCUDA));
  backend::Backend& be = backend::get(DeviceType::CUDA);
  tg::manual_seed(11);
  // Five problems, every transpose pair, different shapes: the first four join (a group holds
  // four), the fifth waits on its own.
  struct P {
    int64_t m, n, k;
    bool ta, tb;
  };
  const std::vector<P> ps = {{128, 512, 512, false, false}, {512, 512, 128, true, false}, {128, 10, 512, false, true},
                             {10, 512, 128, true, true},    {64, 96, 200, false, false}};
  std::vector<Tensor> as, bs, cs;
  for (const P& p : ps) {
    as.push_back(p.ta ? tg::randn({p.k, p.m}, opts) : tg::randn({p.m, p.k}, opts));
    bs.push_back(p.tb ? tg::randn({p.n, p.k}, opts) : tg::randn({p.k, p.n}, opts));
    cs.push_back(tg::empty({p.m, p.n}, opts));
  }
  tg::cuda::synchronize();
  const int64_t before = cuda::detail::gemm_groupings();
  for (size_t i = 0; i < ps.size(); ++i) be.gemm(deferrable_gemm(as[i], ps[i].ta, bs[i], ps[i].tb, cs[i]));
  EXPECT_EQ(cuda::detail::gemm_groupings() - before, 3) << "three joins: a group of four, then one alone";
  for (size_t i = 0; i < ps.size(); ++i)
    EXPECT_TRUE(product_matches(cs[i], as[i], ps[i].ta, bs[i], ps[i].tb)) << "problem " << i;
  // The same bits on a second run, and within float32 rounding of the ungrouped launches.
  std::vector<Tensor> again;
  for (size_t i = 0; i < ps.size(); ++i) {
    again.push_back(tg::empty({ps[i].m, ps[i].n}, opts));
    be.gemm(deferrable_gemm(as[i], ps[i].ta, bs[i], ps[i].tb, again[i]));
  }
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_TRUE(same_bits(cs[i], again[i])) << "problem " << i << " run twice";
}

// The MLP's last layer: its input gradient has one K step (K = 10: one block a tile, many tiles
// packed into each of the group's clusters) beside a weight gradient split over K.
TEST(SmallSgemmGroup, OneStepProblemSharesClustersWithASplitOne) {
  TG_SKIP_WITHOUT_GPU();
  auto opts = TensorOptions().device(Device(kCUDA));
  backend::Backend& be = backend::get(DeviceType::CUDA);
  tg::manual_seed(14);
  Tensor g = tg::randn({128, 10}, opts), w = tg::randn({10, 512}, opts), h = tg::randn({128, 512}, opts);
  Tensor dx = tg::empty({128, 512}, opts), dw = tg::empty({10, 512}, opts);
  tg::cuda::synchronize();
  const int64_t before = cuda::detail::gemm_groupings();
  be.gemm(deferrable_gemm(g, false, w, false, dx));  // dX = g W
  be.gemm(deferrable_gemm(g, true, h, false, dw));   // dW = g^T h
  EXPECT_EQ(cuda::detail::gemm_groupings() - before, 1);
  EXPECT_TRUE(product_matches(dx, g, false, w, false));
  EXPECT_TRUE(product_matches(dw, g, true, h, false));
}

TEST(SmallSgemmGroup, GemmsThatShareWrittenMemoryDoNotJoin) {
  TG_SKIP_WITHOUT_GPU();
  auto opts = TensorOptions().device(Device(kCUDA));
  backend::Backend& be = backend::get(DeviceType::CUDA);
  tg::manual_seed(12);
  Tensor a = tg::randn({128, 256}, opts), b = tg::randn({256, 64}, opts), b2 = tg::randn({64, 32}, opts);
  Tensor c = tg::empty({128, 64}, opts), d = tg::empty({128, 32}, opts);
  tg::cuda::synchronize();
  const int64_t before = cuda::detail::gemm_groupings();
  // d = (a b) b2: the second reads what the first writes.
  be.gemm(deferrable_gemm(a, false, b, false, c));
  be.gemm(deferrable_gemm(c, false, b2, false, d));
  tg::cuda::synchronize();  // (sends the waiting gemm: the next case starts with an empty queue)
  // The second writes what the first reads: b = x^T y ([256, 64]) after c2 = a b.
  Tensor x = tg::randn({128, 256}, opts), y = tg::randn({128, 64}, opts);
  Tensor bcopy = b.clone(), c2 = tg::empty({128, 64}, opts), e = tg::empty({128, 64}, opts);
  tg::cuda::synchronize();
  be.gemm(deferrable_gemm(a, false, b, false, c2));
  be.gemm(deferrable_gemm(x, true, y, false, b));
  tg::cuda::synchronize();
  // Both into the same output: the second must land last.
  be.gemm(deferrable_gemm(a, false, bcopy, false, e));
  be.gemm(deferrable_gemm(x, false, bcopy, false, e));
  EXPECT_EQ(cuda::detail::gemm_groupings() - before, 0);
  EXPECT_TRUE(product_matches(c, a, false, bcopy, false));
  EXPECT_TRUE(product_matches(d, c, false, b2, false));
  EXPECT_TRUE(product_matches(c2, a, false, bcopy, false)) << "read b before it was overwritten";
  EXPECT_TRUE(product_matches(b, x, true, y, false));
  EXPECT_TRUE(product_matches(e, x, false, bcopy, false)) << "the later write wins";
}

// A two-layer MLP's backward: the second linear's input gradient (through the ReLU) and weight
// gradient (with the bias gradient) join; float64 checks them, grouping off gives values within
// rounding, and a CUDA graph of the step replays the eager bits.
TEST(SmallSgemmGroup, MlpBackwardJoinsInputAndWeightGradients) {
  TG_SKIP_WITHOUT_GPU();
  auto opts = TensorOptions().device(Device(kCUDA));
  tg::manual_seed(13);
  Tensor x = tg::randn({128, 784}, opts);
  Tensor w1 = (tg::randn({512, 784}, opts) * 0.03).requires_grad_(), b1 = tg::randn({512}, opts).requires_grad_();
  Tensor w2 = (tg::randn({512, 512}, opts) * 0.04).requires_grad_(), b2 = tg::randn({512}, opts).requires_grad_();
  Tensor g = tg::randn({128, 512}, opts);
  auto step = [&] {
    Tensor h = tg::relu(tg::linear(x, w1, b1));
    Tensor y = tg::linear(h, w2, b2);
    auto grads = tg::autograd::grad({y}, {w1, b1, w2, b2}, {g});
    grads.push_back(h.detach());
    return grads;
  };
  const int64_t before = cuda::detail::gemm_groupings();
  std::vector<Tensor> grouped = step();
  EXPECT_GE(cuda::detail::gemm_groupings() - before, 1) << "layer 2's input and weight gradients in one launch";
  cuda::detail::set_gemm_grouping(false);
  const int64_t mid = cuda::detail::gemm_groupings();
  std::vector<Tensor> apart = step();
  cuda::detail::set_gemm_grouping(true);
  EXPECT_EQ(cuda::detail::gemm_groupings(), mid);
  // float64: dW2 = g^T h, db2 = sum g, and dW1 through the mask, from the float32 values held.
  RefTensor G = RefTensor::from(g), H = RefTensor::from(grouped[4]), W2 = RefTensor::from(w2),
            X = RefTensor::from(x);
  RefTensor GW2 = RefTensor::from(grouped[2]), GB2 = RefTensor::from(grouped[3]), GW1 = RefTensor::from(grouped[0]);
  auto zero = [](int64_t) { return 0.0; };
  EXPECT_LT(worst_rel(
                512, 512, 128, [&](int64_t o, int64_t p) { return GW2.v[o * 512 + p]; },
                [&](int64_t o, int64_t p, int64_t i) { return G.v[i * 512 + o] * H.v[i * 512 + p]; }, zero),
            2e-6);
  EXPECT_LT(worst_rel(
                1, 512, 128, [&](int64_t, int64_t o) { return GB2.v[o]; },
                [&](int64_t, int64_t o, int64_t i) { return G.v[i * 512 + o]; }, zero),
            2e-6);
  // dH = g W2 masked by h > 0 (float64), then dW1 = dH^T x: compare dW1 against that product.
  std::vector<double> dh(128 * 512);
  for (int64_t i = 0; i < 128; ++i)
    for (int64_t p = 0; p < 512; ++p) {
      double s = 0;
      for (int64_t o = 0; o < 512; ++o) s += G.v[i * 512 + o] * W2.v[o * 512 + p];
      dh[i * 512 + p] = H.v[i * 512 + p] > 0 ? s : 0.0;
    }
  EXPECT_LT(worst_rel(
                512, 784, 128, [&](int64_t p, int64_t q) { return GW1.v[p * 784 + q]; },
                [&](int64_t p, int64_t q, int64_t i) { return dh[i * 512 + p] * X.v[i * 784 + q]; }, zero),
            2e-5);  // dH itself carries float32 rounding into this product
  for (size_t i = 0; i < 4; ++i) {
    std::vector<double> u = host(grouped[i]), v = host(apart[i]);
    double worst = 0, scale = 0;
    for (size_t j = 0; j < u.size(); ++j) {
      worst = std::max(worst, std::abs(u[j] - v[j]));
      scale = std::max(scale, std::abs(v[j]));
    }
    EXPECT_LE(worst, 1e-5 * scale) << "gradient " << i << ": grouped against apart";
  }
  // Captured: the replays give the eager (grouped) bits.
  std::vector<Tensor> captured;
  tg::cuda::Stream side;
  {
    tg::cuda::StreamGuard guard(side);
    tg::cuda::Graph graph;
    graph.capture([&] { captured = step(); });
    for (int r = 0; r < 2; ++r) {
      graph.replay();
      side.synchronize();
      for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(same_bits(captured[i], grouped[i])) << "replay " << r << " grad " << i;
    }
  }
}

}  // namespace
}  // namespace tg::testing

#endif  // TG_WITH_CUDA
