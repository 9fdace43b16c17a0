// Adagrad (with learning-rate decay and L2 weight decay): torch.optim.Adagrad's update, defaults
// and state names.
#pragma once
#include <vector>

#include <tapegrad/optim/optimizer.h>

namespace tg::optim {

struct AdagradOptions {
  double lr = 1e-2;
  double lr_decay = 0;
  double weight_decay = 0;
  double initial_accumulator_value = 0;
  double eps = 1e-10;
  bool maximize = false;

  template <class F>
  void visit(F&& f) {
    f("lr", lr);
    f("lr_decay", lr_decay);
    f("weight_decay", weight_decay);
    f("initial_accumulator_value", initial_accumulator_value);
    f("eps", eps);
    f("maximize", maximize);
  }
};

// State per parameter, created at construction as PyTorch does (and on the first step of a
// parameter that has none, e.g. one added by add_param_group): "step" (float32 0-d on the
// parameter's device; a step skipped on found_inf leaves it unchanged) and "sum" (the parameter's
// dtype, filled with initial_accumulator_value). The step at count t uses
// lr / (1 + (t - 1) * lr_decay). On CUDA each group's step is a fused multi-tensor kernel
// (optim/cuda/fused_adagrad.cu).
class Adagrad : public GroupedOptimizer<AdagradOptions> {
 public:
  explicit Adagrad(std::vector<Tensor> params, AdagradOptions options = {});
  Adagrad(std::vector<ParamGroup<AdagradOptions>> groups, AdagradOptions defaults = {});
  using Optimizer::step;
  void step(const StepArgs& args) override;
  const char* name() const override { return "Adagrad"; }

 protected:
  void validate(const AdagradOptions& o) const override;

 private:
  void init_state(const Tensor& param, double initial_accumulator_value);
};

}  // namespace tg::optim
