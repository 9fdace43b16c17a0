// Public autograd API: grad mode (tg::NoGradGuard), the graph's node and edge
// types, tg::autograd::grad, gradcheck, and the in-place hook the core's
// in-place methods call. The engine lives in autograd/engine.cpp; the
// differentiable ops with their backward in autograd/functions/*.cpp.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <tapegrad/core/hooks.h>
#include <tapegrad/core/tensor.h>

namespace tg {
namespace autograd {

// Whether ops record the graph. Thread-local, on by default.
class GradMode {
 public:
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

class Node;

// ---- hooks, anomaly mode (autograd/hooks.cpp, autograd/anomaly.cpp)
// Gradient hooks of tensors (Tensor::register_hook): slot = the output number of the tensor
// at its node (0 for a leaf).
using GradHooks = tg::detail::HookList<std::function<Tensor(const Tensor&)>>;
// A leaf's hooks that run after its .grad() was accumulated (register_post_accumulate_grad_hook).
using PostAccumulateGradHooks = tg::detail::HookList<std::function<void(Tensor&)>>;

// Anomaly detection, as PyTorch's detect_anomaly: while on (thread-local), backward checks
// every gradient a node returns and throws tg::Error naming the forward op and its node's
// sequence number when one holds NaN or Inf. Off: one thread-local load per node.
class AnomalyMode {
 public:
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

// Anomaly mode on (or off, with enabled = false) for a scope (RAII, nests).
class DetectAnomalyGuard {
 public:
  explicit DetectAnomalyGuard(bool enabled = true) : prev_(AnomalyMode::is_enabled()) {
    AnomalyMode::set_enabled(enabled);
  }
  ~DetectAnomalyGuard() { AnomalyMode::set_enabled(prev_); }
  DetectAnomalyGuard(const DetectAnomalyGuard&) = delete;
  DetectAnomalyGuard& operator=(const DetectAnomalyGuard&) = delete;

 private:
  bool prev_;
};

// Saved-tensor hooks, as torch.autograd.graph.saved_tensors_hooks: while the guard lives (on this
// thread; guards nest, the innermost one's hooks apply), every tensor a recorded op saves for
// backward is handed to `pack` and its result is kept instead; backward reads `unpack(packed)`,
// which must have the saved tensor's shape, dtype and device (else a tg::Error naming
// saved_tensors_hooks). A tensor kept through the hooks has no in-place check: what unpack returns
// is what backward uses. utils::checkpoint's segments and backward passes use hooks of their own,
// so saves inside a segment, and a create_graph backward's saves, do not reach these.
class SavedTensorsHooks {
 public:
  SavedTensorsHooks(std::function<Tensor(const Tensor&)> pack, std::function<Tensor(const Tensor&)> unpack);
  ~SavedTensorsHooks();
  SavedTensorsHooks(const SavedTensorsHooks&) = delete;
  SavedTensorsHooks& operator=(const SavedTensorsHooks&) = delete;

 protected:
  // to_saved_device: what unpack returns goes back to the saved tensor's device first (SaveOnCpu).
  SavedTensorsHooks(std::function<Tensor(const Tensor&)> pack, std::function<Tensor(const Tensor&)> unpack,
                    bool to_saved_device);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// torch.autograd.graph.save_on_cpu: saved CUDA tensors wait in host memory (pinned, from the host
// caching allocator) and go back to their device when backward reads them; CPU tensors stay as
// they are.
class SaveOnCpu : public SavedTensorsHooks {
 public:
  SaveOnCpu();
};

// The next node sequence number of this thread (Node::sequence_nr).
uint64_t next_sequence_nr();

// Where a gradient goes: input number `input_nr` of node `fn`.
struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;
  bool valid() const { return fn != nullptr; }
};

// What a node expects for the gradient of one of the tensors it produced; the
// engine reduces (sum_to) and casts every incoming gradient to this, in one place.
// `wide_dtype`: a wider dtype the node also takes its gradient in, as it is (a float32 ->
// float16 / bfloat16 cast takes a float32 gradient, and a view of such a cast takes what the
// cast takes): a backward that can write that dtype directly skips a rounding and a cast
// launch (autograd::grad_dtype_for). Set by autograd when it records a cast or a view.
struct InputMeta {
  Shape shape;
  DType dtype = kFloat32;
  Device device;
  std::optional<DType> wide_dtype;
  // The gradient arriving here is also cast to this dtype by the node's backward (a mixed add's
  // half operand, see grad_twin_dtype): a producer may write that cast beside it.
  std::optional<DType> twin_dtype;
};

// A step of the backward graph: takes one gradient per forward output, returns
// one gradient per next edge (undefined when that input needs none).
class Node : public std::enable_shared_from_this<Node> {
 public:
  Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  virtual ~Node();  // releases long chains iteratively (no deep recursion)

  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grads) = 0;
  virtual const char* name() const = 0;
  // Frees saved tensors once backward has used them (unless retain_graph).
  virtual void release_saved() {}
  // Whether apply() records its own computation when grad mode is on (backward with
  // create_graph), so that its results can be differentiated again. The engine runs any other
  // node without recording and gives its results a "NotImplemented" history whose backward
  // throws tg::Error naming this node (double backward not implemented).
  virtual bool supports_create_graph() const { return false; }

  bool needs_input_grad(size_t i) const { return i < next_edges.size() && next_edges[i].valid(); }
  uint32_t add_input_meta(const Tensor& t);

  std::vector<Edge> next_edges;
  std::vector<InputMeta> input_meta;  // one per forward output
  // Non-leaf tensors that asked for retain_grad(): (output_nr, tensor).
  std::vector<std::pair<uint32_t, std::weak_ptr<TensorImpl>>> retained;
  // Creation order on its thread (the forward order), named by anomaly mode's errors.
  uint64_t sequence_nr = next_sequence_nr();
  // Hooks of the tensors this node produced (null until one is registered).
  std::shared_ptr<GradHooks> tensor_hooks;
  // The gradient hooks the engine runs on this node's incoming gradients (a leaf's
  // AccumulateGrad answers its leaf's).
  virtual GradHooks* grad_hooks() const { return tensor_hooks.get(); }
};

// Per-tensor autograd state (TensorImpl::autograd), created on first need.
struct AutogradMeta {
  Tensor grad;
  std::shared_ptr<Node> grad_fn;  // null for leaves
  uint32_t output_nr = 0;
  bool requires_grad = false;  // the leaf flag
  bool retain_grad = false;
  std::weak_ptr<Node> grad_accumulator;  // the leaf's AccumulateGrad, shared by every use
  std::shared_ptr<GradHooks> hooks;      // a leaf's gradient hooks (a non-leaf's live on its grad_fn)
  std::shared_ptr<PostAccumulateGradHooks> post_accumulate_grad_hooks;
};

// Runs backward from `outputs` and returns d(outputs)/d(inputs) without touching
// any .grad(). An input the outputs do not depend on gets an undefined tensor.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false);

// Options of tg::autograd::grad, as torch.autograd.grad's keywords. `grad_outputs`: one gradient
// per output (empty: implicit 1 for scalar outputs). `retain_graph` defaults to `create_graph`.
// `create_graph`: the backward is itself recorded, so the results can be differentiated again (to
// any order). `allow_unused`: an input the outputs do not depend on gets an undefined tensor instead
// of a tg::Error.
struct GradOptions {
  std::vector<Tensor> grad_outputs;
  std::optional<bool> retain_graph;
  bool create_graph = false;
  bool allow_unused = false;
};
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const GradOptions& options);

// Runs backward from several outputs at once, accumulating into the leaves' .grad() (as
// torch::autograd::backward); grad_outputs as for grad().
void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs = {},
              bool retain_graph = false);

namespace detail {
bool check_inplace_recorded(const Tensor& self, const char* op, std::initializer_list<const Tensor*> others);
}  // namespace detail
// Called by the in-place ops (add_, mul_, ...) before they write: true when the op must be
// recorded (grad mode on and self or an operand takes part in autograd). Throws tg::Error, as
// PyTorch, for a leaf that requires grad, a view of one, and a view made in no-grad mode.
// With grad mode off: one thread-local read, false.
template <typename... Others>
bool check_inplace(const Tensor& self, const char* op, const Others&... others) {
  return GradMode::is_enabled() && detail::check_inplace_recorded(self, op, {&others...});
}

// ---- gradcheck: central differences in float64 against backward.
struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
};

struct GradcheckReport {
  bool ok = true;
  double max_abs_err = 0;
  double max_rel_err = 0;
  int input_index = -1;  // first failing input (-1 when ok)
  int64_t element = -1;  // its flat element index
  std::string message;
  explicit operator bool() const { return ok; }
};
std::ostream& operator<<(std::ostream& os, const GradcheckReport& r);

// fn maps the inputs to a tensor of any shape. The inputs that require grad (all
// floating ones if none does) are copied to contiguous float64 on their device
// and perturbed one element at a time; the output is projected on a fixed random
// direction so one backward gives the whole vector-Jacobian product. To check
// non-contiguous layouts, make the views inside fn.
GradcheckReport gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, GradcheckOptions options = {});

// gradgradcheck: second derivatives against central differences of the analytic first
// derivatives, in float64. The first gradient of fn's output, projected on a random direction u
// (itself differentiated, as torch's gradgradcheck does with grad_outputs), is computed with
// create_graph and checked by gradcheck as a function of the inputs and u.
GradcheckReport gradgradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                              const std::vector<Tensor>& inputs, GradcheckOptions options = {});

}  // namespace autograd

// Turns recording off for a scope (RAII, thread-local, nests).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(autograd::GradMode::is_enabled()) { autograd::GradMode::set_enabled(false); }
  ~NoGradGuard() { autograd::GradMode::set_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// Inference mode, as c10::InferenceMode: recording off (as NoGradGuard), and storage allocated
// inside is an inference tensor's: in-place ops on it made inside the mode do not bump its version
// counter, and it cannot require grad or be saved for backward (either is a tg::Error). In-place
// ops inside the mode on tensors made outside it still bump their version. RAII, thread-local, nests.
class InferenceMode {
 public:
  explicit InferenceMode(bool enabled = true)
      : prev_grad_(autograd::GradMode::is_enabled()), prev_(detail::tls_inference_mode) {
    detail::tls_inference_mode = enabled;
    autograd::GradMode::set_enabled(!enabled);
  }
  ~InferenceMode() {
    detail::tls_inference_mode = prev_;
    autograd::GradMode::set_enabled(prev_grad_);
  }
  InferenceMode(const InferenceMode&) = delete;
  InferenceMode& operator=(const InferenceMode&) = delete;
  static bool is_enabled() { return detail::tls_inference_mode; }

 private:
  bool prev_grad_;
  bool prev_;
};

}  // namespace tg
