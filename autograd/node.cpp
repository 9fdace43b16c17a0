// Graph building blocks: grad mode, nodes and their iterative release, saved
// tensors with the in-place version check, the leaves' AccumulateGrad, and
// record(), which every differentiable op calls after its forward.
#include <vector>

#include <tapegrad/autograd/accumulate_grad.h>
#include <tapegrad/autograd/function.h>

namespace tg::autograd {

// ---- grad mode
namespace {
thread_local bool t_grad_enabled = true;
}  // namespace
bool GradMode::is_enabled() { return t_grad_enabled; }
void GradMode::set_enabled(bool enabled) { t_grad_enabled = enabled; }

// ---- nodes
// Destroying the head of a 100 000-node chain would otherwise recurse once per
// node through the shared_ptr destructors and overflow the stack: instead the
// outermost destructor drains a list of pending nodes that the nested ones append
// to. The thread-local is a plain pointer to that list (trivially destructible,
// so graphs released during static destruction are safe too).
namespace {
thread_local std::vector<std::shared_ptr<Node>>* t_pending = nullptr;
}  // namespace

Node::~Node() {
  if (t_pending) {
    for (auto& e : next_edges)
      if (e.fn) t_pending->push_back(std::move(e.fn));
    return;
  }
  std::vector<std::shared_ptr<Node>> pending;
  for (auto& e : next_edges)
    if (e.fn) pending.push_back(std::move(e.fn));
  if (pending.empty()) return;
  t_pending = &pending;
  while (!pending.empty()) {
    std::shared_ptr<Node> n = std::move(pending.back());
    pending.pop_back();
    n.reset();  // when it was the last owner, n's destructor appends its children
  }
  t_pending = nullptr;
}

uint32_t Node::add_input_meta(const Tensor& t) {
  input_meta.push_back(InputMeta{t.sizes(), t.dtype(), t.device()});
  return static_cast<uint32_t>(input_meta.size() - 1);
}

// ---- saved tensors
Tensor alias(const Tensor& t) {
  Tensor v = native::make_view(t, t.sizes(), t.strides(), t.storage_offset());
  v.impl().autograd.reset();
  return v;
}

SavedTensor::SavedTensor(const Tensor& t, const char* op) : op_(op) {
  if (!t.defined()) return;
  check_not_inference(t, op);
  data_ = alias(t);
  version_ = t.version();
}

Tensor SavedTensor::unpack() const {
  if (data_.defined()) {
    TG_CHECK(data_.version() == version_, op_, ": a tensor saved for backward (shape ", data_.sizes(),
             ") was modified in place (version ", data_.version(), ", expected ", version_, ")");
  }
  return data_;
}

std::vector<Tensor> FunctionNode::apply(std::vector<Tensor>&& grads) {
  TG_CHECK(fn_ != nullptr, name_,
           ": trying to backward through the graph a second time; its saved tensors were freed after the "
           "first backward. Pass retain_graph=true to the first backward() (BackwardOptions{.retain_graph = true})");
  return fn_(grads.at(0), *this);
}

// ---- leaves
Tensor owned_grad(Tensor g) {
  if (!g.is_contiguous()) return native::contiguous(g);  // a fresh dense copy
  if (g.impl_ptr().use_count() > 1 || g.impl().storage.use_count() > 1) return native::clone(g);
  return g;
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grads) {
  Tensor& g = grads.at(0);
  if (!g.defined()) return {};
  auto& meta = leaf_->autograd;
  if (!meta) meta = std::make_shared<AutogradMeta>();
  if (!meta->grad.defined()) {
    meta->grad = owned_grad(std::move(g));
  } else {
    meta->grad = native::add(meta->grad, g);
  }
  run_post_accumulate_grad_hooks(leaf_);
  return {};
}

GradHooks* AccumulateGrad::grad_hooks() const {
  const auto& m = leaf_->autograd;
  return m ? m->hooks.get() : nullptr;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined()) return {};
  auto& m = t.impl().autograd;
  if (!m) return {};
  if (m->grad_fn) return Edge{m->grad_fn, m->output_nr};
  if (!m->requires_grad) return {};
  std::shared_ptr<Node> acc = m->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    acc->add_input_meta(t);
    m->grad_accumulator = acc;
  }
  return Edge{std::move(acc), 0};
}

DType wanted_grad_dtype(const Edge& e) {
  const InputMeta& m = e.fn->input_meta.at(e.input_nr);
  return m.wide_dtype.value_or(m.dtype);
}

Tensor record_view(const char* name, const Tensor& input, Tensor out, BackwardFn fn) {
  Tensor res = record(name, {input}, std::move(out), std::move(fn));
  const auto& m = res.impl().autograd;
  if (!m || !m->grad_fn) return res;  // not recorded (no input needs grad, or a non-floating result)
  const Edge& next = m->grad_fn->next_edges.at(0);
  InputMeta& own = m->grad_fn->input_meta.at(m->output_nr);
  // The view's backward keeps the gradient's dtype: it takes what its input's node takes.
  if (next.valid() && next.fn->input_meta.at(next.input_nr).dtype == own.dtype)
    own.wide_dtype = next.fn->input_meta.at(next.input_nr).wide_dtype;
  return res;
}

// ---- recording
namespace {
template <typename Range>
Tensor record_impl(const char* name, const Range& inputs, Tensor out, BackwardFn fn) {
  if (!is_floating(out.dtype())) return out;  // integer / bool results carry no gradient
  for (const Tensor& in : inputs) {
    if (in.defined() && in.is_same(out)) {  // never overwrite an input's history
      out = alias(out);
      break;
    }
  }
  auto node = std::make_shared<FunctionNode>(name, std::move(fn));
  node->next_edges.reserve(inputs.size());
  for (const Tensor& in : inputs) node->next_edges.push_back(requires_grad(in) ? gradient_edge(in) : Edge{});
  node->add_input_meta(out);
  auto meta = std::make_shared<AutogradMeta>();
  meta->grad_fn = std::move(node);
  meta->output_nr = 0;
  out.impl().autograd = std::move(meta);
  return out;
}
}  // namespace

Tensor record(const char* name, std::initializer_list<Tensor> inputs, Tensor out, BackwardFn fn) {
  return record_impl(name, inputs, std::move(out), std::move(fn));
}
Tensor record(const char* name, const std::vector<Tensor>& inputs, Tensor out, BackwardFn fn) {
  return record_impl(name, inputs, std::move(out), std::move(fn));
}

void check_inplace(const Tensor& self, const char* op) {
  if (!GradMode::is_enabled() || !requires_grad(self)) return;
  const bool leaf = !self.impl().autograd->grad_fn;
  TG_ERROR(op, ": in-place operation on a tensor of shape ", self.sizes(), " that requires grad (",
           leaf ? "a leaf" : "an output of the graph",
           "); autograd may need its old values. Use the out-of-place op, or wrap the update in tg::NoGradGuard");
}

}  // namespace tg::autograd
