// The tracing hook of the op front-end. Every public op in core/ops.h ends with
// TG_TRACE(kind, out, {inputs...}, {attributes...}); when no tracer is installed
// on this thread (always, outside tg::export_module) that is one thread-local
// load and a branch, and the braced lists are never built. export/ installs a
// Tracer to capture a module's forward as a graph.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <tapegrad/core/op_list.h>
#include <tapegrad/core/tensor.h>

namespace tg::detail {

// An op's non-tensor argument: int (dims, indices, integral scalars), double
// (floating scalars), bool (keepdim, bool scalars), int list (shapes, dims) or
// a dtype (stored as its enum).
using TraceValue = std::variant<int64_t, double, bool, std::vector<int64_t>, DType>;
struct TraceAttr {
  const char* name;
  TraceValue value;
};

inline TraceValue trace_scalar(const Scalar& s) {
  if (s.is_bool()) return TraceValue(s.to_int() != 0);
  if (s.is_integral()) return TraceValue(s.to_int());
  return TraceValue(s.to_double());
}

class Tracer {
 public:
  virtual ~Tracer() = default;
  // `out` was computed by `op` from `inputs` (tensor operands, in order) and `attrs`.
  virtual void record(OpKind op, const Tensor& out, std::vector<Tensor> inputs, std::vector<TraceAttr> attrs) = 0;
};

// The tracer of this thread; null when nothing is being traced.
inline thread_local Tracer* tls_tracer = nullptr;

// Installs a tracer for a scope (RAII, restores the previous one).
class TracerGuard {
 public:
  explicit TracerGuard(Tracer* t) : prev_(tls_tracer) { tls_tracer = t; }
  ~TracerGuard() { tls_tracer = prev_; }
  TracerGuard(const TracerGuard&) = delete;
  TracerGuard& operator=(const TracerGuard&) = delete;

 private:
  Tracer* prev_;
};

}  // namespace tg::detail

// TG_TRACE(Kind, out, {a, b}, {{"alpha", tg::detail::trace_scalar(alpha)}}): the inputs and
// attributes are only evaluated while a tracer is installed.
#define TG_TRACE(kind, out, ...)                                                              \
  do {                                                                                        \
    if (::tg::detail::Tracer* tg_tracer_ = ::tg::detail::tls_tracer) [[unlikely]]             \
      tg_tracer_->record(::tg::OpKind::kind, out, __VA_ARGS__);                               \
  } while (0)
