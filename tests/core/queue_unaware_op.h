// A test-only CUDA op written the way every op in core/backend/cuda is, with no knowledge of the
// launch queue (launch_queue.h): it takes its device guard and the stream handle first, runs
// elementwise steps of its own into a buffer whose pointer it took before them, then its own raw
// kernel and a cuBLAS gemm on that handle. It is exact only if the queue never defers the steps
// an op runs itself.
#pragma once
#include <tapegrad/core/tensor.h>

namespace tg::testing {

// out = ((x * 2 + 1) + 1) @ w for float32 CUDA x [m, k], w [k, n] (contiguous), out [m, n]:
// the "* 2 + 1" as tensor ops, the "+ 1" by a raw kernel, the product by cublasSgemm.
void queue_unaware_op(const Tensor& x, const Tensor& w, const Tensor& out);

}  // namespace tg::testing
