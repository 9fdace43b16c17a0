// linear's backward for few outputs on CUDA (out <= 8): weight and bias gradients in one
// launch (backend linear_grad_weight_bias). Against a float64 host reference over out, rows,
// in_features, dtypes, bias or none and both weight layouts; exact on integer values (also
// float32 gradients of half inputs); autocast's float32 weight gradients; bit-identical
// repeats; one dispatch; CUDA-graph replay equal to eager; the cases that keep the gemm
// path. Every case skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <tapegrad/core/native.h>
#include "core/reference.h"
#include "tests/autograd/common.h"

namespace tg::testing {
namespace {

#define TG_SKIP_NO_GPU() \
  if (!::tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

// gw[o, j] = sum_i g[i, o] x[i, j], gb[o] = sum_i g[i, o]; s*: the sums of |terms|.
struct Ref {
  std::vector<double> gw, sgw, gb, sgb;
};
Ref reference(const Tensor& x, const Tensor& g) {
  const int64_t rows = x.size(0), in = x.size(1), out = g.size(1);
  const std::vector<double> X = host(x), G = host(g);
  Ref r{std::vector<double>(out * in), std::vector<double>(out * in), std::vector<double>(out),
        std::vector<double>(out)};
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t o = 0; o < out; ++o) {
      const double gv = G[i * out + o];
      r.gb[o] += gv;
      r.sgb[o] += std::abs(gv);
      if (gv == 0) continue;
      double* w = &r.gw[o * in];
      double* s = &r.sgw[o * in];
      const double* xr = &X[i * in];
      for (int64_t j = 0; j < in; ++j) {
        w[j] += gv * xr[j];
        s[j] += std::abs(gv * xr[j]);
      }
    }
  return r;
}

// Within rel * (sum of |terms|) elementwise (+ a tiny floor for all-zero sums).
::testing::AssertionResult within(const Tensor& got, const std::vector<double>& want, const std::vector<double>& scale,
                                  double rel) {
  const std::vector<double> v = host(got);
  if (v.size() != want.size()) return ::testing::AssertionFailure() << "size " << v.size() << " vs " << want.size();
  for (size_t i = 0; i < v.size(); ++i) {
    // The final rounding to the result dtype is relative only down to its smallest normal;
    // below, it is absolute: half the subnormal spacing (2^-25 for float16, 2^-134 bfloat16).
    const double sub = got.dtype() == kFloat16 ? std::ldexp(1.0, -25) : got.dtype() == kBFloat16 ? std::ldexp(1.0, -134) : 0;
    const double tol = rel * scale[i] + sub + 1e-30;
    if (!(std::abs(v[i] - want[i]) <= tol))
      return ::testing::AssertionFailure() << "element " << i << ": got " << v[i] << ", want " << want[i] << " (tol "
                                           << tol << ", " << got.dtype() << ")";
  }
  return ::testing::AssertionSuccess();
}

// The kernel adds in float; for these shapes no output sees more than 1024 sequential adds
// (rows per thread + row lanes + row chunks), so the accumulation is within 1024 * 2^-24 of
// the sum of |terms|; the result is then rounded once to its dtype (2^-24, 2^-11, 2^-8).
double tol_of(DType result) {
  const double acc = 1024.0 * std::ldexp(1.0, -24);
  switch (result) {
    case kFloat32:
      return acc + std::ldexp(1.0, -24);
    case kFloat16:
      return acc + std::ldexp(1.0, -11);
    case kBFloat16:
      return acc + std::ldexp(1.0, -8);
    default:
      return 0;
  }
}

// Equal strides on every dim of size > 1 (the gradient is in the weight's own layout).
bool same_layout(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes()) return false;
  for (int64_t d = 0; d < a.dim(); ++d)
    if (a.sizes()[d] > 1 && a.strides()[d] != b.strides()[d]) return false;
  return true;
}

const int64_t kOuts[] = {1, 3, 8};
const int64_t kRows[] = {1, 7, 4096, 100000};
const int64_t kIns[] = {1, 64, 300};
const DType kDtypes[] = {kFloat32, kFloat16, kBFloat16};

// The weight as the op sees it: row-major [out, in], or the transpose of a dense [in, out].
Tensor make_weight(int64_t out, int64_t in, DType dt, bool col_major) {
  auto opts = TensorOptions().device(kCUDA);
  Tensor w = col_major ? tg::randn({in, out}, opts).to(dt).t() : tg::randn({out, in}, opts).to(dt);
  return w.detach().requires_grad_();
}

TEST(LinearSmallOut, MatchesFloat64Reference) {
  TG_SKIP_NO_GPU();
  manual_seed(11);
  auto opts = TensorOptions().device(kCUDA);
  for (DType dt : kDtypes)
    for (int64_t rows : kRows)
      for (int64_t in : kIns) {
        Tensor x = tg::randn({rows, in}, opts).to(dt);
        for (int64_t out : kOuts) {
          Tensor g = tg::randn({rows, out}, opts).to(dt);
          const Ref r = reference(x, g);
          const double tol = tol_of(dt);
          for (bool col_major : {false, true}) {
            if (col_major && rows > 4096) continue;
            for (bool bias : {true, false}) {
              SCOPED_TRACE(std::string(dtype_name(dt)) + " rows " + std::to_string(rows) + " in " + std::to_string(in) +
                           " out " + std::to_string(out) + (bias ? " bias" : " no bias") +
                           (col_major ? " column-major weight" : ""));
              Tensor w = make_weight(out, in, dt, col_major);
              Tensor b = bias ? tg::randn({out}, opts).to(dt).requires_grad_() : Tensor();
              Tensor y = tg::linear(x, w, b);
              std::vector<Tensor> wrt = {w};
              if (bias) wrt.push_back(b);
              const std::vector<Tensor> gr = tg::autograd::grad({y}, wrt, {g});
              ASSERT_EQ(gr[0].dtype(), dt);
              ASSERT_EQ(gr[0].sizes(), Shape({out, in}));
              EXPECT_TRUE(same_layout(gr[0], w)) << gr[0].strides() << " vs " << w.strides();
              EXPECT_TRUE(within(gr[0], r.gw, r.sgw, tol)) << "grad w";
              if (bias) {
                ASSERT_EQ(gr[1].dtype(), dt);
                EXPECT_TRUE(within(gr[1], r.gb, r.sgb, tol)) << "grad b";
              }
            }
          }
        }
      }
}

// Integer values (|x|, |g| <= 2) make every partial sum an integer below 2^24: float
// accumulation is exact, so float32 results equal the reference exactly whatever the order,
// which catches any row or column counted twice or missed. Half inputs get float32 gradients
// here (the autocast case) through the native call.
TEST(LinearSmallOut, ExactOnIntegerValues) {
  TG_SKIP_NO_GPU();
  const Domain ints{-2, 2, false, 1};
  uint32_t seed = 100;
  for (DType dt : kDtypes)
    for (int64_t rows : kRows)
      for (int64_t in : kIns) {
        Tensor x = make_values({rows, in}, dt, Device(kCUDA), ints, seed++);
        for (int64_t out : kOuts) {
          Tensor g = make_values({rows, out}, dt, Device(kCUDA), ints, seed++);
          const Ref r = reference(x, g);
          for (bool col_major : {false, true}) {
            SCOPED_TRACE(std::string(dtype_name(dt)) + " rows " + std::to_string(rows) + " in " + std::to_string(in) +
                         " out " + std::to_string(out) + (col_major ? " column-major weight" : ""));
            const uint64_t wide0 = native::wide_gemm_count();
            auto [gw, gb] = native::linear_grad_weight_bias(g, x, true, col_major, kFloat32, true, kFloat32);
            EXPECT_EQ(native::wide_gemm_count() - wide0, dt == kFloat32 ? 0u : 1u);
            ASSERT_EQ(gw.dtype(), kFloat32);
            ASSERT_EQ(gb.dtype(), kFloat32);
            ASSERT_EQ(gw.sizes(), Shape({out, in}));
            EXPECT_EQ(gw.strides(), col_major ? Shape({1, out}) : Shape({in, 1}));
            EXPECT_EQ(host(gw), r.gw);
            EXPECT_EQ(host(gb), r.gb);
            // Weight only; and a bias gradient in the half dtype next to a float32 weight's.
            auto [gw2, gb2] = native::linear_grad_weight_bias(g, x, true, col_major, kFloat32, false, kFloat32);
            EXPECT_FALSE(gb2.defined());
            EXPECT_EQ(host(gw2), r.gw);
            if (dt != kFloat32 && rows <= 7) {  // small sums: exact in the half dtype too
              auto [gw3, gb3] = native::linear_grad_weight_bias(g, x, true, col_major, kFloat32, true, dt);
              EXPECT_EQ(gb3.dtype(), dt);
              EXPECT_EQ(host(gb3), r.gb);
              EXPECT_EQ(host(gw3), r.gw);
            }
          }
        }
      }
}

// Under autocast, float32 weight and bias with float16 x and g: the gradients come out in
// float32 directly (no half rounding), from the one launch.
TEST(LinearSmallOut, AutocastFloat32WeightGradients) {
  TG_SKIP_NO_GPU();
  manual_seed(12);
  auto opts = TensorOptions().device(kCUDA);
  for (int64_t rows : {int64_t{7}, int64_t{4096}, int64_t{100000}})
    for (int64_t in : {int64_t{1}, int64_t{64}, int64_t{300}})
      for (int64_t out : kOuts) {
        SCOPED_TRACE("rows " + std::to_string(rows) + " in " + std::to_string(in) + " out " + std::to_string(out));
        Tensor x = tg::randn({rows, in}, opts);
        Tensor w = (tg::randn({out, in}, opts) * 0.1).requires_grad_();
        Tensor b = tg::randn({out}, opts).requires_grad_();
        Tensor y;
        {
          amp::autocast guard(kCUDA);
          y = tg::linear(x, w, b);
        }
        ASSERT_EQ(y.dtype(), kFloat16);
        Tensor g = tg::randn({rows, out}, opts).to(kFloat16);
        const uint64_t wide0 = native::wide_gemm_count(), c0 = backend::dispatch_count();
        y.backward(g);
        EXPECT_EQ(backend::dispatch_count() - c0, 1u);
        EXPECT_EQ(native::wide_gemm_count() - wide0, 1u);
        ASSERT_EQ(w.grad().dtype(), kFloat32);
        ASSERT_EQ(b.grad().dtype(), kFloat32);
        const Ref r = reference(x.to(kFloat16), g);
        EXPECT_TRUE(within(w.grad(), r.gw, r.sgw, tol_of(kFloat32))) << "grad w";
        EXPECT_TRUE(within(b.grad(), r.gb, r.sgb, tol_of(kFloat32))) << "grad b";
      }
}

// The same inputs give the same bits, with launches of other grids (and other users of the
// stream's done counters: mse_loss) in between.
TEST(LinearSmallOut, BitIdenticalRepeats) {
  TG_SKIP_NO_GPU();
  manual_seed(13);
  auto opts = TensorOptions().device(kCUDA);
  struct Shape3 {
    int64_t rows, in, out;
  };
  for (DType dt : kDtypes)
    for (Shape3 s : {Shape3{4096, 64, 1}, Shape3{100000, 300, 8}, Shape3{100000, 1, 3}, Shape3{7, 300, 8}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " rows " + std::to_string(s.rows) + " in " + std::to_string(s.in) +
                   " out " + std::to_string(s.out));
      Tensor x = tg::randn({s.rows, s.in}, opts).to(dt), g = tg::randn({s.rows, s.out}, opts).to(dt);
      Tensor w = tg::randn({s.out, s.in}, opts).to(dt).requires_grad_(),
             b = tg::randn({s.out}, opts).to(dt).requires_grad_();
      std::vector<double> first_w, first_b;
      for (int rep = 0; rep < 4; ++rep) {
        const std::vector<Tensor> gr = tg::autograd::grad({tg::linear(x, w, b)}, {w, b}, {g});
        if (rep == 0) {
          first_w = host(gr[0]);
          first_b = host(gr[1]);
        } else {
          ASSERT_EQ(host(gr[0]), first_w) << "rep " << rep;
          ASSERT_EQ(host(gr[1]), first_b) << "rep " << rep;
        }
        Tensor big = tg::randn({300000, 8}, opts), big_g = tg::randn({300000, 2}, opts);
        (void)native::linear_grad_weight_bias(big_g, big, true, false, kFloat32, true, kFloat32);
        (void)tg::nn::functional::mse_loss(big, tg::zeros_like(big));
      }
    }
}

// Weight and bias gradients are one backend dispatch (x needs no gradient); without the bias,
// one too. With the path switched off: the gemm path, same values within rounding.
TEST(LinearSmallOut, OneDispatchForWeightAndBias) {
  TG_SKIP_NO_GPU();
  auto opts = TensorOptions().device(kCUDA);
  for (DType dt : kDtypes)
    for (bool bias : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (bias ? " bias" : " no bias"));
      Tensor x = tg::randn({4096, 64}, opts).to(dt), g = tg::randn({4096, 1}, opts).to(dt);
      Tensor w = tg::randn({1, 64}, opts).to(dt).requires_grad_();
      Tensor b = bias ? tg::randn({1}, opts).to(dt).requires_grad_() : Tensor();
      Tensor y = tg::linear(x, w, b);
      uint64_t c0 = backend::dispatch_count();
      y.backward(g, {.retain_graph = true});
      EXPECT_EQ(backend::dispatch_count() - c0, 1u);
      const std::vector<double> fast_w = host(w.grad());
      const std::vector<double> fast_b = bias ? host(b.grad()) : std::vector<double>();
      w.mutable_grad() = Tensor();
      if (bias) b.mutable_grad() = Tensor();
      const bool was = native::linear_small_out_grad();
      native::set_linear_small_out_grad(false);
      c0 = backend::dispatch_count();
      y.backward(g);
      const uint64_t gemm_path = backend::dispatch_count() - c0;
      native::set_linear_small_out_grad(was);
      std::printf("[ info ] %s%s: weight+bias gradient dispatches %llu (gemm path) -> 1\n", dtype_name(dt),
                  bias ? " with bias" : "", static_cast<unsigned long long>(gemm_path));
      EXPECT_GE(gemm_path, 1u);
      const Ref r = reference(x, g);
      const double tol = dt == kFloat32 ? tol_of(kFloat32) : dt == kFloat16 ? 2e-3 : 1.6e-2;  // both paths' bound
      EXPECT_TRUE(within(w.grad(), r.gw, r.sgw, tol));
      std::vector<double> sgw = r.sgw;
      for (double& s : sgw) s *= 2;  // the two results differ by at most both errors
      EXPECT_TRUE(within(w.grad(), fast_w, sgw, tol)) << "gemm path vs one launch";
      if (bias) {
        EXPECT_TRUE(within(b.grad(), r.gb, r.sgb, tol));
        EXPECT_TRUE(within(b.grad(), fast_b, r.sgb, 2 * tol)) << "gemm path vs one launch";
      }
    }
}

// A training-like step captured into a CUDA graph: replays give the eager bits, for a single
// block (no counter), row chunks (the capture's own done counter) and several column tiles;
// eager calls on the capture stream still give them afterwards (counters left at 0).
TEST(LinearSmallOut, GraphReplayMatchesEager) {
  TG_SKIP_NO_GPU();
  manual_seed(14);
  tg::cuda::Stream side;
  tg::cuda::StreamGuard guard(side);
  auto opts = TensorOptions().device(kCUDA);
  struct Shape3 {
    int64_t rows, in, out;
  };
  for (DType dt : {kFloat32, kBFloat16})
    for (Shape3 s : {Shape3{7, 64, 1}, Shape3{4096, 64, 1}, Shape3{100000, 300, 8}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " rows " + std::to_string(s.rows) + " in " + std::to_string(s.in) +
                   " out " + std::to_string(s.out));
      Tensor x = tg::randn({s.rows, s.in}, opts).to(dt), g = tg::randn({s.rows, s.out}, opts).to(dt);
      Tensor w = tg::randn({s.out, s.in}, opts).to(dt).requires_grad_(),
             b = tg::randn({s.out}, opts).to(dt).requires_grad_();
      auto step = [&] {
        w.mutable_grad() = Tensor();
        b.mutable_grad() = Tensor();
        tg::linear(x, w, b).backward(g);
      };
      step();
      const std::vector<double> eager_w = host(w.grad()), eager_b = host(b.grad());
      const Ref r = reference(x, g);
      EXPECT_TRUE(within(w.grad(), r.gw, r.sgw, tol_of(dt)));
      tg::cuda::Graph graph;
      graph.capture(step);
      for (int rep = 0; rep < 3; ++rep) {
        graph.replay();
        ASSERT_EQ(host(w.grad()), eager_w) << "rep " << rep;
        ASSERT_EQ(host(b.grad()), eager_b) << "rep " << rep;
      }
      step();
      EXPECT_EQ(host(w.grad()), eager_w) << "eager after replays";
      EXPECT_EQ(host(b.grad()), eager_b) << "eager after replays";
    }
}

// Outside the path (out > 8, x's inner stride not 1, float64, x not folding to rows without a
// copy) the gemm path runs, with the same values.
TEST(LinearSmallOut, OtherCasesKeepTheGemmPath) {
  TG_SKIP_NO_GPU();
  manual_seed(15);
  auto opts = TensorOptions().device(kCUDA);
  struct Case {
    const char* name;
    Tensor x;
    int64_t out;
  };
  const std::vector<Case> cases = {
      {"out 9", tg::randn({4096, 64}, opts), 9},
      {"x inner stride 2", tg::randn({4096, 128}, opts).slice(1, 0, 128, 2), 4},
      {"float64", tg::randn({4096, 64}, opts.dtype(kFloat64)), 4},
      {"x 3-d, unfoldable", tg::randn({16, 256, 64}, opts).transpose(0, 1), 4},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const int64_t in = c.x.size(c.x.dim() - 1);
    Tensor w = tg::randn({c.out, in}, TensorOptions().dtype(c.x.dtype()).device(kCUDA)).requires_grad_();
    Tensor b = tg::randn({c.out}, TensorOptions().dtype(c.x.dtype()).device(kCUDA)).requires_grad_();
    Tensor y = tg::linear(c.x, w, b);
    Tensor g = tg::randn(y.sizes(), TensorOptions().dtype(c.x.dtype()).device(kCUDA));
    y.backward(g);
    const int64_t rows = c.x.numel() / in;
    const Ref r = reference(c.x.reshape({rows, in}), g.reshape({rows, c.out}));
    const double tol = c.x.dtype() == kFloat64 ? 1e-12 : tol_of(kFloat32);
    EXPECT_TRUE(within(w.grad(), r.gw, r.sgw, tol));
    EXPECT_TRUE(within(b.grad(), r.gb, r.sgb, tol));
  }
}

}  // namespace
}  // namespace tg::testing
