// Type promotion between tensor dtypes, following torch.promote_types.
#include <tapegrad/core/dtype.h>

namespace tg {

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (a == kBool) return b;
  if (b == kBool) return a;
  bool fa = is_floating(a), fb = is_floating(b);
  if (!fa && !fb) {
    // Signed integers: the wider one. uint8 with int8 needs int16 (holds both ranges); uint8 with a
    // wider signed type is that type, as in torch.promote_types.
    if (a == kUInt8 || b == kUInt8) {
      const DType other = a == kUInt8 ? b : a;
      return other == kInt8 ? kInt16 : other;
    }
    return element_size(a) >= element_size(b) ? a : b;
  }
  if (fa && !fb) return a;
  if (fb && !fa) return b;
  if (a == kFloat64 || b == kFloat64) return kFloat64;
  return kFloat32;  // float32 with a half type, or float16 with bfloat16
}

}  // namespace tg
