// The finiteness-witness registry of finite_witness.h.
#include <tapegrad/amp/finite_witness.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace tg::amp::detail {

namespace {

struct Entry {
  std::weak_ptr<TensorImpl> grad;  // not owning: the entry must not keep the gradient alive
  uint32_t version = 0;
  std::vector<Tensor> operands;
  std::vector<uint32_t> versions;
};

struct Registry {
  std::mutex mu;
  std::unordered_map<const TensorImpl*, Entry> entries;
  std::vector<std::weak_ptr<TensorImpl>> last_operands;  // of the latest note that was kept
  size_t purge_at = 64;  // purge dead entries when the map grows past this
  int64_t hits = 0;
};
Registry& registry() {
  static Registry* r = std::make_unique<Registry>().release();  // outlives static destructors
  return *r;
}

void purge_locked(Registry& r) {
  for (auto it = r.entries.begin(); it != r.entries.end();) {
    if (it->second.grad.expired())
      it = r.entries.erase(it);
    else
      ++it;
  }
  r.purge_at = std::max<size_t>(64, 2 * r.entries.size());
}

std::atomic<int> g_tokens{0};

}  // namespace

std::shared_ptr<void> witness_token() {
  g_tokens.fetch_add(1, std::memory_order_relaxed);
  return std::shared_ptr<void>(nullptr, [](void*) {
    if (g_tokens.fetch_sub(1, std::memory_order_relaxed) == 1) purge_finite_witnesses(/*all=*/true);
  });
}

void note_finite_witness(const Tensor& grad, std::initializer_list<Tensor> operands) {
  if (g_tokens.load(std::memory_order_relaxed) == 0) return;
  if (!grad.defined() || grad.dtype() != kFloat32 || operands.size() == 0) return;
  int64_t bytes = 0;
  for (const Tensor& t : operands) {
    if (!t.defined() || t.dtype() != kFloat16 || !t.is_contiguous() || t.device() != grad.device()) return;
    bytes += static_cast<int64_t>(t.nbytes());
  }
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  // The entry keeps its operands alive until the check, so it must be cheap to hold: at most a
  // quarter of the gradient's bytes, or operands that the latest kept entry holds anyway (a
  // linear's bias gradient after its weight's: both read dY).
  if (4 * bytes > static_cast<int64_t>(grad.nbytes())) {
    for (const Tensor& t : operands) {
      const bool held = std::any_of(r.last_operands.begin(), r.last_operands.end(),
                                    [&](const std::weak_ptr<TensorImpl>& w) { return w.lock() == t.impl_ptr(); });
      if (!held) return;
    }
  }
  Entry e;
  e.grad = grad.impl_ptr();
  e.version = grad.version();
  r.last_operands.clear();
  for (const Tensor& t : operands) {
    e.operands.push_back(t);
    e.versions.push_back(t.version());
    r.last_operands.push_back(t.impl_ptr());
  }
  r.entries[&grad.impl()] = std::move(e);
  if (r.entries.size() > r.purge_at) purge_locked(r);
}

std::vector<Tensor> take_finite_witness(const Tensor& grad, bool use) {
  if (!grad.defined()) return {};
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.entries.find(&grad.impl());
  if (it == r.entries.end()) return {};
  Entry e = std::move(it->second);
  r.entries.erase(it);
  if (!use) return {};
  // The same TensorImpl (not another one at a reused address), unchanged since, and so are
  // the operands.
  if (e.grad.lock() != grad.impl_ptr() || e.version != grad.version()) return {};
  for (size_t i = 0; i < e.operands.size(); ++i)
    if (e.operands[i].version() != e.versions[i]) return {};
  return std::move(e.operands);
}

void purge_finite_witnesses(bool all) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (all)
    r.entries.clear();
  else
    purge_locked(r);
}

void count_finite_witness_use() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  ++r.hits;
}

int64_t finite_witness_hits() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.hits;
}
int64_t finite_witness_entries() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return static_cast<int64_t>(r.entries.size());
}
void reset_finite_witness_hits() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.hits = 0;
}

}  // namespace tg::amp::detail
