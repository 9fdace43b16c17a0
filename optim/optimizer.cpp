// The optimizer base: groups bookkeeping, zero_grad, state_dict I/O, and the
// shared step helpers of optim/step_util.h.
#include <tapegrad/optim/optimizer.h>

#include <algorithm>
#include <charconv>
#include <limits>
#include <optional>
#include <set>
#include <unordered_set>

#include <tapegrad/core/cast_copies.h>
#include <tapegrad/autograd/autograd.h>
#include <tapegrad/core/cuda_graph.h>
#include <tapegrad/core/ops.h>
#include <tapegrad/optim/step_util.h>

namespace tg::optim {

// ---- ParamState

Tensor* ParamState::find(std::string_view name) {
  for (auto& [k, v] : entries_)
    if (k == name) return &v;
  return nullptr;
}
const Tensor* ParamState::find(std::string_view name) const {
  for (const auto& [k, v] : entries_)
    if (k == name) return &v;
  return nullptr;
}
Tensor& ParamState::operator[](std::string_view name) {
  if (Tensor* t = find(name)) return *t;
  entries_.emplace_back(std::string(name), Tensor());
  return entries_.back().second;
}
const Tensor& ParamState::at(std::string_view name) const {
  const Tensor* t = find(name);
  TG_CHECK(t != nullptr, "optimizer state has no entry '", name, "'");
  return *t;
}

// ---- Optimizer

Optimizer::~Optimizer() = default;

void Optimizer::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (size_t g = 0; g < num_param_groups(); ++g) {
    for (const Tensor& p : params(g)) {
      Tensor& grad = p.mutable_grad();
      if (!grad.defined()) continue;
      if (set_to_none)
        grad = Tensor();
      else
        grad.zero_();
    }
  }
}

std::vector<Tensor> Optimizer::parameters() const {
  std::vector<Tensor> out;
  for (size_t g = 0; g < num_param_groups(); ++g) {
    const auto& ps = params(g);
    out.insert(out.end(), ps.begin(), ps.end());
  }
  return out;
}

void Optimizer::set_lr(double lr) {
  for (size_t g = 0; g < num_param_groups(); ++g) set_lr(g, lr);
}

const ParamState* Optimizer::state(const Tensor& param) const {
  auto it = state_.find(param.impl_ptr().get());
  return it == state_.end() || it->second.empty() ? nullptr : &it->second;
}

void Optimizer::check_new_params(const std::vector<Tensor>& params) const {
  TG_CHECK(!params.empty(), name(), ": optimizer got an empty parameter list");
  std::unordered_set<const TensorImpl*> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    TG_CHECK(p.defined(), name(), ": parameter ", i, " of the new group is an undefined tensor");
    TG_CHECK(p.is_leaf(), name(), ": can't optimize a non-leaf Tensor (parameter ", i, ", shape ", p.sizes(),
             "); pass the leaf or a detached copy with requires_grad_()");
    TG_CHECK(is_floating(p.dtype()), name(), ": parameter ", i, " has dtype ", p.dtype(),
             "; only floating tensors can be optimized");
    TG_CHECK(seen.insert(p.impl_ptr().get()).second, name(), ": parameter ", i,
             " appears twice in the new parameter group");
  }
  for (size_t g = 0; g < num_param_groups(); ++g)
    for (const Tensor& p : this->params(g))
      TG_CHECK(!seen.count(p.impl_ptr().get()), name(),
               ": some parameters appear in more than one parameter group (one of shape ", p.sizes(), ")");
}

FusedStepTarget Optimizer::fused_cache(size_t group, Device device, DType dtype) {
  const double* lr_ptr = nullptr;
  if (device.is_cuda()) {
    LrSlot* slot = nullptr;
    for (auto& s : lr_slots_)
      if (s.group == group && s.device == device) slot = &s;
    const double value = lr(group);
    if (slot == nullptr || slot->written != value) {
      // Only a group whose parameters were changed through param_groups() lacks a copy, and only an
      // lr assigned there without set_lr makes one stale: a capture would freeze the refresh.
      TG_CHECK(!::tg::cuda::detail::stream_capturing(device.index()), name(), ".step: the lr of parameter group ",
               group, " (", value, ") was changed without set_lr (or the group gained parameters on ", device,
               ") and the step is being captured; call set_lr outside the captured region");
      NoGradGuard no_grad;
      if (slot == nullptr) {
        lr_slots_.push_back(
            LrSlot{group, device, tg::full({}, value, TensorOptions().dtype(kFloat64).device(device)), value});
        slot = &lr_slots_.back();
      } else {
        slot->value.fill_(value);
        slot->written = value;
      }
    }
    lr_ptr = static_cast<const double*>(slot->value.data_ptr());
  }
  for (auto& s : caches_)
    if (s.group == group && s.device == device && s.dtype == dtype) return {s.cache, lr_ptr};
  caches_.push_back(CacheSlot{group, device, dtype, nullptr});
  return {caches_.back().cache, lr_ptr};
}

// ---- device lr, initial_lr, options by name (for the lr schedulers)

void Optimizer::track_group_lr(size_t group) {
  std::vector<Device> devices;
  for (const Tensor& p : params(group))
    if (p.is_cuda() && std::find(devices.begin(), devices.end(), p.device()) == devices.end())
      devices.push_back(p.device());
  NoGradGuard no_grad;
  const double value = lr(group);
  for (Device d : devices)
    lr_slots_.push_back(LrSlot{group, d, tg::full({}, value, TensorOptions().dtype(kFloat64).device(d)), value});
}

void Optimizer::write_device_lr(size_t group) {
  const double value = lr(group);
  NoGradGuard no_grad;
  for (auto& s : lr_slots_) {
    if (s.group != group || s.written == value) continue;
    // Captured, this fill would be replayed with today's value after every later set_lr.
    TG_CHECK(!::tg::cuda::detail::stream_capturing(s.device.index()), name(), ".set_lr: called while ", s.device,
             " is being captured into a CUDA graph (group ", group, ", lr ", value,
             "); set the lr (scheduler.step()) outside the captured region");
    s.value.fill_(value);  // a kernel with the value as its argument: no host sync
    s.written = value;
  }
}

double Optimizer::initial_lr(size_t group) const {
  TG_CHECK(group < num_param_groups(), name(), ": parameter group ", group, " out of range (", num_param_groups(),
           " groups)");
  return group < initial_lrs_.size() ? initial_lrs_[group] : std::numeric_limits<double>::quiet_NaN();
}

void Optimizer::set_initial_lr(size_t group, double lr) {
  TG_CHECK(group < num_param_groups(), name(), ": parameter group ", group, " out of range (", num_param_groups(),
           " groups)");
  if (initial_lrs_.size() < num_param_groups())
    initial_lrs_.resize(num_param_groups(), std::numeric_limits<double>::quiet_NaN());
  initial_lrs_[group] = lr;
}

bool Optimizer::group_option(size_t, std::string_view, std::vector<double>&) const { return false; }

void Optimizer::set_group_option(size_t, std::string_view option, const std::vector<double>&) {
  TG_ERROR(name(), ": no numeric option '", option, "'");
}

StateDict Optimizer::state_dict() const {
  StateDict out, groups;
  int64_t index = 0;
  for (size_t g = 0; g < num_param_groups(); ++g) {
    std::vector<int64_t> indices;
    for (const Tensor& p : params(g)) {
      if (const ParamState* st = state(p)) {
        for (const auto& [name, t] : *st)
          if (t.defined()) out.insert("state." + std::to_string(index) + "." + name, t);
      }
      indices.push_back(index++);
    }
    const std::string prefix = "param_groups." + std::to_string(g) + ".";
    save_group_options(g, prefix, groups);
    groups.insert(prefix + "params", tg::tensor(indices));
  }
  for (const auto& [k, t] : groups) out.insert(k, t);
  return out;
}

namespace {
bool parse_index(std::string_view s, int64_t& out) {
  if (s.empty()) return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && ptr == s.data() + s.size() && out >= 0;
}
}  // namespace

void Optimizer::load_state_dict(const StateDict& sd) {
  const std::string op = std::string(name()) + ".load_state_dict";
  const size_t ngroups = num_param_groups();
  TG_CHECK(!sd.contains("param_groups." + std::to_string(ngroups) + ".params") &&
               (ngroups == 0 || sd.contains("param_groups." + std::to_string(ngroups - 1) + ".params")),
           op, ": loaded state dict has a different number of parameter groups than the optimizer (", ngroups, ")");

  // Saved index -> parameter, and the options, group by group (validated before anything changes).
  // Saved indices run over all groups' parameters, so the optimizer's own parameter count bounds
  // them: nothing is sized from the file.
  size_t nparams = 0;
  for (size_t g = 0; g < ngroups; ++g) nparams += params(g).size();
  std::vector<Tensor> by_index(nparams);
  std::set<std::string> known;
  for (size_t g = 0; g < ngroups; ++g) {
    const std::string prefix = "param_groups." + std::to_string(g) + ".";
    const Tensor* found = sd.find(prefix + "params");
    TG_CHECK(found != nullptr, op, ": missing entry '", prefix, "params'");
    const Tensor& idx = *found;
    TG_CHECK(idx.dtype() == kInt64 && idx.dim() == 1, op, ": '", prefix, "params' must be a 1-D int64 tensor, got ",
             idx.dtype(), " ", idx.sizes());
    const auto& ps = params(g);
    TG_CHECK(static_cast<size_t>(idx.numel()) == ps.size(), op, ": loaded parameter group ", g, " has ", idx.numel(),
             " parameters but the optimizer's group has ", ps.size());
    std::vector<int64_t> ids = idx.to_vector<int64_t>();
    for (size_t i = 0; i < ids.size(); ++i) {
      TG_CHECK(ids[i] >= 0 && static_cast<uint64_t>(ids[i]) < nparams, op, ": bad parameter index ", ids[i],
               " in '", prefix, "params' (the optimizer has ", nparams, " parameters)");
      TG_CHECK(!by_index[ids[i]].defined(), op, ": parameter index ", ids[i], " appears twice");
      by_index[ids[i]] = ps[i];
    }
    StateDict expected;
    save_group_options(g, prefix, expected);
    for (const auto& kv : expected) known.insert(kv.first);
    known.insert(prefix + "params");
  }

  // Per-parameter state, moved to each parameter's device (and dtype, except step).
  std::unordered_map<const TensorImpl*, ParamState> fresh;
  for (const auto& [key, t] : sd) {
    if (key.rfind("param_groups.", 0) == 0) {
      TG_CHECK(known.count(key), op, ": unexpected entry '", key, "'");
      continue;
    }
    TG_CHECK(key.rfind("state.", 0) == 0, op, ": unexpected entry '", key, "'");
    std::string_view rest(key);
    rest.remove_prefix(6);
    size_t dot = rest.find('.');
    int64_t index = -1;
    TG_CHECK(dot != std::string_view::npos && parse_index(rest.substr(0, dot), index) && dot + 1 < rest.size(), op,
             ": malformed state entry '", key, "' (expected state.<param index>.<name>)");
    TG_CHECK(static_cast<size_t>(index) < by_index.size() && by_index[index].defined(), op, ": state entry '", key,
             "' names parameter ", index, ", which is in no parameter group");
    TG_CHECK(t.defined() && is_floating(t.dtype()), op, ": state entry '", key, "' must be a floating tensor");
    const Tensor& p = by_index[index];
    const std::string_view field = rest.substr(dot + 1);
    Tensor value;
    if (field == "step") {
      TG_CHECK(t.numel() == 1, op, ": '", key, "' must have one element, got shape ", t.sizes());
      value = t.to(p.device(), kFloat32).reshape({}).clone();
    } else {
      TG_CHECK(t.sizes() == p.sizes(), op, ": '", key, "' has shape ", t.sizes(), " but parameter ", index,
               " has shape ", p.sizes());
      value = detail::in_layout_of(t.to(p.device(), p.dtype()), p).clone();
    }
    fresh[p.impl_ptr().get()][field] = value.detach();
  }
  // Options are validated group by group as they load: a bad later group puts the earlier ones back.
  StateDict before;
  for (size_t g = 0; g < ngroups; ++g) save_group_options(g, "param_groups." + std::to_string(g) + ".", before);
  try {
    for (size_t g = 0; g < ngroups; ++g) load_group_options(g, "param_groups." + std::to_string(g) + ".", sd);
  } catch (...) {
    for (size_t g = 0; g < ngroups; ++g) load_group_options(g, "param_groups." + std::to_string(g) + ".", before);
    throw;
  }
  state_ = std::move(fresh);
  for (size_t g = 0; g < ngroups; ++g) write_device_lr(g);
  // The fused caches compare pointers, so they notice the new state tensors by themselves.
}

// ---- option <-> tensor

namespace detail {

Tensor option_tensor(double v) { return tg::full({}, v, kFloat64); }
Tensor option_tensor(bool v) { return tg::full({}, v, kBool); }
Tensor option_tensor(const std::pair<double, double>& v) { return tg::tensor(std::vector<double>{v.first, v.second}); }

void option_value(const Tensor& t, const std::string& key, double& v) {
  TG_CHECK(t.defined() && t.numel() == 1 && t.dtype() != kBool, "load_state_dict: option '", key,
           "' must be a numeric tensor with one element");
  v = t.item<double>();
}
void option_value(const Tensor& t, const std::string& key, bool& v) {
  TG_CHECK(t.defined() && t.numel() == 1, "load_state_dict: option '", key, "' must be a tensor with one element");
  v = t.item<bool>();
}
void option_value(const Tensor& t, const std::string& key, std::pair<double, double>& v) {
  TG_CHECK(t.defined() && t.numel() == 2 && is_floating(t.dtype()), "load_state_dict: option '", key,
           "' must be a floating tensor with two elements, got ", t.defined() ? t.sizes() : Shape{});
  auto d = t.to(kCPU, kFloat64).contiguous().to_vector<double>();
  v = {d[0], d[1]};
}

// ---- step helpers

void check_step_args(const char* op, const StepArgs& a) {
  for (const Tensor* t : {&a.grad_scale, &a.found_inf}) {
    if (!t->defined()) continue;
    const char* what = t == &a.grad_scale ? "grad_scale" : "found_inf";
    TG_CHECK(t->dtype() == kFloat32 && t->numel() == 1, op, ": ", what,
             " must be a float32 tensor with one element, got ", t->dtype(), " ", t->sizes());
  }
  if (a.grad_scale.defined() && a.found_inf.defined())
    TG_CHECK(a.grad_scale.device() == a.found_inf.device(), op, ": grad_scale is on ", a.grad_scale.device(),
             " but found_inf is on ", a.found_inf.device());
}

float cpu_scalar(const char* op, const Tensor& t, const char* what, Device params_device, float when_undefined) {
  if (!t.defined()) return when_undefined;
  TG_CHECK(t.is_cpu(), op, ": ", what, " is on ", t.device(), " but parameters are on ", params_device);
  return *static_cast<const float*>(t.data_ptr());
}

const float* device_scalar(const char* op, const Tensor& t, const char* what, Device device) {
  if (!t.defined()) return nullptr;
  TG_CHECK(t.device() == device, op, ": ", what, " is on ", t.device(), " but parameters are on ", device);
  return static_cast<const float*>(t.data_ptr());
}

Tensor usable_grad(const char* op, const Tensor& param) {
  Tensor g = param.grad();
  if (!g.defined()) return g;
  TG_CHECK(g.sizes() == param.sizes() && g.dtype() == param.dtype() && g.device() == param.device(), op,
           ": gradient ", g.dtype(), " ", g.sizes(), " on ", g.device(), " does not match its parameter ",
           param.dtype(), " ", param.sizes(), " on ", param.device());
  TG_CHECK(param.is_contiguous() || param.is_contiguous(MemoryFormat::ChannelsLast), op, ": parameter of shape ",
           param.sizes(), " with strides ", param.strides(), " is neither contiguous nor channels-last");
  return in_layout_of(g, param);
}

Tensor in_layout_of(const Tensor& t, const Tensor& param) {
  if (param.is_contiguous()) return t.contiguous();
  if (param.is_contiguous(MemoryFormat::ChannelsLast)) return t.contiguous(MemoryFormat::ChannelsLast);
  return t.contiguous();
}

Tensor state_like(const Tensor& param, double value) {
  return in_layout_of(tg::full(param.sizes(), value, param.options()), param);
}

void bump_version(const Tensor& t) { t.impl().storage->bump_version(); }

std::vector<Tensor> shadows_for_update(const std::vector<Tensor>& params) {
  std::vector<Tensor> out(params.size());
  std::optional<DType> dtype;  // the first shadow's; others are dropped (one dtype per launch)
  bool any = false;
  for (size_t i = 0; i < params.size(); ++i) {
    out[i] = ::tg::detail::cast_copy_for_update(params[i], dtype);
    if (out[i].defined()) {
      dtype = out[i].dtype();
      any = true;
    }
  }
  if (!any) out.clear();
  return out;
}

void shadows_updated(const std::vector<Tensor>& params, const std::vector<Tensor>& shadows) {
  for (size_t i = 0; i < shadows.size(); ++i) ::tg::detail::cast_copy_updated(params[i], shadows[i]);
}

std::vector<Bucket> bucket_by_device_dtype(const std::vector<Tensor>& params, const std::vector<Tensor>& grads) {
  std::vector<Bucket> out;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!grads[i].defined()) continue;
    const Device d = params[i].device();
    const DType t = params[i].dtype();
    Bucket* b = nullptr;
    for (auto& x : out)
      if (x.device == d && x.dtype == t) b = &x;
    if (b == nullptr) {
      out.push_back(Bucket{d, t, {}});
      b = &out.back();
    }
    b->indices.push_back(i);
  }
  return out;
}

}  // namespace detail
}  // namespace tg::optim
