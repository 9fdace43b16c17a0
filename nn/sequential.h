// tg::nn::Sequential: children "0", "1", ... applied in order.
//
// Modules are passed by value (`Sequential(Linear(4, 8), ReLU(), Linear(8, 1))`)
// or as shared_ptrs; a value is stored as a shared_ptr copy, which shares its
// parameters with the original (Module copies are shallow).
#pragma once
#include <concepts>
#include <memory>
#include <type_traits>

#include <tapegrad/nn/module.h>

namespace tg::nn {

namespace detail {
template <typename T>
struct IsModulePtr : std::false_type {};
template <typename M>
struct IsModulePtr<std::shared_ptr<M>> : std::bool_constant<std::derived_from<M, Module>> {};
// A module value or a shared_ptr to one.
template <typename T>
concept ModuleArg = std::derived_from<std::decay_t<T>, Module> || IsModulePtr<std::decay_t<T>>::value;
// The module as a shared_ptr: a shared_ptr as is, a value as a shared_ptr copy (sharing its
// parameters: Module copies are shallow). Sequential and ModuleList store children this way.
template <ModuleArg M>
std::shared_ptr<Module> to_module_ptr(M&& module) {
  if constexpr (IsModulePtr<std::decay_t<M>>::value) {
    return std::forward<M>(module);
  } else {
    return std::make_shared<std::decay_t<M>>(std::forward<M>(module));
  }
}
}  // namespace detail

class Sequential : public Module {
 public:
  Sequential() = default;
  template <detail::ModuleArg... Ms>
  requires(sizeof...(Ms) > 0 && !(sizeof...(Ms) == 1 && (std::is_same_v<std::decay_t<Ms>, Sequential> &&
                                                         ...))) explicit Sequential(Ms&&... modules) {
    (push_back(std::forward<Ms>(modules)), ...);
  }

  template <detail::ModuleArg M>
  void push_back(M&& module) {
    append(detail::to_module_ptr(std::forward<M>(module)));
  }

  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Sequential"; }
  size_t size() const { return named_children().size(); }
  std::shared_ptr<Module> operator[](size_t i) const;

 private:
  void append(std::shared_ptr<Module> m);
};

}  // namespace tg::nn
