// The shadow table: one low-precision copy per (parameter memory, dtype), tagged
// with the storage and version it equals the cast of. Global (an optimizer may run
// on another thread than the forward) behind one mutex; a few entries per model.
#include <tapegrad/amp/shadow.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include <tapegrad/autograd/function.h>
#include <tapegrad/core/native.h>
#include <tapegrad/core/trace.h>
#if defined(TG_WITH_CUDA)
#include <tapegrad/core/backend/cuda/runtime.h>
#endif

namespace tg::amp::detail {

namespace {

struct Key {
  const Storage* storage;
  int64_t offset;
  int64_t numel;
  DType dtype;
  bool operator==(const Key& o) const {
    return storage == o.storage && offset == o.offset && numel == o.numel && dtype == o.dtype;
  }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    return std::hash<const void*>()(k.storage) ^ (std::hash<int64_t>()(k.offset) * 31) ^
           (std::hash<int64_t>()(k.numel) * 131) ^ static_cast<size_t>(k.dtype);
  }
};
struct Entry {
  std::weak_ptr<Storage> storage;  // not owning: the parameter's memory may go away
  uint32_t version;                // the storage version the shadow is the cast of
  Tensor low;                      // contiguous, detached
  // Read by a CUDA graph capture: the graph holds its address, so the buffer is kept
  // (recast in place when stale, never replaced) for as long as the parameter lives.
  bool pinned = false;
};

struct Table {
  std::mutex mu;
  std::unordered_map<Key, Entry, KeyHash> entries;
};
Table& table() {
  static Table* t = new Table();  // never destroyed: tensors may be released after static teardown began
  return *t;
}

std::atomic<bool> g_enabled{true};
std::atomic<int64_t> g_hits{0}, g_casts{0};

Key key_of(const Tensor& t, DType dtype) { return Key{t.impl().storage.get(), t.storage_offset(), t.numel(), dtype}; }

// The shadow still equals the cast of the memory it was made from.
bool is_valid(const Entry& e, const Storage* storage) {
  std::shared_ptr<Storage> s = e.storage.lock();
  return s && s.get() == storage && s->version() == e.version;
}

// A parameter, or a pure view chain (transpose / permute / t / view) down to one.
bool is_parameter_memory(const Tensor& u) {
  if (u.is_leaf()) return u.requires_grad();
  std::shared_ptr<autograd::Node> fn = u.grad_fn();
  for (int hops = 0; fn && hops < 8; ++hops) {
    const char* name = fn->name();
    if (std::strcmp(name, "AccumulateGrad") == 0) return true;
    const bool view = std::strcmp(name, "transpose") == 0 || std::strcmp(name, "permute") == 0 ||
                      std::strcmp(name, "t") == 0 || std::strcmp(name, "view") == 0;
    if (!view || fn->next_edges.size() != 1) return false;
    fn = fn->next_edges[0].fn;
  }
  return false;
}

bool eligible(const Tensor& u, DType to) {
  return g_enabled.load(std::memory_order_relaxed) && is_reduced_float(to) && u.dtype() == kFloat32 &&
         u.device().is_cuda() && u.is_contiguous() && u.numel() > 0 && ::tg::detail::tls_tracer == nullptr &&
         is_parameter_memory(u);
}

bool capturing(const Tensor& u) {
#if defined(TG_WITH_CUDA)
  try {
    return ::tg::cuda::detail::current_stream_capturing(u.device().index());
  } catch (const Error&) {
    return true;  // the query failed (e.g. an implicit capture dependency): pinning is the safe side
  }
#else
  (void)u;
  return false;
#endif
}

// Writes the cast of `src`'s memory (dense float32 with low's layout) into `low`.
void recast_into(const Tensor& low, const Tensor& src) {
  native::copy_(native::make_view(low, src.sizes(), src.strides(), low.storage_offset()), src);
  low.impl().storage->bump_version();  // autograd refuses saved aliases of the old values
}

// The cast as autocast has always recorded it (Tensor::to's node, autograd/functions/view.cpp:
// keep the two in step), but with `low`'s memory.
Tensor differentiable_alias(const Tensor& u, const Tensor& low) {
  Tensor out = native::make_view(low, u.sizes(), u.strides(), low.storage_offset());
  if (!autograd::should_record(u)) return out;
  const Device in_device = u.device();
  const DType in_dtype = u.dtype();
  Tensor res =
      autograd::record("to", {u}, std::move(out),
                       [in_device, in_dtype](const Tensor& g, const autograd::FunctionNode&) -> std::vector<Tensor> {
                         return {native::to(g, in_device, in_dtype)};  // back to the input's dtype (g if it is)
                       });
  // As Tensor::to marks a float32 -> half cast: it also takes (and passes through) a float32 gradient.
  res.grad_fn()->wide_grad_dtype = kFloat32;
  return res;
}

// Moves the dead entries (and with `all`, every unpinned one) out; the caller frees
// them outside the lock.
void collect_dead(std::unordered_map<Key, Entry, KeyHash>& entries, std::vector<Tensor>& freed, bool all = false) {
  for (auto it = entries.begin(); it != entries.end();) {
    if (it->second.storage.expired() || (all && !it->second.pinned)) {
      freed.push_back(std::move(it->second.low));
      it = entries.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace

Tensor shadow_cast(const Tensor& u, DType to, bool* reused) {
  if (reused != nullptr) *reused = false;
  if (!eligible(u, to)) return u.to(to);
  const bool in_capture = capturing(u);
  Table& t = table();
  const Key key = key_of(u, to);
  Tensor low;
  bool valid = false;
  std::vector<Tensor> freed;  // released outside the lock
  {
    std::lock_guard<std::mutex> lock(t.mu);
    auto it = t.entries.find(key);
    if (it != t.entries.end()) {
      valid = is_valid(it->second, key.storage);
      if (valid || (it->second.pinned && !it->second.storage.expired())) {
        low = it->second.low;
        it->second.pinned = it->second.pinned || in_capture;
      } else {
        freed.push_back(std::move(it->second.low));  // stale: freed before casting anew
        t.entries.erase(it);
      }
    }
    if (!low.defined()) collect_dead(t.entries, freed);
  }
  freed.clear();
  if (low.defined() && valid) {
    g_hits.fetch_add(1, std::memory_order_relaxed);
    if (reused != nullptr) *reused = true;
    return differentiable_alias(u, low);
  }
  if (low.defined()) {
    // A stale pinned shadow: a graph reads this buffer, so the fresh cast goes into it.
    recast_into(low, u);
    {
      std::lock_guard<std::mutex> lock(t.mu);
      auto it = t.entries.find(key);
      if (it != t.entries.end() && it->second.low.is_same(low)) {
        it->second.storage = u.impl().storage;
        it->second.version = u.version();
      }
    }
    g_casts.fetch_add(1, std::memory_order_relaxed);
    return differentiable_alias(u, low);
  }
  Tensor cast = u.to(to);
  if (cast.is_contiguous() && cast.dtype() == to) {
    std::lock_guard<std::mutex> lock(t.mu);
    t.entries[key] = Entry{u.impl().storage, u.version(), autograd::alias(cast), in_capture};
    g_casts.fetch_add(1, std::memory_order_relaxed);
  }
  return cast;
}

Tensor shadow_for_update(const Tensor& param, std::optional<DType> only) {
  if (!param.defined() || param.dtype() != kFloat32 || !param.device().is_cuda() || !param.is_contiguous())
    return Tensor();
  Table& t = table();
  Tensor found;
  std::vector<Tensor> freed;
  std::lock_guard<std::mutex> lock(t.mu);
  if (t.entries.empty()) return found;
  for (DType d : {kFloat16, kBFloat16}) {
    const Key key = key_of(param, d);
    auto it = t.entries.find(key);
    if (it == t.entries.end()) continue;
    const bool use = !found.defined() && (!only || *only == d) && is_valid(it->second, key.storage);
    if (use) {
      found = it->second.low;
    } else if (!it->second.pinned || it->second.storage.expired()) {  // a pinned one stays until recast
      freed.push_back(std::move(it->second.low));
      t.entries.erase(it);
    }
  }
  return found;
}

void shadow_updated(const Tensor& param, const Tensor& shadow) {
  if (!shadow.defined()) return;
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.entries.find(key_of(param, shadow.dtype()));
  if (it == t.entries.end() || it->second.low.impl_ptr() != shadow.impl_ptr()) return;
  it->second.storage = param.impl().storage;
  it->second.version = param.version();
  shadow.impl().storage->bump_version();
}

int64_t refresh_shadows();
#if defined(TG_WITH_CUDA)
namespace {
// Graph replays recast shadows whose parameter changed outside the captured step.
const bool g_replay_hook = [] {
  tg::cuda::detail::set_before_replay_hook([] { (void)refresh_shadows(); });
  return true;
}();
}  // namespace
#endif

int64_t refresh_shadows() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  int64_t n = 0;
  for (auto& [key, e] : t.entries) {
    std::shared_ptr<Storage> s = e.storage.lock();
    if (!s || s.get() != key.storage || s->version() == e.version) continue;
    // The parameter's memory as a dense float32 tensor, cast into the shadow's memory.
    recast_into(e.low, Tensor(std::make_shared<TensorImpl>(s, e.low.sizes(), e.low.strides(), key.offset, kFloat32)));
    e.version = s->version();
    ++n;
  }
  return n;
}

Tensor shadow_of(const Tensor& param, DType dtype) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  const Key key = key_of(param, dtype);
  auto it = t.entries.find(key);
  if (it == t.entries.end() || !is_valid(it->second, key.storage)) return Tensor();
  return it->second.low;
}

int64_t shadow_hits() { return g_hits.load(); }
int64_t shadow_casts() { return g_casts.load(); }
void reset_shadow_counters() {
  g_hits.store(0);
  g_casts.store(0);
}

int64_t shadow_count() {
  purge_dead_shadows();
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  return static_cast<int64_t>(t.entries.size());
}

void clear_shadows() {
  std::vector<Tensor> freed;
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  collect_dead(t.entries, freed, /*all=*/true);
}

void purge_dead_shadows() {
  std::vector<Tensor> freed;
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  if (t.entries.empty()) return;
  collect_dead(t.entries, freed);
  // `freed` is destroyed after the lock (declared before it).
}

void set_shadows_enabled(bool enabled) {
  g_enabled.store(enabled);
  if (!enabled) clear_shadows();
}
bool shadows_enabled() { return g_enabled.load(); }

}  // namespace tg::amp::detail
