// tg::nn::Module: the base of every layer and user model. Holds named
// parameters, buffers and child modules in registration order, and gives
// PyTorch's traversal order, device/dtype moves, train/eval, and state dicts.
//
// Copies are shallow: a copied module shares its parameter tensors and child
// modules with the original (like libtorch's ModuleHolder). That is what lets
// `Sequential(Linear(64, 1))` store a module passed by value.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <ranges>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <tapegrad/core/hooks.h>
#include <tapegrad/core/ops.h>
#include <tapegrad/core/state_dict.h>
#include <tapegrad/core/tensor.h>

namespace tg::nn {

// StateDict (name -> Tensor, insertion-ordered) is core/state_dict.h's tg::StateDict.

// What a non-strict load_state_dict found (a strict one throws instead).
struct LoadResult {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
};

class Module {
 public:
  Module() = default;
  Module(const Module&) = default;
  Module(Module&&) = default;
  Module& operator=(const Module&) = default;
  Module& operator=(Module&&) = default;
  virtual ~Module() = default;

  virtual Tensor forward(const Tensor& x) = 0;
  // forward(x), with the forward hooks around it when any is registered.
  Tensor operator()(const Tensor& x) {
    return hooks_ && !hooks_->empty() ? call_with_hooks(x) : forward(x);
  }
  // ---- forward hooks (PyTorch's), run by operator() in registration order. A copy of the
  // module shares them (shallow, as its parameters). fn(module, input) runs before forward and
  // may return a replacement input; fn(module, input, output) runs after it and may return a
  // replacement output. Either returns void, a Tensor or a std::optional<Tensor> (undefined /
  // empty: keep); the next hook sees the result.
  template <typename F>
  RemovableHandle register_forward_pre_hook(F&& fn) {
    return add_forward_hook(tg::detail::ReplacingHook<Tensor(Module&, const Tensor&)>::wrap(std::forward<F>(fn)), {});
  }
  template <typename F>
  RemovableHandle register_forward_hook(F&& fn) {
    return add_forward_hook({}, tg::detail::ReplacingHook<Tensor(Module&, const Tensor&, const Tensor&)>::wrap(
                                    std::forward<F>(fn)));
  }
  // For messages and printing; layers return their class name.
  virtual std::string name() const { return "Module"; }

  // ---- registration: each returns the stored handle (it shares the TensorImpl
  // the module updates in to() and load_state_dict(), so keep it as a member).
  Tensor register_parameter(const std::string& name, Tensor t, bool requires_grad = true);
  Tensor register_buffer(const std::string& name, Tensor t);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    register_module_impl(name, module);
    return module;
  }

  // ---- traversal, PyTorch's order: own entries in registration order, then
  // each child's (depth first), names joined with ".". Shared tensors appear once.
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<std::shared_ptr<Module>> children() const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const { return children_; }

  // ---- moves: in place, so every handle to a parameter (an optimizer's, a
  // member's) sees the new device/dtype. Parameters stay leaves that require
  // grad; a defined grad is moved along. to(DType) touches floating tensors only.
  Module& to(Device device);
  Module& to(DeviceType device) { return to(Device(device)); }
  Module& to(DType dtype);
  Module& to(Device device, DType dtype);
  // Lays every 4-d parameter and buffer (conv weights) out in `format` (ChannelsLast: NHWC
  // strides), as PyTorch's module.to(memory_format=...); other tensors are untouched.
  Module& to(MemoryFormat format);

  Module& train(bool on = true);
  Module& eval() { return train(false); }
  bool is_training() const { return training_; }

  // Sets every parameter's grad to undefined (PyTorch's set_to_none = True).
  void zero_grad();

  // Parameters then buffers of each module, detached (sharing storage).
  StateDict state_dict() const;
  // Copies values (any dtype/device, converted) into the existing tensors under
  // NoGradGuard. Strict: missing or unexpected keys are an error; a shape
  // mismatch always is. All problems are listed in one tg::Error.
  LoadResult load_state_dict(const StateDict& dict, bool strict = true);

 private:
  void register_module_impl(const std::string& name, std::shared_ptr<Module> module);
  void check_new_name(const std::string& name, const char* what) const;
  template <typename F>
  void visit(const std::string& prefix, F&& f) const;
  void move_all(std::optional<Device> device, std::optional<DType> dtype);

  // Forward hooks: slot 0 pre-hooks, slot 1 hooks. Made with the module, so copies share them.
  using PreHook = std::function<Tensor(Module&, const Tensor&)>;
  using PostHook = std::function<Tensor(Module&, const Tensor&, const Tensor&)>;
  struct ForwardHooks {
    std::shared_ptr<tg::detail::HookList<PreHook>> pre = std::make_shared<tg::detail::HookList<PreHook>>();
    std::shared_ptr<tg::detail::HookList<PostHook>> post = std::make_shared<tg::detail::HookList<PostHook>>();
    bool empty() const { return pre->empty() && post->empty(); }
  };
  RemovableHandle add_forward_hook(PreHook pre, PostHook post);
  Tensor call_with_hooks(const Tensor& x);
  std::shared_ptr<ForwardHooks> hooks_ = std::make_shared<ForwardHooks>();

  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

}  // namespace tg::nn
