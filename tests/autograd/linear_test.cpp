// tg::linear (x W^T + b as one gemm with a fused bias) and its backward, on the CPU
// and on CUDA when present: values and gradients against a float64 host reference
// over contiguous, non-contiguous, transposed-weight, bias-less, 1-D and 3-D cases,
// in float64 / float32 / float16 / bfloat16; gradcheck; the TF32 flag; cuBLAS autotuning;
// launch counts; and errors. Mixed precision (autocast, float32 gradients) is in linear_amp_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <tapegrad/core/cuda.h>
#include <tapegrad/core/cuda_graph.h>
#include <tapegrad/core/native.h>
#include "core/reference.h"
#include "tests/autograd/common.h"

namespace tg::testing {
namespace {

// ---- float64 reference, from the values the tensors hold (already rounded to their dtype)
struct LinRef {
  RefTensor y, gx, gw, gb;
  // sum of |terms| per element: the scale a rounding tolerance is relative to
  RefTensor sy, sgx, sgw, sgb;
};

// x (..., in), w [out, in], b [out] or undefined, g (..., out).
LinRef ref_linear(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& g) {
  RefTensor X = RefTensor::from(x), W = RefTensor::from(w), G = RefTensor::from(g);
  const int64_t out = w.size(0), in = w.size(1), rows = X.numel() / std::max<int64_t>(in, 1);
  std::vector<double> B(static_cast<size_t>(out), 0.0);
  if (b.defined()) B = RefTensor::from(b).v;
  Dims ys(x.sizes().begin(), x.sizes().end());
  ys.back() = out;
  LinRef r{RefTensor(ys), RefTensor(X.shape), RefTensor({out, in}), RefTensor({out}),
           RefTensor(ys), RefTensor(X.shape), RefTensor({out, in}), RefTensor({out})};
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double acc = B[o], s = std::abs(B[o]);
      const double gv = G.v[i * out + o];
      for (int64_t k = 0; k < in; ++k) {
        const double xv = X.v[i * in + k], wv = W.v[o * in + k];
        acc += xv * wv;
        s += std::abs(xv * wv);
        r.gx.v[i * in + k] += gv * wv;
        r.sgx.v[i * in + k] += std::abs(gv * wv);
        r.gw.v[o * in + k] += gv * xv;
        r.sgw.v[o * in + k] += std::abs(gv * xv);
      }
      r.y.v[i * out + o] = acc;
      r.sy.v[i * out + o] = s;
      r.gb.v[o] += gv;
      r.sgb.v[o] += std::abs(gv);
    }
  return r;
}

// |got - want| <= rel * scale + 1e-30 elementwise, with the first failure reported.
::testing::AssertionResult within(const Tensor& got, const RefTensor& want, const RefTensor& scale, double rel) {
  Dims gs(got.sizes().begin(), got.sizes().end());
  if (gs != want.shape)
    return ::testing::AssertionFailure() << "shape " << dims_str(gs) << " vs " << dims_str(want.shape);
  RefTensor G = RefTensor::from(got);
  for (int64_t i = 0; i < G.numel(); ++i) {
    const double err = std::abs(G.v[i] - want.v[i]), tol = rel * scale.v[i] + 1e-30;
    if (!(err <= tol))
      return ::testing::AssertionFailure() << "element " << i << ": got " << G.v[i] << ", want " << want.v[i]
                                           << " (err " << err << ", tol " << tol << ", " << got.dtype() << ")";
  }
  return ::testing::AssertionSuccess();
}

// Error allowed relative to the sum of |terms| of each output. The reference sees the
// rounded inputs; the gemm accumulates in float (double for float64), so what is left is
// the output's rounding: once when the bias is fused, twice on the matmul + add fallback.
double rel_tol(DType t) {
  switch (t) {
    case kFloat64:
      return 1e-12;
    case kFloat32:
      return 1e-5;  // float accumulation over <= 64 terms, TF32 off
    case kFloat16:
      return 2e-3;  // 2 roundings of 2^-11
    case kBFloat16:
      return 1.6e-2;  // 2 roundings of 2^-8
    default:
      return 0;
  }
}

// ---- the cases: how x, w, b are laid out
struct Case {
  const char* name;
  Dims x_shape;  // logical
  enum XLayout { kContig, kTransposed2d, kStep2, kPermuted3d } x_layout;
  bool w_transposed;  // w is a column-major view (the transpose of a contiguous [in, out])
  bool bias;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"contiguous", {7, 5}, Case::kContig, false, true},
      {"no_bias", {7, 5}, Case::kContig, false, false},
      {"x_transposed", {7, 5}, Case::kTransposed2d, false, true},
      {"x_step2", {7, 5}, Case::kStep2, false, true},
      {"w_transposed", {7, 5}, Case::kContig, true, true},
      {"w_transposed_no_bias", {6, 4}, Case::kTransposed2d, true, false},
      {"x_1d", {5}, Case::kContig, false, true},
      {"x_3d", {2, 3, 5}, Case::kContig, false, true},
      {"x_3d_unfoldable", {2, 3, 5}, Case::kPermuted3d, true, true},
      {"one_output", {9, 4}, Case::kContig, false, true},  // Linear(64, 1)-like: out = 1
  };
  return c;
}
constexpr int64_t kOut = 3;

// The leaves (contiguous bases) and the views the op sees.
struct Inputs {
  Tensor xb, wb, bb;  // leaves
  Tensor x, w, b;     // views of them
};

Tensor view_x(const Tensor& xb, const Case& c) {
  const int64_t nd = static_cast<int64_t>(c.x_shape.size());
  switch (c.x_layout) {
    case Case::kContig:
      return xb;
    case Case::kTransposed2d:
      return xb.t();
    case Case::kStep2:
      return xb.slice(nd - 1, 0, c.x_shape.back() * 2, 2);
    case Case::kPermuted3d:
      return xb.transpose(0, 1);
  }
  return xb;
}
Dims base_x_shape(const Case& c) {
  Dims s = c.x_shape;
  const size_t nd = s.size();
  switch (c.x_layout) {
    case Case::kContig:
      break;
    case Case::kTransposed2d:
      std::swap(s[0], s[1]);
      break;
    case Case::kStep2:
      s[nd - 1] *= 2;
      break;
    case Case::kPermuted3d:
      std::swap(s[0], s[1]);
      break;
  }
  return s;
}
Tensor view_w(const Tensor& wb, const Case& c) { return c.w_transposed ? wb.t() : wb; }

Inputs make_inputs(const Case& c, DType dt, Device dev, int64_t out = kOut) {
  const int64_t in = c.x_shape.back();
  const int64_t o = std::string(c.name) == "one_output" ? 1 : out;
  Inputs r;
  r.xb = make_values(base_x_shape(c), dt, dev, {-1, 1}, 1).requires_grad_();
  r.wb = make_values(c.w_transposed ? Dims{in, o} : Dims{o, in}, dt, dev, {-1, 1}, 2).requires_grad_();
  if (c.bias) r.bb = make_values({o}, dt, dev, {-1, 1}, 3).requires_grad_();
  r.x = view_x(r.xb, c);
  r.w = view_w(r.wb, c);
  r.b = r.bb;
  return r;
}

class LinearOp : public ::testing::TestWithParam<Dev> {
 protected:
  Device dev() const { return to_device(GetParam()); }
};

void check_case(const Case& c, DType dt, Device dev) {
  SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt) + " " + dev.str());
  Inputs in = make_inputs(c, dt, dev);
  Tensor y = tg::linear(in.x, in.w, in.b);
  Dims ys = c.x_shape;
  ys.back() = in.w.size(0);
  ASSERT_EQ(Dims(y.sizes().begin(), y.sizes().end()), ys);
  ASSERT_EQ(y.dtype(), dt);
  Tensor g = make_values(ys, dt, dev, {-1, 1}, 4);
  std::vector<Tensor> wrt = {in.x, in.w};
  if (c.bias) wrt.push_back(in.b);
  std::vector<Tensor> grads = tg::autograd::grad({y}, wrt, {g});
  LinRef r = ref_linear(in.x, in.w, in.b, g);
  const double tol = rel_tol(dt);
  EXPECT_TRUE(within(y, r.y, r.sy, tol)) << "y";
  EXPECT_TRUE(within(grads[0], r.gx, r.sgx, tol)) << "grad x";
  EXPECT_TRUE(within(grads[1], r.gw, r.sgw, tol)) << "grad w";
  if (c.bias) EXPECT_TRUE(within(grads[2], r.gb, r.sgb, tol)) << "grad b";
  for (const Tensor& t : grads) EXPECT_EQ(t.dtype(), dt);
}

TEST_P(LinearOp, MatchesFloat64ReferenceInEveryDtypeAndLayout) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16})
    for (const Case& c : cases()) check_case(c, dt, dev());
}

// With the bias gradient fused into the weight gemm (where the backend can) and without.
TEST_P(LinearOp, BiasGradientFusedOrNotGivesTheSameValues) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const bool was = native::fuse_bias_grad();
  for (bool fuse : {false, true}) {
    native::set_fuse_bias_grad(fuse);
    for (DType dt : {kFloat32, kFloat16, kBFloat16})
      for (const Case& c : cases())
        if (c.bias) check_case(c, dt, dev());
  }
  native::set_fuse_bias_grad(was);
}

TEST_P(LinearOp, Gradcheck) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    Inputs in = make_inputs(c, kFloat64, dev());
    std::vector<Tensor> leaves = {in.xb.detach(), in.wb.detach()};
    if (c.bias) leaves.push_back(in.bb.detach());
    auto fn = [&c](const std::vector<Tensor>& v) {
      return tg::linear(view_x(v[0], c), view_w(v[1], c), v.size() > 2 ? v[2] : Tensor());
    };
    auto rep = tg::autograd::gradcheck(fn, leaves);
    EXPECT_TRUE(rep.ok) << rep;
  }
}

// A column-major weight (the transpose of a contiguous [in, out] leaf) gets its gradient in
// its own layout: the leaf's .grad() is dense with no transposing copy.
TEST_P(LinearOp, TransposedWeightGradientKeepsItsLayout) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  auto opts = TensorOptions().device(dev());
  Tensor wt = tg::randn({5, 3}, opts).requires_grad_();  // [in, out]
  Tensor x = tg::randn({4, 5}, opts);
  tg::linear(x, wt.t(), Tensor()).sum().backward();
  ASSERT_TRUE(wt.grad().defined());
  EXPECT_TRUE(wt.grad().is_contiguous());
  EXPECT_EQ(wt.grad().sizes(), wt.sizes());
}

// Only what is needed is computed: no x gradient for data, no bias gradient for a frozen bias.
TEST_P(LinearOp, OnlyNeededGradients) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  auto opts = TensorOptions().device(dev());
  Tensor x = tg::randn({6, 4}, opts), w = tg::randn({3, 4}, opts).requires_grad_(), b = tg::randn({3}, opts);
  tg::linear(x, w, b).sum().backward();
  EXPECT_TRUE(w.grad().defined());
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  Tensor b2 = tg::randn({3}, opts).requires_grad_(), w2 = tg::randn({3, 4}, opts);
  Tensor g = tg::randn({6, 3}, opts);
  tg::linear(x, w2, b2).backward(g);
  ASSERT_TRUE(b2.grad().defined());
  tg::testing::expect_close(b2.grad(), ref_linear(x, w2, b2, g).gb, 1e-5, 1e-5);
}

// Launches: the forward is one backend dispatch on CUDA (gemm with the bias fused), gemm + add
// on the CPU. The backward of weight and bias is one dispatch when the bias gradient is fused
// (CUDA, where cuBLASLt has the epilogue), else gemm + reduction.
TEST_P(LinearOp, Dispatches) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const bool cuda = dev().is_cuda();
  for (DType dt : {kFloat32, kFloat16, kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    auto opts = TensorOptions().dtype(dt).device(dev());
    Tensor x = tg::randn({64, 32}, opts), w = tg::randn({16, 32}, opts).requires_grad_();
    Tensor b = tg::randn({16}, opts).requires_grad_(), g = tg::randn({64, 16}, opts);
    uint64_t c0 = backend::dispatch_count();
    Tensor y = tg::linear(x, w, b);
    EXPECT_EQ(backend::dispatch_count() - c0, cuda ? 1u : 2u);
    c0 = backend::dispatch_count();
    y.backward(g);
    const uint64_t bwd = backend::dispatch_count() - c0;
    if (cuda) {
      EXPECT_LE(bwd, 2u);
      std::printf("[ info ] linear backward (weight + bias) on CUDA in %s: %llu dispatch(es)%s\n", dtype_name(dt),
                  static_cast<unsigned long long>(bwd), bwd == 1 ? " (bias gradient fused)" : "");
    } else {
      EXPECT_EQ(bwd, 2u);
    }
  }
}

// A gradient over 2^20 elements takes the bias gradient as its own reduction even where the
// epilogue exists (faster there: native::linear_grad_weight_bias), with the same values.
TEST_P(LinearOp, LargeGradientBiasIsAReduction) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  auto opts = TensorOptions().dtype(kBFloat16).device(dev());
  tg::manual_seed(4);
  Tensor x = tg::randn({4096, 64}, opts), w = tg::randn({320, 64}, opts).requires_grad_();
  Tensor b = tg::randn({320}, opts).requires_grad_(), g = tg::randn({4096, 320}, opts);  // 1.3M elements
  Tensor y = tg::linear(x, w, b);
  const uint64_t c0 = backend::dispatch_count();
  y.backward(g);
  EXPECT_EQ(backend::dispatch_count() - c0, 2u) << "weight gemm + bias reduction";
  std::vector<double> gb(320, 0.0);
  const auto gh = host(g);
  for (size_t i = 0; i < gh.size(); ++i) gb[i % 320] += gh[i];
  expect_near_vec(host(b.grad()), gb, 0.5, 1e-2, "bias gradient of 4096 rows (bf16)");
}

// float32 on CUDA honours tg::set_allow_tf32: off, float accuracy; on, TF32's 10-bit inputs
// show (and stay within TF32's bound).
TEST_P(LinearOp, Tf32Flag) {
  if (GetParam() == Dev::CPU) GTEST_SKIP() << "TF32 is a CUDA setting";
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const bool was = tg::allow_tf32();
  auto opts = TensorOptions().device(dev());
  Tensor x = tg::randn({256, 512}, opts), w = tg::randn({128, 512}, opts), b = tg::randn({128}, opts);
  Tensor g = tg::zeros({256, 128}, opts);
  LinRef r = ref_linear(x, w, b, g);
  auto max_rel = [&](const Tensor& y) {
    RefTensor Y = RefTensor::from(y);
    double m = 0;
    for (int64_t i = 0; i < Y.numel(); ++i) m = std::max(m, std::abs(Y.v[i] - r.y.v[i]) / r.sy.v[i]);
    return m;
  };
  tg::set_allow_tf32(false);
  const double off = max_rel(tg::linear(x, w, b));
  tg::set_allow_tf32(true);
  const double on = max_rel(tg::linear(x, w, b));
  tg::set_allow_tf32(was);
  EXPECT_LT(off, 1e-6);
  EXPECT_GT(on, 1e-6);  // TF32 was used
  EXPECT_LT(on, 2e-3);  // 2 input roundings of 2^-11
}

// tg::backends::cublas::set_benchmark: each new problem's first call times the algorithms
// cuBLASLt offers and keeps the fastest. Every dtype and layout still matches the float64
// reference, on the tuning call and on the calls that reuse the choice; float32 (which then
// takes cuBLASLt too) keeps float accuracy (no TF32 unless asked).
TEST_P(LinearOp, CublasBenchmarkKeepsValues) {
  if (GetParam() == Dev::CPU) GTEST_SKIP() << "cuBLAS autotuning is a CUDA setting";
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const bool was = tg::backends::cublas::benchmark();
  tg::backends::cublas::set_benchmark(true);
  for (int round = 0; round < 2; ++round)
    for (DType dt : {kFloat32, kFloat16, kBFloat16})
      for (const Case& c : cases()) check_case(c, dt, dev());
  tg::backends::cublas::set_benchmark(was);
}

// A problem first met while a CUDA graph is being captured is not timed there (nothing may
// wait for the device): the capture uses the heuristic's choice, and the replay is right.
TEST_P(LinearOp, CublasBenchmarkInsideCaptureUsesTheHeuristic) {
  if (GetParam() == Dev::CPU) GTEST_SKIP() << "CUDA graphs";
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const bool was = tg::backends::cublas::benchmark();
  tg::backends::cublas::set_benchmark(true);
  auto opts = TensorOptions().dtype(kBFloat16).device(dev());
  tg::manual_seed(11);
  // A shape no other test uses, so its plan is new inside the capture.
  Tensor x = tg::randn({72, 136}, opts), w = tg::randn({40, 136}, opts), b = tg::randn({40}, opts);
  Tensor y;
  tg::cuda::Stream side;
  {
    tg::cuda::StreamGuard guard(side);
    tg::cuda::Graph graph;
    graph.capture([&] { y = tg::linear(x, w, b); });
    graph.replay();
    side.synchronize();
  }
  tg::backends::cublas::set_benchmark(was);
  LinRef r = ref_linear(x, w, b, tg::zeros({72, 40}, opts));
  EXPECT_TRUE(within(y, r.y, r.sy, rel_tol(kBFloat16))) << "y";
}

TEST_P(LinearOp, EmptyShapes) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  auto opts = TensorOptions().device(dev());
  // No rows: empty output; the weight gradient is zeros, the bias gradient zeros.
  Tensor x = tg::randn({0, 4}, opts), w = tg::randn({3, 4}, opts).requires_grad_();
  Tensor b = tg::randn({3}, opts).requires_grad_();
  Tensor y = tg::linear(x, w, b);
  EXPECT_EQ(y.sizes(), Shape({0, 3}));
  y.sum().backward();
  tg::testing::expect_close(w.grad(), RefTensor({3, 4}, 0.0), 0, 0);
  tg::testing::expect_close(b.grad(), RefTensor({3}, 0.0), 0, 0);
  // in_features = 0: the output is the bias.
  Tensor x0 = tg::randn({2, 0}, opts), w0 = tg::randn({3, 0}, opts);
  RefTensor want({2, 3});
  RefTensor bv = RefTensor::from(b.detach());
  for (int i = 0; i < 2; ++i)
    for (int o = 0; o < 3; ++o) want.v[i * 3 + o] = bv.v[o];
  tg::testing::expect_close(tg::linear(x0, w0, b.detach()), want, 0, 0);
}

TEST_P(LinearOp, ErrorsNameLinearAndTheShapes) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  auto opts = TensorOptions().device(dev());
  Tensor x = tg::randn({4, 5}, opts), w = tg::randn({3, 5}, opts), b = tg::randn({3}, opts);
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const tg::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string m = message([&] { tg::linear(tg::randn({4, 6}, opts), w, b); });
  EXPECT_NE(m.find("linear"), std::string::npos) << m;
  EXPECT_NE(m.find("[4, 6]"), std::string::npos) << m;
  EXPECT_NE(m.find("[3, 5]"), std::string::npos) << m;
  m = message([&] { tg::linear(x, tg::randn({15}, opts), b); });
  EXPECT_NE(m.find("linear"), std::string::npos) << m;
  EXPECT_NE(m.find("[15]"), std::string::npos) << m;
  m = message([&] { tg::linear(x, w, tg::randn({4}, opts)); });
  EXPECT_NE(m.find("linear"), std::string::npos) << m;
  EXPECT_NE(m.find("[4]"), std::string::npos) << m;
  m = message([&] { tg::linear(x, w.to(kFloat64), b); });
  EXPECT_NE(m.find("linear"), std::string::npos) << m;
  EXPECT_NE(m.find("float64"), std::string::npos) << m;
  m = message([&] { tg::linear(tg::randn({}, opts), w, b); });
  EXPECT_NE(m.find("linear"), std::string::npos) << m;
  if (dev().is_cuda()) {
    m = message([&] { tg::linear(x.cpu(), w, b); });
    EXPECT_NE(m.find("linear"), std::string::npos) << m;
    EXPECT_NE(m.find("cpu"), std::string::npos) << m;
  }
}

// Under a tracer (export), linear records matmul + add as before, so the exported graph and
// its ONNX lowering are unchanged.
// The trace records the public op (linear, with or without a bias), however it ran (one fused
// kernel); the exported program replays it.
TEST(LinearExport, TracesAsLinear) {
  tg::manual_seed(3);
  for (bool bias : {true, false}) {
    tg::nn::Linear l(4, 2, bias);
    auto ep = tg::export_module(l, {tg::randn({3, 4})});
    const std::string g = ep.graph();
    EXPECT_NE(g.find(bias ? "linear(%x, %p_weight, %p_bias)" : "linear(%x, %p_weight)"), std::string::npos) << g;
    EXPECT_EQ(g.find("matmul("), std::string::npos) << g;
    Tensor x = tg::randn({3, 4});
    tg::testing::expect_close(ep.run({x})[0], RefTensor::from(l(x)), 1e-6, 1e-6);
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, LinearOp, ::testing::Values(Dev::CPU, Dev::CUDA), dev_name);

}  // namespace
}  // namespace tg::testing
