// The backward engine: an iterative topological order from the roots (Kahn's
// algorithm on dependency counts, so deep graphs never recurse), then one reverse
// pass with a per-node input buffer that sums gradients from several consumers.
// Every gradient entering a node is reduced (sum_to) and cast to what that node
// expects here, in one place. Also the Tensor autograd methods.
#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <tapegrad/autograd/accumulate_grad.h>
#include <tapegrad/autograd/function.h>
#include <tapegrad/core/autocast_hook.h>
#include <tapegrad/core/trace.h>
#if defined(TG_WITH_CUDA)
#include <tapegrad/core/backend/cuda/runtime.h>
#include <tapegrad/core/cuda.h>
#endif

namespace tg {
namespace autograd {
namespace {

// The one place a broadcast gradient is reduced to its input's shape and cast
// back to its dtype / device. A gradient already in the wider dtype the node also
// takes (`wanted`, see InputMeta::wide_dtype) is kept as it is.
// Under create_graph (grad mode on in the engine) both steps are recorded.
Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (!creating_graph()) return native::sum_to(g, shape);
  const int64_t lead = g.dim() - static_cast<int64_t>(shape.size());
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < g.dim(); ++d)
    if (d < lead || (shape[d - lead] == 1 && g.size(d) != 1)) dims.push_back(d);
  return bw::reshape(dims.empty() ? g : bw::sum(g, dims, true), shape);
}

Tensor conform(Tensor g, const InputMeta& m, DType wanted) {
  if (g.sizes() != m.shape) g = sum_to(g, m.shape);
  const DType dtype = g.dtype() == wanted ? wanted : m.dtype;
  if (g.dtype() != dtype || g.device() != m.device) g = bw::to(g, m.device, dtype);
  return g;
}

// A gradient as the tensor it belongs to has it (for .grad() of retained non-leaves and
// autograd::grad's results, which may have arrived in a node's wider dtype).
Tensor as_meta(const Tensor& g, const InputMeta& m) {
  return g.defined() && g.dtype() != m.dtype ? bw::to(g, m.device, m.dtype) : g;
}

// The engine's mode for one backward run: grad mode on exactly with create_graph (so the
// differentiable backward closures record); autocast and tracing off, as in PyTorch's backward
// (the closures' tg:: ops neither cast nor trace; utils::checkpoint sets the forward's autocast), and
// no saved-tensor hook (a create_graph backward inside a checkpointed segment keeps its own saves).
class BackwardMode {
 public:
  explicit BackwardMode(bool create_graph)
      : grad_(GradMode::is_enabled()), autocast_(amp::detail::tls_autocast.enabled_mask), tracer_(tg::detail::tls_tracer) {
    GradMode::set_enabled(create_graph);
    amp::detail::tls_autocast.enabled_mask = 0;
    tg::detail::tls_tracer = nullptr;
  }
  ~BackwardMode() {
    GradMode::set_enabled(grad_);
    amp::detail::tls_autocast.enabled_mask = autocast_;
    tg::detail::tls_tracer = tracer_;
  }
  BackwardMode(const BackwardMode&) = delete;
  BackwardMode& operator=(const BackwardMode&) = delete;

 private:
  bool grad_;
  uint8_t autocast_;
  tg::detail::Tracer* tracer_;
  SavedTensorHookGuard no_hook_{nullptr};
};

// Under create_graph, the results of a node whose backward does not record itself get a history
// that refuses to be differentiated (PyTorch's "NotImplemented" node): its edges are the node's own
// (the forward inputs the result depends on through saved tensors) and the incoming gradients'.
Tensor not_implemented(const Node& node, const std::vector<Tensor>& incoming, Tensor result) {
  auto n = std::make_shared<FunctionNode>(
      "NotImplemented", [name = std::string(node.name())](const Tensor&, const FunctionNode&) -> std::vector<Tensor> {
        TG_CHECK(false, name, ": double backward not implemented (a gradient computed with create_graph=true went "
                 "through ", name, "'s backward, which is not differentiable)");
        return {};
      });
  n->next_edges = node.next_edges;
  for (const Tensor& g : incoming)
    if (requires_grad(g)) n->next_edges.push_back(gradient_edge(g));
  Tensor r = alias(result);
  n->add_input_meta(r);
  auto meta = std::make_shared<AutogradMeta>();
  meta->grad_fn = std::move(n);
  r.impl().autograd = std::move(meta);
  return r;
}

// The implicit gradient of a scalar CUDA root (loss.backward()): one read-only 1 per
// (device, dtype), made once, so that a training step's backward starts without a fill
// launch. It never reaches users writable: AccumulateGrad copies gradients whose storage
// is shared (owned_grad), and autograd::grad results and custom Functions' incoming
// gradients are copied when they are this tensor (is_implicit_one).
struct ImplicitOnes {
  std::mutex mu;
  std::map<std::tuple<int, int>, Tensor> by_key;  // (device index, dtype)
};
ImplicitOnes& implicit_ones() {
  static auto* o = new ImplicitOnes;  // never destroyed: CUDA memory outlives static teardown order
  return *o;
}

Tensor implicit_one(const Tensor& r) {
  Tensor fresh;
#if defined(TG_WITH_CUDA)
  if (r.is_cuda()) {
    ImplicitOnes& o = implicit_ones();
    const auto key = std::make_tuple(r.device().index(), static_cast<int>(r.dtype()));
    std::lock_guard<std::mutex> lock(o.mu);
    auto it = o.by_key.find(key);
    if (it == o.by_key.end()) {
      // Made eagerly only: a fill captured into a graph would not run now.
      if (cuda::detail::current_stream_capturing(r.device().index()))
        return native::full(r.sizes(), 1, r.dtype(), r.device());
      Tensor one = native::full(Shape{}, 1, r.dtype(), r.device());
      cuda::current_stream().synchronize();  // written before any stream reads it
      it = o.by_key.emplace(key, std::move(one)).first;
    }
    return native::view(it->second, r.sizes());
  }
#endif
  return native::full(r.sizes(), 1, r.dtype(), r.device());
}

struct Capture {
  uint32_t input_nr;
  size_t result_index;
};

// Gradients for one input of a node are summed lazily: small CUDA gradients wait in a list and
// are added in one fused launch (native::add_n) when the node runs or the list is full, since on
// a GPU a launch per contribution costs far more than the arithmetic. Large ones add at once.
struct Slot {
  std::vector<Tensor> parts;
  Tensor collapse() {
    if (parts.size() > 1) {
      // Parts may mix a node's own dtype and the wider one it also takes: sum in the wider.
      DType dt = parts[0].dtype();
      for (const Tensor& p : parts) dt = promote_types(dt, p.dtype());
      for (Tensor& p : parts)
        if (p.dtype() != dt) p = bw::to(p, p.device(), dt);
      if (creating_graph()) {
        for (size_t i = 1; i < parts.size(); ++i) parts[0] = tg::add(parts[0], parts[i]);
        parts.resize(1);
      } else {
        parts = {native::add_n(parts)};
      }
    }
    return parts.empty() ? Tensor() : parts[0];
  }
};
using Buffers = std::unordered_map<Node*, std::vector<Slot>>;

// The node whose backward runs now on this thread and the reverse pass's state it may look at
// (take_pending_grad, pointwise_next); saved and restored around each call, so nested passes see
// their own. `absorbed`: the edges whose next node the running backward applied (absorb_next).
struct PassState {
  Buffers* buffers;
  std::unordered_map<Node*, int>* deps;
  const std::unordered_map<Node*, std::vector<Capture>>* captures;
};
struct Running {
  const Node* node = nullptr;
  PassState* pass = nullptr;
  std::vector<size_t>* absorbed = nullptr;
};
thread_local Running t_running;
thread_local uint64_t t_absorbed_count = 0;

class RunningGuard {
 public:
  RunningGuard(const Node* node, PassState* pass, std::vector<size_t>* absorbed) : prev_(t_running) {
    t_running = {node, pass, absorbed};
  }
  ~RunningGuard() { t_running = prev_; }
  RunningGuard(const RunningGuard&) = delete;
  RunningGuard& operator=(const RunningGuard&) = delete;

 private:
  Running prev_;
};

// Runs the reverse pass. With `inputs` (tg::autograd::grad), the gradients
// reaching them are returned and no leaf's .grad() is touched.
// The pass owns `roots` and `root_grads` and drops them once it has their edges: what keeps a root's
// value or its gradient alive during the pass is the caller's reference or a node that saved it.
std::vector<Tensor> run_backward(std::vector<Tensor> roots, std::vector<Tensor> root_grads, bool retain_graph,
                                 bool create_graph, const std::vector<Tensor>* inputs, const char* op) {
  BackwardMode mode(create_graph);
  TG_CHECK(!roots.empty(), op, ": no output tensors given");
  TG_CHECK(root_grads.empty() || root_grads.size() == roots.size(), op, ": got ", root_grads.size(), " gradients for ",
           roots.size(), " outputs");

  // ---- root gradients
  std::vector<std::pair<Edge, Tensor>> starts;
  starts.reserve(roots.size());
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    TG_CHECK(r.defined(), op, ": output ", i, " is an undefined tensor");
    TG_CHECK(requires_grad(r), op, ": the tensor of shape ", r.sizes(),
             " does not require grad and has no grad_fn (did it come from leaves with requires_grad_()?)");
    Tensor g = root_grads.empty() ? Tensor() : std::move(root_grads[i]);
    if (!g.defined()) {
      TG_CHECK(r.numel() == 1, op, ": grad can be implicitly created only for scalar outputs; the output has shape ",
               r.sizes(), ", pass a gradient of that shape");
      g = implicit_one(r);
    } else {
      TG_CHECK(g.sizes() == r.sizes(), op, ": gradient has shape ", g.sizes(), " but the output has shape ", r.sizes());
      TG_CHECK(g.dtype() == r.dtype(), op, ": gradient has dtype ", g.dtype(), " but the output has dtype ", r.dtype());
      TG_CHECK(g.device() == r.device(), op, ": gradient is on ", g.device(), " but the output is on ", r.device());
    }
    starts.emplace_back(gradient_edge(r), std::move(g));
  }
  roots = {};
  root_grads = {};

  // ---- dependency counts over the reachable graph (iterative DFS)
  std::unordered_map<Node*, int> deps;
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack;
  for (auto& [e, g] : starts)
    if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.fn) continue;
      ++deps[e.fn.get()];
      if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    }
  }

  // ---- what tg::autograd::grad wants back
  std::unordered_map<Node*, std::vector<Capture>> captures;
  std::vector<Tensor> results;
  if (inputs) {
    results.resize(inputs->size());
    for (size_t i = 0; i < inputs->size(); ++i) {
      const Tensor& t = (*inputs)[i];
      TG_CHECK(t.defined() && requires_grad(t), op, ": input ", i, " (shape ",
               t.defined() ? t.sizes().str() : std::string("undefined"), ") does not require grad");
      const auto& m = t.impl().autograd;
      std::shared_ptr<Node> fn = m->grad_fn ? m->grad_fn : m->grad_accumulator.lock();
      if (fn && seen.count(fn.get())) captures[fn.get()].push_back({m->grad_fn ? m->output_nr : 0u, i});
    }
  }

  // ---- the reverse pass (Slot: the sum of one input's gradients)
  constexpr int64_t kLazyMaxNumel = 1 << 16;
  Buffers buffers;
  PassState pass{&buffers, &deps, &captures};
  // Results of nodes whose backward a node before them applied (absorb_next): when such a node's
  // turn comes, these are its gradients and it does not run.
  std::unordered_map<Node*, std::vector<Tensor>> precomputed;
  auto deliver = [&](const Edge& e, Tensor g) {
    Node* n = e.fn.get();
    g = conform(std::move(g), n->input_meta.at(e.input_nr), wanted_grad_dtype(e));
    auto& buf = buffers[n];
    if (buf.empty()) buf.resize(n->input_meta.size());
    Slot& slot = buf[e.input_nr];
    const bool lazy = g.is_cuda() && g.numel() <= kLazyMaxNumel && is_floating(g.dtype());
    slot.parts.push_back(std::move(g));
    if (slot.parts.size() >= static_cast<size_t>(lazy ? backend::kMaxAddN : 2)) slot.collapse();
  };
  for (auto& [e, g] : starts) deliver(e, std::move(g));

  // Roots' nodes with no consumer inside the graph start the pass. `owner` keeps
  // each node alive while it runs even if the user dropped every tensor.
  std::vector<std::shared_ptr<Node>> ready;
  for (auto& [e, g] : starts)
    if (deps.find(e.fn.get()) == deps.end() &&
        std::none_of(ready.begin(), ready.end(), [&](const auto& p) { return p.get() == e.fn.get(); }))
      ready.push_back(e.fn);

  // A node's results go to its next nodes, each ready once its last incoming edge is done.
  auto send_on = [&](const Node& node, std::vector<Tensor>& outs) {
    for (size_t i = 0; i < node.next_edges.size(); ++i) {
      const Edge& e = node.next_edges[i];
      if (!e.fn) continue;
      if (i < outs.size() && outs[i].defined()) deliver(e, std::move(outs[i]));
      auto d = deps.find(e.fn.get());
      if (--d->second == 0) {
        deps.erase(d);
        ready.push_back(e.fn);
      }
    }
  };
  while (!ready.empty()) {
    std::shared_ptr<Node> node = std::move(ready.back());
    ready.pop_back();
    if (auto pc = precomputed.find(node.get()); pc != precomputed.end()) {
      std::vector<Tensor> outs = std::move(pc->second);
      precomputed.erase(pc);
      buffers.erase(node.get());
      if (!retain_graph) node->release_saved();
      send_on(*node, outs);
      continue;
    }
    std::vector<Tensor> buf;
    if (auto it = buffers.find(node.get()); it != buffers.end()) {
      for (Slot& slot : it->second) buf.push_back(slot.collapse());
      buffers.erase(it);
    }
    buf.resize(node->input_meta.size());
    if (GradHooks* hooks = node->grad_hooks(); hooks && !hooks->empty()) run_grad_hooks(*node, *hooks, buf);

    if (auto it = captures.find(node.get()); it != captures.end())
      for (const Capture& c : it->second)
        results[c.result_index] = writable(as_meta(buf[c.input_nr], node->input_meta[c.input_nr]));
    if (!inputs) {
      for (auto& [nr, weak] : node->retained) {
        auto impl = weak.lock();
        if (!impl || nr >= buf.size() || !buf[nr].defined()) continue;
        auto& m = impl->autograd;
        const Tensor g = as_meta(buf[nr], node->input_meta[nr]);
        if (create_graph) m->grad = m->grad.defined() ? tg::add(m->grad, g) : g.clone();
        else m->grad = m->grad.defined() ? native::add(m->grad, g) : native::clone(g);
      }
    }

    const bool any = std::any_of(buf.begin(), buf.end(), [](const Tensor& t) { return t.defined(); });
    const bool skip = !any || (inputs && dynamic_cast<AccumulateGrad*>(node.get()) != nullptr);
    std::vector<Tensor> outs;
    if (!skip) {
      if (create_graph && !node->supports_create_graph() && !dynamic_cast<AccumulateGrad*>(node.get())) {
        std::vector<Tensor> incoming = buf;
        {
          NoGradGuard no_grad;
          outs = AnomalyMode::is_enabled() ? apply_in_anomaly_mode(*node, std::move(buf)) : node->apply(std::move(buf));
        }
        for (Tensor& o : outs)
          if (o.defined()) o = not_implemented(*node, incoming, std::move(o));
      } else {
        std::vector<size_t> absorbed;
        {
          RunningGuard running(node.get(), &pass, &absorbed);
          outs = AnomalyMode::is_enabled() ? apply_in_anomaly_mode(*node, std::move(buf)) : node->apply(std::move(buf));
        }
        for (size_t i : absorbed) {  // input i's gradient is already the next node's result
          TG_CHECK(i < outs.size() && outs[i].defined(), node->name(), ": backward applied its input ", i,
                   "'s next node but returned no gradient for it");
          precomputed[node->next_edges[i].fn.get()] = {std::move(outs[i])};
          outs[i] = Tensor();
        }
      }
      if (!retain_graph) node->release_saved();
      TG_CHECK(outs.empty() || outs.size() == node->next_edges.size(), node->name(), ": backward returned ",
               outs.size(), " gradients for ", node->next_edges.size(), " inputs");
    }
    send_on(*node, outs);
  }
  return results;
}

}  // namespace

bool is_implicit_one(const Tensor& g) {
  if (!g.defined() || !g.is_cuda() || g.numel() != 1) return false;
  ImplicitOnes& o = implicit_ones();
  std::lock_guard<std::mutex> lock(o.mu);
  for (const auto& [key, t] : o.by_key)
    if (t.impl().storage == g.impl().storage) return true;
  return false;
}

Tensor writable(const Tensor& g) { return is_implicit_one(g) ? native::clone(g) : g; }

Tensor take_pending_grad(const Node& n, size_t i, const Shape& shape, DType dtype, Device device) {
  const Running& r = t_running;
  if (r.node != &n || creating_graph() || i >= n.next_edges.size() || !n.next_edges[i].fn) return Tensor();
  const Edge& e = n.next_edges[i];
  auto it = r.pass->buffers->find(e.fn.get());
  if (it == r.pass->buffers->end() || e.input_nr >= it->second.size()) return Tensor();
  std::vector<Tensor>& parts = it->second[e.input_nr].parts;
  if (parts.size() != 1 || parts[0].sizes() != shape || parts[0].dtype() != dtype || parts[0].device() != device)
    return Tensor();
  Tensor pending = std::move(parts[0]);
  parts.clear();
  return pending;
}

const PointwiseGrad* pointwise_next(const Node& n, size_t i) {
  const Running& r = t_running;
  if (r.node != &n || creating_graph() || AnomalyMode::is_enabled() || i >= n.next_edges.size()) return nullptr;
  auto* m = dynamic_cast<FunctionNode*>(n.next_edges[i].fn.get());
  if (!m || !m->pointwise || m->next_edges.size() != 1 || m->input_meta.size() != 1 || !m->retained.empty())
    return nullptr;
  if (GradHooks* hooks = m->grad_hooks(); hooks && !hooks->empty()) return nullptr;
  if (r.pass->captures->count(m)) return nullptr;
  // n's edge is the only one left into m and nothing arrived there before.
  auto d = r.pass->deps->find(m);
  if (d == r.pass->deps->end() || d->second != 1) return nullptr;
  if (std::count_if(n.next_edges.begin(), n.next_edges.end(), [&](const Edge& e) { return e.fn.get() == m; }) != 1)
    return nullptr;
  if (auto b = r.pass->buffers->find(m); b != r.pass->buffers->end())
    for (const Slot& slot : b->second)
      if (!slot.parts.empty()) return nullptr;
  return &*m->pointwise;
}

void absorb_next(const Node& n, size_t i) {
  TG_CHECK(pointwise_next(n, i) != nullptr, n.name(), ": absorb_next(", i, ") without pointwise_next");
  TG_CHECK(std::find(t_running.absorbed->begin(), t_running.absorbed->end(), i) == t_running.absorbed->end(),
           n.name(), ": absorb_next(", i, ") twice");
  t_running.absorbed->push_back(i);
  ++t_absorbed_count;
}

uint64_t absorbed_node_count() { return t_absorbed_count; }

void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs, bool retain_graph) {
  run_backward(outputs, grad_outputs, retain_graph, false, nullptr, "autograd::backward");
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph) {
  return run_backward(outputs, grad_outputs, retain_graph, false, &inputs, "autograd::grad");
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const GradOptions& options) {
  std::vector<Tensor> res = run_backward(outputs, options.grad_outputs,
                                         options.retain_graph.value_or(options.create_graph), options.create_graph,
                                         &inputs, "autograd::grad");
  if (!options.allow_unused)
    for (size_t i = 0; i < res.size(); ++i)
      TG_CHECK(res[i].defined(), "autograd::grad: input ", i, " (shape ", inputs[i].sizes(),
               ") was not used in the graph (no gradient reached it); pass allow_unused = true to get an "
               "undefined tensor for it");
  return res;
}

}  // namespace autograd

// ---- Tensor's autograd methods
using autograd::AutogradMeta;

const Tensor& Tensor::requires_grad_(bool requires_grad) const {
  auto& m = impl().autograd;
  if (m && m->grad_fn) {
    TG_CHECK(requires_grad, "requires_grad_(false): the tensor of shape ", sizes(),
             " is not a leaf (it has a grad_fn); use detach() instead");
    return *this;
  }
  TG_CHECK(!requires_grad || is_floating(dtype()), "requires_grad_: only floating tensors can require grad; got ",
           dtype(), " of shape ", sizes());
  TG_CHECK(!requires_grad || !impl().storage->is_inference() || InferenceMode::is_enabled(),
           "requires_grad_: setting requires_grad on an inference tensor (shape ", sizes(),
           ", made inside tg::InferenceMode) outside InferenceMode is not allowed; clone() it first");
  if (!m) {
    if (!requires_grad) return *this;
    m = std::make_shared<AutogradMeta>();
  }
  m->requires_grad = requires_grad;
  return *this;
}

bool Tensor::requires_grad() const { return autograd::requires_grad(*this); }

bool Tensor::is_leaf() const {
  autograd::sync_view_history(*this);  // a view's history follows in-place changes of its base
  const auto& m = impl().autograd;
  return !m || !m->grad_fn;
}

Tensor Tensor::grad() const {
  const auto& m = impl().autograd;
  return m ? m->grad : Tensor();
}

Tensor& Tensor::mutable_grad() const {
  auto& m = impl().autograd;
  if (!m) m = std::make_shared<AutogradMeta>();
  return m->grad;
}

void Tensor::retain_grad() const {
  TG_CHECK(requires_grad(), "retain_grad: the tensor of shape ", sizes(), " does not require grad");
  auto& m = impl().autograd;
  if (!m->grad_fn || m->retain_grad) return;  // leaves always keep their grad
  m->retain_grad = true;
  m->grad_fn->retained.emplace_back(m->output_nr, impl_ptr());
}

void Tensor::backward(const Tensor& gradient, BackwardOptions options) const {
  autograd::run_backward({*this}, {gradient}, options.retain_graph.value_or(options.create_graph),
                         options.create_graph, nullptr, "backward");
}

std::shared_ptr<autograd::Node> Tensor::grad_fn() const {
  autograd::sync_view_history(*this);
  const auto& m = impl().autograd;
  return m ? m->grad_fn : nullptr;
}

}  // namespace tg
