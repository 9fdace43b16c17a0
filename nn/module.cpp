// tg::nn::Module.
#include <tapegrad/nn/module.h>

#include <sstream>
#include <unordered_set>

#include <tapegrad/autograd/autograd.h>
#include <tapegrad/core/native.h>

namespace tg::nn {

// ---- registration
void Module::check_new_name(const std::string& name, const char* what) const {
  TG_CHECK(!name.empty(), this->name(), ".", what, ": the name must not be empty");
  TG_CHECK(name.find('.') == std::string::npos, this->name(), ".", what, ": the name '", name,
           "' must not contain '.'");
  auto taken = [&](const auto& list) {
    for (const auto& e : list)
      if (e.first == name) return true;
    return false;
  };
  TG_CHECK(!taken(params_) && !taken(buffers_) && !taken(children_), this->name(), ".", what, ": the name '", name,
           "' is already registered");
}

Tensor Module::register_parameter(const std::string& name, Tensor t, bool requires_grad) {
  check_new_name(name, "register_parameter");
  TG_CHECK(t.defined(), this->name(), ".register_parameter('", name, "'): the tensor is undefined");
  // A parameter is a leaf: cut any history the tensor came with.
  if (!t.is_leaf()) t = t.detach();
  t.requires_grad_(requires_grad);
  params_.emplace_back(name, t);
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  check_new_name(name, "register_buffer");
  TG_CHECK(t.defined(), this->name(), ".register_buffer('", name, "'): the tensor is undefined");
  if (t.requires_grad()) t = t.detach();
  buffers_.emplace_back(name, t);
  return t;
}

void Module::register_module_impl(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name, "register_module");
  TG_CHECK(module != nullptr, this->name(), ".register_module('", name, "'): the module is null");
  TG_CHECK(module.get() != this, this->name(), ".register_module('", name, "'): a module cannot be its own child");
  children_.emplace_back(name, std::move(module));
}

// ---- traversal
// Calls f(full_name, tensor, is_param) for params then buffers of each module,
// depth first: PyTorch's state_dict order.
template <typename F>
void Module::visit(const std::string& prefix, F&& f) const {
  for (const auto& [n, t] : params_) f(prefix + n, t, true);
  for (const auto& [n, t] : buffers_) f(prefix + n, t, false);
  for (const auto& [n, c] : children_) c->visit(prefix + n + ".", f);
}

namespace {
// Named entries of one kind, own first then children's; shared tensors once.
template <typename Get>
void collect(const Module& m, const std::string& prefix, bool recurse, Get get,
             std::unordered_set<const TensorImpl*>& seen, std::vector<std::pair<std::string, Tensor>>& out) {
  for (const auto& [n, t] : get(m)) {
    if (seen.insert(t.impl_ptr().get()).second) out.emplace_back(prefix + n, t);
  }
  if (!recurse) return;
  for (const auto& [n, c] : m.named_children()) collect(*c, prefix + n + ".", true, get, seen, out);
}
}  // namespace

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::unordered_set<const TensorImpl*> seen;
  collect(
      *this, "", recurse, [](const Module& m) -> const auto& { return m.params_; }, seen, out);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters(recurse)) out.push_back(std::move(t));
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::unordered_set<const TensorImpl*> seen;
  collect(
      *this, "", recurse, [](const Module& m) -> const auto& { return m.buffers_; }, seen, out);
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_buffers(recurse)) out.push_back(std::move(t));
  return out;
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& [n, c] : children_) out.push_back(c);
  return out;
}

// ---- moves
namespace {
// Points dst's TensorImpl at src's data and metadata, keeping dst's autograd
// state (leaf, requires_grad, grad). Every handle sharing dst's impl sees it.
void swap_in(const Tensor& dst, const Tensor& src) {
  TensorImpl& d = dst.impl();
  const TensorImpl& s = src.impl();
  d.storage = s.storage;
  d.sizes = s.sizes;
  d.strides = s.strides;
  d.offset = s.offset;
  d.dtype = s.dtype;
  d.device = s.device;
  d.refresh();
  if (d.autograd) d.autograd->grad_accumulator.reset();  // its input meta names the old dtype/device
}

void move_tensor(const Tensor& t, std::optional<Device> device, std::optional<DType> dtype) {
  const bool cast = dtype && is_floating(t.dtype());
  if (!device && !cast) return;
  Tensor moved = native::to(t, device.value_or(t.device()), cast ? *dtype : t.dtype());
  if (!moved.is_same(t)) swap_in(t, moved);
  if (t.impl().autograd && t.impl().autograd->grad.defined()) {
    Tensor& g = t.impl().autograd->grad;
    g = native::to(g, device.value_or(g.device()), cast ? *dtype : g.dtype());
  }
}
}  // namespace

void Module::move_all(std::optional<Device> device, std::optional<DType> dtype) {
  NoGradGuard guard;
  if (device) device = native::resolve(*device);
  if (dtype) TG_CHECK(is_floating(*dtype), this->name(), ".to(", *dtype, "): the dtype must be floating point");
  std::unordered_set<const TensorImpl*> seen;
  visit("", [&](const std::string&, const Tensor& t, bool) {
    if (seen.insert(t.impl_ptr().get()).second) move_tensor(t, device, dtype);
  });
}

Module& Module::to(Device device) {
  move_all(device, std::nullopt);
  return *this;
}
Module& Module::to(DType dtype) {
  move_all(std::nullopt, dtype);
  return *this;
}
Module& Module::to(Device device, DType dtype) {
  move_all(device, dtype);
  return *this;
}

Module& Module::to(MemoryFormat format) {
  TG_CHECK(format != MemoryFormat::Preserve, name(), ".to(MemoryFormat::Preserve): nothing to convert to");
  NoGradGuard guard;
  std::unordered_set<const TensorImpl*> seen;
  visit("", [&](const std::string&, const Tensor& t, bool) {
    if (t.dim() != 4 || !seen.insert(t.impl_ptr().get()).second) return;
    Tensor laid = t.detach().contiguous(format);
    if (!laid.is_same(t) && laid.impl().storage != t.impl().storage) swap_in(t, laid);
    if (t.impl().autograd && t.impl().autograd->grad.defined())
      t.impl().autograd->grad = t.impl().autograd->grad.contiguous(format);
  });
  return *this;
}

Module& Module::train(bool on) {
  training_ = on;
  for (const auto& [n, c] : children_) c->train(on);
  return *this;
}

void Module::zero_grad() {
  for (const Tensor& p : parameters()) {
    if (p.impl().autograd) p.impl().autograd->grad = Tensor();
  }
}

// ---- state dicts
StateDict Module::state_dict() const {
  StateDict sd;
  visit("", [&](const std::string& name, const Tensor& t, bool) { sd.insert(name, t.detach()); });
  return sd;
}

LoadResult Module::load_state_dict(const StateDict& dict, bool strict) {
  StateDict own;
  visit("", [&](const std::string& name, const Tensor& t, bool) { own.insert(name, t); });
  LoadResult result;
  std::vector<std::string> mismatched;
  for (const auto& [name, t] : own) {
    const Tensor* src = dict.find(name);
    if (src == nullptr) {
      result.missing_keys.push_back(name);
    } else if (!src->defined() || src->sizes() != t.sizes()) {
      mismatched.push_back(
          detail::str_cat(name, ": checkpoint ", src->defined() ? src->sizes() : Shape{}, " vs model ", t.sizes()));
    }
  }
  for (const auto& [name, t] : dict)
    if (!own.contains(name)) result.unexpected_keys.push_back(name);

  const bool key_error = strict && (!result.missing_keys.empty() || !result.unexpected_keys.empty());
  if (key_error || !mismatched.empty()) {
    std::ostringstream msg;
    msg << this->name() << ".load_state_dict: ";
    auto list = [&](const char* what, const std::vector<std::string>& v) {
      if (v.empty()) return;
      msg << what << " (" << v.size() << "): ";
      for (size_t i = 0; i < v.size(); ++i) msg << (i ? ", " : "") << v[i];
      msg << "; ";
    };
    if (strict) {
      list("missing keys", result.missing_keys);
      list("unexpected keys", result.unexpected_keys);
    }
    list("shape mismatches", mismatched);
    std::string s = msg.str();
    s.resize(s.size() - 2);
    TG_ERROR(s);
  }
  NoGradGuard guard;
  for (const auto& [name, t] : own) {
    if (const Tensor* src = dict.find(name)) t.copy_(*src);
  }
  return result;
}

// ---- forward hooks
RemovableHandle Module::add_forward_hook(PreHook pre, PostHook post) {
  if (!hooks_) hooks_ = std::make_shared<ForwardHooks>();  // a moved-from module
  if (pre) return tg::detail::add_hook(hooks_->pre, 0, std::move(pre));
  TG_CHECK(post != nullptr, name(), ": register_forward_hook: the hook is empty");
  return tg::detail::add_hook(hooks_->post, 0, std::move(post));
}

Tensor Module::call_with_hooks(const Tensor& x) {
  const std::shared_ptr<ForwardHooks> hooks = hooks_;  // alive even if a hook replaces the module's
  Tensor input = x;
  for (auto& fn : hooks->pre->for_slot(0)) {
    Tensor r = fn(*this, input);
    if (r.defined()) input = std::move(r);
  }
  Tensor output = forward(input);
  for (auto& fn : hooks->post->for_slot(0)) {
    Tensor r = fn(*this, input, output);
    if (r.defined()) output = std::move(r);
  }
  return output;
}

}  // namespace tg::nn
