// Internal: the CUDA gemm behind CudaBackend::gemm (cuBLAS for float32/float64, cuBLASLt for
// float16/bfloat16, float32 results of half operands and fused epilogues; small_gemm.cu for
// float32 gemms of few output tiles). Row-major GemmArgs are mapped onto the column-major
// libraries here; callers pass validated arguments.
#pragma once
#include <tapegrad/core/backend/backend.h>

namespace tg::cuda::detail {

void gemm(const tg::backend::GemmArgs& a);
// Whether gemm(a) fuses a.epilogue (cuBLASLt has a kernel for it); builds and caches the plan.
bool gemm_fuses(const tg::backend::GemmArgs& a);

// Whether gemm(a) runs small_gemm.cu's split-K float32 kernel (float32 without TF32, batch 1,
// at most 2^19 outputs and 16 K steps of 16 a block; None / Bias / RowSumsA / ColSumsB
// epilogues) instead of cuBLAS.
// set_small_sgemm(false) sends those to cuBLAS too (tests and A/B benchmarks; default on).
bool small_sgemm_applies(const tg::backend::GemmArgs& a);
void set_small_sgemm(bool on);
bool small_sgemm_enabled();

// Backend::fuse_into_deferred_gemm (a linear's deferred float16 / bfloat16 gemm takes a GELU
// (tanh) of its result as cuBLASLt's GELU_AUX(_BIAS) epilogue). set_gemm_activation_fusion(false)
// stops deferring and fusing (tests and A/B benchmarks; default on); gemm_activation_fusions()
// counts the fusions made in this process.
Tensor fuse_into_deferred_gemm(backend::ElemOp op, const Tensor& a);
void set_gemm_activation_fusion(bool on);
int64_t gemm_activation_fusions();

// A deferrable float32 gemm that small_gemm.cu runs joins the small gemm(s) waiting last in the
// launch queue when it reads and writes nothing they write (and writes nothing they read): a
// linear's input and weight gradients run as one launch. set_gemm_grouping(false) (or
// TG_GEMM_GROUPING=0) turns that off (tests and A/B benchmarks; default on); gemm_groupings()
// counts the joins made in this process.
void set_gemm_grouping(bool on);
int64_t gemm_groupings();
// The rule of a join: whether y may run at the same time as x (both float32 gemms of
// small_gemm.cu's epilogues): y writes no byte x reads or writes, and reads no byte x writes,
// judged by the address ranges of A, B and C (leading dimensions, transposes) and of the
// epilogue's vector or matrix. Host only.
bool gemms_independent(const tg::backend::GemmArgs& x, const tg::backend::GemmArgs& y);

}  // namespace tg::cuda::detail
