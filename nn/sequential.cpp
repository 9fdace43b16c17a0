// tg::nn::Sequential.
#include <tapegrad/nn/sequential.h>

#include <string>

namespace tg::nn {

void Sequential::append(std::shared_ptr<Module> m) { register_module(std::to_string(size()), std::move(m)); }

std::shared_ptr<Module> Sequential::operator[](size_t i) const {
  TG_CHECK(i < size(), "Sequential[", i, "]: index out of range for ", size(), " modules");
  return named_children()[i].second;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (const auto& [n, m] : named_children()) y = (*m)(y);  // through operator(): the children's forward hooks run
  return y;
}

}  // namespace tg::nn
