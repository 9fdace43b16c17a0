// A user's own data/dataset.h (see core/tensor.h).
#pragma once
#include "core/tensor.h"
namespace user {
struct Dataset {
  Tensor shape{2, 3};
};
}  // namespace user
