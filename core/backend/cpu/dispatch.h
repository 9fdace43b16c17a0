// dtype dispatch for the CPU elementwise kernels: runs a generic lambda with the
// storage type of a runtime dtype, limited at compile time to the dtypes an op
// supports, and throws a tg::Error naming the op and dtype for the rest.
#pragma once
#include <utility>

#include <tapegrad/core/backend/backend.h>
#include <tapegrad/core/backend/cpu/cpu.h>
#include <tapegrad/core/backend/cpu/loops.h>
#include <tapegrad/core/error.h>

namespace tg::cpu {

enum class Kinds { Float, Numeric, All };  // float types; + uint8/int8/int16/int32/int64; + bool

template <Kinds K, typename F>
void dispatch(const char* name, DType t, F&& f) {
  // NOLINTBEGIN(bugprone-branch-clone): the branches call f with different types
  switch (t) {
    case DType::Float32:
      return f(float{});
    case DType::Float16:
      return f(Half{});
    case DType::BFloat16:
      return f(BFloat16{});
    case DType::Float64:
      return f(double{});
    case DType::Int64:
      if constexpr (K != Kinds::Float) return f(int64_t{});
      break;
    case DType::Int32:
      if constexpr (K != Kinds::Float) return f(int32_t{});
      break;
    case DType::Bool:
      if constexpr (K == Kinds::All) return f(bool{});
      break;
    case DType::UInt8:
      if constexpr (K != Kinds::Float) return f(uint8_t{});
      break;
    case DType::Int8:
      if constexpr (K != Kinds::Float) return f(int8_t{});
      break;
    case DType::Int16:
      if constexpr (K != Kinds::Float) return f(int16_t{});
      break;
  }
  // NOLINTEND(bugprone-branch-clone)
  TG_ERROR(name, ": dtype ", dtype_name(t), " is not supported on cpu",
           K == Kinds::Float ? " (floating types only)" : "");
}

template <Kinds K, typename F>
void dispatch(backend::ElemOp op, DType t, F&& f) {
  dispatch<K>(op_name(op), t, std::forward<F>(f));
}

// Scalar parameter i in the op's compute type: dparams for floating types, iparams otherwise.
template <typename T>
opmath_t<T> param(const backend::ElementwiseIter& it, int i) {
  if constexpr (kIsFloat<T>) {
    return static_cast<opmath_t<T>>(it.dparams[i]);
  } else {
    return static_cast<opmath_t<T>>(it.iparams[i]);
  }
}

// Scalar for a comparison: rounded to T first, as PyTorch compares in the tensor's dtype.
template <typename T>
opmath_t<T> compare_param(const backend::ElementwiseIter& it, int i) {
  if constexpr (kIsFloat<T>) {
    return static_cast<opmath_t<T>>(static_cast<T>(static_cast<opmath_t<T>>(it.dparams[i])));
  } else {
    return static_cast<opmath_t<T>>(it.iparams[i]);
  }
}

// out = f(opmath(x)) stored back as T; in a mixed form (backend::has_mixed_form) stored as Out,
// float32 out of a float16 / bfloat16 x.
template <typename T, typename Out = T, typename F>
void map1(const backend::ElementwiseIter& it, const F& f) {
  using A = opmath_t<T>;
  cpu_kernel<Out, T>(it, [f](T x) { return static_cast<Out>(f(static_cast<A>(x))); });
}

// out = f(opmath(a), opmath(b)) stored back as T; in a mixed form the inputs are stored as
// In0 / In1 (float32 beside a float16 / bfloat16 T, whose opmath is float too).
template <typename T, typename In0 = T, typename In1 = T, typename F>
void map2(const backend::ElementwiseIter& it, const F& f) {
  using A = opmath_t<T>;
  cpu_kernel<T, In0, In1>(it, [f](In0 a, In1 b) { return static_cast<T>(f(static_cast<A>(a), static_cast<A>(b))); });
}

// Runs fn(R{}) for the float16 / bfloat16 operand type R of a mixed form whose operand `i` is R.
template <typename F>
void dispatch_reduced(backend::ElemOp op, const backend::ElementwiseIter& it, int i, F&& fn) {
  if (it.dtypes[i] == DType::Float16) return fn(Half{});
  if (it.dtypes[i] == DType::BFloat16) return fn(BFloat16{});
  TG_ERROR(op_name(op), ": no cpu kernel for the dtypes ", dtype_name(it.dtypes[0]), ", ", dtype_name(it.dtypes[1]),
           it.noperands > 2 ? ", " : "", it.noperands > 2 ? dtype_name(it.dtypes[2]) : "");
}

}  // namespace tg::cpu
