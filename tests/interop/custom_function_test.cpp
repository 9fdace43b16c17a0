// User-defined autograd functions: gradients against gradcheck and a float64
// host reference, non-tensor arguments, several outputs, needs_input_grad, the
// saved-tensor in-place check, and a RawKernel forward on CUDA.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.h>

namespace {

using tg::Tensor;
using tg::autograd::AutogradContext;
using Inputs = std::vector<Tensor>;

std::vector<double> host(const Tensor& t) { return t.to(tg::Device(tg::kCPU), tg::kFloat64).contiguous().to_vector<double>(); }

// y = a * x^3 + x * w (w broadcast over rows), written with tg ops but with its own backward.
struct CubicMix : tg::autograd::Function<CubicMix> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, double a, const Tensor& w) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["a"] = a;
    return x * x * x * a + x * w;
  }
  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grads) {
    auto saved = ctx->saved_tensors();
    const Tensor& x = saved[0];
    const Tensor& w = saved[1];
    const double a = std::any_cast<double>(ctx->saved_data.at("a"));
    const Tensor& g = grads[0];
    Tensor gx, gw;
    if (ctx->needs_input_grad(0)) gx = g * (x * x * (3 * a) + w);
    if (ctx->needs_input_grad(2)) gw = (g * x).sum(0);
    return {gx, Tensor(), gw};
  }
};

// A backward that scales its incoming gradient in place (allowed: it owns it).
struct InPlaceTriple : tg::autograd::Function<InPlaceTriple> {
  static Tensor forward(AutogradContext*, const Tensor& x) { return x * 1.0; }
  static std::vector<Tensor> backward(AutogradContext*, std::vector<Tensor> grads) {
    grads[0].mul_(3);
    return {grads[0]};
  }
};

TEST(CustomFunction, InPlaceWriteToIncomingGradLeavesLaterBackwardsAlone) {
  for (tg::DeviceType d : {tg::kCPU, tg::kCUDA}) {
    if (d == tg::kCUDA && !tg::cuda::is_available()) continue;
    auto opts = tg::TensorOptions().dtype(tg::kFloat64).device(tg::Device(d));
    for (int rep = 0; rep < 3; ++rep) {  // the implicit 1 of the scalar root must stay 1
      Tensor x = tg::full({}, 2.0, opts).requires_grad_();
      InPlaceTriple::apply(x).backward();
      EXPECT_EQ(host(x.grad())[0], 3.0) << rep;
      Tensor z = tg::full({}, 5.0, opts).requires_grad_();
      (z * 1.0).backward();
      EXPECT_EQ(host(z.grad())[0], 1.0) << rep;
    }
  }
}

TEST(CustomFunction, GradcheckCpu) {
  Tensor x = tg::randn({4, 3}, tg::kFloat64).requires_grad_();
  Tensor w = tg::randn({3}, tg::kFloat64).requires_grad_();
  auto report =
      tg::autograd::gradcheck([](const Inputs& v) { return CubicMix::apply(v[0], 0.7, v[1]); }, {x, w});
  EXPECT_TRUE(report.ok) << report;
}

TEST(CustomFunction, MatchesHostReference) {
  Tensor x = tg::randn({2, 3}, tg::kFloat64).requires_grad_();
  Tensor w = tg::randn({3}, tg::kFloat64).requires_grad_();
  Tensor y = CubicMix::apply(x, 2.0, w);
  ASSERT_TRUE(y.requires_grad());
  y.sum().backward();
  auto xs = host(x), ws = host(w), gx = host(x.grad()), gw = host(w.grad()), ys = host(y);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) {
      double xv = xs[i * 3 + j];
      EXPECT_NEAR(ys[i * 3 + j], 2 * xv * xv * xv + xv * ws[j], 1e-12);
      EXPECT_NEAR(gx[i * 3 + j], 6 * xv * xv + ws[j], 1e-12);
    }
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(gw[j], xs[j] + xs[3 + j], 1e-12);
}

TEST(CustomFunction, NeedsInputGradAndNoRecordingWithoutGrad) {
  Tensor x = tg::randn({3}, tg::kFloat64).requires_grad_();
  Tensor w = tg::randn({3}, tg::kFloat64);  // needs no grad
  Tensor y = CubicMix::apply(x, 1.0, w);
  y.sum().backward();
  EXPECT_TRUE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());

  Tensor z = CubicMix::apply(w, 1.0, w);
  EXPECT_FALSE(z.requires_grad());
  {
    tg::NoGradGuard guard;
    EXPECT_FALSE(CubicMix::apply(x, 1.0, w).requires_grad());
  }
}

// Two outputs; only one of them is used downstream (the other's gradient arrives as zeros).
struct ExpSquare : tg::autograd::Function<ExpSquare> {
  static std::vector<Tensor> forward(AutogradContext* ctx, const Tensor& x) {
    ctx->save_for_backward({x});
    return {x.exp(), x * x};
  }
  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grads) {
    Tensor x = ctx->saved_tensors()[0];
    return {grads[0] * x.exp() + grads[1] * 2 * x};
  }
};

TEST(CustomFunction, SeveralOutputs) {
  Tensor x = tg::randn({5}, tg::kFloat64).requires_grad_();
  auto report = tg::autograd::gradcheck(
      [](const Inputs& v) {
        auto outs = ExpSquare::apply(v[0]);
        return outs[0] + outs[1] * 3;
      },
      {x});
  EXPECT_TRUE(report.ok) << report;
  auto outs = ExpSquare::apply(x);
  outs[1].sum().backward();  // outs[0] unused
  auto xs = host(x), g = host(x.grad());
  for (size_t i = 0; i < xs.size(); ++i) EXPECT_NEAR(g[i], 2 * xs[i], 1e-12);
}

TEST(CustomFunction, SavedTensorModifiedInPlaceIsAnError) {
  Tensor x = tg::randn({3}, tg::kFloat64).requires_grad_();
  Tensor w = tg::randn({3}, tg::kFloat64);
  Tensor y = CubicMix::apply(x, 1.0, w);
  w.mul_(2.0);
  try {
    y.sum().backward();
    FAIL() << "expected tg::Error";
  } catch (const tg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("modified in place"), std::string::npos) << e.what();
  }
}

TEST(CustomFunction, WrongGradientCountIsAnError) {
  struct Bad : tg::autograd::Function<Bad> {
    static Tensor forward(AutogradContext*, const Tensor& x, const Tensor& y) { return x + y; }
    static std::vector<Tensor> backward(AutogradContext*, std::vector<Tensor> grads) { return {grads[0]}; }
  };
  Tensor x = tg::randn({3}).requires_grad_();
  Tensor y = tg::randn({3}).requires_grad_();
  EXPECT_THROW(Bad::apply(x, y).sum().backward(), tg::Error);
}

// A RawKernel in forward and backward: y = x^2 elementwise.
const char* kSquareSource = R"(
extern "C" __global__ void square_fwd(const double* x, double* y, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * x[i];
}
extern "C" __global__ void square_bwd(const double* x, const double* g, double* gx, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) gx[i] = 2.0 * x[i] * g[i];
}
)";

struct KernelSquare : tg::autograd::Function<KernelSquare> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x) {
    Tensor xc = x.contiguous();
    ctx->save_for_backward({xc});
    Tensor y = tg::empty_like(xc);
    static const tg::cuda::RawKernel k(kSquareSource, "square_fwd");
    const int64_t n = xc.numel();
    k.launch((n + 255) / 256, 256, xc, y, static_cast<long long>(n));
    return y;
  }
  static std::vector<Tensor> backward(AutogradContext* ctx, std::vector<Tensor> grads) {
    Tensor x = ctx->saved_tensors()[0];
    Tensor g = grads[0].contiguous();
    Tensor gx = tg::empty_like(x);
    static const tg::cuda::RawKernel k(kSquareSource, "square_bwd");
    const int64_t n = x.numel();
    k.launch((n + 255) / 256, 256, x, g, gx, static_cast<long long>(n));
    return {gx};
  }
};

TEST(CustomFunction, RawKernelForwardOnCuda) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Tensor x = tg::randn({7, 5}, tg::TensorOptions().dtype(tg::kFloat64).device(tg::kCUDA)).requires_grad_();
  auto report = tg::autograd::gradcheck([](const Inputs& v) { return KernelSquare::apply(v[0]); }, {x});
  EXPECT_TRUE(report.ok) << report;
  Tensor y = KernelSquare::apply(x);
  (y * 3).sum().backward();
  auto xs = host(x), ys = host(y), g = host(x.grad());
  for (size_t i = 0; i < xs.size(); ++i) {
    EXPECT_NEAR(ys[i], xs[i] * xs[i], 1e-12);
    EXPECT_NEAR(g[i], 6 * xs[i], 1e-12);
  }
}

}  // namespace
