// Activation modules: stateless wrappers around the elementwise ops, for use
// inside Sequential.
#pragma once
#include <tapegrad/nn/module.h>

namespace tg::nn {

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return relu(x); }
  std::string name() const override { return "ReLU"; }
};

// The exact (erf) form, torch's default.
class GELU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return gelu(x); }
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

}  // namespace tg::nn
