// Activation modules: stateless wrappers around the elementwise ops, for use
// inside Sequential.
#pragma once
#include <string>
#include <utility>

#include <tapegrad/nn/module.h>

namespace tg::nn {

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return relu(x); }
  std::string name() const override { return "ReLU"; }
};

// The exact (erf) form, torch's default; GELU("tanh") the tanh approximation.
class GELU : public Module {
 public:
  GELU() = default;
  explicit GELU(std::string approximate) : approximate(std::move(approximate)) {
    TG_CHECK(this->approximate == "none" || this->approximate == "tanh",
             "GELU: approximate must be \"none\" or \"tanh\", got \"", this->approximate, "\"");
  }
  Tensor forward(const Tensor& x) override { return approximate == "none" ? gelu(x) : gelu(x, approximate); }
  std::string approximate = "none";
  std::string name() const override { return "GELU"; }
};

class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override { return tanh(x); }
  std::string name() const override { return "Tanh"; }
};

class Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& x) override { return sigmoid(x); }
  std::string name() const override { return "Sigmoid"; }
};

// ---- issue 15: general ops
class SiLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return silu(x); }
  std::string name() const override { return "SiLU"; }
};

// Returns its input (a placeholder layer, as torch.nn.Identity).
class Identity : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x; }
  std::string name() const override { return "Identity"; }
};

class LeakyReLU : public Module {
 public:
  explicit LeakyReLU(double negative_slope = 0.01) : negative_slope(negative_slope) {}
  Tensor forward(const Tensor& x) override { return leaky_relu(x, negative_slope); }
  std::string name() const override { return "LeakyReLU"; }
  double negative_slope;
};

class ELU : public Module {
 public:
  explicit ELU(double alpha = 1.0) : alpha(alpha) {}
  Tensor forward(const Tensor& x) override { return elu(x, alpha); }
  std::string name() const override { return "ELU"; }
  double alpha;
};

class Softplus : public Module {
 public:
  explicit Softplus(double beta = 1.0, double threshold = 20.0) : beta(beta), threshold(threshold) {}
  Tensor forward(const Tensor& x) override { return softplus(x, beta, threshold); }
  std::string name() const override { return "Softplus"; }
  double beta, threshold;
};

}  // namespace tg::nn
