// Internal: the CUDA gemm behind CudaBackend::gemm (cuBLAS for float32/float64,
// cuBLASLt for float16/bfloat16). Row-major GemmArgs are mapped onto the
// column-major libraries here; callers pass validated arguments.
#pragma once
#include "core/backend/backend.h"

namespace tg::cuda::detail {

void gemm(const tg::backend::GemmArgs& a);

}  // namespace tg::cuda::detail
