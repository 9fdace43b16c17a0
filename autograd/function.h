// Internal helpers the differentiable ops (autograd/functions/*.cpp) use to
// record themselves: saved tensors with a version check, a node that runs a
// backward closure, and the cheap "does anything need grad" test. Not installed.
#pragma once
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <tapegrad/autograd/autograd.h>
#include <tapegrad/core/native.h>
#include <tapegrad/core/ops.h>

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

// What a saved tensor is to the node that saves it: an input (or any tensor with its own history)
// or the node's own output (saved before record() gives it its history).
enum class Saved { kInput, kOutput };

// Where a saved tensor's value goes while a hook is set on the thread (PyTorch's
// saved_tensors_hooks; utils::checkpoint's recompute frame, autograd/checkpoint.cpp): pack()
// gets the tensor as it is saved and returns the handle the SavedTensor keeps instead of it
// (nullptr: keep the tensor as usual); the handle's unpack() gives the value back when backward
// needs it.
class PackedTensor {
 public:
  virtual ~PackedTensor() = default;
  virtual Tensor unpack() = 0;
};
class SavedTensorHook {
 public:
  virtual ~SavedTensorHook() = default;
  virtual std::shared_ptr<PackedTensor> pack(const Tensor& t) = 0;
};
// The thread's hook now (null without one): SavedTensor and custom Functions' ctx save through it.
SavedTensorHook* saved_tensor_hook();
// Sets the thread's hook for a scope; the innermost guard's hook gets the saves.
class SavedTensorHookGuard {
 public:
  explicit SavedTensorHookGuard(SavedTensorHook* hook);
  ~SavedTensorHookGuard();
  SavedTensorHookGuard(const SavedTensorHookGuard&) = delete;
  SavedTensorHookGuard& operator=(const SavedTensorHookGuard&) = delete;

 private:
  SavedTensorHook* prev_;
};

// A tensor kept for backward: a detached alias (no graph, so a node never keeps
// its own outputs alive through a cycle) plus the storage version at save time, and the
// edge it had (an input's) or the fact that it is the node's output. Unpacked inside a backward
// run with create_graph (grad mode on), it gets that history back (an output's is the node being
// applied), so the backward's own graph links to the forward graph. Saved under a
// SavedTensorHook, it keeps the hook's handle instead of the alias (the handle checks versions).
class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& t, const char* op, Saved kind = Saved::kInput);
  // Throws when the tensor was modified in place since it was saved.
  Tensor unpack() const;

 private:
  Tensor data_;
  std::shared_ptr<PackedTensor> packed_;
  Edge edge_;  // the history an input had when saved (none when it did not require grad)
  uint32_t version_ = 0;
  bool output_ = false;
  const char* op_ = "";
};

class FunctionNode;
// grad of the single forward output -> one grad per input (undefined if not needed).
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad, const FunctionNode& node)>;
// grads of every forward output (undefined where none arrived) -> one grad per input: the backward
// of an op with several outputs (split, chunk, unbind), recorded with record_multi.
using MultiBackwardFn = std::function<std::vector<Tensor>(std::vector<Tensor>& grads, const FunctionNode& node)>;

// A node whose backward is a closure written right below the op's forward. The
// closure owns the saved tensors, so releasing it frees them all.
// Whether a backward closure computes with autograd::bw / differentiable ops only, so that
// running it with grad mode on (create_graph) records a graph that can be differentiated again.
enum class Backward { kFirstOrder, kDifferentiable };
inline constexpr Backward kDifferentiable = Backward::kDifferentiable;

// The backward of a node that is one elementwise op of its gradient and a saved tensor,
// grad_in = elementwise(op, grad_out, saved, p0, p1) (an activation's): the node whose backward
// produces grad_out may apply it itself, a GEMM in its epilogue (pointwise_next / absorb_next).
struct PointwiseGrad {
  const char* name;  // the backward's node name under create_graph (bw::elementwise_backward)
  backend::ElemOp op;
  SavedTensor saved;
  double p0 = 0, p1 = 0;
};

class FunctionNode final : public Node {
 public:
  FunctionNode(const char* name, BackwardFn fn, Backward kind = Backward::kFirstOrder)
      : name_(name), fn_(std::move(fn)), differentiable_(kind == Backward::kDifferentiable) {}
  FunctionNode(const char* name, MultiBackwardFn fn, Backward kind = Backward::kFirstOrder)
      : name_(name), multi_fn_(std::move(fn)), differentiable_(kind == Backward::kDifferentiable) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  const char* name() const override { return name_; }
  void release_saved() override {
    fn_ = nullptr;
    multi_fn_ = nullptr;
    pointwise.reset();
  }
  bool supports_create_graph() const override { return differentiable_; }

  // Set when the backward is exactly that pointwise op (unary activations).
  std::optional<PointwiseGrad> pointwise;

 private:
  const char* name_;
  BackwardFn fn_;
  MultiBackwardFn multi_fn_;  // instead of fn_, for a node with several outputs
  bool differentiable_;
};

// The edge a gradient for t flows along (grad_fn or the leaf's accumulator).
Edge gradient_edge(const Tensor& t);

// The dtype the node at e takes its gradient in without a copy: its InputMeta's wide_dtype when
// it has one, else its dtype.
DType wanted_grad_dtype(const Edge& e);

// The dtype the node at n.next_edges[i] will also cast the gradient it receives for that edge to
// (InputMeta::twin_dtype, set by expect_grad_cast), when any: a backward whose kernel can write
// that cast of input i's gradient in the same pass leaves it as the gradient's twin
// (core/cast_copies.h), and the cast takes it. Only a hint: values are the same either way.
std::optional<DType> grad_twin_dtype(const Node& n, size_t i);
// Marks out (just recorded) as an output whose gradient its node's backward also casts to dtype.
void expect_grad_cast(const Tensor& out, DType dtype);

// The gradient another consumer of input i of node n already sent, taken out of the engine's sum
// for n.next_edges[i] when it is exactly one tensor of `shape`, `dtype` and `device`: a backward
// that adds it into the gradient it writes for input i (a fused kernel's addend) saves the engine
// a separate pass over both. A backward that takes it must return it summed in. Undefined, with
// nothing taken, outside n's own backward call, under create_graph, or when no such gradient waits.
Tensor take_pending_grad(const Node& n, size_t i, const Shape& shape, DType dtype, Device device);

// The pointwise backward of the node that input i's gradient goes to next, when n's backward may
// apply it in that node's place: the node has no other gradient coming, no hooks, is not retained,
// not an input of autograd::grad, and anomaly mode is off. A backward that applies it calls
// absorb_next(n, i) and returns for input i that node's result (its input's gradient); the engine
// then delivers it onward and skips the node. Null (as take_pending_grad) outside n's own backward
// call, under create_graph, or when that node is not pointwise.
const PointwiseGrad* pointwise_next(const Node& n, size_t i);
void absorb_next(const Node& n, size_t i);
// How many nodes this thread's backward passes skipped so (absorb_next): for tests and profiles.
uint64_t absorbed_node_count();

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
// `kind`: kDifferentiable when fn is written with autograd::bw (its double backward works).
Tensor record(const char* name, std::initializer_list<Tensor> inputs, Tensor out, BackwardFn fn,
              Backward kind = Backward::kFirstOrder);
Tensor record(const char* name, const std::vector<Tensor>& inputs, Tensor out, BackwardFn fn,
              Backward kind = Backward::kFirstOrder);
// record() for a view-like op of one input whose backward keeps the gradient's dtype (transpose,
// permute, reshape, contiguous): its node also takes the wider gradient dtype its input's node
// takes, so a GEMM behind a transposed float16 view of a float32 weight writes float32 directly.
Tensor record_view(const char* name, const Tensor& input, Tensor out, BackwardFn fn,
                   Backward kind = Backward::kFirstOrder);
// record_view() for an op that returns several views of one input (split, chunk, unbind): one node
// whose output i is outs[i]; fn gets one gradient per output (undefined where none arrived), so the
// input's gradient is assembled once instead of summed from one zero-padded tensor per output.
std::vector<Tensor> record_multi_view(const char* name, const Tensor& input, std::vector<Tensor> outs,
                                      MultiBackwardFn fn, Backward kind = Backward::kFirstOrder);

// Traces and records `out`, the cast of `src` to out's dtype and device that the caller computed,
// exactly as Tensor::to does (which computes it with native::to): for autocast, which may take
// the cast of a parameter from its kept copy (core/cast_copies.h). Returns out.
Tensor finish_to(const Tensor& src, Tensor out);

// A detached alias of t sharing storage (for detach() and saved tensors).
Tensor alias(const Tensor& t);
// A detached alias of t that has the history `e` (a leaf's accumulator, or a node's output): a saved
// tensor unpacked under create_graph.
Tensor with_history(const Tensor& t, const Edge& e);

// ---- in-place ops (node.cpp)
// Records the in-place op `name` that has just overwritten self (after check_inplace said to
// record and after the version bump): a node running fn, whose inputs are self's previous value
// and `others`, becomes self's history; for a view (TensorImpl::view_base) it is wrapped in a
// CopySlices node that becomes the base's history, and the view's own history becomes its region
// of that (PyTorch's rebase_history). A backward that reads the result saves it before this call.
void rebase_history(const char* name, const Tensor& self, std::initializer_list<Tensor> others, BackwardFn fn,
                    Backward kind = Backward::kFirstOrder);
// Notes on a view that a public view method just made from `input` (if it shares its storage):
// its base and version, and the grad mode (see TensorImpl::view_base). Returns out.
Tensor mark_view(const Tensor& input, Tensor out);

// ---- backward math that can be differentiated again (create_graph; autograd/backward_math.cpp)
// The engine runs a backward closure with grad mode on exactly when it was asked to create_graph
// (and with autocast and tracing off). The closures of the ops that support double backward
// compute with these: native ops (nothing recorded, the first-order path unchanged) or, under
// create_graph, the recorded tg:: ops.
inline bool creating_graph() { return GradMode::is_enabled(); }
namespace bw {
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, Scalar s);
Tensor div(const Tensor& a, const Tensor& b);
Tensor neg(const Tensor& a);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor unsqueeze(const Tensor& a, int64_t dim);
Tensor squeeze(const Tensor& a, int64_t dim);
Tensor transpose(const Tensor& a, int64_t d0, int64_t d1);
Tensor permute(const Tensor& a, const Shape& dims);
Tensor reshape(const Tensor& a, const Shape& shape);
Tensor expand(const Tensor& a, const Shape& shape);
Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end, int64_t step);
Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim);
Tensor to(const Tensor& a, Device device, DType dtype);
// A fused elementwise backward kernel bwd(g, saved, p0, p1) (ElemOp::*Backward) as a differentiable
// op: linear in g (its gradient for g is bwd(gg, saved)); its gradient for `saved` comes from a
// table of second derivatives (a tg::Error naming `name`, e.g. "tanh_backward", for a kernel the
// table lacks). `name` is a string literal (the node's name).
Tensor elementwise_backward(const char* name, backend::ElemOp bwd, const Tensor& g, const Tensor& saved, double p0 = 0,
                            double p1 = 0);
// out = f(g) for a linear map f whose adjoint is `adjoint` (written with differentiable ops):
// f runs on native ops; under create_graph out is recorded with `adjoint` as its backward.
Tensor linear_map(const char* name, const Tensor& g, const std::function<Tensor(const Tensor&)>& f,
                  std::function<Tensor(const Tensor&)> adjoint);
}  // namespace bw

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

}  // namespace tg::autograd
