// AccumulateGrad: the node at every leaf that requires grad; the engine's last
// step for that leaf adds the arriving gradient into leaf.grad(). Not installed.
#pragma once
#include <memory>
#include <vector>

#include <tapegrad/autograd/autograd.h>

namespace tg::autograd {

class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  const char* name() const override { return "AccumulateGrad"; }
  GradHooks* grad_hooks() const override;  // the leaf's (Tensor::register_hook)

 private:
  std::shared_ptr<TensorImpl> leaf_;  // as PyTorch: the graph keeps its leaves alive
};

// g itself when nothing else holds it and it is dense; otherwise a dense copy, so
// that .grad() never aliases another tensor or an expanded (stride-0) view.
Tensor owned_grad(Tensor g);

}  // namespace tg::autograd
