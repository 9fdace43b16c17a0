// Automatic mixed precision, the autocast half: a thread-local, per-device-type
// RAII guard and the cast policy of every op (generated from core/op_list.h).
// Inside `tg::amp::autocast guard(tg::kCUDA)` matmul runs in float16 (bfloat16
// on the CPU), numerically sensitive ops (pow, exp, log, sum, mean, var/std,
// mse_loss) in float32, multi-input ops in their widest floating input dtype.
// The casts are ordinary differentiable Tensor::to calls, so gradients reach
// float32 parameters in float32. The op front-ends call the hook in core/autocast_hook.h.
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>

#include <tapegrad/core/device.h>
#include <tapegrad/core/dtype.h>
#include <tapegrad/core/op_list.h>

namespace tg::amp {

// What autocast does to an op's floating inputs (other than float64, and only on
// the autocast device type): Lower casts them to the autocast dtype, Fp32 to
// float32, Promote to the widest floating input dtype, None leaves them alone.
using CastPolicy = AutocastCategory;

// The policy of an op; the table is core/op_list.h's autocast column.
constexpr CastPolicy policy(OpKind op) { return autocast_category(op); }
// The same by the op's serialized name ("matmul", "pow", ...); also knows the ops
// that are compositions of others but carry their own policy ("mse_loss", "linear").
// nullopt for an unknown name.
std::optional<CastPolicy> policy(std::string_view op_name);
const char* policy_name(CastPolicy p);

// Whether autocast is on for a device type on this thread, and the dtype it lowers to
// (float16 on CUDA and bfloat16 on the CPU unless a guard chose otherwise).
bool is_enabled(DeviceType device);
DType get_dtype(DeviceType device);

// Turns autocast on (or off, with enabled = false) for one device type on this
// thread for a scope, and restores the previous state on exit; guards nest. Without
// a dtype the current one is kept (at top level: float16 on CUDA, bfloat16 on the
// CPU). Leaving the outermost guard empties the weight-cast cache.
class Autocast {
 public:
  explicit Autocast(DeviceType device, std::optional<DType> dtype = std::nullopt, bool enabled = true);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  DeviceType device_;
  bool prev_enabled_;
  DType prev_dtype_;
};
// PyTorch's spelling: tg::amp::autocast guard(tg::kCUDA, tg::kFloat16).
using autocast = Autocast;

namespace detail {
// The weight-cast cache: inside the outermost autocast region, the lowered copy of a
// float32 leaf that requires grad is made once per (tensor, version, dtype, grad mode).
// Across regions, CUDA parameters keep a shadow copy that the fused optimizer steps
// update (core/cast_copies.h): a reused copy is counted there, not as a miss here.
int64_t cast_cache_misses();  // casts made for cacheable tensors since the last reset
int64_t cast_cache_hits();
int64_t cast_cache_size();    // entries held now
void reset_cast_cache_counters();
void clear_cast_cache();
}  // namespace detail

}  // namespace tg::amp
