// The autocast guard, the policy lookups, the input casting behind the op hook,
// and the weight-cast cache.
#include <tapegrad/amp/autocast.h>

#include <algorithm>
#include <unordered_map>
#include <vector>

#include <tapegrad/core/autocast_hook.h>
#include <tapegrad/autograd/function.h>
#include <tapegrad/core/cast_copies.h>
#include <tapegrad/core/error.h>
#include <tapegrad/core/tensor.h>

namespace tg::amp {

namespace {

constexpr uint8_t device_bit(DeviceType d) { return static_cast<uint8_t>(1u << static_cast<int>(d)); }
constexpr int device_index(DeviceType d) { return static_cast<int>(d); }

// One cached cast. The source is held so that its TensorImpl address cannot be
// reused by another tensor while the entry lives.
struct CacheEntry {
  Tensor source;
  uint32_t version;
  Tensor cast;
};
struct CacheKey {
  const TensorImpl* impl;
  DType dtype;
  bool grad_mode;  // a cast made under no_grad has no graph: never hand it to a recording op
  bool operator==(const CacheKey& o) const { return impl == o.impl && dtype == o.dtype && grad_mode == o.grad_mode; }
};
struct CacheKeyHash {
  size_t operator()(const CacheKey& k) const {
    return std::hash<const void*>()(k.impl) ^ (static_cast<size_t>(k.dtype) << 1) ^ static_cast<size_t>(k.grad_mode);
  }
};
struct CastCache {
  std::unordered_map<CacheKey, CacheEntry, CacheKeyHash> entries;
  int64_t misses = 0;
  int64_t hits = 0;
};
thread_local CastCache tls_cache;

bool is_cacheable(const Tensor& t, DType to) {
  // PyTorch's rule: lowering casts of float32 leaves that require grad (the weights).
  return is_reduced_float(to) && t.dtype() == kFloat32 && t.is_leaf() && t.requires_grad();
}

// The dims of t in memory order (outermost first) when t is dense under a permutation of its
// dims (w.t() in a matmul, say); nullopt for gaps, overlaps or broadcasts.
std::optional<Shape> memory_order(const Tensor& t) {
  const int64_t nd = t.dim();
  Shape perm(std::vector<int64_t>(static_cast<size_t>(nd)));
  for (int64_t i = 0; i < nd; ++i) perm[i] = i;
  if (t.is_contiguous()) return perm;
  std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) { return t.stride(a) > t.stride(b); });
  int64_t expect = 1;
  for (int64_t i = nd - 1; i >= 0; --i) {
    const int64_t d = perm[i];
    if (t.size(d) != 1 && t.stride(d) != expect) return std::nullopt;
    expect *= t.size(d);
  }
  return perm;
}

// A dense tensor viewed with permuted dims is cast in its memory order and viewed back, so the
// copy reads and writes straight through memory and the result keeps the layout (matmul takes a
// transposed operand for free), where Tensor::to would make a transposing copy. Differentiable:
// permute is a view op.
Tensor cast_dense(const Tensor& t, DType to) {
  if (t.is_contiguous() || t.dim() < 2) return t.to(to);
  std::optional<Shape> perm = memory_order(t);
  if (!perm) return t.to(to);
  Shape inv(*perm);
  for (int64_t i = 0; i < t.dim(); ++i) inv[(*perm)[i]] = i;
  return t.permute(*perm).to(to).permute(inv);
}

// A parameter's cast (a float32 leaf that requires grad), in its layout: on CUDA from the
// parameter's kept copy (core/cast_copies.h), recorded as Tensor::to records it.
Tensor cast_parameter(const Tensor& t, DType to, bool* reused) {
  *reused = false;
  std::optional<Shape> perm;
  if (t.is_cuda()) perm = memory_order(t);
  if (!perm) return cast_dense(t, to);
  const Tensor dense = t.is_contiguous() ? t : native::permute(t, *perm);  // t's memory, contiguous
  const Tensor low = ::tg::detail::cast_copy(dense, to, reused);
  // low is dense in the same memory order: t's strides address it as they address t.
  return autograd::finish_to(t, native::make_view(low, t.sizes(), t.strides(), low.storage_offset()));
}

Tensor cast_to(const Tensor& t, DType to) {
  if (!is_cacheable(t, to)) return cast_dense(t, to);
  CastCache& c = tls_cache;
  const CacheKey key{&t.impl(), to, autograd::GradMode::is_enabled()};
  auto it = c.entries.find(key);
  if (it != c.entries.end() && it->second.version == t.version()) {
    ++c.hits;
    return it->second.cast;
  }
  bool reused = false;
  Tensor cast = cast_parameter(t, to, &reused);
  if (!reused) ++c.misses;  // a reused copy is no new cast
  c.entries[key] = CacheEntry{t, t.version(), cast};
  return cast;
}

// Autocast applies to a floating tensor other than float64 on an enabled device type.
bool eligible(const Tensor& t, uint8_t mask) {
  return t.defined() && is_floating(t.dtype()) && t.dtype() != kFloat64 && (mask & device_bit(t.device().type()));
}

}  // namespace

std::optional<CastPolicy> policy(std::string_view op_name) {
  OpKind op;
  if (!op_from_name(op_name, op)) return std::nullopt;
  return policy(op);
}

const char* policy_name(CastPolicy p) {
  switch (p) {
    case CastPolicy::None: return "none";
    case CastPolicy::Lower: return "lower";
    case CastPolicy::Fp32: return "fp32";
    case CastPolicy::Promote: return "promote";
  }
  return "?";
}

bool is_enabled(DeviceType device) { return detail::tls_autocast.enabled_mask & device_bit(device); }
DType get_dtype(DeviceType device) { return detail::tls_autocast.dtype[device_index(device)]; }

Autocast::Autocast(DeviceType device, std::optional<DType> dtype, bool enabled)
    : device_(device), prev_enabled_(is_enabled(device)), prev_dtype_(get_dtype(device)) {
  if (dtype)
    TG_CHECK(is_reduced_float(*dtype), "autocast(", device, "): dtype must be float16 or bfloat16, got ", *dtype);
  detail::AutocastState& s = detail::tls_autocast;
  if (dtype) s.dtype[device_index(device)] = *dtype;
  if (enabled)
    s.enabled_mask = static_cast<uint8_t>(s.enabled_mask | device_bit(device));
  else
    s.enabled_mask = static_cast<uint8_t>(s.enabled_mask & ~device_bit(device));
  ++s.nesting;
}

Autocast::~Autocast() {
  detail::AutocastState& s = detail::tls_autocast;
  s.dtype[device_index(device_)] = prev_dtype_;
  if (prev_enabled_)
    s.enabled_mask = static_cast<uint8_t>(s.enabled_mask | device_bit(device_));
  else
    s.enabled_mask = static_cast<uint8_t>(s.enabled_mask & ~device_bit(device_));
  if (--s.nesting == 0) {
    tls_cache.entries.clear();  // releases the cached casts (no throw: plain frees)
  }
}

namespace detail {

int64_t cast_cache_misses() { return tls_cache.misses; }
int64_t cast_cache_hits() { return tls_cache.hits; }
int64_t cast_cache_size() { return static_cast<int64_t>(tls_cache.entries.size()); }
void reset_cast_cache_counters() { tls_cache.misses = tls_cache.hits = 0; }
void clear_cast_cache() { tls_cache.entries.clear(); }

bool autocast_inputs(AutocastCategory policy, const Tensor* const* inputs, Tensor* out, size_t n) {
  const uint8_t mask = tls_autocast.enabled_mask;
  if (policy == AutocastCategory::None || mask == 0) return false;
  // The op's device type decides the target dtype; operands on other device types are left alone.
  DType target = kFloat32;
  bool any = false;
  for (size_t i = 0; i < n; ++i) {
    const Tensor& t = *inputs[i];
    if (!t.defined() || !is_floating(t.dtype())) continue;
    if (policy == AutocastCategory::Promote) {
      // Widest among all floating operands (float64 included: then the others go to float64).
      if (!(mask & device_bit(t.device().type()))) continue;
      target = any ? promote_types(target, t.dtype()) : t.dtype();
      any = true;
    } else if (eligible(t, mask)) {
      target = policy == AutocastCategory::Lower ? tls_autocast.dtype[device_index(t.device().type())] : kFloat32;
      any = true;
      break;
    }
  }
  if (!any) return false;
  bool changed = false;
  for (size_t i = 0; i < n; ++i) {
    const Tensor& t = *inputs[i];
    if (eligible(t, mask) && t.dtype() != target) {
      out[i] = cast_to(t, target);
      changed = true;
    } else {
      out[i] = t;
    }
  }
  return changed;
}

}  // namespace detail

}  // namespace tg::amp
