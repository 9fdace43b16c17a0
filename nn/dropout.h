// Dropout: functional::dropout and the module nn::Dropout. The mask comes from the device's
// counter-based Philox generator and is regenerated in backward from (seed, offset), never stored;
// a seed gives the same mask on the CPU and on CUDA.
#pragma once
#include <tapegrad/nn/module.h>

namespace tg::nn {

namespace functional {
// training: each element zeroed with probability p, the rest scaled by 1 / (1 - p) (p = 1: all
// zeros). Not training, or p = 0: x itself. p outside [0, 1] is a tg::Error.
Tensor dropout(const Tensor& x, double p = 0.5, bool training = true);
}  // namespace functional

// Reads the module's training flag: active after train() (the default), x itself after eval().
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Dropout"; }

  double p = 0.5;
};

}  // namespace tg::nn
