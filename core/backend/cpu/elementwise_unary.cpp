// CPU kernels for Fill and the one-input elementwise ops (math, scalar
// arithmetic, scalar comparisons). Half / bfloat16 compute in float.
#include <cmath>

#include <tapegrad/core/backend/cpu/dispatch.h>

namespace tg::cpu {

using backend::ElementwiseIter;
using backend::ElemOp;

namespace {

template <typename T, typename Cmp>
void compare_scalar(const ElementwiseIter& it, Cmp cmp) {
  using A = opmath_t<T>;
  const A p = compare_param<T>(it, 0);
  cpu_kernel<bool, T>(it, [p, cmp](T x) { return cmp(static_cast<A>(x), p); });
}

template <typename T, typename Out = T>
void pow_scalar(const ElementwiseIter& it) {
  using A = opmath_t<T>;
  const A p = param<T>(it, 0);
  // x * x is exactly pow(x, 2) and much cheaper; likewise pow(x, 1) == x.
  if (p == A(2)) {
    map1<T, Out>(it, [](A x) { return x * x; });
  } else if (p == A(1)) {
    map1<T, Out>(it, [](A x) { return x; });
  } else {
    map1<T, Out>(it, [p](A x) { return std::pow(x, p); });
  }
}

// The mixed form of autocast's float32 ops (backend::has_mixed_form): a float16 / bfloat16 input
// read as is, float32 out, computed as the float32 op does.
void unary_widening(ElemOp op, const ElementwiseIter& it) {
  dispatch_reduced(op, it, 1, [&](auto tag) {
    using R = decltype(tag);
    switch (op) {
      case ElemOp::Exp:
        return map1<R, float>(it, [](float x) { return std::exp(x); });
      case ElemOp::Log:
        return map1<R, float>(it, [](float x) { return std::log(x); });
      case ElemOp::Sqrt:
        return map1<R, float>(it, [](float x) { return std::sqrt(x); });
      case ElemOp::PowScalar:
        return pow_scalar<R, float>(it);
      default:
        TG_ERROR(op_name(op), ": no cpu kernel from ", dtype_name(it.dtypes[1]), " to float32");
    }
  });
}

}  // namespace

void unary_kernel(ElemOp op, const ElementwiseIter& it) {
  const DType t = it.dtypes[0];
  if (it.noperands == 2 && it.dtypes[1] != t &&
      (op == ElemOp::Exp || op == ElemOp::Log || op == ElemOp::Sqrt || op == ElemOp::PowScalar))
    return unary_widening(op, it);
  switch (op) {
    case ElemOp::Fill:
      return dispatch<Kinds::All>(op, t, [&](auto tag) {
        using T = decltype(tag);
        T v;
        if constexpr (std::is_same_v<T, bool>) {
          v = it.iparams[0] != 0 || it.dparams[0] != 0;
        } else {
          v = static_cast<T>(param<T>(it, 0));
        }
        cpu_kernel<T>(it, [v]() { return v; });
      });
    case ElemOp::Neg:
      return dispatch<Kinds::Numeric>(op, t, [&](auto tag) {
        using T = decltype(tag);
        map1<T>(it, [](auto x) { return -x; });
      });
    case ElemOp::Exp:
      return dispatch<Kinds::Float>(op, t,
                                    [&](auto tag) { map1<decltype(tag)>(it, [](auto x) { return std::exp(x); }); });
    case ElemOp::Log:
      return dispatch<Kinds::Float>(op, t,
                                    [&](auto tag) { map1<decltype(tag)>(it, [](auto x) { return std::log(x); }); });
    case ElemOp::Sqrt:
      return dispatch<Kinds::Float>(op, t,
                                    [&](auto tag) { map1<decltype(tag)>(it, [](auto x) { return std::sqrt(x); }); });
    case ElemOp::Abs:
      return dispatch<Kinds::Numeric>(op, t, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (kIsFloat<T>) {
          map1<T>(it, [](auto x) { return std::abs(x); });
        } else {
          map1<T>(it, [](auto x) { return x < 0 ? -x : x; });
        }
      });
    case ElemOp::Relu:
      return dispatch<Kinds::Numeric>(op, t, [&](auto tag) {
        using T = decltype(tag);
        using A = opmath_t<T>;
        map1<T>(it, [](A x) { return x > A(0) ? x : (x == x ? A(0) : x); });  // NaN stays NaN
      });
    case ElemOp::Sigmoid:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) {
        using A = opmath_t<decltype(tag)>;
        map1<decltype(tag)>(it, [](A x) { return A(1) / (A(1) + std::exp(-x)); });
      });
    case ElemOp::Tanh:
      return dispatch<Kinds::Float>(op, t,
                                    [&](auto tag) { map1<decltype(tag)>(it, [](auto x) { return std::tanh(x); }); });
    case ElemOp::Gelu:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) {
        using A = opmath_t<decltype(tag)>;
        map1<decltype(tag)>(it, [](A x) { return x * A(0.5) * (A(1) + std::erf(x * A(M_SQRT1_2))); });
      });
    case ElemOp::PowScalar:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) { pow_scalar<decltype(tag)>(it); });
    case ElemOp::Clamp:
      return dispatch<Kinds::Numeric>(op, t, [&](auto tag) {
        using T = decltype(tag);
        using A = opmath_t<T>;
        const A lo = param<T>(it, 0), hi = param<T>(it, 1);
        // NaN passes through; lo > hi gives hi, as torch.clamp.
        map1<T>(it, [lo, hi](A x) {
          A y = x < lo ? lo : x;
          return y > hi ? hi : y;
        });
      });
    case ElemOp::AddScalar:
      return dispatch<Kinds::Numeric>(op, t, [&](auto tag) {
        using T = decltype(tag);
        const auto p = param<T>(it, 0);
        map1<T>(it, [p](auto x) { return x + p; });
      });
    case ElemOp::RSubScalar:
      return dispatch<Kinds::Numeric>(op, t, [&](auto tag) {
        using T = decltype(tag);
        const auto p = param<T>(it, 0);
        map1<T>(it, [p](auto x) { return p - x; });
      });
    case ElemOp::MulScalar:
      return dispatch<Kinds::Numeric>(op, t, [&](auto tag) {
        using T = decltype(tag);
        const auto p = param<T>(it, 0);
        map1<T>(it, [p](auto x) { return x * p; });
      });
    case ElemOp::DivScalar:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) {
        using T = decltype(tag);
        const auto p = param<T>(it, 0);
        map1<T>(it, [p](auto x) { return x / p; });
      });
    case ElemOp::RDivScalar:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) {
        using T = decltype(tag);
        const auto p = param<T>(it, 0);
        map1<T>(it, [p](auto x) { return p / x; });
      });
    case ElemOp::EqScalar:
      return dispatch<Kinds::All>(op, it.dtypes[1], [&](auto tag) {
        compare_scalar<decltype(tag)>(it, [](auto a, auto b) { return a == b; });
      });
    case ElemOp::NeScalar:
      return dispatch<Kinds::All>(op, it.dtypes[1], [&](auto tag) {
        compare_scalar<decltype(tag)>(it, [](auto a, auto b) { return a != b; });
      });
    case ElemOp::LtScalar:
      return dispatch<Kinds::All>(
          op, it.dtypes[1], [&](auto tag) { compare_scalar<decltype(tag)>(it, [](auto a, auto b) { return a < b; }); });
    case ElemOp::LeScalar:
      return dispatch<Kinds::All>(op, it.dtypes[1], [&](auto tag) {
        compare_scalar<decltype(tag)>(it, [](auto a, auto b) { return a <= b; });
      });
    case ElemOp::GtScalar:
      return dispatch<Kinds::All>(
          op, it.dtypes[1], [&](auto tag) { compare_scalar<decltype(tag)>(it, [](auto a, auto b) { return a > b; }); });
    case ElemOp::GeScalar:
      return dispatch<Kinds::All>(op, it.dtypes[1], [&](auto tag) {
        compare_scalar<decltype(tag)>(it, [](auto a, auto b) { return a >= b; });
      });
    // ---- issue 15: general ops
    case ElemOp::Sin:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) {
        using A = opmath_t<decltype(tag)>;
        map1<decltype(tag)>(it, [](A x) { return std::sin(x); });
      });
    case ElemOp::Cos:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) {
        using A = opmath_t<decltype(tag)>;
        map1<decltype(tag)>(it, [](A x) { return std::cos(x); });
      });
    case ElemOp::Rsqrt:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) {
        using A = opmath_t<decltype(tag)>;
        map1<decltype(tag)>(it, [](A x) { return A(1) / std::sqrt(x); });
      });
    case ElemOp::Silu:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) {
        using A = opmath_t<decltype(tag)>;
        map1<decltype(tag)>(it, [](A x) { return x / (A(1) + std::exp(-x)); });
      });
    case ElemOp::GeluTanh:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) {
        using A = opmath_t<decltype(tag)>;
        map1<decltype(tag)>(it, [](A x) {
          const A kBeta = A(0.7978845608028654);  // sqrt(2 / pi)
          return A(0.5) * x * (A(1) + std::tanh(kBeta * (x + A(0.044715) * x * x * x)));
        });
      });
    case ElemOp::Softplus:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) {
        using T = decltype(tag);
        using A = opmath_t<T>;
        const A beta = param<T>(it, 0), threshold = param<T>(it, 1);
        map1<T>(it, [beta, threshold](A x) {
          const A bx = beta * x;
          return bx > threshold ? x : std::log1p(std::exp(bx)) / beta;
        });
      });
    case ElemOp::LeakyRelu:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) {
        using T = decltype(tag);
        using A = opmath_t<T>;
        const A slope = param<T>(it, 0);
        map1<T>(it, [slope](A x) { return x > A(0) ? x : x * slope; });
      });
    case ElemOp::Elu:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) {
        using T = decltype(tag);
        using A = opmath_t<T>;
        const A alpha = param<T>(it, 0);
        map1<T>(it, [alpha](A x) { return x > A(0) ? x : alpha * std::expm1(x); });
      });
    default:
      TG_ERROR("cpu unary_kernel: ", op_name(op), " is not a one-input op");
  }
}

}  // namespace tg::cpu
