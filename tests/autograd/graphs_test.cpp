// Whole graphs: random matmul DAGs (matmul, broadcast add, relu, tanh, sum, with
// nodes reused by several consumers) through gradcheck, and half-precision
// backward against float32 with stated tolerances.
#include <random>
#include <vector>

#include "tests/autograd/common.h"

namespace tg::testing {
namespace {

using Inputs = std::vector<Tensor>;

// A random DAG over n x n matrices. Inputs: x (n x n), weights W0..W2 (n x n), bias
// b (n). Each step picks earlier values at random (so values are reused) and
// applies one op; the result sums a few of the values.
Tensor random_dag(const Inputs& v, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<Tensor> vals = {v[0]};
  auto pick = [&](size_t upto) { return vals[std::uniform_int_distribution<size_t>(0, upto - 1)(gen)]; };
  for (int step = 0; step < 8; ++step) {
    Tensor a = pick(vals.size());
    switch (std::uniform_int_distribution<int>(0, 4)(gen)) {
      case 0:
        vals.push_back(tg::matmul(a, v[1 + gen() % 3]) * 0.5);
        break;
      case 1:
        vals.push_back(a + v[4]);
        break;  // broadcast bias
      case 2:
        vals.push_back(a.relu());
        break;
      case 3:
        vals.push_back(a.tanh());
        break;
      default:
        vals.push_back(tg::matmul(a, pick(vals.size())) * 0.3);
        break;  // value x value
    }
  }
  Tensor out = vals.back().sum();
  for (size_t i = 0; i + 1 < vals.size(); i += 3) out = out + vals[i].sum(1).sum() * 0.1;
  return out;
}

class Graphs : public ::testing::TestWithParam<Dev> {
 protected:
  void SetUp() override { TG_SKIP_WITHOUT_CUDA(GetParam()); }
  Device dev() const { return to_device(GetParam()); }
};

TEST_P(Graphs, RandomMatmulDagsPassGradcheck) {
  const int64_t n = 4;
  for (uint32_t seed = 0; seed < 6; ++seed) {
    SCOPED_TRACE(seed);
    tg::manual_seed(100 + seed);
    auto o = TensorOptions().dtype(kFloat64).device(dev());
    Inputs in = {tg::randn({n, n}, o), tg::randn({n, n}, o), tg::randn({n, n}, o), tg::randn({n, n}, o),
                 tg::randn({n}, o)};
    auto r = autograd::gradcheck([seed](const Inputs& v) { return random_dag(v, seed); }, in);
    EXPECT_TRUE(r.ok) << r;
  }
}

TEST_P(Graphs, MlpGradsMatchHostReference) {
  // loss = sum(relu(x @ W + b)); float64 host reference of dW and db.
  tg::manual_seed(3);
  const int64_t m = 6, k = 5, n = 4;
  auto o = TensorOptions().dtype(kFloat64).device(dev());
  auto x = tg::randn({m, k}, o);
  auto W = tg::randn({k, n}, o.requires_grad(true));
  auto b = tg::randn({n}, o.requires_grad(true));
  (tg::matmul(x, W) + b).relu().sum().backward();
  std::vector<double> hx = host(x), hw = host(W), hb = host(b), gw(k * n, 0), gb(n, 0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double pre = hb[j];
      for (int64_t p = 0; p < k; ++p) pre += hx[i * k + p] * hw[p * n + j];
      if (pre <= 0) continue;
      gb[j] += 1;
      for (int64_t p = 0; p < k; ++p) gw[p * n + j] += hx[i * k + p];
    }
  expect_near_vec(host(W.grad()), gw, 1e-10, 1e-10, "dW");
  expect_near_vec(host(b.grad()), gb, 1e-10, 1e-10, "db");
}

TEST_P(Graphs, HalfPrecisionBackwardMatchesFloat32) {
  // The same small network in float16 / bfloat16 and in float32. Tolerances: the
  // narrow types carry 11 (fp16) / 8 (bf16) significant bits and every op rounds its
  // output, so we allow 2e-2 (fp16) and 8e-2 (bf16) of the gradient's scale.
  tg::manual_seed(11);
  auto x32 = tg::randn({8, 16}, dev()) * 0.5;
  auto w32 = tg::randn({16, 8}, dev()) * 0.25;
  auto b32 = tg::randn({8}, dev()) * 0.1;
  auto grads = [&](DType dt) {
    auto x = x32.to(dt);
    auto w = w32.to(dt).detach().requires_grad_();
    auto b = b32.to(dt).detach().requires_grad_();
    auto h = (tg::matmul(x, w) + b).tanh();
    auto loss = (h * h).mean() + h.relu().sum() * 0.01 + h.sigmoid().mean();
    loss.backward();
    EXPECT_EQ(w.grad().dtype(), dt);
    return std::vector<std::vector<double>>{host(w.grad()), host(b.grad())};
  };
  auto ref = grads(kFloat32);
  for (DType dt : {kFloat16, kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const double tol = dt == kFloat16 ? 2e-2 : 8e-2;
    auto got = grads(dt);
    for (size_t t = 0; t < ref.size(); ++t) {
      double scale = 0;
      for (double v : ref[t]) scale = std::max(scale, std::abs(v));
      expect_near_vec(got[t], ref[t], tol * scale, 0, t == 0 ? "dW" : "db");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, Graphs, ::testing::Values(Dev::CPU, Dev::CUDA), dev_name);

TEST(CudaMemory, BackwardReturnsToBaselinePlusGradients) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  tg::manual_seed(5);
  auto w = tg::randn({64, 64}, TensorOptions().device(kCUDA).requires_grad(true));
  auto b = tg::randn({64}, TensorOptions().device(kCUDA).requires_grad(true));
  auto x = tg::randn({32, 64}, kCUDA);
  {
    // Warm-up outside the measurement: lazily created cuBLAS workspaces and the like.
    tg::NoGradGuard g;
    (tg::matmul(x, w) * 0.1 + b).tanh().sum().item<float>();
  }
  {  // and the engine's shared implicit root gradient (a 1 kept for every later backward)
    auto z = tg::randn({2}, kCUDA).requires_grad_();
    z.sum().backward();
  }
  tg::cuda::synchronize();
  const size_t before = tg::cuda::memory_allocated();
  {
    Tensor h = x;
    for (int i = 0; i < 25; ++i) h = (tg::matmul(h, w) * 0.1 + b).tanh() * 1.0;  // 4 ops per step: 100 ops
    h.sum().backward();
  }
  tg::cuda::synchronize();
  const size_t after = tg::cuda::memory_allocated();
  // What stays: the two gradients (each rounded up by the allocator to 512 bytes).
  auto rounded = [](size_t n) { return (n + 511) / 512 * 512; };
  const size_t grads = w.grad().nbytes() + b.grad().nbytes();
  const size_t grads_rounded = rounded(w.grad().nbytes()) + rounded(b.grad().nbytes());
  EXPECT_GE(after, before + grads);
  EXPECT_LE(after, before + grads_rounded) << "before " << before << " after " << after;
}

}  // namespace
}  // namespace tg::testing
