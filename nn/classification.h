// Classification losses (cross_entropy, nll_loss, binary_cross_entropy_with_logits) with their
// modules, and the Softmax / LogSoftmax modules. cross_entropy over class indices runs as one fused
// kernel each way (per-row logsumexp saved; the gradient written straight from the logits).
#pragma once
#include <cstdint>
#include <string>

#include <tapegrad/nn/module.h>

namespace tg::nn {

namespace functional {

// Options of cross_entropy. The first three members are the binding order; `weight` (a [C]
// floating tensor of per-class weights, undefined for none) comes after them.
struct CrossEntropyOptions {
  std::string reduction = "mean";  // "mean", "sum" or "none"
  int64_t ignore_index = -100;     // class-index targets equal to it add nothing (and count nothing)
  double label_smoothing = 0.0;    // in [0, 1]
  Tensor weight = {};
};
// PyTorch's cross_entropy. logits [N, C], [N, C, d...] or [C]; target int64 class indices
// ([N], [N, d...] or []) or floating class probabilities shaped like the logits. The weighted mean
// divides by the sum of the weights of the non-ignored targets (NaN when all are ignored).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options = {});

struct NllLossOptions {
  std::string reduction = "mean";
  int64_t ignore_index = -100;
  Tensor weight = {};
};
// PyTorch's nll_loss: -w[t] * log_probs[n, t] per target, log_probs [N, C], [N, C, d...] or [C].
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const NllLossOptions& options = {});

struct BCEWithLogitsOptions {
  std::string reduction = "mean";
  Tensor weight = {};      // broadcast against the loss (per element)
  Tensor pos_weight = {};  // broadcast against the last dim (per class)
};
// PyTorch's binary_cross_entropy_with_logits: -w [p y log s(x) + (1 - y) log(1 - s(x))],
// p = pos_weight, computed stably; target shaped like x.
Tensor binary_cross_entropy_with_logits(const Tensor& x, const Tensor& target,
                                        const BCEWithLogitsOptions& options = {});

}  // namespace functional

// softmax over `dim` as a module.
class Softmax : public Module {
 public:
  explicit Softmax(int64_t dim) : dim_(dim) {}
  Tensor forward(const Tensor& x) override { return softmax(x, dim_); }
  std::string name() const override { return "Softmax"; }
  int64_t dim() const { return dim_; }

 private:
  int64_t dim_;
};

class LogSoftmax : public Module {
 public:
  explicit LogSoftmax(int64_t dim) : dim_(dim) {}
  Tensor forward(const Tensor& x) override { return log_softmax(x, dim_); }
  std::string name() const override { return "LogSoftmax"; }
  int64_t dim() const { return dim_; }

 private:
  int64_t dim_;
};

// The loss modules: forward(input, target); a defined weight (and pos_weight) is a buffer named as
// in PyTorch ("weight", "pos_weight"), so it moves with to() and appears in state_dict().
class CrossEntropyLoss : public Module {
 public:
  explicit CrossEntropyLoss(functional::CrossEntropyOptions options = {});
  Tensor forward(const Tensor& input, const Tensor& target) const;
  Tensor operator()(const Tensor& input, const Tensor& target) const { return forward(input, target); }
  Tensor forward(const Tensor& x) override;  // an error: a loss needs a target
  std::string name() const override { return "CrossEntropyLoss"; }
  Tensor weight;

 private:
  functional::CrossEntropyOptions options_;
};

class NLLLoss : public Module {
 public:
  explicit NLLLoss(functional::NllLossOptions options = {});
  Tensor forward(const Tensor& input, const Tensor& target) const;
  Tensor operator()(const Tensor& input, const Tensor& target) const { return forward(input, target); }
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "NLLLoss"; }
  Tensor weight;

 private:
  functional::NllLossOptions options_;
};

class BCEWithLogitsLoss : public Module {
 public:
  explicit BCEWithLogitsLoss(functional::BCEWithLogitsOptions options = {});
  Tensor forward(const Tensor& input, const Tensor& target) const;
  Tensor operator()(const Tensor& input, const Tensor& target) const { return forward(input, target); }
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "BCEWithLogitsLoss"; }
  Tensor weight;
  Tensor pos_weight;

 private:
  functional::BCEWithLogitsOptions options_;
};

}  // namespace tg::nn
