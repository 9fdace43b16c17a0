// tg::nn::ModuleList.
#include <tapegrad/nn/module_list.h>

#include <string>

namespace tg::nn {

void ModuleList::append(std::shared_ptr<Module> m) {
  TG_CHECK(m != nullptr, "ModuleList::push_back: null module");
  register_module(std::to_string(items_.size()), m);
  items_.push_back(std::move(m));
}

const std::shared_ptr<Module>& ModuleList::operator[](size_t i) const {
  TG_CHECK(i < items_.size(), "ModuleList[", i, "]: index out of range for ", items_.size(), " modules");
  return items_[i];
}

Tensor ModuleList::forward(const Tensor&) {
  TG_ERROR("ModuleList: has no forward; call its modules (for (auto& m : list) x = m->forward(x))");
}

}  // namespace tg::nn
