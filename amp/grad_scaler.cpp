// GradScaler: PyTorch's state machine on the host, the numbers on the device
// (CUDA kernels in amp/cuda/grad_scaler.cu, host loops here for the CPU).
#include <tapegrad/amp/grad_scaler.h>

#include <atomic>
#include <cmath>
#include <type_traits>
#include <set>
#include <tuple>
#include <vector>

#include <tapegrad/core/error.h>
#include <tapegrad/core/finite_proxy.h>
#include <tapegrad/core/ops.h>
#if defined(TG_WITH_CUDA)
#include <tapegrad/amp/cuda/amp_kernels.h>
#endif

namespace tg::amp {

namespace {

// The CPU twin of the fused kernel: found_inf = 1 if any element is inf/NaN; with a
// scale, grads *= float(1 / double(scale)) in place.
void cpu_check_and_unscale(const std::vector<Tensor>& grads, const Tensor& found_inf, const Tensor& scale) {
  const float inv = scale.defined() ? static_cast<float>(1.0 / static_cast<double>(*static_cast<const float*>(scale.data_ptr())))
                                    : 1.f;
  std::atomic<bool> bad{false};
  for (const Tensor& g : grads) {
    visit_dtype(g.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, Half> ||
                    std::is_same_v<T, BFloat16>) {
        using M = std::conditional_t<std::is_same_v<T, double>, double, float>;
        T* p = static_cast<T*>(g.data_ptr());
        const bool unscale = scale.defined() && inv != 1.f;
        tg::parallel_for(0, g.numel(), 1 << 16, [&](int64_t lo, int64_t hi) {
          bool local = false;
          for (int64_t i = lo; i < hi; ++i) {
            const M v = static_cast<M>(p[i]);
            local |= !std::isfinite(v);
            if (unscale) p[i] = static_cast<T>(v * static_cast<M>(inv));
          }
          if (local) bad.store(true, std::memory_order_relaxed);
        });
      }
    });
  }
  if (bad.load()) *static_cast<float*>(found_inf.data_ptr()) = 1.f;
}

// Like the CUDA kernel: reads every found_inf and clears it.
void cpu_update_scale(const Tensor& scale, const Tensor& tracker, const std::vector<Tensor>& found_infs,
                      double growth, double backoff, int64_t interval) {
  float& s = *static_cast<float*>(scale.data_ptr());
  int32_t& t = *static_cast<int32_t*>(tracker.data_ptr());
  bool overflow = false;
  for (const Tensor& f : found_infs) {
    float& v = *static_cast<float*>(f.data_ptr());
    overflow |= v != 0.f;
    v = 0.f;
  }
  if (overflow) {
    s = static_cast<float>(static_cast<double>(s) * backoff);
    t = 0;
  } else {
    const int64_t successful = static_cast<int64_t>(t) + 1;
    if (successful == interval) {
      const float grown = static_cast<float>(static_cast<double>(s) * growth);
      if (std::isfinite(grown)) s = grown;
      t = 0;
    } else {
      t = static_cast<int32_t>(successful);
    }
  }
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : options_(options) {
  if (!options_.enabled) return;
  TG_CHECK(options_.init_scale > 0 && std::isfinite(options_.init_scale),
           "GradScaler: init_scale must be positive and finite, got ", options_.init_scale);
  TG_CHECK(options_.growth_factor > 1.0, "GradScaler: growth_factor should be > 1, got ", options_.growth_factor);
  TG_CHECK(options_.backoff_factor > 0 && options_.backoff_factor < 1.0,
           "GradScaler: backoff_factor should be in (0, 1), got ", options_.backoff_factor);
  TG_CHECK(options_.growth_interval > 0, "GradScaler: growth_interval should be a positive integer, got ",
           options_.growth_interval);
}

void GradScaler::check_scale(const char* op) const {
  TG_CHECK(scale_.defined(), "GradScaler.", op,
           ": the scale is not set. This may indicate your script did not call scaler.scale(loss) earlier in the "
           "iteration.");
}

Tensor GradScaler::scale(const Tensor& outputs) {
  if (!options_.enabled) return outputs;
  TG_CHECK(outputs.defined(), "GradScaler.scale: undefined tensor");
  TG_CHECK(is_floating(outputs.dtype()), "GradScaler.scale: expected a floating tensor, got ", outputs.dtype());
  if (!scale_.defined()) {
    // Created with fill kernels on the loss's device and current stream: no host copy.
    scale_ = tg::full({}, options_.init_scale, TensorOptions().dtype(kFloat32).device(outputs.device()));
    growth_tracker_ = tg::full({}, init_growth_tracker_, TensorOptions().dtype(kInt32).device(outputs.device()));
  }
  TG_CHECK(scale_.device() == outputs.device(), "GradScaler.scale: the scale lives on ", scale_.device(),
           " but the outputs are on ", outputs.device(), "; use one GradScaler per device");
  return outputs * scale_;
}

Tensor GradScaler::check_grads(optim::Optimizer& opt, bool unscale, const char* op) {
  std::vector<Tensor> grads;
  std::vector<std::pair<Tensor, Tensor>> write_back;  // (the .grad, its contiguous working copy)
  // A read-only check reads a gradient's finite proxy instead of the gradient when it has one
  // (core/finite_proxy.h: the float16 operands of a float32 weight gradient); each operand once.
  std::vector<Tensor> stand_ins;
  std::set<std::tuple<const void*, int64_t, DType>> seen;
  for (const Tensor& p : opt.parameters()) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    TG_CHECK(is_floating(g.dtype()), "GradScaler.", op, ": gradient of dtype ", g.dtype(), " (shape ", g.sizes(),
             ") is not floating point");
    TG_CHECK(g.device() == scale_.device(), "GradScaler.", op, ": a gradient of shape ", g.sizes(), " is on ",
             g.device(), " but the scale is on ", scale_.device());
    std::vector<Tensor> proxy = ::tg::detail::take_finite_proxy(g);  // taken either way: it is for one check
    if (!unscale && !proxy.empty()) {
      ::tg::detail::count_finite_proxy_use();
      for (Tensor& w : proxy)
        if (seen.insert(std::make_tuple(w.data_ptr(), w.numel(), w.dtype())).second) stand_ins.push_back(std::move(w));
      continue;
    }
    if (!g.is_contiguous()) {
      Tensor c = g.contiguous();
      if (unscale) write_back.emplace_back(g, c);
      g = c;
    }
    grads.push_back(std::move(g));
  }
  grads.insert(grads.end(), stand_ins.begin(), stand_ins.end());
  // The optimizer's persistent flag: zero unless a check wrote it and no update cleared it since.
  FoundInfBuffer& buf = found_inf_buffers_[&opt];
  if (!buf.flag.defined() || buf.flag.device() != scale_.device()) {
    buf.flag = tg::zeros({}, TensorOptions().dtype(kFloat32).device(scale_.device()));
  } else if (buf.dirty) {
    buf.flag.fill_(0.0);
  }
  buf.dirty = true;
  const Tensor& found_inf = buf.flag;
  const Tensor scale = unscale ? scale_ : Tensor();
  if (scale_.is_cpu()) {
    cpu_check_and_unscale(grads, found_inf, scale);
  } else {
#if defined(TG_WITH_CUDA)
    cuda::non_finite_check_and_unscale(grads, found_inf, scale);
#else
    TG_ERROR("GradScaler.", op, ": scale on ", scale_.device(), " but tapegrad was built without CUDA");
#endif
  }
  if (unscale) {
    for (const Tensor& g : grads) g.impl().storage->bump_version();
    for (auto& [dst, src] : write_back) dst.copy_(src);
  }
  return found_inf;
}

void GradScaler::unscale_(optim::Optimizer& opt) {
  if (!options_.enabled) return;
  check_scale("unscale_");
  PerOptimizer& st = per_optimizer_[&opt];
  TG_CHECK(st.state != OptState::Unscaled,
           "GradScaler.unscale_: unscale_() has already been called on this optimizer since the last update().");
  TG_CHECK(st.state != OptState::Stepped, "GradScaler.unscale_: unscale_() is being called after step().");
  st.found_inf = check_grads(opt, /*unscale=*/true, "unscale_");
  st.state = OptState::Unscaled;
}

void GradScaler::step(optim::Optimizer& opt) {
  if (!options_.enabled) {
    opt.step();
    return;
  }
  check_scale("step");
  PerOptimizer& st = per_optimizer_[&opt];
  TG_CHECK(st.state != OptState::Stepped, "GradScaler.step: step() has already been called since the last update().");
  if (st.state == OptState::Ready) {
    // One read-only pass; the optimizer divides by the scale as it reads each gradient.
    st.found_inf = check_grads(opt, /*unscale=*/false, "step");
    opt.step({.grad_scale = scale_, .found_inf = st.found_inf});
  } else {
    TG_CHECK(st.found_inf.defined(), "GradScaler.step: no inf checks were recorded for this optimizer.");
    opt.step({.grad_scale = Tensor(), .found_inf = st.found_inf});
  }
  st.state = OptState::Stepped;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  check_scale("update");
  // The flags the update reads and clears; beyond what one launch takes, the rest are
  // summed into one extra operand first (and stay dirty: the next check zero-fills them).
  constexpr size_t kMaxFlags = 16;  // == cuda::kMaxFoundInfs
  std::vector<Tensor> found;
  std::vector<const optim::Optimizer*> cleared;
  Tensor extra;
  for (auto& [opt, st] : per_optimizer_) {
    if (!st.found_inf.defined()) continue;
    if (found.size() + 1 < kMaxFlags) {
      found.push_back(st.found_inf);
      cleared.push_back(opt);
    } else {
      extra = extra.defined() ? extra + st.found_inf : st.found_inf.clone();
    }
  }
  if (extra.defined()) found.push_back(extra);
  TG_CHECK(!found.empty(), "GradScaler.update: no inf checks were recorded prior to update().");
  if (scale_.is_cpu()) {
    cpu_update_scale(scale_, growth_tracker_, found, options_.growth_factor, options_.backoff_factor,
                     options_.growth_interval);
  } else {
#if defined(TG_WITH_CUDA)
    cuda::update_scale(scale_, growth_tracker_, found, options_.growth_factor, options_.backoff_factor,
                       options_.growth_interval);
#endif
  }
  for (const optim::Optimizer* opt : cleared) found_inf_buffers_[opt].dirty = false;
  scale_.impl().storage->bump_version();
  growth_tracker_.impl().storage->bump_version();
  per_optimizer_.clear();
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled) return;
  check_scale("update");
  TG_CHECK(new_scale > 0 && std::isfinite(new_scale), "GradScaler.update: new_scale must be positive and finite, got ",
           new_scale);
  scale_.fill_(new_scale);
  per_optimizer_.clear();
}

double GradScaler::get_scale() const {
  if (!options_.enabled) return 1.0;
  return scale_.defined() ? scale_.item<double>() : options_.init_scale;
}

int64_t GradScaler::get_growth_tracker() const {
  if (!options_.enabled) return 0;
  return growth_tracker_.defined() ? growth_tracker_.item<int64_t>() : init_growth_tracker_;
}

Tensor GradScaler::found_inf(const optim::Optimizer& opt) const {
  auto it = per_optimizer_.find(&opt);
  return it == per_optimizer_.end() ? Tensor() : it->second.found_inf;
}

StateDict GradScaler::state_dict() const {
  if (!options_.enabled) return {};
  return {{"scale", tg::full({}, get_scale(), kFloat64)},
          {"growth_factor", tg::full({}, options_.growth_factor, kFloat64)},
          {"backoff_factor", tg::full({}, options_.backoff_factor, kFloat64)},
          {"growth_interval", tg::full({}, options_.growth_interval, kInt64)},
          {"_growth_tracker", tg::full({}, get_growth_tracker(), kInt64)}};
}

void GradScaler::load_state_dict(const StateDict& state) {
  if (!options_.enabled) return;
  TG_CHECK(!state.empty(),
           "GradScaler.load_state_dict: the state dict is empty, possibly because it was saved from a disabled "
           "GradScaler.");
  for (const auto& [key, t] : state)
    TG_CHECK(key == "scale" || key == "growth_factor" || key == "backoff_factor" || key == "growth_interval" ||
                 key == "_growth_tracker",
             "GradScaler.load_state_dict: unexpected key '", key, "'");
  auto get = [&](const char* key) {
    const Tensor* t = state.find(key);
    TG_CHECK(t != nullptr, "GradScaler.load_state_dict: missing key '", key, "'");
    TG_CHECK(t->defined(), "GradScaler.load_state_dict: '", key, "' is undefined");
    TG_CHECK(t->numel() == 1 && t->dtype() != kBool, "GradScaler.load_state_dict: '", key,
             "' must be a numeric tensor with one element, got ", t->dtype(), " ", t->sizes());
    return t->to(kCPU, kFloat64).item<double>();
  };
  // Everything is checked before anything changes: the values come from a file, and a double
  // outside an integer's range is undefined behaviour to convert.
  const double scale = get("scale"), growth = get("growth_factor"), backoff = get("backoff_factor");
  const double interval = get("growth_interval"), tracker = get("_growth_tracker");
  TG_CHECK(scale > 0 && std::isfinite(scale), "GradScaler.load_state_dict: 'scale' must be positive and finite, got ",
           scale);
  TG_CHECK(growth > 1.0 && std::isfinite(growth), "GradScaler.load_state_dict: 'growth_factor' must be finite and > 1, got ",
           growth);
  TG_CHECK(backoff > 0 && backoff < 1.0, "GradScaler.load_state_dict: 'backoff_factor' must be in (0, 1), got ", backoff);
  // The tracker is an int32 on the device and counts up to the interval.
  constexpr double kInt32Max = 2147483647.0;
  TG_CHECK(interval >= 1 && interval <= kInt32Max && interval == std::trunc(interval),
           "GradScaler.load_state_dict: 'growth_interval' must be an integer in [1, 2^31 - 1], got ", interval);
  TG_CHECK(tracker >= 0 && tracker <= kInt32Max && tracker == std::trunc(tracker),
           "GradScaler.load_state_dict: '_growth_tracker' must be an integer in [0, 2^31 - 1], got ", tracker);
  options_.init_scale = scale;
  options_.growth_factor = growth;
  options_.backoff_factor = backoff;
  options_.growth_interval = static_cast<int64_t>(interval);
  if (scale_.defined()) scale_.fill_(options_.init_scale);
  init_growth_tracker_ = static_cast<int64_t>(tracker);
  if (growth_tracker_.defined()) growth_tracker_.fill_(init_growth_tracker_);
}

}  // namespace tg::amp
