// Adam (with L2 weight decay and AMSGrad) and AdamW (decoupled weight decay):
// torch.optim.Adam / AdamW's updates, bias corrections and defaults.
#pragma once
#include <utility>
#include <vector>

#include <tapegrad/optim/optimizer.h>

namespace tg::optim {

struct AdamOptions {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0;
  bool amsgrad = false;
  bool maximize = false;

  template <class F>
  void visit(F&& f) {
    f("lr", lr);
    f("betas", betas);
    f("eps", eps);
    f("weight_decay", weight_decay);
    f("amsgrad", amsgrad);
    f("maximize", maximize);
  }
};

// The same fields; only the weight_decay default (1e-2) and its meaning differ.
struct AdamWOptions {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;

  template <class F>
  void visit(F&& f) {
    f("lr", lr);
    f("betas", betas);
    f("eps", eps);
    f("weight_decay", weight_decay);
    f("amsgrad", amsgrad);
    f("maximize", maximize);
  }
};

// State per parameter: "step" (float32 0-d, on the parameter's device; it advances
// only when a step is taken, so a skipped AMP step leaves it unchanged), "exp_avg",
// "exp_avg_sq" and, with amsgrad, "max_exp_avg_sq" (the parameter's dtype).
// On CUDA each group's step is a fused multi-tensor kernel (optim/cuda/fused_adam.cu).
class Adam : public GroupedOptimizer<AdamOptions> {
 public:
  explicit Adam(std::vector<Tensor> params, AdamOptions options = {});
  Adam(std::vector<ParamGroup<AdamOptions>> groups, AdamOptions defaults = {});
  using Optimizer::step;
  void step(const StepArgs& args) override;
  const char* name() const override { return "Adam"; }

 protected:
  void validate(const AdamOptions& o) const override;
};

class AdamW : public GroupedOptimizer<AdamWOptions> {
 public:
  explicit AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  AdamW(std::vector<ParamGroup<AdamWOptions>> groups, AdamWOptions defaults = {});
  using Optimizer::step;
  void step(const StepArgs& args) override;
  const char* name() const override { return "AdamW"; }

 protected:
  void validate(const AdamWOptions& o) const override;
};

}  // namespace tg::optim
