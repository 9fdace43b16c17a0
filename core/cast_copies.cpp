// The lower-precision parameter copies of cast_copies.h: a small list attached to each
// parameter's storage, every list behind one mutex (an optimizer may run on another thread than
// the forward; a model has a few entries, touched once per parameter per step).
#include <tapegrad/core/cast_copies.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <tapegrad/core/cuda_graph.h>
#include <tapegrad/core/native.h>

namespace tg::detail {

namespace {

std::atomic<int64_t> g_live{0}, g_hits{0}, g_casts{0};
std::atomic<bool> g_enabled{true};
std::atomic<bool> g_twins{true};
std::atomic<int64_t> g_twin_hits{0};
std::mutex g_mu;  // guards every storage's Copies

struct Copy {
  int64_t offset = 0;
  int64_t numel = 0;
  DType dtype = kFloat16;
  uint32_t version = 0;      // the parameter storage's version this is the cast of
  uint32_t own_version = 0;  // the copy's own storage version then (an edit of the copy shows)
  Tensor low;                // contiguous, detached
  bool pinned = false;       // read by a capture: kept, recast in place when stale
  bool twin = false;         // a result's one-shot twin (attach_cast_twin), not a parameter's copy
};

// Storage::attachment of a parameter's memory.
struct Copies {
  std::vector<Copy> list;
  ~Copies() {  // cast_copy_count() counts parameters' copies, not twins
    g_live.fetch_sub(std::count_if(list.begin(), list.end(), [](const Copy& e) { return !e.twin; }),
                     std::memory_order_relaxed);
  }
};

Copies* copies_of(Storage& s, bool create) {
  std::shared_ptr<void>& a = s.attachment();
  if (!a && create) a = std::make_shared<Copies>();
  return static_cast<Copies*>(a.get());
}

Copy* find(Copies* c, const Tensor& t, DType dtype, bool twin = false) {
  if (c == nullptr) return nullptr;
  for (Copy& e : c->list)
    if (e.offset == t.storage_offset() && e.numel == t.numel() && e.dtype == dtype && e.twin == twin) return &e;
  return nullptr;
}

bool is_valid(const Copy& e, const Storage& param) {
  return e.version == param.version() && e.own_version == e.low.impl().storage->version();
}

// Takes entry e out of the list (the caller frees its copy outside the lock).
Tensor remove(Copies* c, Copy* e) {
  Tensor low = std::move(e->low);
  if (!e->twin) g_live.fetch_sub(1, std::memory_order_relaxed);
  if (e != &c->list.back()) *e = std::move(c->list.back());
  c->list.pop_back();
  return low;
}

bool qualifies(const Tensor& dense, DType to) {
  return g_enabled.load(std::memory_order_relaxed) && is_reduced_float(to) && dense.dtype() == kFloat32 &&
         dense.device().is_cuda() && dense.is_contiguous() && dense.numel() > 0;
}

// Writes the cast of `src` (dense float32) into `low` (its contiguous copy) and bumps low's version.
void recast_into(const Tensor& low, const Tensor& src) {
  native::copy_(low, src);
  low.impl().storage->bump_version();
}

// Re-tags the entry of `low` in `param`'s list after a recast.
void retag(Storage& param, const Tensor& low, uint32_t version) {
  std::lock_guard<std::mutex> lock(g_mu);
  Copies* c = copies_of(param, false);
  if (c == nullptr) return;
  for (Copy& e : c->list)
    if (e.low.defined() && e.low.impl().storage == low.impl().storage) {
      e.version = version;
      e.own_version = low.impl().storage->version();
    }
}

// Before every replay of the capturing graph: recast the pinned copy if its parameter changed.
void pin(const Tensor& dense, const Tensor& low) {
  std::weak_ptr<Storage> param = dense.impl().storage;
  const Shape sizes = dense.sizes(), strides = dense.strides();
  const int64_t offset = dense.storage_offset();
  const DType dtype = low.dtype();
  cuda::detail::add_replay_prologue([param, low, sizes, strides, offset, dtype] {
    std::shared_ptr<Storage> s = param.lock();
    if (!s) return;
    Tensor src(std::make_shared<TensorImpl>(s, sizes, strides, offset, kFloat32));
    bool stale = false;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      Copy* e = find(copies_of(*s, false), src, dtype);
      stale = e != nullptr && e->low.impl().storage == low.impl().storage && !is_valid(*e, *s);
    }
    if (!stale) return;
    const uint32_t version = s->version();
    recast_into(low, src);
    retag(*s, low, version);
  });
}

}  // namespace

Tensor cast_copy(const Tensor& dense, DType to, bool* reused) {
  if (reused != nullptr) *reused = false;
  if (!qualifies(dense, to)) return native::to(dense, dense.device(), to);
  Storage& param = *dense.impl().storage;
  const bool capturing = cuda::detail::stream_capturing(dense.device().index());
  Tensor low, freed;  // `freed` is released after the lock
  bool valid = false, newly_pinned = false;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    Copies* c = copies_of(param, false);
    if (Copy* e = find(c, dense, to)) {
      valid = is_valid(*e, param);
      // A stale copy is recast in place when nothing else can see it (or a graph reads it);
      // otherwise (an autograd graph saved it, say) it is dropped and a new one made.
      if (valid || e->pinned || e->low.impl().storage.use_count() == 1) {
        low = e->low;
        newly_pinned = capturing && !e->pinned;
        e->pinned = e->pinned || capturing;
      } else {
        freed = remove(c, e);
      }
    }
  }
  freed = Tensor();
  if (newly_pinned) pin(dense, low);
  if (low.defined() && valid) {
    g_hits.fetch_add(1, std::memory_order_relaxed);
    if (reused != nullptr) *reused = true;
    return low;
  }
  g_casts.fetch_add(1, std::memory_order_relaxed);
  const uint32_t version = param.version();
  if (low.defined()) {
    recast_into(low, dense);
    retag(param, low, version);
    return low;
  }
  Tensor cast = native::to(dense, dense.device(), to);
  if (!cast.is_contiguous() || cast.dtype() != to) return cast;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    Copies* c = copies_of(param, true);
    if (find(c, dense, to) != nullptr) return cast;  // another thread was first: keep theirs
    c->list.push_back(Copy{dense.storage_offset(), dense.numel(), to, version, cast.impl().storage->version(), cast,
                           capturing});
    g_live.fetch_add(1, std::memory_order_relaxed);
  }
  if (capturing) pin(dense, cast);
  return cast;
}

Tensor cast_copy_for_update(const Tensor& param, std::optional<DType> only) {
  if (!param.defined() || param.dtype() != kFloat32 || !param.device().is_cuda() || !param.is_contiguous())
    return Tensor();
  std::vector<Tensor> freed;  // released after the lock
  Tensor found;
  std::lock_guard<std::mutex> lock(g_mu);
  Storage& s = *param.impl().storage;
  Copies* c = copies_of(s, false);
  if (c == nullptr) return found;
  for (DType d : {kFloat16, kBFloat16}) {
    Copy* e = find(c, param, d);
    if (e == nullptr) continue;
    if (!found.defined() && (!only || *only == d) && is_valid(*e, s))
      found = e->low;
    else if (!e->pinned)  // a pinned one stays until recast
      freed.push_back(remove(c, e));
  }
  return found;
}

void cast_copy_updated(const Tensor& param, const Tensor& copy) {
  if (!copy.defined()) return;
  std::lock_guard<std::mutex> lock(g_mu);
  Copy* e = find(copies_of(*param.impl().storage, false), param, copy.dtype());
  if (e == nullptr || e->low.impl().storage != copy.impl().storage) return;
  copy.impl().storage->bump_version();
  e->version = param.version();
  e->own_version = copy.impl().storage->version();
}

Tensor cast_copy_of(const Tensor& param, DType dtype) {
  std::lock_guard<std::mutex> lock(g_mu);
  Storage& s = *param.impl().storage;
  Copy* e = find(copies_of(s, false), param, dtype);
  return e != nullptr && is_valid(*e, s) ? e->low : Tensor();
}

void attach_cast_twin(const Tensor& result, const Tensor& low) {
  if (!g_twins.load(std::memory_order_relaxed) || !result.defined() || !low.defined()) return;
  if (result.dtype() != kFloat32 || !result.device().is_cuda() || !result.is_contiguous() ||
      !is_reduced_float(low.dtype()) || !low.is_contiguous() || low.sizes() != result.sizes() ||
      low.device() != result.device() || result.numel() == 0)
    return;
  Tensor replaced;  // released after the lock
  std::lock_guard<std::mutex> lock(g_mu);
  Storage& s = *result.impl().storage;
  Copies* c = copies_of(s, true);
  if (Copy* e = find(c, result, low.dtype(), true)) replaced = remove(c, e);
  c->list.push_back(Copy{result.storage_offset(), result.numel(), low.dtype(), s.version(),
                         low.impl().storage->version(), low, false, true});
}

Tensor take_cast_twin(const Tensor& t, DType to) {
  if (!t.defined() || t.dtype() != kFloat32 || !is_reduced_float(to) || !t.device().is_cuda() || !t.is_contiguous())
    return Tensor();
  Tensor low;
  bool valid = false;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    Storage& s = *t.impl().storage;
    Copy* e = find(copies_of(s, false), t, to, true);
    if (e == nullptr) return Tensor();
    valid = is_valid(*e, s) && e->low.sizes() == t.sizes();
    low = remove(copies_of(s, false), e);  // taken or stale: either way it leaves the list
  }
  if (!valid) return Tensor();  // the stale twin is freed here, outside the lock
  g_twin_hits.fetch_add(1, std::memory_order_relaxed);
  return low;
}

int64_t cast_twin_hits() { return g_twin_hits.load(); }
void set_cast_twins_enabled(bool enabled) { g_twins.store(enabled); }
bool cast_twins_enabled() { return g_twins.load(); }

int64_t cast_copy_hits() { return g_hits.load(); }
int64_t cast_copy_casts() { return g_casts.load(); }
void reset_cast_copy_counters() {
  g_hits.store(0);
  g_casts.store(0);
}
int64_t cast_copy_count() { return g_live.load(); }
void set_cast_copies_enabled(bool enabled) { g_enabled.store(enabled); }
bool cast_copies_enabled() { return g_enabled.load(); }

}  // namespace tg::detail
