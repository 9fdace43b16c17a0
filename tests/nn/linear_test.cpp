// nn::Linear forward/backward against a float64 host reference, PyTorch's
// init bounds, and nn::init.
#include <gtest/gtest.h>

#include <tapegrad/tapegrad.h>

#include <cmath>
#include <vector>

namespace {

using tg::Tensor;
namespace nn = tg::nn;

std::vector<double> host(const Tensor& t) {
  return t.to(tg::Device(tg::kCPU), tg::kFloat64).contiguous().to_vector<double>();
}

void check_linear(tg::Device dev) {
  tg::manual_seed(11);
  const int64_t n = 7, in = 5, out = 3;
  nn::Linear l(in, out);
  l.to(dev);
  Tensor x = tg::randn({n, in}, dev).requires_grad_();
  Tensor y = l(x);
  ASSERT_EQ(y.sizes(), (tg::Shape{n, out}));
  Tensor go = tg::randn({n, out}, dev);
  (y * go).sum().backward();
  auto X = host(x), W = host(l.weight), B = host(l.bias), Y = host(y), G = host(go);
  std::vector<double> dx(n * in, 0), dw(out * in, 0), db(out, 0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double acc = B[o];
      for (int64_t k = 0; k < in; ++k) acc += X[i * in + k] * W[o * in + k];
      EXPECT_NEAR(Y[i * out + o], acc, 1e-5) << i << "," << o;
      const double g = G[i * out + o];
      db[o] += g;
      for (int64_t k = 0; k < in; ++k) {
        dx[i * in + k] += g * W[o * in + k];
        dw[o * in + k] += g * X[i * in + k];
      }
    }
  auto gx = host(x.grad()), gw = host(l.weight.grad()), gb = host(l.bias.grad());
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(gx[i], dx[i], 1e-5);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(gw[i], dw[i], 1e-5);
  for (size_t i = 0; i < db.size(); ++i) EXPECT_NEAR(gb[i], db[i], 1e-5);
}

TEST(Linear, ForwardBackwardCpu) { check_linear(tg::kCPU); }
TEST(Linear, ForwardBackwardCuda) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  check_linear(tg::kCUDA);
}

TEST(Linear, BatchedInputAndNoBias) {
  nn::Linear l(4, 2, false);
  EXPECT_FALSE(l.bias.defined());
  EXPECT_EQ(l.named_parameters().size(), 1u);
  Tensor x = tg::randn({3, 5, 4});
  EXPECT_EQ(l(x).sizes(), (tg::Shape{3, 5, 2}));
  EXPECT_THROW(l(tg::randn({3, 5})), tg::Error);
}

TEST(Linear, GradcheckFloat64) {
  nn::Linear l(3, 2, true, tg::kFloat64);
  auto rep =
      tg::autograd::gradcheck([&](const std::vector<Tensor>& in) { return tg::matmul(in[0], in[1].t()) + in[2]; },
                              {tg::randn({4, 3}, tg::kFloat64), l.weight.detach().clone(), l.bias.detach().clone()});
  EXPECT_TRUE(rep) << rep;
}

TEST(Linear, InitBounds) {
  tg::manual_seed(5);
  const int64_t in = 400, out = 300;
  nn::Linear l(in, out);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  auto w = host(l.weight), b = host(l.bias);
  double lo = 1, hi = -1, sum = 0, sq = 0;
  for (double v : w) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    sum += v;
    sq += v * v;
  }
  EXPECT_GE(lo, -bound);
  EXPECT_LT(hi, bound);
  EXPECT_LT(lo, -0.99 * bound);  // the range is used
  EXPECT_GT(hi, 0.99 * bound);
  const double mean = sum / w.size(), var = sq / w.size() - mean * mean;
  EXPECT_NEAR(mean, 0, 0.01 * bound);
  EXPECT_NEAR(var, bound * bound / 3, 0.02 * bound * bound);  // variance of U(-b, b)
  for (double v : b) {
    EXPECT_GE(v, -bound);
    EXPECT_LT(v, bound);
  }
  EXPECT_TRUE(l.weight.requires_grad() && l.weight.is_leaf());
}

TEST(Init, Functions) {
  Tensor t = tg::empty({64, 32});
  nn::init::uniform_(t, -2, 3);
  for (double v : host(t)) {
    EXPECT_GE(v, -2);
    EXPECT_LT(v, 3);
  }
  nn::init::zeros_(t);
  EXPECT_EQ(host(t), std::vector<double>(64 * 32, 0.0));
  nn::init::constant_(t, 2.5);
  EXPECT_EQ(host(t)[17], 2.5);
  nn::init::normal_(t, 1.0, 0.5);
  double s = 0;
  for (double v : host(t)) s += v;
  EXPECT_NEAR(s / t.numel(), 1.0, 0.05);
  auto [fi, fo] = nn::init::calculate_fan_in_and_fan_out(tg::empty({8, 4, 3, 3}));
  EXPECT_EQ(fi, 36);
  EXPECT_EQ(fo, 72);
  EXPECT_NEAR(nn::init::calculate_gain("leaky_relu", std::sqrt(5.0)), std::sqrt(1.0 / 3.0), 1e-12);
  EXPECT_THROW(nn::init::calculate_gain("swish"), tg::Error);
  EXPECT_THROW(nn::init::uniform_(tg::empty({2}, tg::kInt64)), tg::Error);
  // In-place init of a parameter that requires grad is allowed and keeps it a leaf.
  Tensor p = tg::zeros({3, 3}).requires_grad_();
  nn::init::kaiming_uniform_(p, std::sqrt(5.0));
  EXPECT_TRUE(p.is_leaf());
}

TEST(Activation, Modules) {
  Tensor x = tg::tensor(std::vector<float>{-2.f, -0.5f, 0.f, 1.5f});
  auto r = host(nn::ReLU()(x)), t = host(nn::Tanh()(x)), s = host(nn::Sigmoid()(x)), g = host(nn::GELU()(x));
  auto xs = host(x);
  for (size_t i = 0; i < xs.size(); ++i) {
    EXPECT_NEAR(r[i], std::max(0.0, xs[i]), 1e-7);
    EXPECT_NEAR(t[i], std::tanh(xs[i]), 1e-6);
    EXPECT_NEAR(s[i], 1 / (1 + std::exp(-xs[i])), 1e-6);
    EXPECT_NEAR(g[i], 0.5 * xs[i] * (1 + std::erf(xs[i] / std::sqrt(2.0))), 1e-6);
  }
}

}  // namespace
