// The optimizer base: parameter groups with per-group options, per-parameter
// state, zero_grad, step (optionally with device-side grad_scale / found_inf for
// AMP) and a flat state_dict. SGD, Adam and AdamW (optim/sgd.h, optim/adam.h)
// derive from GroupedOptimizer<TheirOptions>.
#pragma once
#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <tapegrad/core/error.h>
#include <tapegrad/core/state_dict.h>
#include <tapegrad/core/tensor.h>

namespace tg::optim {

// Extra inputs of a step, both optional, both float32 scalars (numel 1) on the
// parameters' device. Gradients are divided by grad_scale before use; when
// found_inf != 0 the step does nothing at all (parameters, state and step counts
// stay bit-identical). On CUDA both are read by the kernels: no host sync.
struct StepArgs {
  Tensor grad_scale;
  Tensor found_inf;
};

// An optimizer's checkpoint is a StateDict (core/state_dict.h), every entry a tensor,
// in PyTorch's order (all state, then the groups):
//   "state.<i>.<name>"         per-parameter state of parameter i, numbered over all
//                              groups in order (PyTorch's numbering): "step" (float32
//                              0-d), "exp_avg", "momentum_buffer", ...
//   "param_groups.<g>.<option>" each option of group g: float64 0-d for numbers, bool
//                              0-d for flags, float64 [2] for betas
//   "param_groups.<g>.params"  int64 [n]: the indices of the group's parameters
// torch.optim's nested {'state': {i: {name: t}}, 'param_groups': [{option: v, 'params': [i..]}]}
// is this with the dots as nesting (docs/api.md; tests/parity/optim_state_to_torch.py).
// state_dict() returns the live state tensors (like PyTorch, not copies), so
// tg::save them before the next step if a snapshot is wanted.
using OptimizerStateDict = StateDict;  // the same type, for existing code

// The named state tensors of one parameter (a few entries, kept in insertion order;
// references stay valid when entries are added).
class ParamState {
 public:
  Tensor* find(std::string_view name);
  const Tensor* find(std::string_view name) const;
  Tensor& operator[](std::string_view name);  // inserts an undefined tensor when missing
  const Tensor& at(std::string_view name) const;  // tg::Error when missing
  bool empty() const { return entries_.empty(); }
  auto begin() const { return entries_.begin(); }
  auto end() const { return entries_.end(); }

 private:
  std::deque<std::pair<std::string, Tensor>> entries_;
};

// The device-side caches of a fused step (pointer lists); defined by the CUDA code.
struct FusedCache {
  virtual ~FusedCache() = default;
};

// What the fused CUDA step of one (group, device, dtype) bucket is handed: its cache slot and the
// group's lr on that device (a float64 0-d device scalar the kernels read; null on the CPU).
struct FusedStepTarget {
  std::unique_ptr<FusedCache>& cache;
  const double* lr = nullptr;
};

class Optimizer {
 public:
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Clears every parameter's gradient: drops it (set_to_none, the default, as
  // PyTorch) or fills it with zeros.
  void zero_grad(bool set_to_none = true);
  void step() { step(StepArgs{}); }
  // Parameters whose grad() is undefined are skipped, as in PyTorch.
  virtual void step(const StepArgs& args) = 0;

  virtual size_t num_param_groups() const = 0;
  virtual const std::vector<Tensor>& params(size_t group) const = 0;
  std::vector<Tensor> parameters() const;  // every group's, in order
  // The learning rate of a group, and setters for schedulers.
  virtual double lr(size_t group = 0) const = 0;
  // On CUDA the new lr is also written to the group's device copy (an async fill on the current
  // stream, no host sync), which the fused step kernels read: a captured tg::cuda::Graph step
  // replays with the lr set last. Call it (scheduler.step()) outside the captured region.
  virtual void set_lr(size_t group, double lr) = 0;
  void set_lr(double lr);  // every group

  // ---- for lr schedulers (optim/lr_scheduler.h)
  // PyTorch's param_groups[g]["initial_lr"]: set by the first scheduler built on the optimizer
  // (OneCycleLR overwrites it); NaN before. Not part of state_dict().
  double initial_lr(size_t group) const;
  void set_initial_lr(size_t group, double lr);
  // A numeric option of a group by PyTorch's name ("momentum"; "betas" gives two values): false
  // when the optimizer has no such option. set_group_option validates as the constructor does.
  virtual bool group_option(size_t group, std::string_view name, std::vector<double>& out) const;
  virtual void set_group_option(size_t group, std::string_view name, const std::vector<double>& v);

  // The state of one parameter (null before its first step).
  const ParamState* state(const Tensor& param) const;

  StateDict state_dict() const;
  // Checks the group and parameter counts, restores the options and copies the
  // state onto each parameter's device (state in the parameter's dtype, step in
  // float32). Unknown or malformed entries, and state shaped unlike its parameter,
  // are a tg::Error; everything is validated before anything changes.
  void load_state_dict(const StateDict& state_dict);

  virtual const char* name() const = 0;

 protected:
  Optimizer() = default;
  // Options of a group as named tensors, and back.
  virtual void save_group_options(size_t group, const std::string& prefix, StateDict& out) const = 0;
  virtual void load_group_options(size_t group, const std::string& prefix, const StateDict& in) = 0;
  // Validates a new group's parameters against every existing group.
  void check_new_params(const std::vector<Tensor>& params) const;
  // Creates the device lr copies of a new group (one per CUDA device of its parameters), and
  // writes a group's copies after its lr changed.
  void track_group_lr(size_t group);
  void write_device_lr(size_t group);

 public:
  // Internal, for the step code of the optimizers: the mutable state of a
  // parameter (created empty on first use) and what the fused step of a (group, device, dtype)
  // bucket gets: its cache slot and the group's device lr (refreshed here when the lr was changed
  // through param_groups() rather than set_lr; a tg::Error while capturing).
  ParamState& state_of(const Tensor& param) { return state_[param.impl_ptr().get()]; }
  FusedStepTarget fused_cache(size_t group, Device device, DType dtype);

 private:
  std::unordered_map<const TensorImpl*, ParamState> state_;
  struct CacheSlot {
    size_t group;
    Device device;
    DType dtype;
    std::unique_ptr<FusedCache> cache;
  };
  std::vector<CacheSlot> caches_;
  struct LrSlot {
    size_t group;
    Device device;
    Tensor value;    // float64 0-d on `device`
    double written;  // the host value last written to it
  };
  std::vector<LrSlot> lr_slots_;
  std::vector<double> initial_lrs_;
};

namespace detail {
Tensor option_tensor(double v);
Tensor option_tensor(bool v);
Tensor option_tensor(const std::pair<double, double>& v);
void option_value(const Tensor& t, const std::string& key, double& v);
void option_value(const Tensor& t, const std::string& key, bool& v);
void option_value(const Tensor& t, const std::string& key, std::pair<double, double>& v);
}  // namespace detail

// Options of a group; each Options type has `lr` and a visit(f) that calls
// f(name, member&) for every option (used by state_dict).
template <class Options>
struct ParamGroup {
  std::vector<Tensor> params;
  Options options;
};

template <class Options>
class GroupedOptimizer : public Optimizer {
 public:
  using Group = ParamGroup<Options>;

  // A group whose lr is left unset (NaN) takes the defaults' lr.
  void add_param_group(Group group) {
    check_new_params(group.params);
    if (group.options.lr != group.options.lr) group.options.lr = defaults_.lr;
    this->validate(group.options);
    groups_.push_back(std::move(group));
    track_group_lr(groups_.size() - 1);
  }
  std::vector<Group>& param_groups() { return groups_; }
  const std::vector<Group>& param_groups() const { return groups_; }
  const Options& defaults() const { return defaults_; }

  size_t num_param_groups() const override { return groups_.size(); }
  const std::vector<Tensor>& params(size_t group) const override { return checked(group).params; }
  double lr(size_t group = 0) const override { return checked(group).options.lr; }
  void set_lr(size_t group, double lr) override {
    checked(group).options.lr = lr;
    write_device_lr(group);
  }
  using Optimizer::set_lr;

  bool group_option(size_t group, std::string_view name, std::vector<double>& out) const override {
    Options o = checked(group).options;
    bool found = false;
    o.visit([&](const char* n, auto& v) {
      if (name != n) return;
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(v)>, double>) {
        out = {v};
        found = true;
      } else if constexpr (std::is_same_v<std::remove_cvref_t<decltype(v)>, std::pair<double, double>>) {
        out = {v.first, v.second};
        found = true;
      }
    });
    return found;
  }
  void set_group_option(size_t group, std::string_view name, const std::vector<double>& value) override {
    Options o = checked(group).options;
    bool found = false;
    o.visit([&](const char* n, auto& v) {
      if (name != n) return;
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(v)>, double>) {
        TG_CHECK(value.size() == 1, name_str(), ": option '", n, "' takes one value, got ", value.size());
        v = value[0];
        found = true;
      } else if constexpr (std::is_same_v<std::remove_cvref_t<decltype(v)>, std::pair<double, double>>) {
        TG_CHECK(value.size() == 2, name_str(), ": option '", n, "' takes two values, got ", value.size());
        v = {value[0], value[1]};
        found = true;
      }
    });
    TG_CHECK(found, name_str(), ": no numeric option '", name, "'");
    validate(o);
    const bool lr_changed = o.lr != checked(group).options.lr;
    checked(group).options = o;
    if (lr_changed) write_device_lr(group);
  }

 protected:
  explicit GroupedOptimizer(Options defaults) : defaults_(defaults) {}
  virtual void validate(const Options& options) const = 0;

  void save_group_options(size_t group, const std::string& prefix, StateDict& out) const override {
    Options o = groups_[group].options;
    o.visit([&](const char* name, auto& v) { out.insert(prefix + name, detail::option_tensor(v)); });
  }
  void load_group_options(size_t group, const std::string& prefix, const StateDict& in) override {
    Options o = groups_[group].options;
    o.visit([&](const char* name, auto& v) {
      const Tensor* t = in.find(prefix + name);
      TG_CHECK(t != nullptr, name_str(), ".load_state_dict: missing entry '", prefix, name, "'");
      detail::option_value(*t, prefix + name, v);
    });
    validate(o);
    groups_[group].options = o;
  }

 private:
  std::string name_str() const { return name(); }
  const Group& checked(size_t g) const {
    TG_CHECK(g < groups_.size(), name(), ": parameter group ", g, " out of range (", groups_.size(), " groups)");
    return groups_[g];
  }
  Group& checked(size_t g) {
    TG_CHECK(g < groups_.size(), name(), ": parameter group ", g, " out of range (", groups_.size(), " groups)");
    return groups_[g];
  }
  Options defaults_;
  std::vector<Group> groups_;
};


}  // namespace tg::optim
