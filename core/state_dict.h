// tg::StateDict: the one name -> Tensor checkpoint type. A Module's, an
// optimizer's, a GradScaler's, a scheduler's and the random generators' state are
// all StateDicts, so tg::save / tg::load (nn/serialize.h) hold a whole training
// state. It lives in core because optim and amp use it and must not depend on nn;
// tg::nn::StateDict (the binding name) is the same type.
#pragma once
#include <cstddef>
#include <initializer_list>
#include <ranges>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <tapegrad/core/tensor.h>

namespace tg {

// An insertion-ordered map name -> Tensor: the order is PyTorch's state_dict
// order, and it is the order tg::save writes. Iterates as pairs (structured
// bindings work); lookups by name are O(1). Inserting an existing name replaces
// its tensor in place (the position is kept).
class StateDict {
 public:
  using value_type = std::pair<std::string, Tensor>;
  using const_iterator = std::vector<value_type>::const_iterator;

  StateDict() = default;
  StateDict(std::initializer_list<value_type> items) {
    for (const auto& [k, v] : items) insert(k, v);
  }
  // From any range of (name, Tensor) pairs: named_parameters(), a std::map, ...
  // (implicit, so they pass straight to tg::save).
  template <std::ranges::input_range R>
  requires(!std::same_as<std::remove_cvref_t<R>, StateDict> &&
           std::convertible_to<std::tuple_element_t<0, std::ranges::range_value_t<R>>, std::string> &&
           std::convertible_to<std::tuple_element_t<1, std::ranges::range_value_t<R>>, Tensor>)
      StateDict(const R& items) {  // NOLINT(google-explicit-constructor)
    for (const auto& [k, v] : items) insert(k, v);
  }

  void insert(const std::string& name, Tensor t);
  // Removes `name` (the others keep their order); false when it was absent.
  bool erase(std::string_view name);
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  // nullptr when absent.
  const Tensor* find(std::string_view name) const;
  const Tensor& at(std::string_view name) const;  // tg::Error when absent
  const Tensor& operator[](std::string_view name) const { return at(name); }
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  std::vector<std::string> keys() const;
  const_iterator begin() const { return items_.begin(); }
  const_iterator end() const { return items_.end(); }

 private:
  std::vector<value_type> items_;
  std::unordered_map<std::string, size_t> index_;
};

namespace nn {
using StateDict = ::tg::StateDict;  // the name the API uses
}  // namespace nn

}  // namespace tg
