// A user's own core/tensor.h: the consumer proves tapegrad's installed headers never pick it up
// (they include each other only as <tapegrad/...>).
#pragma once
namespace user {
struct Tensor {
  int rows = 0, cols = 0;
};
}  // namespace user
