// The CPU matrix-product kernels built once per instruction set (isa/gemm_eigen.cpp, compiled
// with the baseline flags, with AVX2 + FMA and with AVX-512), and the run-time choice among them
// (gemm.cpp). Eigen picks its vector width when it is compiled, so one library runs the widest
// kernel the CPU has only by carrying several copies: the default build (x86-64's SSE2) alone
// runs a 3x3 convolution's product at a third of what AVX-512 gives (benchmarks/NOTES.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tg::cpu::isa {

// One single-threaded product C = op(A) @ op(B), row-major with leading dimensions (the
// caller splits rows or columns across threads).
struct GemmBlock {
  int64_t m, n, k;
  bool ta, tb;
  int64_t lda, ldb, ldc;
};

using GemmF32 = void (*)(const GemmBlock&, const float*, const float*, float*);
using GemmF64 = void (*)(const GemmBlock&, const double*, const double*, double*);

struct GemmKernels {
  const char* name;  // "base", "avx2", "avx512"
  GemmF32 f32;
  GemmF64 f64;
};

// The kernels in use: the widest the CPU supports, or TG_CPU_ISA (base / avx2 / avx512) when
// set (an unsupported or unknown value is a tg::Error at the first product).
const GemmKernels& gemm_kernels();
// The instruction sets this build carries that this CPU runs, narrowest first.
std::vector<std::string> available_gemm_isas();
// Switches the kernels (tests and benchmarks); tg::Error naming the choices for one this CPU or
// build lacks. Not meant to race with products running on other threads.
void set_gemm_isa(std::string_view name);

// Each ISA's entry points (defined in isa/gemm_eigen.cpp; the avx2 / avx512 ones exist only where
// the build has TG_CPU_ISA_AVX2 / TG_CPU_ISA_AVX512).
void gemm_f32_base(const GemmBlock&, const float*, const float*, float*);
void gemm_f64_base(const GemmBlock&, const double*, const double*, double*);
void gemm_f32_avx2(const GemmBlock&, const float*, const float*, float*);
void gemm_f64_avx2(const GemmBlock&, const double*, const double*, double*);
void gemm_f32_avx512(const GemmBlock&, const float*, const float*, float*);
void gemm_f64_avx512(const GemmBlock&, const double*, const double*, double*);

}  // namespace tg::cpu::isa
