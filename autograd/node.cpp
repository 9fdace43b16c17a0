// Graph building blocks: grad mode, nodes and their iterative release, saved
// tensors with the in-place version check, the leaves' AccumulateGrad,
// record(), which every differentiable op calls after its forward, and the
// recording of in-place ops (rebase_history, CopySlices, views' histories).
#include <algorithm>
#include <utility>
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

namespace {
thread_local SavedTensorHook* t_saved_hook = nullptr;
}  // namespace

SavedTensorHook* saved_tensor_hook() { return t_saved_hook; }
SavedTensorHookGuard::SavedTensorHookGuard(SavedTensorHook* hook) : prev_(t_saved_hook) { t_saved_hook = hook; }
SavedTensorHookGuard::~SavedTensorHookGuard() { t_saved_hook = prev_; }

SavedTensor::SavedTensor(const Tensor& t, const char* op, Saved kind) : op_(op) {
  if (!t.defined()) return;
  check_not_inference(t, op);
  output_ = kind == Saved::kOutput;
  if (!output_ && requires_grad(t)) edge_ = gradient_edge(t);
  if (t_saved_hook) {
    packed_ = t_saved_hook->pack(t);
    if (packed_) return;
  }
  data_ = alias(t);
  version_ = t.version();
}

namespace {
// The FunctionNode whose backward runs on this thread (its saved outputs' history under create_graph).
thread_local FunctionNode* t_applying = nullptr;
}  // namespace

Tensor with_history(const Tensor& t, const Edge& e) {
  Tensor v = alias(t);
  auto m = std::make_shared<AutogradMeta>();
  if (dynamic_cast<AccumulateGrad*>(e.fn.get())) {
    m->requires_grad = true;
    m->grad_accumulator = e.fn;  // kept alive by the SavedTensor's edge and, once recorded, by the new nodes
  } else {
    m->grad_fn = e.fn;
    m->output_nr = e.input_nr;
  }
  v.impl().autograd = std::move(m);
  return v;
}

Tensor SavedTensor::unpack() const {
  Tensor data = packed_ ? packed_->unpack() : data_;
  if (!data.defined()) return data;
  TG_CHECK(packed_ || data.version() == version_, op_, ": a tensor saved for backward (shape ", data.sizes(),
           ") was modified in place (version ", data.version(), ", expected ", version_,
           "): one of the variables needed for gradient computation has been modified by an inplace "
           "operation; use the out-of-place op, or clone() the tensor before changing it");
  if (!creating_graph()) return data;
  if (output_) return t_applying ? with_history(data, Edge{t_applying->shared_from_this(), 0}) : data;
  return edge_.valid() ? with_history(data, edge_) : data;
}

std::vector<Tensor> FunctionNode::apply(std::vector<Tensor>&& grads) {
  TG_CHECK(fn_ != nullptr || multi_fn_ != nullptr, name_,
           ": trying to backward through the graph a second time; its saved tensors were freed after the "
           "first backward. Pass retain_graph=true to the first backward() (BackwardOptions{.retain_graph = true})");
  struct Applying {
    FunctionNode* prev = t_applying;
    ~Applying() { t_applying = prev; }
  } applying;
  t_applying = this;
  if (multi_fn_) return multi_fn_(grads, *this);
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
  if (creating_graph()) {  // create_graph: .grad() keeps its history (a recorded clone / sum), as PyTorch
    meta->grad = meta->grad.defined() ? tg::add(meta->grad, g) : g.clone();
  } else if (!meta->grad.defined()) {
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

std::optional<DType> grad_twin_dtype(const Node& n, size_t i) {
  if (i >= n.next_edges.size() || !n.next_edges[i].fn) return std::nullopt;
  const Edge& e = n.next_edges[i];
  return e.fn->input_meta.at(e.input_nr).twin_dtype;
}

void expect_grad_cast(const Tensor& out, DType dtype) {
  const auto& m = out.impl().autograd;
  if (!m || !m->grad_fn) return;
  m->grad_fn->input_meta.at(m->output_nr).twin_dtype = dtype;
}

DType wanted_grad_dtype(const Edge& e) {
  const InputMeta& m = e.fn->input_meta.at(e.input_nr);
  return m.wide_dtype.value_or(m.dtype);
}

Tensor record_view(const char* name, const Tensor& input, Tensor out, BackwardFn fn, Backward kind) {
  Tensor res = record(name, {input}, std::move(out), std::move(fn), kind);
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
Tensor record_impl(const char* name, const Range& inputs, Tensor out, BackwardFn fn, Backward kind) {
  if (!is_floating(out.dtype())) return out;  // integer / bool results carry no gradient
  for (const Tensor& in : inputs) {
    if (in.defined() && in.is_same(out)) {  // never overwrite an input's history
      out = alias(out);
      break;
    }
  }
  auto node = std::make_shared<FunctionNode>(name, std::move(fn), kind);
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

std::vector<Tensor> record_multi_view(const char* name, const Tensor& input, std::vector<Tensor> outs,
                                      MultiBackwardFn fn, Backward kind) {
  if (!is_floating(input.dtype()) || outs.empty()) return outs;  // integer / bool results carry no gradient
  auto node = std::make_shared<FunctionNode>(name, std::move(fn), kind);
  node->next_edges.push_back(requires_grad(input) ? gradient_edge(input) : Edge{});
  const Edge& next = node->next_edges[0];
  for (Tensor& out : outs) {
    if (out.is_same(input)) out = alias(out);  // never overwrite the input's history
    const uint32_t nr = node->add_input_meta(out);
    // Views keep the gradient's dtype: each output takes what the input's node takes.
    if (next.valid() && next.fn->input_meta.at(next.input_nr).dtype == out.dtype())
      node->input_meta[nr].wide_dtype = next.fn->input_meta.at(next.input_nr).wide_dtype;
    auto meta = std::make_shared<AutogradMeta>();
    meta->grad_fn = node;
    meta->output_nr = nr;
    out.impl().autograd = std::move(meta);
  }
  return outs;
}

Tensor record(const char* name, std::initializer_list<Tensor> inputs, Tensor out, BackwardFn fn, Backward kind) {
  return record_impl(name, inputs, std::move(out), std::move(fn), kind);
}
Tensor record(const char* name, const std::vector<Tensor>& inputs, Tensor out, BackwardFn fn, Backward kind) {
  return record_impl(name, inputs, std::move(out), std::move(fn), kind);
}

// ---- in-place ops on tensors in a graph (PyTorch's rebase_history and CopySlices)
namespace {
struct Geometry {
  Shape sizes, strides;
  int64_t offset = 0;
  explicit Geometry(const Tensor& t) : sizes(t.sizes()), strides(t.strides()), offset(t.storage_offset()) {}
};

// An uninitialised tensor laid out as `base` and its sub-tensor at the place `view` has in base's storage.
std::pair<Tensor, Tensor> base_and_region(const Geometry& base, const Geometry& view, DType dtype, Device device) {
  Tensor r = native::empty_strided(base.sizes, base.strides, dtype, device);
  Tensor region = native::make_view(r, view.sizes, view.strides, r.storage_offset() + view.offset - base.offset);
  return {std::move(r), std::move(region)};
}

// The gradient of a view's region, g, as a gradient of its base: zeros outside the region. Dims the
// view broadcasts (stride 0, as expand) sum their gradient first.
Tensor view_grad_to_base(const Geometry& base, Geometry view, Tensor g) {
  std::vector<int64_t> bcast;
  for (size_t d = 0; d < view.sizes.size(); ++d)
    if (view.strides[d] == 0 && view.sizes[d] > 1) {
      bcast.push_back(static_cast<int64_t>(d));
      view.sizes[d] = 1;
    }
  if (!bcast.empty()) g = native::reduce(backend::ReduceOp::Sum, g, DimList(std::move(bcast)), true);
  auto [r, region] = base_and_region(base, view, g.dtype(), g.device());
  native::fill_(r, 0);
  native::copy_(region, g);
  return r;
}

// The view's region of a base-shaped gradient gg (a contiguous copy, view-shaped; a dim the view
// broadcasts reads its one element repeatedly): view_grad_to_base's adjoint.
Tensor region_of_native(const Geometry& base, const Geometry& view, const Tensor& gg) {
  auto [r, region] = base_and_region(base, view, gg.dtype(), gg.device());
  native::copy_(r, gg);
  return native::clone(region);
}

// The two linear maps between a view's gradient and its base's, each recorded under create_graph
// with the other as its backward, so in-place ops on views (CopySlices) and the views' rebuilt
// histories (as_strided) are differentiable to any order.
Tensor region_of(const Geometry& base, const Geometry& view, const Tensor& gg);
Tensor to_base(const Geometry& base, const Geometry& view, const Tensor& g) {
  auto f = [&](const Tensor& x) { return view_grad_to_base(base, view, x); };
  if (!creating_graph()) return f(g);
  return bw::linear_map("as_strided_backward", g, f, [base, view](const Tensor& gg) { return region_of(base, view, gg); });
}
Tensor region_of(const Geometry& base, const Geometry& view, const Tensor& gg) {
  auto f = [&](const Tensor& x) { return region_of_native(base, view, x); };
  if (!creating_graph()) return f(gg);
  return bw::linear_map("as_strided", gg, f, [base, view](const Tensor& g) { return to_base(base, view, g); });
}

// The history of a base after an in-place op on one of its views: the base-shaped gradient with the
// view's region replaced by what the op's backward (fn) gives for that region; the op's other
// inputs get fn's other gradients. Under create_graph (when fn records itself) the same with
// recorded ops: g - to_base(region) + to_base(fn(region)).
class CopySlices final : public Node {
 public:
  CopySlices(const Tensor& base, const Tensor& view, std::shared_ptr<FunctionNode> fn, Edge base_edge)
      : base_(base), view_(view), fn_(std::move(fn)) {
    next_edges = fn_->next_edges;
    next_edges.at(0) = std::move(base_edge);
    add_input_meta(base);
  }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor& g = grads.at(0);
    if (creating_graph()) return apply_recorded(g);
    auto [result, region] = base_and_region(base_, view_, g.dtype(), g.device());
    native::copy_(result, g);
    std::vector<Tensor> res = fn_->apply({native::clone(region)});
    std::vector<Tensor> out(next_edges.size());
    if (needs_input_grad(0)) {
      if (res.at(0).defined()) native::copy_(region, res[0]);
      else native::fill_(region, 0);
      out[0] = std::move(result);
    }
    for (size_t i = 1; i < out.size() && i < res.size(); ++i) out[i] = std::move(res[i]);
    return out;
  }
  const char* name() const override { return "CopySlices"; }
  void release_saved() override { fn_->release_saved(); }
  bool supports_create_graph() const override { return fn_->supports_create_graph(); }

 private:
  std::vector<Tensor> apply_recorded(const Tensor& g) {
    const Tensor gr = region_of(base_, view_, g);
    std::vector<Tensor> res = fn_->apply({gr});
    std::vector<Tensor> out(next_edges.size());
    if (needs_input_grad(0)) {
      out[0] = bw::sub(g, to_base(base_, view_, gr));
      if (res.at(0).defined()) out[0] = bw::add(out[0], to_base(base_, view_, res[0]));
    }
    for (size_t i = 1; i < out.size() && i < res.size(); ++i) out[i] = std::move(res[i]);
    return out;
  }

  Geometry base_, view_;
  std::shared_ptr<FunctionNode> fn_;
};

// t's edge from its autograd state as it is (check_inplace brought views up to date before the write).
Edge current_edge(const Tensor& t) {
  if (!t.defined()) return {};
  const auto& m = t.impl().autograd;
  return m && (m->requires_grad || m->grad_fn) ? gradient_edge(t) : Edge{};
}

// Makes node t's history; a retain_grad() follows the tensor to it, as in PyTorch.
void set_history(const Tensor& t, std::shared_ptr<Node> node) {
  auto& m = t.impl().autograd;
  if (!m) m = std::make_shared<AutogradMeta>();
  if (m->retain_grad) {
    if (m->grad_fn) {
      auto& r = m->grad_fn->retained;
      r.erase(std::remove_if(r.begin(), r.end(), [&](const auto& e) { return e.second.lock() == t.impl_ptr(); }),
              r.end());
    }
    node->retained.emplace_back(0, t.impl_ptr());
  }
  m->grad_fn = std::move(node);
  m->output_nr = 0;
}

// A view's history as its region of its base's current history (PyTorch's AsStridedBackward).
std::shared_ptr<Node> view_of_base_node(const Tensor& base, const Tensor& view) {
  auto n = std::make_shared<FunctionNode>(
      "as_strided",
      [b = Geometry(base), v = Geometry(view)](const Tensor& g, const FunctionNode&) -> std::vector<Tensor> {
        return {to_base(b, v, g)};
      },
      kDifferentiable);
  n->next_edges.push_back(current_edge(base));
  n->add_input_meta(view);
  return n;
}
}  // namespace

Tensor mark_view(const Tensor& input, Tensor out) {
  const TensorImpl& in = input.impl();
  TensorImpl& o = out.impl();
  if (&o == &in || o.storage != in.storage) return out;  // not a view (a reshape that copied)
  o.view_base = in.view_base ? in.view_base : input.impl_ptr();
  o.view_version = in.storage->version();
  o.view_no_grad = in.view_no_grad || !GradMode::is_enabled();
  return out;
}

void refresh_view(const Tensor& t) {
  TensorImpl& v = t.impl();
  auto& m = v.autograd;
  const uint32_t now = v.storage->version();
  if (v.view_no_grad || (m && m->requires_grad && !m->grad_fn)) {  // no history that follows the base
    v.view_version = now;
    return;
  }
  const Tensor base(v.view_base);
  const auto& bm = base.impl().autograd;
  if (!bm || (!bm->requires_grad && !bm->grad_fn)) {
    if (m && m->grad_fn) v.view_version = now;  // the base left autograd: keep what the view has
    return;  // else, as PyTorch, looked at again until the base takes part in autograd
  }
  set_history(t, view_of_base_node(base, t));
  v.view_version = now;
}

bool detail::check_inplace_recorded(const Tensor& self, const char* op, std::initializer_list<const Tensor*> others) {
  bool any = requires_grad(self);  // also brings each view's history up to date
  for (const Tensor* o : others) any = requires_grad(*o) || any;
  if (!any) return false;
  const TensorImpl& s = self.impl();
  if (s.view_base) {
    TG_CHECK(!s.view_no_grad, op, ": a view (shape ", self.sizes(), ") was created in no_grad mode and is being "
             "modified inplace with grad mode enabled; make the view and the in-place op both inside the "
             "tg::NoGradGuard scope (not recorded) or both outside it (recorded)");
    const auto& bm = s.view_base->autograd;
    TG_CHECK(!(bm && bm->requires_grad && !bm->grad_fn), op, ": a view of a leaf Variable that requires grad is "
             "being used in an in-place operation (view of shape ", self.sizes(), ", leaf of shape ",
             s.view_base->sizes, "); wrap the update in tg::NoGradGuard or use the out-of-place op");
  }
  const auto& m = s.autograd;
  TG_CHECK(!(m && m->requires_grad && !m->grad_fn), op, ": a leaf Variable that requires grad is being used in an "
           "in-place operation (shape ", self.sizes(), "); wrap the update in tg::NoGradGuard or use the "
           "out-of-place op");
  for (size_t d = 0; d < s.sizes.size(); ++d)
    TG_CHECK(s.strides[d] != 0 || s.sizes[d] <= 1, op, ": unsupported operation: more than one element of the "
             "written-to tensor (shape ", self.sizes(), ", strides ", self.strides(), ") refers to a single memory "
             "location; clone() it before the in-place op");
  return true;
}

void rebase_history(const char* name, const Tensor& self, std::initializer_list<Tensor> others, BackwardFn fn,
                    Backward kind) {
  if (!is_floating(self.dtype())) return;
  auto node = std::make_shared<FunctionNode>(name, std::move(fn), kind);
  node->next_edges.reserve(others.size() + 1);
  node->next_edges.push_back(current_edge(self));
  for (const Tensor& o : others) node->next_edges.push_back(current_edge(o));
  node->add_input_meta(self);
  TensorImpl& s = self.impl();
  if (!s.view_base) {
    set_history(self, std::move(node));
    return;
  }
  const Tensor base(s.view_base);
  set_history(base, std::make_shared<CopySlices>(base, self, std::move(node), current_edge(base)));
  set_history(self, view_of_base_node(base, self));
  s.view_version = s.storage->version();
}

}  // namespace tg::autograd
