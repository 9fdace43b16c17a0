// A linear's float16 / bfloat16 gemm waits in the CUDA launch queue until the next op; a GELU
// (tanh) of its whole result becomes the gemm's epilogue (cuBLASLt GELU_AUX(_BIAS), blas.cpp's
// fuse_into_deferred_gemm). Likewise a float32 linear on the small-gemm kernel and a ReLU.
// Checked: the fusion happens (counted) where it should and nowhere else; the linear's result
// (the gemm's aux output) and the activation against float64 from the same rounded operands;
// gradients against the unfused pass; an op in between and a GELU of another tensor leave the gemm
// alone; under graph capture the pair fuses too and replays correctly; GPT-2's MLP under autocast
// fuses; the MNIST MLP's training step fuses its two ReLUs and matches the unfused step. CUDA only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include <tapegrad/tapegrad.h>

#include <tapegrad/autograd/function.h>
#include <tapegrad/core/cuda_graph.h>
#include "tests/autograd/common.h"

#ifdef TG_WITH_CUDA
#include <tapegrad/core/backend/cuda/blas.h>

namespace tg::testing {
namespace {

#define TG_SKIP_WITHOUT_GPU() \
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

// Restores the fusion at the end of a test that turned it off.
struct FusionOn {
  ~FusionOn() { cuda::detail::set_gemm_activation_fusion(true); }
};

double gelu_tanh(double v) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * v * (1.0 + std::tanh(k * (v + 0.044715 * v * v * v)));
}

struct Problem {
  Tensor x, w, b;  // leaves of dtype dt on the GPU
};

// x [rows, in], w [out, in], b [out]: values with |x @ w^T + b| mostly below 3.
Problem make_problem(DType dt, int64_t rows, int64_t in, int64_t out, bool grad) {
  tg::manual_seed(21);
  auto leaf = [&](Shape s, double scale) {
    Tensor t = (tg::randn(s, kFloat64) * scale).to(Device(kCUDA), dt).detach();
    return grad ? t.requires_grad_(true) : t;
  };
  return {leaf({rows, in}, 1.0), leaf({out, in}, 1.0 / std::sqrt(static_cast<double>(in))), leaf({out}, 0.5)};
}

// h = x w^T + b in float64 from the rounded operands.
std::vector<double> reference_linear(const Problem& p) {
  const std::vector<double> x = host(p.x), w = host(p.w), b = host(p.b);
  const int64_t rows = p.x.size(0), in = p.x.size(1), out = p.w.size(0);
  std::vector<double> h(static_cast<size_t>(rows * out));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double s = b[o];
      for (int64_t j = 0; j < in; ++j) s += x[i * in + j] * w[o * in + j];
      h[i * out + o] = s;
    }
  return h;
}

// Both within eps (the dtype's relative rounding, with room for cuBLASLt's GELU approximation and
// for the fused GELU reading the unrounded h) of float64.
void expect_linear_gelu(const Tensor& h, const Tensor& y, const Problem& p, double eps, const std::string& what) {
  const std::vector<double> ref = reference_linear(p), gh = host(h), gy = host(y);
  ASSERT_EQ(gh.size(), ref.size());
  int bad_h = 0, bad_y = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double yr = gelu_tanh(ref[i]);
    if (std::abs(gh[i] - ref[i]) > eps * std::abs(ref[i]) + 1e-3 && bad_h++ < 5)
      ADD_FAILURE() << what << ": h[" << i << "] = " << gh[i] << ", float64 " << ref[i];
    if (std::abs(gy[i] - yr) > 2 * eps * (std::abs(yr) + std::abs(ref[i])) + 1e-3 && bad_y++ < 5)
      ADD_FAILURE() << what << ": gelu[" << i << "] = " << gy[i] << ", float64 " << yr;
  }
}

double eps_of(DType dt) { return dt == kBFloat16 ? 1.0 / 128 : 1.0 / 1024; }

TEST(GemmGelu, FusesAndMatchesFloat64) {
  TG_SKIP_WITHOUT_GPU();
  for (DType dt : {kBFloat16, kFloat16}) {
    for (bool bias : {true, false}) {
      Problem p = make_problem(dt, 256, 192, 1024, false);
      if (!bias) p.b = tg::zeros({1024}, TensorOptions().dtype(dt).device(Device(kCUDA)));
      const int64_t before = cuda::detail::gemm_activation_fusions();
      Tensor h = bias ? tg::linear(p.x, p.w, p.b) : tg::linear(p.x, p.w);
      Tensor y = tg::gelu(h, "tanh");
      EXPECT_EQ(cuda::detail::gemm_activation_fusions() - before, 1) << dtype_name(dt) << " bias " << bias;
      EXPECT_EQ(y.dtype(), dt);
      EXPECT_EQ(y.sizes(), h.sizes());
      expect_linear_gelu(h, y, p, eps_of(dt), std::string(dtype_name(dt)) + (bias ? " with bias" : " no bias"));
    }
  }
}

// [B, T, C] inputs (the linear's result a view of its 2-D gemm output) fuse too.
TEST(GemmGelu, ThreeDimensionalInput) {
  TG_SKIP_WITHOUT_GPU();
  Problem p = make_problem(kBFloat16, 256, 64, 512, false);
  Tensor x3 = p.x.reshape({4, 64, 64});
  const int64_t before = cuda::detail::gemm_activation_fusions();
  Tensor y = tg::gelu(tg::linear(x3, p.w, p.b), "tanh");
  EXPECT_EQ(cuda::detail::gemm_activation_fusions() - before, 1);
  EXPECT_EQ(y.sizes(), (Shape{4, 64, 512}));
  expect_linear_gelu(tg::linear(p.x, p.w, p.b), y.reshape({256, 512}), p, eps_of(kBFloat16), "3-d");
}

TEST(GemmGelu, GradientsMatchTheUnfusedPass) {
  TG_SKIP_WITHOUT_GPU();
  FusionOn restore;
  Problem p = make_problem(kBFloat16, 256, 128, 512, true);
  Tensor g = (tg::randn({256, 512}, kFloat64)).to(Device(kCUDA), kBFloat16);
  auto run = [&](bool fuse) {
    cuda::detail::set_gemm_activation_fusion(fuse);
    for (Tensor* t : {&p.x, &p.w, &p.b}) t->mutable_grad() = Tensor();
    const int64_t before = cuda::detail::gemm_activation_fusions();
    Tensor y = tg::gelu(tg::linear(p.x, p.w, p.b), "tanh");
    EXPECT_EQ(cuda::detail::gemm_activation_fusions() - before, fuse ? 1 : 0);
    y.backward(g);
    return std::vector<std::vector<double>>{host(p.x.grad()), host(p.w.grad()), host(p.b.grad())};
  };
  const auto fused = run(true), plain = run(false);
  const char* names[] = {"grad x", "grad w", "grad b"};
  for (size_t i = 0; i < fused.size(); ++i) {
    double d = 0, m = 0;
    for (size_t j = 0; j < fused[i].size(); ++j) {
      d = std::max(d, std::abs(fused[i][j] - plain[i][j]));
      m = std::max(m, std::abs(plain[i][j]));
    }
    // The two passes differ only by GELU's forward rounding (a bf16 ulp here and there).
    EXPECT_LE(d, 2e-2 * m) << names[i] << ": fused and unfused differ by " << d << " (largest " << m << ")";
    EXPECT_GT(m, 0) << names[i];
  }
}

// Anything touching the GPU between the linear and the GELU sends the gemm on as it was.
TEST(GemmGelu, AnOpInBetweenLeavesTheGemmAlone) {
  TG_SKIP_WITHOUT_GPU();
  Problem p = make_problem(kBFloat16, 256, 64, 512, false);
  const int64_t before = cuda::detail::gemm_activation_fusions();
  Tensor h = tg::linear(p.x, p.w, p.b);
  Tensor s = h.sum();
  Tensor y = tg::gelu(h, "tanh");
  EXPECT_EQ(cuda::detail::gemm_activation_fusions() - before, 0);
  expect_linear_gelu(h, y, p, eps_of(kBFloat16), "op in between");
  const std::vector<double> ref = reference_linear(p);
  double sum = 0;
  for (double v : ref) sum += v;
  EXPECT_NEAR(host(s)[0], sum, 0.02 * std::abs(sum) + 2.0);
}

// A GELU of another tensor, and a GELU of a slice of the result, do not amend the gemm; the
// linear's result is still written.
TEST(GemmGelu, GeluOfAnotherTensorLeavesTheGemmAlone) {
  TG_SKIP_WITHOUT_GPU();
  Problem p = make_problem(kBFloat16, 256, 64, 512, false);
  Tensor other = tg::randn({256, 512}, TensorOptions().device(Device(kCUDA))).to(kBFloat16);
  const int64_t before = cuda::detail::gemm_activation_fusions();
  Tensor h = tg::linear(p.x, p.w, p.b);
  Tensor z = tg::gelu(other, "tanh");
  Tensor h2 = tg::linear(p.x, p.w, p.b);
  Tensor zs = tg::gelu(h2.slice(0, 0, 128), "tanh");
  EXPECT_EQ(cuda::detail::gemm_activation_fusions() - before, 0);
  const std::vector<double> ref = reference_linear(p), gh = host(h), gh2 = host(h2), go = host(other), gz = host(z);
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_NEAR(gh[i], ref[i], eps_of(kBFloat16) * std::abs(ref[i]) + 1e-3) << i;
    ASSERT_NEAR(gh2[i], ref[i], eps_of(kBFloat16) * std::abs(ref[i]) + 1e-3) << i;
    ASSERT_NEAR(gz[i], gelu_tanh(go[i]), 2 * eps_of(kBFloat16) * (std::abs(go[i]) + 1)) << i;
  }
  EXPECT_EQ(zs.sizes(), (Shape{128, 512}));
}

// A GELU of the GELU: the second is an ordinary kernel.
TEST(GemmGelu, OnlyOneActivationJoins) {
  TG_SKIP_WITHOUT_GPU();
  Problem p = make_problem(kBFloat16, 256, 64, 512, false);
  const int64_t before = cuda::detail::gemm_activation_fusions();
  Tensor y = tg::gelu(tg::gelu(tg::linear(p.x, p.w, p.b), "tanh"), "tanh");
  EXPECT_EQ(cuda::detail::gemm_activation_fusions() - before, 1);
  const std::vector<double> ref = reference_linear(p), gy = host(y);
  for (size_t i = 0; i < ref.size(); ++i) {
    const double want = gelu_tanh(gelu_tanh(ref[i]));
    ASSERT_NEAR(gy[i], want, 4 * eps_of(kBFloat16) * (std::abs(ref[i]) + 1)) << i;
  }
}

// A captured linear + GELU fuses too (the deferred gemm waits in the queue, and capture_end
// flushes it into the graph); the replay writes both results. A gemm left waiting at the end of
// the captured function is part of the graph.
TEST(GemmGelu, CaptureFusesAndReplays) {
  TG_SKIP_WITHOUT_GPU();
  Problem p = make_problem(kBFloat16, 256, 64, 512, false);
  Tensor h, y, last;
  tg::cuda::Stream side;
  {
    tg::cuda::StreamGuard guard(side);
    tg::cuda::Graph graph;
    const int64_t before = cuda::detail::gemm_activation_fusions();
    graph.capture([&] {
      h = tg::linear(p.x, p.w, p.b);
      y = tg::gelu(h, "tanh");
      last = tg::linear(p.x, p.w, p.b);  // still waiting when the function returns
    });
    EXPECT_EQ(cuda::detail::gemm_activation_fusions() - before, 1);
    graph.replay();
    side.synchronize();
  }
  expect_linear_gelu(h, y, p, eps_of(kBFloat16), "captured");
  expect_linear_gelu(last, y, p, eps_of(kBFloat16), "captured, last gemm");
}

// GPT-2's MLP as the example writes it: float32 Linear under bfloat16 autocast, then GELU.
TEST(GemmGelu, AutocastLinearThenGeluFuses) {
  TG_SKIP_WITHOUT_GPU();
  tg::manual_seed(5);
  const auto opts = TensorOptions().device(Device(kCUDA));
  nn::Linear c_fc(128, 512, true, opts);
  Tensor x = tg::randn({4, 64, 128}, opts);
  const int64_t before = cuda::detail::gemm_activation_fusions();
  Tensor y;
  {
    amp::Autocast ac(kCUDA, kBFloat16);
    y = tg::gelu(c_fc.forward(x), "tanh");
  }
  EXPECT_EQ(cuda::detail::gemm_activation_fusions() - before, 1);
  EXPECT_EQ(y.dtype(), kBFloat16);
  Problem p{x.reshape({256, 128}).to(kBFloat16), c_fc.weight.detach().to(kBFloat16), c_fc.bias.detach().to(kBFloat16)};
  expect_linear_gelu(tg::linear(p.x, p.w, p.b), y.reshape({256, 512}), p, eps_of(kBFloat16), "autocast");
}


// ---- float32 linear + ReLU on the small-gemm kernel

// h and relu(h): h within float32 accumulation error of float64, relu(h) exactly relu of h.
void expect_linear_relu(const Tensor& h, const Tensor& y, const Problem& p, const std::string& what) {
  const std::vector<double> ref = reference_linear(p), gh = host(h), gy = host(y);
  ASSERT_EQ(gh.size(), ref.size());
  ASSERT_EQ(gy.size(), ref.size());
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::abs(gh[i] - ref[i]) > 1e-5 * (std::abs(ref[i]) + 1) && bad++ < 5)
      ADD_FAILURE() << what << ": h[" << i << "] = " << gh[i] << ", float64 " << ref[i];
    if (gy[i] != (gh[i] < 0 ? 0.0 : gh[i]) && bad++ < 5)
      ADD_FAILURE() << what << ": relu[" << i << "] = " << gy[i] << " for h = " << gh[i];
  }
}

TEST(GemmRelu, FusesAndMatchesFloat64) {
  TG_SKIP_WITHOUT_GPU();
  for (bool bias : {true, false}) {
    for (auto [rows, in, out] : {std::tuple<int64_t, int64_t, int64_t>{128, 784, 512}, {100, 70, 30}}) {
      Problem p = make_problem(kFloat32, rows, in, out, false);
      if (!bias) p.b = tg::zeros({out}, TensorOptions().device(Device(kCUDA)));
      const int64_t before = cuda::detail::gemm_activation_fusions();
      Tensor h = bias ? tg::linear(p.x, p.w, p.b) : tg::linear(p.x, p.w);
      Tensor y = tg::relu(h);
      const std::string what = std::to_string(rows) + "x" + std::to_string(in) + "->" + std::to_string(out) +
                               (bias ? " with bias" : " no bias");
      EXPECT_EQ(cuda::detail::gemm_activation_fusions() - before, 1) << what;
      EXPECT_EQ(y.sizes(), h.sizes());
      expect_linear_relu(h, y, p, what);
    }
  }
}

// A float32 problem too large for the small-gemm kernel (cuBLAS) is not fused and stays right.
TEST(GemmRelu, LargeFloat32IsNotFused) {
  TG_SKIP_WITHOUT_GPU();
  Problem p = make_problem(kFloat32, 1024, 64, 1024, false);
  const int64_t before = cuda::detail::gemm_activation_fusions();
  Tensor h = tg::linear(p.x, p.w, p.b);
  Tensor y = tg::relu(h);
  EXPECT_EQ(cuda::detail::gemm_activation_fusions() - before, 0);
  expect_linear_relu(h, y, p, "1024x64->1024");
}

// A ReLU of another tensor, or of a slice of the result, leaves the gemm alone.
TEST(GemmRelu, ReluOfAnotherTensorLeavesTheGemmAlone) {
  TG_SKIP_WITHOUT_GPU();
  Problem p = make_problem(kFloat32, 128, 96, 256, false);
  Tensor other = tg::randn({128, 256}, TensorOptions().device(Device(kCUDA)));
  const int64_t before = cuda::detail::gemm_activation_fusions();
  Tensor h = tg::linear(p.x, p.w, p.b);
  Tensor z = tg::relu(other);
  Tensor h2 = tg::linear(p.x, p.w, p.b);
  Tensor zs = tg::relu(h2.slice(0, 0, 64));
  EXPECT_EQ(cuda::detail::gemm_activation_fusions() - before, 0);
  expect_linear_relu(h, tg::relu(h), p, "first linear");
  const std::vector<double> go = host(other), gz = host(z), gh2 = host(h2), gzs = host(zs);
  for (size_t i = 0; i < go.size(); ++i) ASSERT_EQ(gz[i], go[i] < 0 ? 0.0 : go[i]) << i;
  for (size_t i = 0; i < gzs.size(); ++i) ASSERT_EQ(gzs[i], gh2[i] < 0 ? 0.0 : gh2[i]) << i;
}

// The MNIST MLP's training step (784-512-512-10, cross_entropy, Adam) with both ReLUs in the
// gemms' epilogues: the same losses and parameters, bit for bit, as with the ReLU kernels, eager
// and replayed as a graph. (Both runs apply the ReLUs' backward masks in the input-gradient gemms;
// Absorb.ReluMlpGradientsMatchFloat64AndTheUnfusedPass compares that with the ReLU backward kernel.)
TEST(GemmRelu, MlpTrainingStepMatchesTheUnfusedStep) {
  TG_SKIP_WITHOUT_GPU();
  FusionOn restore;
  const auto opts = TensorOptions().device(Device(kCUDA));
  auto run = [&](bool fuse, bool graph) {
    cuda::detail::set_gemm_activation_fusion(fuse);
    tg::manual_seed(3);
    nn::Sequential net(nn::Linear(784, 512), nn::ReLU(), nn::Linear(512, 512), nn::ReLU(), nn::Linear(512, 10));
    net.to(kCUDA);
    optim::Adam opt(net.parameters());
    Tensor x = tg::rand({128, 784}, opts), y = (tg::rand({128}, opts) * 10).to(kInt64);
    Tensor loss;
    const int64_t before = cuda::detail::gemm_activation_fusions();
    const uint64_t absorbed = autograd::absorbed_node_count();
    auto step = [&] {
      opt.zero_grad();
      loss = nn::functional::cross_entropy(net(x), y);
      loss.backward();
      opt.step();
    };
    std::vector<double> losses;
    if (graph) {
      step();  // warm-up, eager
      losses.push_back(host(loss)[0]);
      tg::cuda::Stream side;
      tg::cuda::StreamGuard guard(side);
      tg::cuda::Graph g;
      g.capture(step);
      for (int i = 0; i < 3; ++i) {
        g.replay();
        side.synchronize();
        losses.push_back(host(loss)[0]);
      }
    } else {
      for (int i = 0; i < 4; ++i) {
        step();
        losses.push_back(host(loss)[0]);
      }
    }
    const int64_t fusions = cuda::detail::gemm_activation_fusions() - before;
    const uint64_t absorbs = autograd::absorbed_node_count() - absorbed;
    EXPECT_EQ(fusions, fuse ? (graph ? 4 : 8) : 0) << "two ReLUs a step (graph: the warm-up and the capture)";
    EXPECT_EQ(absorbs, graph ? 4u : 8u) << "two ReLU nodes applied by the linears' backward a step";
    (void)fusions;
    std::vector<double> out = losses;
    for (const Tensor& prm : net.parameters()) {
      const std::vector<double> v = host(prm);
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  };
  for (bool graph : {false, true}) {
    const std::vector<double> fused = run(true, graph), plain = run(false, graph);
    ASSERT_EQ(fused.size(), plain.size());
    for (size_t i = 0; i < fused.size(); ++i)
      ASSERT_EQ(fused[i], plain[i]) << (graph ? "graph" : "eager") << ": value " << i << " (the first 4: losses)";
    EXPECT_TRUE(std::isfinite(fused[0]) && fused[0] > 2.0 && fused[0] < 2.6) << fused[0];  // ~ln(10) at first
  }
}

}  // namespace
}  // namespace tg::testing

#endif  // TG_WITH_CUDA
