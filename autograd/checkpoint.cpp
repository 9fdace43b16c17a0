// tg::utils::checkpoint (autograd/checkpoint.h), torch.utils.checkpoint's non-reentrant form: the
// forward records the segment's nodes as usual, but every tensor they save goes into a slot of
// one recompute frame (a SavedTensorHook) instead of the node. The first slot that backward
// unpacks reruns fn, with the forward's generators and autocast state, until the last slot still
// needed is filled, and stops there: the ops after it (a block's trailing Dropout) never rerun.
// The nodes then run their own backward closures on the refilled values, in the outer pass.
#include <tapegrad/autograd/checkpoint.h>

#include <memory>
#include <optional>
#include <utility>

#include <tapegrad/amp/autocast.h>
#include <tapegrad/autograd/function.h>

namespace tg::utils {

namespace {
using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

struct AutocastState {
  bool enabled[2];
  DType dtype[2];
  static AutocastState now() {
    return {{amp::is_enabled(kCPU), amp::is_enabled(kCUDA)}, {amp::get_dtype(kCPU), amp::get_dtype(kCUDA)}};
  }
};

// Sets the generators to `replay` for a scope and puts back the state they had.
class RngReplay {
 public:
  explicit RngReplay(const native::RngState* replay) : on_(replay != nullptr) {
    if (!on_) return;
    current_ = native::get_rng_state();
    native::set_rng_state(*replay);
  }
  ~RngReplay() {
    if (on_) native::set_rng_state(current_);
  }
  RngReplay(const RngReplay&) = delete;
  RngReplay& operator=(const RngReplay&) = delete;

 private:
  bool on_;
  native::RngState current_;
};

class EnableGrad {
 public:
  EnableGrad() : prev_(autograd::GradMode::is_enabled()) { autograd::GradMode::set_enabled(true); }
  ~EnableGrad() { autograd::GradMode::set_enabled(prev_); }
  EnableGrad(const EnableGrad&) = delete;
  EnableGrad& operator=(const EnableGrad&) = delete;

 private:
  bool prev_;
};

// Thrown by the recompute's hook once the last needed slot is filled; not a tg::Error, so that
// nothing between fn's ops and the frame takes it for a failure.
struct StopRecompute {};

struct Frame;

// One tensor the segment saved: its forward shape, dtype and device, and the recomputed value.
struct Slot final : autograd::PackedTensor {
  std::shared_ptr<Frame> frame;
  Shape sizes;
  DType dtype;
  Device device;
  Tensor data;
  uint32_t version = 0;
  bool filled = false;
  Tensor unpack() override;
};

struct Frame {
  std::shared_ptr<Fn> fn;
  std::vector<autograd::SavedTensor> inputs;  // with the in-place check
  std::vector<bool> input_requires_grad;
  std::shared_ptr<native::RngState> rng;  // null without preserve_rng_state
  AutocastState autocast;
  std::vector<std::weak_ptr<Slot>> slots;  // in save order; expired once its node is released
  bool recomputing = false;
  void recompute();
};

// The forward's hook: each save becomes a new slot of the frame.
class Pack final : public autograd::SavedTensorHook {
 public:
  explicit Pack(std::shared_ptr<Frame> frame) : frame_(std::move(frame)) {}
  std::shared_ptr<autograd::PackedTensor> pack(const Tensor& t) override {
    auto s = std::make_shared<Slot>();
    s->frame = frame_;
    s->sizes = t.sizes();
    s->dtype = t.dtype();
    s->device = t.device();
    frame_->slots.push_back(s);
    return s;
  }

 private:
  std::shared_ptr<Frame> frame_;
};

// The recompute's hook: the k-th save fills the forward's k-th slot (when still needed); the
// recompute's own nodes keep theirs as usual (aliases of the same values, gone with the
// recompute's graph at the stop; a backward that fn itself runs reads them), and stop_at saves
// end it.
class Fill final : public autograd::SavedTensorHook {
 public:
  Fill(Frame& frame, size_t stop_at) : frame_(frame), stop_at_(stop_at) {}
  std::shared_ptr<autograd::PackedTensor> pack(const Tensor& t) override {
    const size_t k = count_++;
    TG_CHECK(k < frame_.slots.size(), "checkpoint: the recompute saved more tensors for backward than the forward's ",
             frame_.slots.size(), " (fn must do the same on every call)");
    if (auto s = frame_.slots[k].lock(); s && !s->filled) {
      TG_CHECK(t.sizes() == s->sizes && t.dtype() == s->dtype && t.device() == s->device, "checkpoint: saved tensor ",
               k, " was recomputed with shape ", t.sizes(), ", ", t.dtype(), " on ", t.device(), "; the forward's had ",
               s->sizes, ", ", s->dtype, " on ", s->device, " (fn must do the same on every call)");
      s->data = autograd::alias(t);
      s->version = t.version();
      s->filled = true;
    }
    if (count_ == stop_at_) throw StopRecompute{};
    return nullptr;
  }
  size_t count() const { return count_; }

 private:
  Frame& frame_;
  size_t stop_at_;
  size_t count_ = 0;
};

void Frame::recompute() {
  size_t stop_at = 0;  // one past the last slot a node still holds and that is not yet filled
  for (size_t k = 0; k < slots.size(); ++k)
    if (auto s = slots[k].lock(); s && !s->filled) stop_at = k + 1;
  if (stop_at == 0) return;
  TG_CHECK(!recomputing, "checkpoint: backward of the segment was asked for while fn was being recomputed");
  recomputing = true;
  struct Done {
    bool& flag;
    ~Done() { flag = false; }
  } done{recomputing};
  std::vector<Tensor> in(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    in[i] = inputs[i].unpack();  // a tg::Error naming checkpoint when an input was modified in place
    if (!in[i].defined()) continue;
    in[i] = autograd::alias(in[i]);
    if (input_requires_grad[i]) in[i].requires_grad_();
  }
  Fill fill(*this, stop_at);
  bool stopped = false;
  {
    RngReplay replay(rng.get());
    EnableGrad grad_on;
    const AutocastState now = AutocastState::now();
    std::optional<amp::Autocast> cpu_ac, cuda_ac;  // only where the state differs from the forward's
    if (now.enabled[0] != autocast.enabled[0] || now.dtype[0] != autocast.dtype[0])
      cpu_ac.emplace(kCPU, autocast.dtype[0], autocast.enabled[0]);
    if (now.enabled[1] != autocast.enabled[1] || now.dtype[1] != autocast.dtype[1])
      cuda_ac.emplace(kCUDA, autocast.dtype[1], autocast.enabled[1]);
    autograd::SavedTensorHookGuard hook(&fill);
    try {
      (void)(*fn)(in);
    } catch (const StopRecompute&) {
      stopped = true;
    }
  }
  TG_CHECK(stopped, "checkpoint: the recompute saved ", fill.count(), " tensors for backward, the forward ",
           slots.size(), " (fn must do the same on every call)");
}

Tensor Slot::unpack() {
  if (!filled) frame->recompute();
  TG_CHECK(filled, "checkpoint: a saved tensor of the segment was not recomputed");
  TG_CHECK(data.version() == version, "checkpoint: a recomputed tensor saved for backward (shape ", data.sizes(),
           ") was modified in place later in the segment (version ", data.version(), ", expected ", version,
           "): one of the variables needed for gradient computation has been modified by an inplace operation");
  return data;
}
}  // namespace

std::vector<Tensor> checkpoint(Fn fn, const std::vector<Tensor>& inputs, CheckpointOptions options) {
  TG_CHECK(fn != nullptr, "checkpoint: fn is empty");
  if (!autograd::GradMode::is_enabled()) return fn(inputs);
  auto frame = std::make_shared<Frame>();
  for (size_t i = 0; i < inputs.size(); ++i) {
    TG_CHECK(inputs[i].defined(), "checkpoint: input ", i, " is undefined");
    // Saved before this frame's hook is set: under an enclosing checkpoint they are its slots.
    frame->inputs.emplace_back(inputs[i], "checkpoint");
    frame->input_requires_grad.push_back(inputs[i].requires_grad());
  }
  if (options.preserve_rng_state) frame->rng = std::make_shared<native::RngState>(native::get_rng_state());
  frame->autocast = AutocastState::now();
  frame->fn = std::make_shared<Fn>(std::move(fn));
  Pack pack(frame);
  autograd::SavedTensorHookGuard hook(&pack);
  return (*frame->fn)(inputs);
}

Tensor checkpoint(std::function<Tensor(const std::vector<Tensor>&)> fn, const std::vector<Tensor>& inputs,
                  CheckpointOptions options) {
  TG_CHECK(fn != nullptr, "checkpoint: fn is empty");
  auto outs = checkpoint([f = std::move(fn)](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in)}; },
                         inputs, options);
  return std::move(outs.at(0));
}

}  // namespace tg::utils
