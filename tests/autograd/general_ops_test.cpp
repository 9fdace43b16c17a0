// Issue 15's general ops against hand-computed float64 references: values in every floating
// dtype (float16 / bfloat16 with their rounding as tolerance), non-contiguous inputs, gradients,
// and the errors that name the op, shapes and dtypes. CPU always; CUDA when present.
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "tests/autograd/common.h"

namespace tg::testing {
namespace {

class GeneralOps : public ::testing::TestWithParam<Dev> {
 protected:
  Device dev() const { return to_device(GetParam()); }
};

// Relative tolerance of one dtype's rounding (with float math inside).
double tol_of(DType t) {
  switch (t) {
    case kFloat64:
      return 1e-12;
    case kFloat32:
      return 2e-6;
    case kFloat16:
      return 2e-3;
    case kBFloat16:
      return 1.6e-2;
    default:
      return 0;
  }
}

const DType kFloatTypes[] = {kFloat64, kFloat32, kFloat16, kBFloat16};

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> fn;
  std::function<double(double)> ref;
  std::function<double(double)> dref;  // derivative
};

double sigm(double x) { return 1 / (1 + std::exp(-x)); }
double gelu_tanh_ref(double x) {
  const double k = std::sqrt(2 / M_PI);
  return 0.5 * x * (1 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
double gelu_tanh_dref(double x) {
  const double k = std::sqrt(2 / M_PI), u = k * (x + 0.044715 * x * x * x), t = std::tanh(u);
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}

std::vector<UnaryCase> unary_cases() {
  return {
      {"sin", [](const Tensor& x) { return tg::sin(x); }, [](double x) { return std::sin(x); },
       [](double x) { return std::cos(x); }},
      {"cos", [](const Tensor& x) { return x.cos(); }, [](double x) { return std::cos(x); },
       [](double x) { return -std::sin(x); }},
      {"rsqrt", [](const Tensor& x) { return x.abs().rsqrt(); }, [](double x) { return 1 / std::sqrt(std::abs(x)); },
       [](double x) { return -0.5 * std::pow(std::abs(x), -1.5) * (x > 0 ? 1 : -1); }},
      {"silu", [](const Tensor& x) { return tg::silu(x); }, [](double x) { return x * sigm(x); },
       [](double x) { return sigm(x) * (1 + x * (1 - sigm(x))); }},
      {"gelu_tanh", [](const Tensor& x) { return x.gelu("tanh"); }, gelu_tanh_ref, gelu_tanh_dref},
      {"softplus", [](const Tensor& x) { return tg::softplus(x); }, [](double x) { return std::log1p(std::exp(x)); },
       [](double x) { return sigm(x); }},
      {"softplus_beta", [](const Tensor& x) { return tg::softplus(x, 2.0, 1.0); },
       [](double x) { return 2 * x > 1 ? x : std::log1p(std::exp(2 * x)) / 2; },
       [](double x) { return 2 * x > 1 ? 1 : sigm(2 * x); }},
      {"leaky_relu", [](const Tensor& x) { return tg::leaky_relu(x); }, [](double x) { return x > 0 ? x : 0.01 * x; },
       [](double x) { return x > 0 ? 1 : 0.01; }},
      {"leaky_relu_0.2", [](const Tensor& x) { return tg::leaky_relu(x, 0.2); },
       [](double x) { return x > 0 ? x : 0.2 * x; }, [](double x) { return x > 0 ? 1 : 0.2; }},
      {"elu", [](const Tensor& x) { return tg::elu(x); }, [](double x) { return x > 0 ? x : std::expm1(x); },
       [](double x) { return x > 0 ? 1 : std::exp(x); }},
      {"elu_alpha", [](const Tensor& x) { return tg::elu(x, 1.5); },
       [](double x) { return x > 0 ? x : 1.5 * std::expm1(x); },
       [](double x) { return x > 0 ? 1 : 1.5 * std::exp(x); }},
  };
}

// Values away from the kinks (|x| >= 0.05) so a rounded input stays on its side.
std::vector<double> sample_values(int n) {
  std::vector<double> v;
  for (int i = 0; i < n; ++i) {
    double x = -4.0 + 8.0 * (i + 0.5) / n;
    if (std::abs(x) < 0.05) x = 0.3;
    v.push_back(x);
  }
  return v;
}

TEST_P(GeneralOps, UnaryValuesEveryDtypeAndLayout) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const std::vector<double> xs = sample_values(48);
  for (const UnaryCase& c : unary_cases()) {
    for (DType dt : kFloatTypes) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      // [6, 8] stored transposed: a non-contiguous input.
      Tensor base = tg::tensor<double>(xs, {8, 6}).to(dev(), dt);
      Tensor x = base.t();
      ASSERT_FALSE(x.is_contiguous());
      Tensor y = c.fn(x);
      EXPECT_EQ(y.dtype(), dt);
      EXPECT_EQ(y.sizes(), Shape({6, 8}));
      std::vector<double> xin = host(x), got = host(y), want;
      for (double v : xin) want.push_back(c.ref(v));
      const double tol = tol_of(dt);
      expect_near_vec(got, want, tol, 2 * tol, c.name);
    }
  }
}

TEST_P(GeneralOps, UnaryGradientsAgainstDerivative) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const std::vector<double> xs = sample_values(20);
  for (const UnaryCase& c : unary_cases()) {
    for (DType dt : {kFloat64, kFloat32}) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      Tensor x = tg::tensor<double>(xs, {4, 5}).to(dev(), dt);
      x.requires_grad_();
      Tensor w = tg::tensor<double>(std::vector<double>{1, -2, 0.5, 3, 0.25}, {5}).to(dev(), dt);
      (c.fn(x) * w).sum().backward();  // broadcast weight: g varies per column
      std::vector<double> got = host(x.grad()), want;
      for (size_t i = 0; i < xs.size(); ++i) want.push_back(c.dref(xs[i]) * host(w)[i % 5]);
      expect_near_vec(got, want, 10 * tol_of(dt), 10 * tol_of(dt), c.name);
    }
  }
}

// GELU's tanh form on float16 / bfloat16 tensors (CUDA: x sigma(2u) on the hardware exp and
// reciprocal) over the whole useful range, values and gradients, against float64 from the rounded
// inputs: within one rounding of the storage type (2e-6 absolute: float arithmetic near 0), and
// exactly 0 / x far out.
TEST_P(GeneralOps, GeluTanhHalfValuesAndGradientsOverTheRange) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  std::vector<double> xs;
  for (int i = 0; i < 481; ++i) xs.push_back(-12.0 + 0.05 * i);
  for (DType dt : {kFloat16, kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const double ulp = dt == kFloat16 ? 0x1p-11 : 0x1p-8;  // half an ulp, relative
    Tensor x = tg::tensor<double>(xs, {481}).to(dev(), dt).detach().requires_grad_(true);
    Tensor g = tg::tensor<double>(std::vector<double>(481, 1.0), {481}).to(dev(), dt);
    Tensor y = x.gelu("tanh");
    y.backward(g);
    const std::vector<double> xr = host(x), got = host(y), gx = host(x.grad());
    for (size_t i = 0; i < xr.size(); ++i) {
      const double want = gelu_tanh_ref(xr[i]), dwant = gelu_tanh_dref(xr[i]);
      EXPECT_NEAR(got[i], want, 2 * ulp * std::abs(want) + 2e-6) << "gelu(" << xr[i] << ")";
      EXPECT_NEAR(gx[i], dwant, 2 * ulp * std::abs(dwant) + 2e-6) << "gelu'(" << xr[i] << ")";
    }
    EXPECT_EQ(got.front(), 0.0);
    EXPECT_EQ(got.back(), 12.0);
    EXPECT_EQ(gx.front(), 0.0);
    EXPECT_EQ(gx.back(), 1.0);
  }
}

TEST_P(GeneralOps, UnaryMathOfIntegersComputesInFloat32) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  Tensor i = tg::tensor<int64_t>(std::vector<int64_t>{1, 4, 9}, TensorOptions(kInt64).device(dev()));
  Tensor s = tg::sin(i), r = tg::rsqrt(i);
  EXPECT_EQ(s.dtype(), kFloat32);
  expect_near_vec(host(s), {std::sin(1.0), std::sin(4.0), std::sin(9.0)}, 1e-6, 0, "sin int");
  expect_near_vec(host(r), {1.0, 0.5, 1.0 / 3}, 1e-6, 0, "rsqrt int");
}

TEST_P(GeneralOps, SoftplusLargeInputsStayLinear) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  Tensor x = tg::tensor<float>(std::vector<float>{25.f, 1000.f, -1000.f}, TensorOptions().device(dev()));
  expect_near_vec(host(tg::softplus(x)), {25, 1000, 0}, 1e-6, 0, "softplus");
}

TEST_P(GeneralOps, ActivationErrorsNameTheOp) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  Tensor i = tg::tensor<int64_t>(std::vector<int64_t>{1, 2}, TensorOptions(kInt64).device(dev()));
  for (auto& [name, fn] :
       std::vector<std::pair<std::string, std::function<Tensor()>>>{{"silu", [&] { return tg::silu(i); }},
                                                                    {"gelu", [&] { return tg::gelu(i, "tanh"); }},
                                                                    {"softplus", [&] { return tg::softplus(i); }},
                                                                    {"leaky_relu", [&] { return tg::leaky_relu(i); }},
                                                                    {"elu", [&] { return tg::elu(i); }}}) {
    try {
      fn();
      ADD_FAILURE() << name << " accepted int64";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name + ": expected a floating tensor, got int64"), std::string::npos)
          << e.what();
    }
  }
  Tensor f = tg::zeros({2}, TensorOptions().device(dev()));
  EXPECT_THROW(tg::gelu(f, "erf"), Error);
  EXPECT_THROW(nn::GELU("tanhh"), Error);
}

TEST_P(GeneralOps, ActivationModules) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  Tensor x = tg::tensor<float>(std::vector<float>{-2.f, -0.5f, 0.5f, 2.f}, TensorOptions().device(dev()));
  std::vector<double> xv = host(x);
  auto each = [&](double (*f)(double)) {
    std::vector<double> out;
    for (double v : xv) out.push_back(f(v));
    return out;
  };
  nn::SiLU silu;
  nn::Identity id;
  nn::GELU gt("tanh");
  nn::LeakyReLU lr(0.1);
  nn::ELU elu(2.0);
  nn::Softplus sp(1.0, 20.0);
  expect_near_vec(host(silu(x)), each([](double v) { return v * sigm(v); }), 1e-6, 1e-6, "SiLU");
  EXPECT_TRUE(id(x).is_same(x));
  expect_near_vec(host(gt(x)), each(gelu_tanh_ref), 1e-6, 1e-6, "GELU(tanh)");
  expect_near_vec(host(lr(x)), each([](double v) { return v > 0 ? v : 0.1 * v; }), 1e-6, 1e-6, "LeakyReLU");
  expect_near_vec(host(elu(x)), each([](double v) { return v > 0 ? v : 2 * std::expm1(v); }), 1e-6, 1e-6, "ELU");
  expect_near_vec(host(sp(x)), each([](double v) { return std::log1p(std::exp(v)); }), 1e-6, 1e-6, "Softplus");
  EXPECT_EQ(gt.approximate, "tanh");
  EXPECT_EQ(nn::GELU().approximate, "none");
  EXPECT_EQ(silu.name(), "SiLU");
  EXPECT_TRUE(silu.state_dict().empty());
}

// Under autocast rsqrt and softplus run in float32 (PyTorch's fp32 list); sin / silu keep the dtype.
TEST_P(GeneralOps, AutocastCategories) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  Tensor x = tg::rand({4}, TensorOptions().device(dev()).dtype(kFloat16)) + 0.5;
  amp::autocast guard(dev().type(), kFloat16);
  EXPECT_EQ(tg::rsqrt(x).dtype(), kFloat32);
  EXPECT_EQ(tg::softplus(x).dtype(), kFloat32);
  EXPECT_EQ(tg::sin(x).dtype(), kFloat16);
  EXPECT_EQ(tg::silu(x).dtype(), kFloat16);
}

INSTANTIATE_TEST_SUITE_P(Devices, GeneralOps, ::testing::Values(Dev::CPU, Dev::CUDA), dev_name);

}  // namespace
}  // namespace tg::testing
