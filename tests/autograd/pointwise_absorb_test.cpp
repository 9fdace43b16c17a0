// A linear's backward applying the backward of the activation its input came from
// (autograd::pointwise_next / absorb_next: GELU's tanh form in cuBLASLt's DGELU epilogue on CUDA,
// ReLU's mask in the float32 small-gemm kernel's epilogue on CUDA, right after the GEMM
// elsewhere): the gradients equal those of the unfused pass (a hook on the
// activation's output keeps its node from being absorbed), float64 gradcheck holds through it,
// and the node is absorbed only when nothing else needs it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include <tapegrad/autograd/function.h>

#include "tests/autograd/common.h"

namespace tg::testing {
namespace {

class Absorb : public ::testing::TestWithParam<Dev> {
 protected:
  void SetUp() override { TG_SKIP_WITHOUT_CUDA(GetParam()); }
  Device dev() const { return to_device(GetParam()); }
};

struct Mlp {
  Tensor x, w1, b1, w2, b2;
};

Mlp make_mlp(Device d, DType dt, int64_t rows, int64_t c, int64_t hidden) {
  tg::manual_seed(11);
  auto leaf = [&](Shape s, double scale) { return (tg::randn(s, kFloat64) * scale).to(d, dt).detach().requires_grad_(true); };
  return {leaf({rows, c}, 1.5), leaf({hidden, c}, 0.3), leaf({hidden}, 0.5), leaf({c, hidden}, 0.3), leaf({c}, 0.1)};
}

enum class Act { GeluTanh, Relu };

// y = c_proj(act(c_fc(x))), backward with g; returns {x, w1, b1, w2, b2} gradients and how many
// nodes the pass absorbed. hook: a (value-keeping) hook on the activation's output.
std::vector<std::vector<double>> run_mlp(Mlp& m, const Tensor& g, bool hook, uint64_t& absorbed,
                                         Act act = Act::GeluTanh) {
  for (Tensor* t : {&m.x, &m.w1, &m.b1, &m.w2, &m.b2}) t->mutable_grad() = Tensor();
  Tensor h = tg::linear(m.x, m.w1, m.b1);
  Tensor a = act == Act::Relu ? tg::relu(h) : tg::gelu(h, "tanh");
  if (hook) a.register_hook([](const Tensor&) {});
  Tensor y = tg::linear(a, m.w2, m.b2);
  const uint64_t before = autograd::absorbed_node_count();
  y.backward(g);
  absorbed = autograd::absorbed_node_count() - before;
  return {host(m.x.grad()), host(m.w1.grad()), host(m.b1.grad()), host(m.w2.grad()), host(m.b2.grad())};
}

// max |got - want| / max |want|
double rel_err(const std::vector<double>& got, const std::vector<double>& want) {
  double d = 0, m = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    d = std::max(d, std::abs(got[i] - want[i]));
    m = std::max(m, std::abs(want[i]));
  }
  return d / std::max(m, 1e-300);
}

// The absorbed pass against float64 on the CPU from the same rounded values, next to the unfused
// pass. tol: the largest error of either, relative to each gradient's largest element. exact: the
// two passes must agree bit for bit (the same kernels run: no epilogue on this device or dtype).
void check_mlp(Device d, DType dt, int64_t rows, int64_t c, int64_t hidden, double tol, bool exact,
               Act act = Act::GeluTanh) {
  Mlp m = make_mlp(d, dt, rows, c, hidden);
  Tensor g = tg::randn({rows, c}, kFloat64).to(d, dt);
  uint64_t fused_count = 0, plain_count = 0, ref_count = 0;
  auto fused = run_mlp(m, g, false, fused_count, act);
  auto plain = run_mlp(m, g, true, plain_count, act);
  EXPECT_EQ(fused_count, 1u) << "the activation's node applied by c_proj's backward";
  EXPECT_EQ(plain_count, 0u) << "a hook on the activation's output keeps its node";
  auto to64 = [](const Tensor& t) { return t.to(Device(kCPU), kFloat64).detach().requires_grad_(true); };
  Mlp r{to64(m.x), to64(m.w1), to64(m.b1), to64(m.w2), to64(m.b2)};
  auto ref = run_mlp(r, g.to(Device(kCPU), kFloat64), false, ref_count, act);
  const char* names[] = {"grad x", "grad w1", "grad b1", "grad w2", "grad b2"};
  for (size_t i = 0; i < fused.size(); ++i) {
    const std::string what =
        std::string(act == Act::Relu ? "relu " : "gelu ") + dtype_name(dt) + " " + names[i];
    const double ef = rel_err(fused[i], ref[i]), ep = rel_err(plain[i], ref[i]);
    std::printf("%s on %s: absorbed %.3g, unfused %.3g off float64\n", what.c_str(), d.str().c_str(), ef, ep);
    EXPECT_LE(ef, tol) << what << ": absorbed pass off float64 by " << ef << " (unfused: " << ep << ")";
    EXPECT_LE(ep, tol) << what << ": unfused pass off float64 by " << ep;
    if (exact) expect_near_vec(fused[i], plain[i], 0, 0, what + " (absorbed = unfused)");
  }
}

TEST_P(Absorb, MlpGradientsMatchFloat64AndTheUnfusedPass) {
  const bool cpu = GetParam() == Dev::CPU;
  check_mlp(dev(), kFloat64, 5, 3, 8, 1e-12, true);
  check_mlp(dev(), kFloat32, 64, 24, 96, 2e-6, true);  // float32: no epilogue on CUDA either
  check_mlp(dev(), kBFloat16, 256, 64, 256, 1.2e-2, cpu);
  check_mlp(dev(), kFloat16, 128, 64, 192, 2e-3, cpu);
}

// ReLU's mask: exact on every device and dtype (on CUDA float32 the small-gemm kernel applies it
// in its epilogue, elsewhere the ReLU backward kernel runs right after the GEMM; the same bits).
// 128 x 784 -> 512 is the MNIST MLP's first layer.
TEST_P(Absorb, ReluMlpGradientsMatchFloat64AndTheUnfusedPass) {
  check_mlp(dev(), kFloat64, 5, 3, 8, 1e-12, true, Act::Relu);
  check_mlp(dev(), kFloat32, 64, 24, 96, 2e-6, true, Act::Relu);
  check_mlp(dev(), kFloat32, 128, 784, 512, 1e-5, true, Act::Relu);
  // bfloat16: where h is within its rounding of 0 the mask differs from float64's, and each such
  // element moves the gradient by a whole term; the check that matters is absorbed = unfused.
  check_mlp(dev(), kBFloat16, 256, 64, 256, 0.15, true, Act::Relu);
}

TEST_P(Absorb, GradcheckThroughTheAbsorbedNode) {
  // gradcheck's analytic pass is the engine's: the gelu node is absorbed there.
  auto fn = [](const std::vector<Tensor>& v) { return tg::linear(tg::gelu(tg::linear(v[0], v[1], v[2]), "tanh"), v[3]); };
  tg::manual_seed(2);
  const TensorOptions o = TensorOptions(kFloat64).device(dev());
  auto r = tg::autograd::gradcheck(fn, {tg::randn({4, 3}, o) * 2, tg::randn({5, 3}, o), tg::randn({5}, o),
                                        tg::randn({2, 5}, o)});
  EXPECT_TRUE(r.ok) << r;
  // A 3-d input, a transposed (non-contiguous) weight.
  auto fn3 = [](const std::vector<Tensor>& v) {
    return tg::linear(tg::gelu(tg::linear(v[0], v[1].t(), Tensor()), "tanh"), v[2]);
  };
  auto r3 = tg::autograd::gradcheck(fn3, {tg::randn({2, 3, 4}, o), tg::randn({4, 6}, o), tg::randn({3, 6}, o)});
  EXPECT_TRUE(r3.ok) << r3;
  // Through an absorbed ReLU (inputs away from its kink: finite differences stay on one side).
  auto fnr = [](const std::vector<Tensor>& v) { return tg::linear(tg::relu(tg::linear(v[0], v[1], v[2])), v[3]); };
  auto rr = tg::autograd::gradcheck(fnr, {tg::randn({4, 3}, o) * 2, tg::randn({5, 3}, o), tg::randn({5}, o) + 0.3,
                                          tg::randn({2, 5}, o)});
  EXPECT_TRUE(rr.ok) << rr;
}

TEST_P(Absorb, OnlyWhenNothingElseNeedsTheNode) {
  Mlp m = make_mlp(dev(), kFloat32, 6, 4, 8);
  Tensor g = tg::ones({6, 4}, TensorOptions(kFloat32).device(dev()));
  auto absorbed_in = [&](auto&& build) {
    const uint64_t before = autograd::absorbed_node_count();
    build();
    return autograd::absorbed_node_count() - before;
  };
  // gelu's output also feeds a second op: its node waits for two gradients.
  EXPECT_EQ(absorbed_in([&] {
              Tensor a = tg::gelu(tg::linear(m.x, m.w1, m.b1), "tanh");
              (tg::linear(a, m.w2, m.b2).sum() + a.sum()).backward();
            }),
            0u);
  // Its gradient retained: the node runs (and .grad() of a is c_proj's input gradient).
  Tensor kept;
  EXPECT_EQ(absorbed_in([&] {
              Tensor a = tg::gelu(tg::linear(m.x, m.w1, m.b1), "tanh");
              a.retain_grad();
              tg::linear(a, m.w2, m.b2).backward(g);
              kept = a.grad();
            }),
            0u);
  expect_near_vec(host(kept), host(tg::matmul(g, m.w2)), 1e-5, 1e-5, "retained grad of gelu's output");
  // autograd::grad asking for gelu's output, and create_graph: no absorption either.
  EXPECT_EQ(absorbed_in([&] {
              Tensor a = tg::gelu(tg::linear(m.x, m.w1, m.b1), "tanh");
              tg::autograd::grad({tg::linear(a, m.w2, m.b2).sum()}, {a, m.x});
            }),
            0u);
  EXPECT_EQ(absorbed_in([&] {
              Tensor a = tg::gelu(tg::linear(m.x, m.w1, m.b1), "tanh");
              tg::autograd::grad({tg::linear(a, m.w2, m.b2).sum()}, {m.x}, tg::autograd::GradOptions{.create_graph = true});
            }),
            0u);
  // Other activations with a saved-input backward are applied right after the GEMM.
  EXPECT_EQ(absorbed_in([&] { tg::linear(tg::silu(tg::linear(m.x, m.w1, m.b1)), m.w2, m.b2).backward(g); }), 1u);
}

INSTANTIATE_TEST_SUITE_P(Devices, Absorb, ::testing::Values(Dev::CPU, Dev::CUDA), dev_name);

}  // namespace
}  // namespace tg::testing
