// The engine side of user-defined autograd functions (autograd/custom_function.h):
// saved tensors with the in-place check, and the node that calls the user's backward.
#include <tapegrad/autograd/custom_function.h>

#include <algorithm>

#include <tapegrad/autograd/function.h>

namespace tg::autograd {

void AutogradContext::save_for_backward(const std::vector<Tensor>& tensors) {
  saved_.clear();
  released_ = false;
  for (const Tensor& t : tensors) {
    if (!t.defined()) {
      saved_.push_back(Saved{});
      continue;
    }
    // Only when apply records a node (some input needs grad): forward also runs without one.
    if (std::find(needs_input_grad_.begin(), needs_input_grad_.end(), true) != needs_input_grad_.end())
      check_not_inference(t, "custom Function save_for_backward");
    // A detached alias: saving an output must not make the node own itself. An input's edge is
    // kept (upstream of the node: no cycle) for create_graph.
    const Edge edge = requires_grad(t) ? gradient_edge(t) : Edge{};
    SavedTensorHook* hook = saved_tensor_hook();
    if (auto packed = hook ? hook->pack(t) : nullptr)
      saved_.push_back(Saved{Tensor(), std::move(packed), 0, edge, t.impl_ptr().get()});
    else
      saved_.push_back(Saved{alias(t), nullptr, t.version(), edge, t.impl_ptr().get()});
  }
}

void AutogradContext::set_node(const std::shared_ptr<Node>& node, const std::vector<const void*>& outputs) {
  node_ = node;
  for (Saved& s : saved_) {
    if ((!s.data.defined() && !s.packed) || s.edge.valid()) continue;
    for (size_t k = 0; k < outputs.size(); ++k)
      if (outputs[k] == s.source) s.output_nr = static_cast<int64_t>(k);
  }
}

std::vector<Tensor> AutogradContext::saved_tensors() const {
  TG_CHECK(!released_, "custom Function: saved tensors were freed after the first backward; pass retain_graph = "
                       "true to the first backward() to run it twice");
  std::vector<Tensor> out;
  out.reserve(saved_.size());
  for (size_t i = 0; i < saved_.size(); ++i) {
    const Saved& s = saved_[i];
    const Tensor data = s.packed ? s.packed->unpack() : s.data;  // a packed value checks its own version
    if (!s.packed && data.defined()) {
      TG_CHECK(s.data.version() == s.version, "custom Function: saved tensor ", i, " (shape ", s.data.sizes(),
               ") was modified in place after save_for_backward (version ", s.data.version(), ", expected ", s.version,
               ")");
    }
    // Under create_graph (the backward runs with grad mode on) a saved input has its history back
    // and a saved output the node's, so the backward's own ops link to the forward graph.
    std::shared_ptr<Node> node = s.output_nr >= 0 ? node_.lock() : nullptr;
    if (!data.defined() || !creating_graph()) {
      out.push_back(data);
    } else if (node) {
      out.push_back(with_history(data, Edge{node, static_cast<uint32_t>(s.output_nr)}));
    } else {
      out.push_back(s.edge.valid() ? with_history(data, s.edge) : data);
    }
  }
  return out;
}

void AutogradContext::release_saved() {
  saved_.clear();
  saved_data.clear();
  released_ = true;
}

namespace {

class CustomFunctionNode final : public Node {
 public:
  CustomFunctionNode(std::string name, std::shared_ptr<AutogradContext> ctx, std::vector<bool> arg_is_tensor,
                     detail::CustomBackward backward, bool differentiable)
      : name_(std::move(name)), ctx_(std::move(ctx)), arg_is_tensor_(std::move(arg_is_tensor)),
        backward_(std::move(backward)), differentiable_(differentiable) {}

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    // Outputs that got no gradient get zeros, so backward can use every slot.
    for (size_t i = 0; i < grads.size() && i < input_meta.size(); ++i) {
      if (!grads[i].defined()) {
        const InputMeta& m = input_meta[i];
        grads[i] = native::full(m.shape, 0, m.dtype, m.device);
      } else {
        grads[i] = writable(grads[i]);  // user code may write into its incoming gradients
      }
    }
    std::vector<Tensor> per_arg = backward_(ctx_.get(), std::move(grads));
    size_t n_tensors = 0;
    for (bool b : arg_is_tensor_) n_tensors += b;
    TG_CHECK(per_arg.size() == arg_is_tensor_.size(), name_, ": backward returned ", per_arg.size(),
             " gradient(s); it must return one per forward argument (", arg_is_tensor_.size(), ", of which ",
             n_tensors, " tensor(s)), an undefined Tensor() for the others");
    std::vector<Tensor> per_edge;
    per_edge.reserve(n_tensors);
    for (size_t i = 0; i < per_arg.size(); ++i) {
      if (!arg_is_tensor_[i]) continue;
      const size_t e = per_edge.size();
      Tensor g = std::move(per_arg[i]);
      if (g.defined() && e < next_edges.size() && next_edges[e].valid()) {
        const InputMeta& want = next_edges[e].fn->input_meta.at(next_edges[e].input_nr);
        TG_CHECK(g.device() == want.device, name_, ": backward's gradient for argument ", i, " is on ", g.device(),
                 " but the input is on ", want.device);
      }
      per_edge.push_back(std::move(g));
    }
    return per_edge;
  }
  const char* name() const override { return name_.c_str(); }
  void release_saved() override { ctx_->release_saved(); }
  AutogradContext& context() { return *ctx_; }
  // As PyTorch: under create_graph the user's backward runs with grad mode on, so the tg:: ops it
  // uses record themselves and it can be differentiated again.
  bool supports_create_graph() const override { return differentiable_; }

 private:
  std::string name_;
  std::shared_ptr<AutogradContext> ctx_;
  std::vector<bool> arg_is_tensor_;
  detail::CustomBackward backward_;
  bool differentiable_;
};

}  // namespace

bool detail::requires_grad(const Tensor& t) { return autograd::requires_grad(t); }

bool detail::any_requires_grad(const std::vector<Tensor>& tensors) {
  for (const Tensor& t : tensors)
    if (autograd::requires_grad(t)) return true;
  return false;
}

std::vector<Tensor> detail::record_custom(std::string name, std::shared_ptr<AutogradContext> ctx,
                                          std::vector<Tensor> tensor_inputs, std::vector<bool> arg_is_tensor,
                                          std::vector<Tensor> outputs, CustomBackward backward, bool differentiable) {
  auto node = std::make_shared<CustomFunctionNode>(std::move(name), std::move(ctx), std::move(arg_is_tensor),
                                                   std::move(backward), differentiable);
  std::vector<const void*> sources;
  for (const Tensor& out : outputs) sources.push_back(out.defined() ? out.impl_ptr().get() : nullptr);
  node->context().set_node(node, sources);
  node->next_edges.reserve(tensor_inputs.size());
  for (const Tensor& in : tensor_inputs)
    node->next_edges.push_back(autograd::requires_grad(in) ? gradient_edge(in) : Edge{});
  for (size_t k = 0; k < outputs.size(); ++k) {
    Tensor& out = outputs[k];
    TG_CHECK(out.defined(), node->name(), ": forward returned an undefined tensor as output ", k);
    // Never overwrite an input's (or another output's) history: give the output its own TensorImpl.
    bool shared = false;
    for (const Tensor& in : tensor_inputs) shared |= in.is_same(out);
    for (size_t j = 0; j < k; ++j) shared |= outputs[j].is_same(out);
    if (shared || out.impl().autograd) out = alias(out);
    const uint32_t nr = node->add_input_meta(out);
    if (!is_floating(out.dtype())) continue;  // integer / bool outputs carry no gradient
    auto meta = std::make_shared<AutogradMeta>();
    meta->grad_fn = node;
    meta->output_nr = nr;
    out.impl().autograd = std::move(meta);
  }
  return outputs;
}

}  // namespace tg::autograd
