// Internal helpers the differentiable ops (autograd/functions/*.cpp) use to
// record themselves: saved tensors with a version check, a node that runs a
// backward closure, and the cheap "does anything need grad" test. Not installed.
#pragma once
#include <functional>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

#include <tapegrad/autograd/autograd.h>
#include <tapegrad/core/native.h>

namespace tg::autograd {

// A view whose storage changed version since its history was last made current may have a stale
// grad_fn (its base, or another view of it, was modified in place): refresh_view rebuilds it as
// PyTorch does, the view's region of its base's current history (node.cpp).
void refresh_view(const Tensor& t);
inline void sync_view_history(const Tensor& t) {
  const TensorImpl& i = t.impl();
  if (i.view_base && i.view_version != i.storage->version()) [[unlikely]]
    refresh_view(t);
}

// True when t takes part in autograd (a leaf that requires grad or a graph output).
inline bool requires_grad(const Tensor& t) {
  if (!t.defined()) return false;
  sync_view_history(t);
  const auto& m = t.impl().autograd;
  return m && (m->requires_grad || m->grad_fn);
}

// The no-grad fast path: no allocation, a thread-local read and a few pointer tests.
template <typename... Ts>
bool should_record(const Ts&... inputs) {
  return GradMode::is_enabled() && (requires_grad(inputs) || ...);
}
inline bool should_record_list(const std::vector<Tensor>& inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const auto& t : inputs)
    if (requires_grad(t)) return true;
  return false;
}

// A tensor kept for backward: a detached alias (no graph, so a node never keeps
// its own outputs alive through a cycle) plus the storage version at save time.
class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& t, const char* op);
  // Throws when the tensor was modified in place since it was saved.
  Tensor unpack() const;

 private:
  Tensor data_;
  uint32_t version_ = 0;
  const char* op_ = "";
};

class FunctionNode;
// grad of the single forward output -> one grad per input (undefined if not needed).
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad, const FunctionNode& node)>;

// A node whose backward is a closure written right below the op's forward. The
// closure owns the saved tensors, so releasing it frees them all.
class FunctionNode final : public Node {
 public:
  FunctionNode(const char* name, BackwardFn fn) : name_(name), fn_(std::move(fn)) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  const char* name() const override { return name_; }
  void release_saved() override { fn_ = nullptr; }

 private:
  const char* name_;
  BackwardFn fn_;
};

// The edge a gradient for t flows along (grad_fn or the leaf's accumulator).
Edge gradient_edge(const Tensor& t);

// The dtype the node at e takes its gradient in without a copy: its InputMeta's wide_dtype when
// it has one, else its dtype.
DType wanted_grad_dtype(const Edge& e);

// The engine's shared implicit root gradient (a read-only CUDA 1, see engine.cpp), and
// g made safe to hand to user code (a copy when it is that tensor).
bool is_implicit_one(const Tensor& g);
Tensor writable(const Tensor& g);

// The dtype a backward writes input i's gradient in: float32 when its natural dtype (that of the
// forward operand) is float16 / bfloat16 and the gradient flows to a cast from float32 (a GEMM
// stores float32 directly: no half rounding, no cast launch); else `natural`.
inline DType grad_dtype_for(const Node& n, size_t i, DType natural) {
  if (!is_reduced_float(natural) || !n.needs_input_grad(i)) return natural;
  return wanted_grad_dtype(n.next_edges[i]) == kFloat32 ? kFloat32 : natural;
}


// Records `out` as the result of op `name` applied to `inputs`: builds the node,
// its edges, and sets out's history. Returns out (re-aliased if it shares an
// input's TensorImpl). Only floating outputs are recorded.
Tensor record(const char* name, std::initializer_list<Tensor> inputs, Tensor out, BackwardFn fn);
Tensor record(const char* name, const std::vector<Tensor>& inputs, Tensor out, BackwardFn fn);
// record() for a view-like op of one input whose backward keeps the gradient's dtype (transpose,
// permute, reshape, contiguous): its node also takes the wider gradient dtype its input's node
// takes, so a GEMM behind a transposed float16 view of a float32 weight writes float32 directly.
Tensor record_view(const char* name, const Tensor& input, Tensor out, BackwardFn fn);

// Traces and records `out`, the cast of `src` to out's dtype and device that the caller computed,
// exactly as Tensor::to does (which computes it with native::to): for autocast, which may take
// the cast of a parameter from its kept copy (core/cast_copies.h). Returns out.
Tensor finish_to(const Tensor& src, Tensor out);

// A detached alias of t sharing storage (for detach() and saved tensors).
Tensor alias(const Tensor& t);

// ---- in-place ops (node.cpp)
// Records the in-place op `name` that has just overwritten self (after check_inplace said to
// record and after the version bump): a node running fn, whose inputs are self's previous value
// and `others`, becomes self's history; for a view (TensorImpl::view_base) it is wrapped in a
// CopySlices node that becomes the base's history, and the view's own history becomes its region
// of that (PyTorch's rebase_history). A backward that reads the result saves it before this call.
void rebase_history(const char* name, const Tensor& self, std::initializer_list<Tensor> others, BackwardFn fn);
// Notes on a view that a public view method just made from `input` (if it shares its storage):
// its base and version, and the grad mode (see TensorImpl::view_base). Returns out.
Tensor mark_view(const Tensor& input, Tensor out);

// ---- hooks, anomaly mode, inference tensors (autograd/hooks.cpp, autograd/anomaly.cpp)
// Runs `hooks` on the node's incoming gradients `buf` (one per output), replacing them in place.
void run_grad_hooks(const Node& node, GradHooks& hooks, std::vector<Tensor>& buf);
// Runs a leaf's post-accumulate-grad hooks (AccumulateGrad::apply).
void run_post_accumulate_grad_hooks(const std::shared_ptr<TensorImpl>& leaf);
// node.apply(grads) in anomaly mode: a tg::Error it raises gets the op's name and sequence number
// appended, and a returned gradient holding NaN or Inf is a tg::Error.
std::vector<Tensor> apply_in_anomaly_mode(Node& node, std::vector<Tensor>&& grads);
// Throws tg::Error when t is an inference tensor (tg::InferenceMode), which cannot be saved for backward.
void check_not_inference(const Tensor& t, const char* op);
// Whether the backward running on this thread is tg::autograd::grad's (it writes no .grad()).
bool in_grad_call();

}  // namespace tg::autograd
