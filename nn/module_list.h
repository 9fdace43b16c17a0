// tg::nn::ModuleList: an indexed list of child modules registered as "0", "1", ... (so a parent's
// state_dict names them `blocks.0.weight`), as torch.nn.ModuleList. It has no forward: the owner
// calls its modules.
#pragma once
#include <memory>
#include <typeinfo>
#include <vector>

#include <tapegrad/nn/sequential.h>

namespace tg::nn {

class ModuleList : public Module {
 public:
  ModuleList() = default;
  template <detail::ModuleArg... Ms>
  requires(sizeof...(Ms) > 0 && !(sizeof...(Ms) == 1 && (std::is_same_v<std::decay_t<Ms>, ModuleList> &&
                                                         ...))) explicit ModuleList(Ms&&... modules) {
    (push_back(std::forward<Ms>(modules)), ...);
  }

  // A value is stored as a shared_ptr copy (sharing its parameters: Module copies are shallow).
  template <detail::ModuleArg M>
  void push_back(M&& module) {
    append(detail::to_module_ptr(std::forward<M>(module)));
  }

  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  // tg::Error when i >= size().
  const std::shared_ptr<Module>& operator[](size_t i) const;
  // The i-th module as M (tg::Error when it is not one).
  template <typename M>
  std::shared_ptr<M> get(size_t i) const {
    auto p = std::dynamic_pointer_cast<M>((*this)[i]);
    TG_CHECK(p != nullptr, "ModuleList::get<", typeid(M).name(), ">(", i, "): the module is a ", (*this)[i]->name());
    return p;
  }
  std::vector<std::shared_ptr<Module>>::const_iterator begin() const { return items_.begin(); }
  std::vector<std::shared_ptr<Module>>::const_iterator end() const { return items_.end(); }

  // A ModuleList is not callable (tg::Error), as in PyTorch.
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "ModuleList"; }

 private:
  void append(std::shared_ptr<Module> m);
  std::vector<std::shared_ptr<Module>> items_;
};

}  // namespace tg::nn
