// Tensor hooks: register_hook (on the gradient flowing into a tensor; a leaf's live in its
// AutogradMeta, a non-leaf's on its grad_fn, keyed by output number) and
// register_post_accumulate_grad_hook (a leaf's, after .grad() was accumulated). The engine
// runs the gradient hooks of a node on its summed incoming gradients before anything reads them.
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <tapegrad/autograd/accumulate_grad.h>
#include <tapegrad/autograd/function.h>

namespace tg {
namespace autograd {

// ---- saved-tensor hooks (SavedTensorsHooks): the user's pack / unpack on the one save path
// (SavedTensor and custom Functions' ctx ask the thread's SavedTensorHook).
namespace {
using TensorFn = std::function<Tensor(const Tensor&)>;

class UserPacked final : public PackedTensor {
 public:
  UserPacked(Tensor packed, std::shared_ptr<const TensorFn> unpack, bool to_saved_device, const Tensor& saved)
      : packed_(std::move(packed)),
        unpack_(std::move(unpack)),
        to_saved_device_(to_saved_device),
        sizes_(saved.sizes()),
        dtype_(saved.dtype()),
        device_(saved.device()) {}
  Tensor unpack() override {
    Tensor t = (*unpack_)(packed_);
    if (to_saved_device_ && t.defined() && t.device() != device_) t = t.to(device_);
    TG_CHECK(t.defined() && t.sizes() == sizes_ && t.dtype() == dtype_ && t.device() == device_,
             "saved_tensors_hooks: unpack returned ",
             t.defined() ? fmt_meta(t.sizes(), t.dtype(), t.device()) : std::string("an undefined tensor"),
             " for a tensor saved as ", fmt_meta(sizes_, dtype_, device_));
    return t;
  }

 private:
  static std::string fmt_meta(const Shape& s, DType d, Device dev) {
    std::ostringstream o;
    o << "shape " << s << ", " << d << " on " << dev;
    return o.str();
  }
  Tensor packed_;
  std::shared_ptr<const TensorFn> unpack_;
  bool to_saved_device_;
  Shape sizes_;
  DType dtype_;
  Device device_;
};

class UserHook final : public SavedTensorHook {
 public:
  UserHook(TensorFn pack, TensorFn unpack, bool to_saved_device)
      : pack_(std::move(pack)),
        unpack_(std::make_shared<const TensorFn>(std::move(unpack))),
        to_saved_device_(to_saved_device) {}
  std::shared_ptr<PackedTensor> pack(const Tensor& t) override {
    Tensor p;
    {
      NoGradGuard no_grad;  // what pack computes is storage, not part of the graph
      SavedTensorHookGuard none(nullptr);
      p = pack_(alias(t));
    }
    return std::make_shared<UserPacked>(std::move(p), unpack_, to_saved_device_, t);
  }

 private:
  TensorFn pack_;
  std::shared_ptr<const TensorFn> unpack_;
  bool to_saved_device_;
};
}  // namespace

struct SavedTensorsHooks::Impl {
  UserHook hook;
  SavedTensorHookGuard guard{&hook};
  Impl(TensorFn pack, TensorFn unpack, bool to_saved_device)
      : hook(std::move(pack), std::move(unpack), to_saved_device) {}
};

SavedTensorsHooks::SavedTensorsHooks(TensorFn pack, TensorFn unpack) : SavedTensorsHooks(pack, unpack, false) {}
SavedTensorsHooks::SavedTensorsHooks(TensorFn pack, TensorFn unpack, bool to_saved_device) {
  TG_CHECK(pack != nullptr && unpack != nullptr, "saved_tensors_hooks: pack and unpack must both be set");
  impl_ = std::make_unique<Impl>(std::move(pack), std::move(unpack), to_saved_device);
}
SavedTensorsHooks::~SavedTensorsHooks() = default;

// Packed on the host; the handle moves the value back to the saved tensor's device.
SaveOnCpu::SaveOnCpu()
    : SavedTensorsHooks([](const Tensor& t) { return t.device().type() == kCUDA ? t.to(Device(kCPU)) : t; },
                        [](const Tensor& p) { return p; }, /*to_saved_device=*/true) {}

void run_grad_hooks(const Node& node, GradHooks& hooks, std::vector<Tensor>& buf) {
  for (uint32_t nr = 0; nr < buf.size(); ++nr) {
    if (!buf[nr].defined()) continue;  // no gradient reached this output
    auto fns = hooks.for_slot(nr);
    if (fns.empty()) continue;
    const InputMeta& m = node.input_meta.at(nr);
    // The gradient as the tensor has it (it may have arrived in the node's wider dtype), and
    // never the engine's shared read-only 1: hooks may write into it.
    Tensor g = buf[nr];
    if (g.dtype() != m.dtype) g = native::to(g, m.device, m.dtype);
    g = writable(g);
    for (size_t i = 0; i < fns.size(); ++i) {
      Tensor r = fns[i](g);
      if (!r.defined()) continue;
      TG_CHECK(r.sizes() == m.shape && r.dtype() == m.dtype && r.device() == m.device, "register_hook: hook ", i,
               " of a tensor produced by ", node.name(), " returned a gradient of shape ", r.sizes(), ", dtype ",
               r.dtype(), " on ", r.device(), "; the gradient has shape ", m.shape, ", dtype ", m.dtype, " on ",
               m.device);
      g = std::move(r);
    }
    buf[nr] = std::move(g);
  }
}

void run_post_accumulate_grad_hooks(const std::shared_ptr<TensorImpl>& leaf) {
  const auto& m = leaf->autograd;
  if (!m || !m->post_accumulate_grad_hooks || m->post_accumulate_grad_hooks->empty()) return;
  Tensor param(leaf);
  for (auto& fn : m->post_accumulate_grad_hooks->for_slot(0)) fn(param);
}

}  // namespace autograd

RemovableHandle Tensor::add_grad_hook(std::function<Tensor(const Tensor&)> fn) const {
  TG_CHECK(fn != nullptr, "register_hook: the hook is empty");
  TG_CHECK(requires_grad(), "register_hook: cannot register a hook on a tensor that does not require grad (shape ",
           sizes(), ")");
  auto& m = impl().autograd;
  if (m->grad_fn) {  // a non-leaf: on its node, for its output number
    auto& hooks = m->grad_fn->tensor_hooks;
    if (!hooks) hooks = std::make_shared<autograd::GradHooks>();
    return detail::add_hook(hooks, m->output_nr, std::move(fn));
  }
  if (!m->hooks) m->hooks = std::make_shared<autograd::GradHooks>();
  return detail::add_hook(m->hooks, 0, std::move(fn));
}

RemovableHandle Tensor::register_post_accumulate_grad_hook(std::function<void(Tensor&)> fn) const {
  TG_CHECK(fn != nullptr, "register_post_accumulate_grad_hook: the hook is empty");
  TG_CHECK(requires_grad() && is_leaf(),
           "register_post_accumulate_grad_hook: only leaf tensors that require grad "
           "take post-accumulate-grad hooks; this tensor of shape ",
           sizes(), " is ", is_leaf() ? "a leaf that does not require grad" : "not a leaf (it has a grad_fn)");
  auto& hooks = impl().autograd->post_accumulate_grad_hooks;
  if (!hooks) hooks = std::make_shared<autograd::PostAccumulateGradHooks>();
  return detail::add_hook(hooks, 0, std::move(fn));
}

}  // namespace tg
