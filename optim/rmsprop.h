// RMSprop (optionally centered, with momentum and L2 weight decay): torch.optim.RMSprop's update,
// defaults and state names.
#pragma once
#include <vector>

#include <tapegrad/optim/optimizer.h>

namespace tg::optim {

struct RMSpropOptions {
  double lr = 1e-2;
  double alpha = 0.99;
  double eps = 1e-8;
  double weight_decay = 0;
  double momentum = 0;
  bool centered = false;
  bool maximize = false;

  template <class F>
  void visit(F&& f) {
    f("lr", lr);
    f("alpha", alpha);
    f("eps", eps);
    f("weight_decay", weight_decay);
    f("momentum", momentum);
    f("centered", centered);
    f("maximize", maximize);
  }
};

// State per parameter, created on its first step: "step" (float32 0-d on the parameter's device;
// a step skipped on found_inf leaves it unchanged), "square_avg", "momentum_buffer" (momentum > 0)
// and "grad_avg" (centered), in the parameter's dtype. On CUDA each group's step is a fused
// multi-tensor kernel (optim/cuda/fused_rmsprop.cu).
class RMSprop : public GroupedOptimizer<RMSpropOptions> {
 public:
  explicit RMSprop(std::vector<Tensor> params, RMSpropOptions options = {});
  RMSprop(std::vector<ParamGroup<RMSpropOptions>> groups, RMSpropOptions defaults = {});
  using Optimizer::step;
  void step(const StepArgs& args) override;
  const char* name() const override { return "RMSprop"; }

 protected:
  void validate(const RMSpropOptions& o) const override;
};

}  // namespace tg::optim
