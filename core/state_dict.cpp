// tg::StateDict.
#include <tapegrad/core/state_dict.h>

#include <tapegrad/core/error.h>

namespace tg {

void StateDict::insert(const std::string& name, Tensor t) {
  auto it = index_.find(name);
  if (it != index_.end()) {
    items_[it->second].second = std::move(t);
    return;
  }
  index_.emplace(name, items_.size());
  items_.emplace_back(name, std::move(t));
}

bool StateDict::erase(std::string_view name) {
  auto it = index_.find(std::string(name));
  if (it == index_.end()) return false;
  const size_t pos = it->second;
  index_.erase(it);
  items_.erase(items_.begin() + static_cast<std::ptrdiff_t>(pos));
  for (auto& [k, i] : index_)
    if (i > pos) --i;
  return true;
}

const Tensor* StateDict::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

const Tensor& StateDict::at(std::string_view name) const {
  const Tensor* t = find(name);
  TG_CHECK(t != nullptr, "StateDict: no entry named '", name, "' (", items_.size(), " entries)");
  return *t;
}

std::vector<std::string> StateDict::keys() const {
  std::vector<std::string> out;
  out.reserve(items_.size());
  for (const auto& [k, v] : items_) out.push_back(k);
  return out;
}

}  // namespace tg
