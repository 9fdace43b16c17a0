// The autocast hook of the op front-ends. An op whose policy (core/op_list.h) is not None starts
// with one line,
//     TG_AUTOCAST(Matmul, tg::matmul(a, b), a, b);
// naming its kind, the call that re-enters it, and its tensor operands. With
// autocast off on this thread that is one thread-local load and a branch. With it
// on, the operands are cast per the policy (differentiably, through Tensor::to)
// and, if any changed, the op is called again with the cast operands (whose
// names shadow the originals inside the call) and its result returned; the
// second entry finds nothing left to cast and runs the op. The casting itself, with its caches,
// is amp/autocast.cpp's (autocast_inputs): amp sits above the ops it casts for, and the ops see
// only this header.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <tapegrad/core/op_list.h>
#include <tapegrad/core/tensor.h>

namespace tg::amp::detail {

// The autocast state of a thread. `enabled_mask` (bit = 1 << DeviceType) is what
// the hook reads; the rest is only touched when it is non-zero or by the guards.
struct AutocastState {
  uint8_t enabled_mask = 0;
  DType dtype[2] = {DType::BFloat16, DType::Float16};  // indexed by DeviceType: CPU, CUDA
  int32_t nesting = 0;                                 // guards alive (enabled or not)
};
inline thread_local AutocastState tls_autocast;

// Whether autocast's float32 policy would cast `a` up from float16 / bfloat16 (on for a's device
// type). The unary float32 ops whose kernels read those dtypes as is (exp, log, sqrt, pow with a
// scalar exponent: backend::has_mixed_form) ask this instead of casting; one thread-local load
// when autocast is off.
inline bool fp32_reads_reduced(const Tensor& a) {
  const uint8_t mask = tls_autocast.enabled_mask;
  return mask != 0 && a.defined() && is_reduced_float(a.dtype()) &&
         (mask & static_cast<uint8_t>(1u << static_cast<int>(a.device().type()))) != 0;
}

// The dtype autocast lowers to on a's device type when a is float32 and autocast is on there;
// nullopt otherwise (one thread-local load when autocast is off). A float32-policy op whose result
// is usually lowered next writes that cast beside it (core/cast_copies.h: twins).
inline std::optional<DType> lowered_dtype(const Tensor& a) {
  const uint8_t mask = tls_autocast.enabled_mask;
  if (mask == 0 || !a.defined() || a.dtype() != DType::Float32) return std::nullopt;
  const int d = static_cast<int>(a.device().type());
  if (d > 1 || !(mask & static_cast<uint8_t>(1u << d))) return std::nullopt;
  return tls_autocast.dtype[d];
}

// Casts inputs[i] into out[i] per `policy`; false (out untouched) when nothing changes.
bool autocast_inputs(AutocastCategory policy, const Tensor* const* inputs, Tensor* out, size_t n);

template <class F, size_t... I>
Tensor autocast_apply(F& f, Tensor* cast, std::index_sequence<I...>) {
  return f(cast[I]...);
}

template <class F, class... Ts>
std::optional<Tensor> autocast_call(AutocastCategory policy, F&& f, const Ts&... inputs) {
  const Tensor* in[] = {&inputs...};
  Tensor cast[sizeof...(Ts)];
  if (!autocast_inputs(policy, in, cast, sizeof...(Ts))) return std::nullopt;
  return autocast_apply(f, cast, std::index_sequence_for<Ts...>{});
}

template <class F>
std::optional<Tensor> autocast_call_list(AutocastCategory policy, F&& f, const std::vector<Tensor>& inputs) {
  std::vector<const Tensor*> in;
  in.reserve(inputs.size());
  for (const Tensor& t : inputs) in.push_back(&t);
  std::vector<Tensor> cast(inputs.size());
  if (!autocast_inputs(policy, in.data(), cast.data(), inputs.size())) return std::nullopt;
  return f(cast);
}

}  // namespace tg::amp::detail

#define TG_AUTOCAST_PARAM_(x) const ::tg::Tensor& x
#define TG_AUTOCAST_PARAMS1_(a) TG_AUTOCAST_PARAM_(a)
#define TG_AUTOCAST_PARAMS2_(a, b) TG_AUTOCAST_PARAM_(a), TG_AUTOCAST_PARAM_(b)
#define TG_AUTOCAST_PARAMS3_(a, b, c) TG_AUTOCAST_PARAM_(a), TG_AUTOCAST_PARAM_(b), TG_AUTOCAST_PARAM_(c)
#define TG_AUTOCAST_PICK_(_1, _2, _3, name, ...) name
#define TG_AUTOCAST_PARAMS_(...) \
  TG_AUTOCAST_PICK_(__VA_ARGS__, TG_AUTOCAST_PARAMS3_, TG_AUTOCAST_PARAMS2_, TG_AUTOCAST_PARAMS1_, )(__VA_ARGS__)

// TG_AUTOCAST_AS(policy, call, operands...): the hook with an explicit policy (for
// composite ops that are not in the op list, e.g. mse_loss).
#define TG_AUTOCAST_AS(policy, call, ...)                                                                   \
  do {                                                                                                      \
    if (::tg::amp::detail::tls_autocast.enabled_mask) [[unlikely]] {                                        \
      if (auto tg_autocast_out_ = ::tg::amp::detail::autocast_call(                                         \
              (policy), [&](TG_AUTOCAST_PARAMS_(__VA_ARGS__)) -> ::tg::Tensor { return call; }, __VA_ARGS__)) \
        return std::move(*tg_autocast_out_);                                                                \
    }                                                                                                       \
  } while (0)

// TG_AUTOCAST(Kind, call, operands...): the policy of OpKind::Kind (at most 3 tensor operands).
#define TG_AUTOCAST(kind, call, ...) TG_AUTOCAST_AS(::tg::autocast_category(::tg::OpKind::kind), call, __VA_ARGS__)

// TG_AUTOCAST_LIST(Kind, call, list): for ops over a std::vector<Tensor> (cat).
#define TG_AUTOCAST_LIST(kind, call, list)                                                                  \
  do {                                                                                                      \
    if (::tg::amp::detail::tls_autocast.enabled_mask) [[unlikely]] {                                        \
      if (auto tg_autocast_out_ = ::tg::amp::detail::autocast_call_list(                                    \
              ::tg::autocast_category(::tg::OpKind::kind),                                                  \
              [&](const std::vector<::tg::Tensor>& list) -> ::tg::Tensor { return call; }, list))           \
        return std::move(*tg_autocast_out_);                                                                \
    }                                                                                                       \
  } while (0)
