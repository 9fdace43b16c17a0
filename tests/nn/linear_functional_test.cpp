// nn::functional::linear and nn::Linear on the fused op: same values as the float64
// reference, the module and the functional agree bit for bit, the regression model's
// step (Sequential(Linear(64, 1))) runs the layer's forward as one dispatch on CUDA, and
// under autocast the parameters' gradients are float32.
#include <gtest/gtest.h>

#include <tapegrad/tapegrad.h>

#include <cmath>
#include <vector>

#include <tapegrad/core/backend/backend.h>

namespace {

using tg::Tensor;
namespace nn = tg::nn;
namespace F = tg::nn::functional;

std::vector<double> host(const Tensor& t) {
  return t.to(tg::Device(tg::kCPU), tg::kFloat64).contiguous().to_vector<double>();
}

std::vector<tg::Device> devices() {
  std::vector<tg::Device> d{tg::kCPU};
  if (tg::cuda::is_available()) d.emplace_back(tg::kCUDA);
  return d;
}

TEST(LinearFunctional, MatchesModuleAndReference) {
  for (tg::Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    tg::manual_seed(21);
    nn::Linear l(6, 4);
    l.to(dev);
    Tensor x = tg::randn({2, 5, 6}, dev);
    Tensor y = l(x), yf = F::linear(x, l.weight, l.bias), yn = F::linear(x, l.weight);
    EXPECT_EQ(host(y), host(yf));
    auto X = host(x), W = host(l.weight), B = host(l.bias), Y = host(y), YN = host(yn);
    for (int64_t r = 0; r < 10; ++r)
      for (int64_t o = 0; o < 4; ++o) {
        double acc = 0, s = 0;
        for (int64_t k = 0; k < 6; ++k) {
          acc += X[r * 6 + k] * W[o * 6 + k];
          s += std::abs(X[r * 6 + k] * W[o * 6 + k]);
        }
        EXPECT_NEAR(Y[r * 4 + o], acc + B[o], 1e-5 * (s + std::abs(B[o])) + 1e-7);
        EXPECT_NEAR(YN[r * 4 + o], acc, 1e-5 * s + 1e-7);
      }
  }
}

// The regression example's model: Linear(64, 1) on batches of 4096. On CUDA the layer's forward
// is one dispatch (gemm with the bias fused); its weight and bias gradients at most two.
TEST(LinearFunctional, RegressionLayerDispatches) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  nn::Sequential net(nn::Linear(64, 1));
  net.to(tg::kCUDA);
  Tensor xb = tg::randn({4096, 64}, tg::kCUDA), g = tg::randn({4096, 1}, tg::kCUDA);
  uint64_t c0 = tg::backend::dispatch_count();
  Tensor y = net(xb);
  EXPECT_EQ(tg::backend::dispatch_count() - c0, 1u);
  c0 = tg::backend::dispatch_count();
  y.backward(g);
  EXPECT_LE(tg::backend::dispatch_count() - c0, 2u);
  for (const Tensor& p : net.parameters()) EXPECT_TRUE(p.grad().defined());
}

TEST(LinearFunctional, AutocastGradientsAreFloat32) {
  for (tg::Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    nn::Linear l(16, 8);
    l.to(dev);
    Tensor x = tg::randn({4, 16}, dev);
    Tensor loss;
    {
      tg::amp::autocast guard(dev.type());
      Tensor y = l(x);
      EXPECT_EQ(y.dtype(), dev.is_cuda() ? tg::kFloat16 : tg::kBFloat16);
      loss = y.to(tg::kFloat32).sum();
    }
    loss.backward();
    EXPECT_EQ(l.weight.grad().dtype(), tg::kFloat32);
    EXPECT_EQ(l.bias.grad().dtype(), tg::kFloat32);
    // d sum(y) / d b = number of rows, exactly.
    for (double v : host(l.bias.grad())) EXPECT_EQ(v, 4.0);
  }
}

}  // namespace
