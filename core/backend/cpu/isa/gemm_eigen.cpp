// One single-threaded Eigen product, compiled once per instruction set: CMake builds this file
// with TG_ISA=base (the target's default flags), TG_ISA=avx2 (-mavx2 -mfma) and TG_ISA=avx512
// (-mavx512f/dq/bw/vl) and gemm.cpp chooses at run time (isa/gemm_isa.h).
//
// Eigen's templates would otherwise be emitted under the same names by every copy, and the
// linker would keep one of them for all three: `Eigen` is renamed per copy (the macro below,
// before Eigen's headers), so each copy's instantiations are its own. Nothing else from this file
// is shared beyond std's small inline helpers that Eigen calls.
#ifndef TG_ISA
#error "compile gemm_eigen.cpp through CMake (TG_ISA names the instruction set)"
#endif
#define TG_ISA_CAT2(a, b) a##_##b
#define TG_ISA_CAT(a, b) TG_ISA_CAT2(a, b)
#define Eigen TG_ISA_CAT(Eigen, TG_ISA)

#include <Eigen/Core>

#include <tapegrad/core/backend/cpu/isa/gemm_isa.h>

namespace tg::cpu::isa {

namespace {

template <typename S>
using RowMat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename S>
using ConstMap = Eigen::Map<const RowMat<S>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <typename S>
using MutMap = Eigen::Map<RowMat<S>, Eigen::Unaligned, Eigen::OuterStride<>>;

template <typename S>
void product(const GemmBlock& g, const S* a, const S* b, S* c) {
  MutMap<S> C(c, g.m, g.n, Eigen::OuterStride<>(g.ldc));
  if (g.k == 0) {
    C.setZero();
    return;
  }
  ConstMap<S> A(a, g.ta ? g.k : g.m, g.ta ? g.m : g.k, Eigen::OuterStride<>(g.lda));
  ConstMap<S> B(b, g.tb ? g.n : g.k, g.tb ? g.k : g.n, Eigen::OuterStride<>(g.ldb));
  if (!g.ta && !g.tb)
    C.noalias() = A * B;
  else if (!g.ta)
    C.noalias() = A * B.transpose();
  else if (!g.tb)
    C.noalias() = A.transpose() * B;
  else
    C.noalias() = A.transpose() * B.transpose();
}

}  // namespace

void TG_ISA_CAT(gemm_f32, TG_ISA)(const GemmBlock& g, const float* a, const float* b, float* c) {
  product<float>(g, a, b, c);
}
void TG_ISA_CAT(gemm_f64, TG_ISA)(const GemmBlock& g, const double* a, const double* b, double* c) {
  product<double>(g, a, b, c);
}

}  // namespace tg::cpu::isa
