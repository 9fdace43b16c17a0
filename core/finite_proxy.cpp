// Finite proxies (finite_proxy.h).
#include <tapegrad/core/finite_proxy.h>

#include <atomic>
#include <memory>
#include <utility>

namespace tg::detail {

namespace {
std::atomic<int64_t> g_hits{0};
}  // namespace

void set_finite_proxy(const Tensor& t, std::vector<Tensor> operands) {
  if (!t.defined() || operands.empty()) return;
  int64_t bytes = 0;
  for (const Tensor& o : operands) {
    if (!o.defined() || !o.is_contiguous() || o.device() != t.device()) return;
    bytes += static_cast<int64_t>(o.nbytes());
  }
  if (4 * bytes > static_cast<int64_t>(t.nbytes())) return;
  auto p = std::make_shared<FiniteProxy>();
  p->version = t.version();
  for (const Tensor& o : operands) p->versions.push_back(o.version());
  p->operands = std::move(operands);
  t.impl().finite_proxy = std::move(p);
}

std::vector<Tensor> take_finite_proxy(const Tensor& t) {
  if (!t.defined()) return {};
  std::shared_ptr<FiniteProxy> p = std::move(t.impl().finite_proxy);
  if (!p || p->version != t.version()) return {};
  for (size_t i = 0; i < p->operands.size(); ++i)
    if (p->operands[i].version() != p->versions[i]) return {};
  return std::move(p->operands);
}

bool has_finite_proxy(const Tensor& t) { return t.defined() && t.impl().finite_proxy != nullptr; }

void count_finite_proxy_use() { g_hits.fetch_add(1, std::memory_order_relaxed); }
int64_t finite_proxy_hits() { return g_hits.load(); }
void reset_finite_proxy_hits() { g_hits.store(0); }

}  // namespace tg::detail
