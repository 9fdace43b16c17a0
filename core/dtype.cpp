// Type promotion between tensor dtypes, following torch.promote_types.
#include <tapegrad/core/dtype.h>

namespace tg {

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (a == kBool) return b;
  if (b == kBool) return a;
  bool fa = is_floating(a), fb = is_floating(b);
  if (!fa && !fb) return kInt64;  // int32 with int64
  if (fa && !fb) return a;
  if (fb && !fa) return b;
  if (a == kFloat64 || b == kFloat64) return kFloat64;
  return kFloat32;  // float32 with a half type, or float16 with bfloat16
}

}  // namespace tg
