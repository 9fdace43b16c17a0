// Learning-rate schedulers: torch.optim.lr_scheduler's classes and formulas (the chainable forms
// that PyTorch 2.x's scheduler.step() uses, and the closed forms where SequentialLR restarts a
// scheduler). Each keeps one lr per parameter group and writes it with Optimizer::set_lr, which on
// CUDA is an async write of the group's device lr: call step() outside a captured tg::cuda::Graph
// and the next replay uses the new lr.
//
//   tg::optim::SGD opt(params, {.lr = 0.1, .momentum = 0.9});
//   tg::optim::lr_scheduler::CosineAnnealingLR sched(opt, 100);
//   for (int epoch = 0; epoch < 100; ++epoch) { train(opt); sched.step(); }
//
// Like PyTorch, the constructor performs the first step (last_epoch becomes 0), and the first
// scheduler built on an optimizer records each group's lr as its "initial_lr", the base lr of
// every later scheduler on it. Schedulers keep a pointer to the optimizer: it must outlive them.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <tapegrad/nn/module.h>
#include <tapegrad/optim/optimizer.h>

namespace tg::optim::lr_scheduler {

// The base of every scheduler (PyTorch's LRScheduler).
class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // Advances last_epoch by one and sets every group's lr.
  virtual void step();
  // The lr of each group as this scheduler last set it.
  std::vector<double> get_last_lr() const { return last_lr_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  int64_t last_epoch() const { return last_epoch_; }
  Optimizer& optimizer() const { return *optimizer_; }
  virtual const char* name() const = 0;

  // PyTorch's entries as 0-d int64 / float64 tensors, lists as 1-D ("base_lrs", "_last_lr",
  // "last_epoch", "_step_count", and the class's own, e.g. "gamma", "milestones"), plus "type": the
  // class name as uint8 bytes. Loading checks the type, every key, dtype and shape, and the values'
  // ranges before anything changes; it sets the scheduler's state, not the optimizer's lr.
  nn::StateDict state_dict() const;
  void load_state_dict(const nn::StateDict& state_dict);

 protected:
  // track_initial_lr: record each group's lr as its initial_lr when not yet set and take the
  // initial_lrs as base_lrs (every scheduler but ReduceLROnPlateau and SequentialLR).
  LRScheduler(Optimizer& optimizer, bool track_initial_lr);
  // PyTorch's _initial_step: step count 0, then one step flagged as the initial one. Called at the
  // end of each derived constructor.
  void initial_step();
  // The chainable form at last_epoch.
  virtual std::vector<double> get_lr() = 0;
  // The closed form at last_epoch, where PyTorch has one (_get_closed_form_lr).
  virtual std::optional<std::vector<double>> closed_form_lr() const { return std::nullopt; }
  // step(epoch) as SequentialLR calls it at a milestone (epoch 0): the closed form, or get_lr.
  virtual void step_to(int64_t epoch);
  // Undoes the constructor's step for SequentialLR (last_epoch -= 1; nested ones recurse).
  virtual void undo_initial_step() { --last_epoch_; }
  // The class's own entries, and reading them back (validated, before anything is assigned).
  virtual void save_extra(nn::StateDict& out) const { (void)out; }
  virtual void load_extra(const nn::StateDict& in) { (void)in; }
  // Keys whose 1-D length may differ from this scheduler's (e.g. "milestones").
  virtual bool variable_length(const std::string& key) const {
    (void)key;
    return false;
  }

  std::vector<double> current_lrs() const;
  void set_lrs(const std::vector<double>& lrs);
  void check_group_count(const char* what) const;

  Optimizer* optimizer_;
  std::vector<double> base_lrs_, last_lr_;
  int64_t last_epoch_ = -1;
  int64_t step_count_ = 0;
  bool is_initial_ = false;
  friend class SequentialLR;
};

// lr = base_lr * lr_lambda(last_epoch); one function for every group, or one per group.
// state_dict() holds no functions.
class LambdaLR final : public LRScheduler {
 public:
  LambdaLR(Optimizer& optimizer, std::function<double(int64_t)> lr_lambda);
  LambdaLR(Optimizer& optimizer, std::vector<std::function<double(int64_t)>> lr_lambdas);
  const char* name() const override { return "LambdaLR"; }

 protected:
  std::vector<double> get_lr() override;

 private:
  std::vector<std::function<double(int64_t)>> lr_lambdas_;
};

// Multiplies the lr by gamma every step_size steps (step_size > 0, gamma >= 0).
class StepLR final : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  const char* name() const override { return "StepLR"; }

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void save_extra(nn::StateDict& out) const override;
  void load_extra(const nn::StateDict& in) override;

 private:
  int64_t step_size_;
  double gamma_;
};

// Multiplies the lr by gamma at each milestone (sorted, >= 0; a repeated milestone multiplies by
// gamma as many times).
class MultiStepLR final : public LRScheduler {
 public:
  MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);
  const char* name() const override { return "MultiStepLR"; }

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void save_extra(nn::StateDict& out) const override;
  void load_extra(const nn::StateDict& in) override;
  bool variable_length(const std::string& key) const override { return key == "milestones"; }

 private:
  std::vector<int64_t> milestones_;
  double gamma_;
};

// Multiplies the lr by factor (0 < factor <= 1) until last_epoch reaches total_iters (> 0).
class ConstantLR final : public LRScheduler {
 public:
  ConstantLR(Optimizer& optimizer, double factor = 1.0 / 3, int64_t total_iters = 5);
  const char* name() const override { return "ConstantLR"; }

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void save_extra(nn::StateDict& out) const override;
  void load_extra(const nn::StateDict& in) override;

 private:
  double factor_;
  int64_t total_iters_;
};

// Scales the lr by a factor going linearly from start_factor (0, 1] to end_factor [0, 1] over
// total_iters (> 0) steps.
class LinearLR final : public LRScheduler {
 public:
  LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0, int64_t total_iters = 5);
  const char* name() const override { return "LinearLR"; }

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void save_extra(nn::StateDict& out) const override;
  void load_extra(const nn::StateDict& in) override;

 private:
  double start_factor_, end_factor_;
  int64_t total_iters_;
};

// Multiplies the lr by gamma (>= 0) every step.
class ExponentialLR final : public LRScheduler {
 public:
  ExponentialLR(Optimizer& optimizer, double gamma);
  const char* name() const override { return "ExponentialLR"; }

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void save_extra(nn::StateDict& out) const override;
  void load_extra(const nn::StateDict& in) override;

 private:
  double gamma_;
};

// Cosine annealing from the base lr to eta_min over T_max (> 0) steps, PyTorch's recursive form
// (past T_max the cosine continues, back up).
class CosineAnnealingLR final : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t T_max,
                    double eta_min = 0.0);  // NOLINT(readability-identifier-naming)
  const char* name() const override { return "CosineAnnealingLR"; }

 protected:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() const override;
  void save_extra(nn::StateDict& out) const override;
  void load_extra(const nn::StateDict& in) override;

 private:
  int64_t T_max_;
  double eta_min_;
};

// SGDR: cosine annealing restarting after T_0 (> 0) steps, each period T_mult (>= 1) times longer.
class CosineAnnealingWarmRestarts final : public LRScheduler {
 public:
  CosineAnnealingWarmRestarts(Optimizer& optimizer, int64_t T_0, int64_t T_mult = 1, double eta_min = 0.0);  // NOLINT
  void step() override;
  const char* name() const override { return "CosineAnnealingWarmRestarts"; }

 protected:
  std::vector<double> get_lr() override;
  void step_to(int64_t epoch) override;
  void save_extra(nn::StateDict& out) const override;
  void load_extra(const nn::StateDict& in) override;

 private:
  int64_t T_0_, T_i_, T_mult_, T_cur_;
  double eta_min_;
};

// Runs `schedulers` (built on the same optimizer, none a ReduceLROnPlateau) one after the other,
// switching at the milestones (strictly increasing, > 0; one fewer than the schedulers); at a
// milestone the next scheduler restarts from epoch 0.
class SequentialLR final : public LRScheduler {
 public:
  SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones);
  void step() override;
  const char* name() const override { return "SequentialLR"; }
  const std::vector<std::shared_ptr<LRScheduler>>& schedulers() const { return schedulers_; }

 protected:
  std::vector<double> get_lr() override;
  void undo_initial_step() override;
  void save_extra(nn::StateDict& out) const override;
  void load_extra(const nn::StateDict& in) override;

 private:
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

struct OneCycleLROptions {
  int64_t total_steps = 0;  // 0: epochs * steps_per_epoch (both then required)
  int64_t epochs = 0;
  int64_t steps_per_epoch = 0;
  double pct_start = 0.3;                      // in [0, 1]
  std::string anneal_strategy = "cos";         // "cos" or "linear"
  bool cycle_momentum = true;                  // needs an optimizer with "momentum" (SGD) or "betas" (Adam: beta1)
  std::vector<double> base_momentum = {0.85};  // one value, or one per group
  std::vector<double> max_momentum = {0.95};
  double div_factor = 25.0;       // initial_lr = max_lr / div_factor
  double final_div_factor = 1e4;  // min_lr = initial_lr / final_div_factor
  bool three_phase = false;
};

// The 1cycle policy: from max_lr / div_factor up to max_lr (pct_start of the steps), then down to
// min_lr (two phases), or back to the initial lr and then down (three_phase); momentum (or beta1)
// cycles inversely between max_momentum and base_momentum. Stepping past total_steps is a tg::Error.
// The momentum is set on the host (Optimizer::set_group_option): unlike the lr, a captured CUDA
// graph keeps the momentum of its capture.
class OneCycleLR final : public LRScheduler {
 public:
  OneCycleLR(Optimizer& optimizer, double max_lr, OneCycleLROptions options = {});
  OneCycleLR(Optimizer& optimizer, std::vector<double> max_lr, OneCycleLROptions options = {});
  const char* name() const override { return "OneCycleLR"; }
  int64_t total_steps() const { return total_steps_; }

 protected:
  std::vector<double> get_lr() override;
  void save_extra(nn::StateDict& out) const override;
  void load_extra(const nn::StateDict& in) override;

 private:
  struct Phase {
    double end_step;
    int start_lr, end_lr, start_momentum, end_momentum;  // 0 initial, 1 max, 2 min (lr); 0 max, 1 base (momentum)
  };
  void build_phases();
  double anneal(double start, double end, double pct) const;
  int64_t total_steps_;
  double pct_start_;
  bool linear_, three_phase_, cycle_momentum_, use_beta1_ = false;
  double div_factor_, final_div_factor_;
  std::vector<double> max_lrs_, initial_lrs_, min_lrs_, base_momentums_, max_momentums_;
  std::vector<Phase> phases_;
};

struct ReduceLROnPlateauOptions {
  std::string mode = "min";  // "min" or "max"
  double factor = 0.1;       // new_lr = lr * factor, in [0, 1)
  int64_t patience = 10;
  double threshold = 1e-4;
  std::string threshold_mode = "rel";  // "rel" or "abs"
  int64_t cooldown = 0;
  std::vector<double> min_lr = {0.0};  // one value, or one per group
  double eps = 1e-8;                   // smaller lr changes are skipped
};

// Multiplies the lr by factor when the metric passed to step(metric) has not improved for more
// than `patience` steps. step() without a metric is a tg::Error.
class ReduceLROnPlateau final : public LRScheduler {
 public:
  explicit ReduceLROnPlateau(Optimizer& optimizer, ReduceLROnPlateauOptions options = {});
  void step() override;
  void step(double metric);
  void step(const Tensor& metric);  // one element, read on the host (a sync for a CUDA tensor)
  const char* name() const override { return "ReduceLROnPlateau"; }
  double best() const { return best_; }
  int64_t num_bad_epochs() const { return num_bad_epochs_; }

 protected:
  std::vector<double> get_lr() override;
  void save_extra(nn::StateDict& out) const override;
  void load_extra(const nn::StateDict& in) override;

 private:
  bool is_better(double a, double best) const;
  bool max_mode_, abs_threshold_;
  double factor_, threshold_, eps_;
  int64_t patience_, cooldown_;
  std::vector<double> min_lrs_;
  double best_;
  int64_t num_bad_epochs_ = 0, cooldown_counter_ = 0;
};

}  // namespace tg::optim::lr_scheduler
