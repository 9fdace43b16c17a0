// Custom differentiable functions with a user-written forward and backward, like
// torch.autograd.Function / libtorch's torch::autograd::Function, so that kernels
// the user writes (RawKernel, ElementwiseKernel, nvcc-compiled) can train:
//
//   struct Square : tg::autograd::Function<Square> {
//     static tg::Tensor forward(tg::autograd::AutogradContext* ctx, const tg::Tensor& x) {
//       ctx->save_for_backward({x});
//       return x * x;
//     }
//     static std::vector<tg::Tensor> backward(tg::autograd::AutogradContext* ctx, std::vector<tg::Tensor> grads) {
//       tg::Tensor x = ctx->saved_tensors()[0];
//       return {grads[0] * 2 * x};
//     }
//   };
//   tg::Tensor y = Square::apply(x);
//
// forward runs with grad recording off and returns a Tensor or a
// std::vector<Tensor>; apply returns the same. Any argument may be a non-tensor
// (a scalar, a kernel, ...). backward gets one gradient per forward output
// (zeros where an output received none) and returns one per forward argument,
// in order: an undefined Tensor() for non-tensor arguments and for inputs that
// need no gradient (ctx->needs_input_grad(i) says which do).
//
// Double backward, as PyTorch: under create_graph backward runs with grad mode on and its saved
// tensors carry their history (an input's, or the node's output), so a backward written with tg::
// ops is differentiated again. A backward that calls raw kernels (which record nothing) declares
// `static constexpr bool once_differentiable = true;`: then differentiating its result again is a
// tg::Error naming the function instead of a silently constant gradient.
#pragma once
#include <any>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <tapegrad/autograd/autograd.h>
#include <tapegrad/core/tensor.h>

namespace tg::autograd {

class PackedTensor;  // autograd/function.h

// Per-call state shared by a custom function's forward and backward.
class AutogradContext {
 public:
  // Keeps tensors for backward; reading them after an in-place change throws.
  void save_for_backward(const std::vector<Tensor>& tensors);
  std::vector<Tensor> saved_tensors() const;
  std::vector<Tensor> get_saved_variables() const { return saved_tensors(); }  // libtorch's name
  // Whether forward argument i is a tensor whose gradient is wanted.
  bool needs_input_grad(size_t i) const { return i < needs_input_grad_.size() && needs_input_grad_[i]; }
  // Anything else backward needs (sizes, scalars, a kernel...).
  std::map<std::string, std::any> saved_data;

  // Used by Function::apply and the node it records.
  void set_needs_input_grad(std::vector<bool> v) { needs_input_grad_ = std::move(v); }
  void release_saved();
  // The node recorded for the call (weak: it owns this context) and its outputs' TensorImpls as
  // forward returned them: saved tensors that are outputs get the node's history under create_graph.
  void set_node(const std::shared_ptr<Node>& node, const std::vector<const void*>& outputs);

 private:
  struct Saved {
    Tensor data;                           // a detached alias, or
    std::shared_ptr<PackedTensor> packed;  // the handle of the thread's saved-tensor hook (checkpoint)
    uint32_t version = 0;
    Edge edge;                     // the history a saved input had (none for outputs and constants)
    const void* source = nullptr;  // the saved tensor's TensorImpl, to recognise outputs
    int64_t output_nr = -1;        // which output of the node it is, or -1
  };
  std::vector<Saved> saved_;
  std::weak_ptr<Node> node_;
  std::vector<bool> needs_input_grad_;
  bool released_ = false;
};

namespace detail {
using CustomBackward = std::function<std::vector<Tensor>(AutogradContext*, std::vector<Tensor>)>;
// Builds the node for a custom function's outputs: edges to the tensor
// arguments (arg_is_tensor marks which forward arguments are tensors), one
// gradient slot per output. Returns the outputs with their history set.
// `differentiable`: whether backward may run with grad mode on under create_graph (its tg:: ops
// record themselves); else the engine runs it without recording and a second differentiation is a
// tg::Error naming the function.
std::vector<Tensor> record_custom(std::string name, std::shared_ptr<AutogradContext> ctx,
                                  std::vector<Tensor> tensor_inputs, std::vector<bool> arg_is_tensor,
                                  std::vector<Tensor> outputs, CustomBackward backward, bool differentiable = true);
bool any_requires_grad(const std::vector<Tensor>& tensors);
bool requires_grad(const Tensor& t);

template <typename T>
inline constexpr bool kIsTensorArg = std::is_same_v<std::decay_t<T>, Tensor>;
// Derived::once_differentiable (PyTorch's @once_differentiable), false when absent.
template <class D, class = void>
struct OnceDifferentiable : std::false_type {};
template <class D>
struct OnceDifferentiable<D, std::void_t<decltype(D::once_differentiable)>>
    : std::bool_constant<static_cast<bool>(D::once_differentiable)> {};
}  // namespace detail

template <class Derived>
struct Function {
  template <typename... Args>
  static auto apply(Args&&... args) {
    auto ctx = std::make_shared<AutogradContext>();
    std::vector<Tensor> tensor_inputs;
    std::vector<bool> arg_is_tensor;
    std::vector<bool> needs;
    const bool grad_on = GradMode::is_enabled();
    auto collect = [&](const auto& a) {
      if constexpr (detail::kIsTensorArg<decltype(a)>) {
        tensor_inputs.push_back(a);
        arg_is_tensor.push_back(true);
        needs.push_back(grad_on && detail::requires_grad(a));
      } else {
        arg_is_tensor.push_back(false);
        needs.push_back(false);
      }
    };
    (collect(args), ...);
    ctx->set_needs_input_grad(needs);
    const bool record = grad_on && detail::any_requires_grad(tensor_inputs);

    using Out = decltype(Derived::forward(ctx.get(), std::forward<Args>(args)...));
    static_assert(std::is_same_v<Out, Tensor> || std::is_same_v<Out, std::vector<Tensor>>,
                  "tg::autograd::Function: forward must return tg::Tensor or std::vector<tg::Tensor>");
    Out out;
    {
      NoGradGuard no_grad;
      out = Derived::forward(ctx.get(), std::forward<Args>(args)...);
    }
    if (!record) return out;
    std::vector<Tensor> outs;
    if constexpr (std::is_same_v<Out, Tensor>) {
      outs.push_back(std::move(out));
    } else {
      outs = std::move(out);
    }
    auto recorded = detail::record_custom(
        typeid(Derived).name(), std::move(ctx), std::move(tensor_inputs), std::move(arg_is_tensor), std::move(outs),
        [](AutogradContext* c, std::vector<Tensor> grads) { return Derived::backward(c, std::move(grads)); },
        !detail::OnceDifferentiable<Derived>::value);
    if constexpr (std::is_same_v<Out, Tensor>) {
      return std::move(recorded[0]);
    } else {
      return recorded;
    }
  }
};

}  // namespace tg::autograd
