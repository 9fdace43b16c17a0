// Internal: the CUDA gemm behind CudaBackend::gemm (cuBLAS for float32/float64,
// cuBLASLt for float16/bfloat16, float32 results of half operands and fused epilogues). Row-major GemmArgs are mapped
// onto the column-major libraries here; callers pass validated arguments.
#pragma once
#include <tapegrad/core/backend/backend.h>

namespace tg::cuda::detail {

void gemm(const tg::backend::GemmArgs& a);
// Whether gemm(a) fuses a.epilogue (cuBLASLt has a kernel for it); builds and caches the plan.
bool gemm_fuses(const tg::backend::GemmArgs& a);

}  // namespace tg::cuda::detail
