// Stochastic gradient descent with momentum, dampening, weight decay and Nesterov
// momentum: torch.optim.SGD's update and defaults. The learning rate is required.
#pragma once
#include <limits>
#include <vector>

#include <tapegrad/optim/optimizer.h>

namespace tg::optim {

struct SGDOptions {
  double lr = std::numeric_limits<double>::quiet_NaN();  // required: NaN means "not given"
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool maximize = false;

  template <class F>
  void visit(F&& f) {
    f("lr", lr);
    f("momentum", momentum);
    f("dampening", dampening);
    f("weight_decay", weight_decay);
    f("nesterov", nesterov);
    f("maximize", maximize);
  }
};

// State per parameter with momentum: "momentum_buffer" (the parameter's dtype) and
// "step" (float32 0-d, counts the steps taken, so that the first step initializes the
// buffer even when it is decided on the device). Without momentum: no state.
// On CUDA each group's step is a fused multi-tensor kernel (optim/cuda/fused_sgd.cu).
class SGD : public GroupedOptimizer<SGDOptions> {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  SGD(std::vector<ParamGroup<SGDOptions>> groups, SGDOptions defaults);
  using Optimizer::step;
  void step(const StepArgs& args) override;
  const char* name() const override { return "SGD"; }

 protected:
  void validate(const SGDOptions& o) const override;
};

}  // namespace tg::optim
