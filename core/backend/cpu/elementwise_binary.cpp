// CPU kernels for the two- and three-input elementwise ops: arithmetic,
// comparisons, the fused backward helpers and where.
#include <cmath>

#include <tapegrad/core/backend/cpu/dispatch.h>

namespace tg::cpu {

using backend::ElementwiseIter;
using backend::ElemOp;

namespace {

template <typename T, typename Cmp>
void compare(const ElementwiseIter& it, Cmp cmp) {
  using A = opmath_t<T>;
  cpu_kernel<bool, T, T>(it, [cmp](T a, T b) { return cmp(static_cast<A>(a), static_cast<A>(b)); });
}

// a + alpha * b (sign = -1 for Sub); alpha == 1 skips the multiply.
template <typename T>
void add_sub(const ElementwiseIter& it, int sign) {
  using A = opmath_t<T>;
  const A alpha = param<T>(it, 0);
  if (alpha == A(1)) {
    if (sign > 0) {
      map2<T>(it, [](A a, A b) { return a + b; });
    } else {
      map2<T>(it, [](A a, A b) { return a - b; });
    }
  } else {
    const A s = sign > 0 ? alpha : A(-alpha);
    map2<T>(it, [s](A a, A b) { return a + s * b; });
  }
}

template <typename T, typename In0 = T, typename In1 = T>
void pow_scalar_backward(const ElementwiseIter& it) {
  using A = opmath_t<T>;
  const A p = param<T>(it, 0);
  if (p == A(0)) {
    map2<T, In0, In1>(it, [](A, A) { return A(0); });
  } else if (p == A(2)) {
    map2<T, In0, In1>(it, [](A g, A x) { return g * A(2) * x; });
  } else {
    map2<T, In0, In1>(it, [p](A g, A x) { return g * p * std::pow(x, p - A(1)); });
  }
}

// The mixed forms of the gradients of autocast's float32 ops (backend::has_mixed_form): out
// float16 / bfloat16 R, the gradient float32, the saved tensor float32 or R; computed in float as
// the float32 op does, rounded once by the store.
void binary_narrowing(ElemOp op, const ElementwiseIter& it) {
  dispatch_reduced(op, it, 0, [&](auto tag) {
    using R = decltype(tag);
    const bool saved_float = it.dtypes[2] == DType::Float32;
    switch (op) {
      case ElemOp::Mul:
        if (saved_float) return map2<R, float, float>(it, [](float a, float b) { return a * b; });
        break;
      case ElemOp::SqrtBackward:
        if (saved_float) return map2<R, float, float>(it, [](float g, float y) { return g / (y * 2.0f); });
        break;
      case ElemOp::Div:
        if (!saved_float) return map2<R, float, R>(it, [](float a, float b) { return a / b; });
        break;
      case ElemOp::PowScalarBackward:
        if (!saved_float) return pow_scalar_backward<R, float, R>(it);
        break;
      default:
        break;
    }
    TG_ERROR(op_name(op), ": no cpu kernel for the dtypes ", dtype_name(it.dtypes[0]), ", ", dtype_name(it.dtypes[1]),
             ", ", dtype_name(it.dtypes[2]));
  });
}

// The widening mixed forms (backend::has_mixed_form): float32 = a +- alpha * b with one of a, b
// float16 / bfloat16, read as it is.
void binary_widening(ElemOp op, const ElementwiseIter& it) {
  const float s = param<float>(it, 0) * (op == ElemOp::Sub ? -1.0f : 1.0f);
  const bool half_b = it.dtypes[1] == DType::Float32;
  dispatch_reduced(op, it, half_b ? 2 : 1, [&](auto tag) {
    using R = decltype(tag);
    if (half_b) return map2<float, float, R>(it, [s](float a, float b) { return a + s * b; });
    return map2<float, R, float>(it, [s](float a, float b) { return a + s * b; });
  });
}

}  // namespace

void binary_kernel(ElemOp op, const ElementwiseIter& it) {
  const DType t = it.dtypes[0];
  if (it.noperands == 3 && (it.dtypes[1] != t || it.dtypes[2] != t) && (op == ElemOp::Add || op == ElemOp::Sub))
    return binary_widening(op, it);
  if (it.noperands == 3 && it.dtypes[1] != t &&
      (op == ElemOp::Mul || op == ElemOp::Div || op == ElemOp::PowScalarBackward || op == ElemOp::SqrtBackward))
    return binary_narrowing(op, it);
  switch (op) {
    case ElemOp::Add:
      return dispatch<Kinds::Numeric>(op, t, [&](auto tag) { add_sub<decltype(tag)>(it, 1); });
    case ElemOp::Sub:
      return dispatch<Kinds::Numeric>(op, t, [&](auto tag) { add_sub<decltype(tag)>(it, -1); });
    case ElemOp::Mul:
      return dispatch<Kinds::Numeric>(op, t,
                                      [&](auto tag) { map2<decltype(tag)>(it, [](auto a, auto b) { return a * b; }); });
    case ElemOp::Div:
      return dispatch<Kinds::Float>(op, t,
                                    [&](auto tag) { map2<decltype(tag)>(it, [](auto a, auto b) { return a / b; }); });
    case ElemOp::Pow:
      return dispatch<Kinds::Float>(
          op, t, [&](auto tag) { map2<decltype(tag)>(it, [](auto a, auto b) { return std::pow(a, b); }); });
    case ElemOp::Maximum:  // NaN in either input gives NaN
      return dispatch<Kinds::Numeric>(
          op, t, [&](auto tag) { map2<decltype(tag)>(it, [](auto a, auto b) { return (a != a || a > b) ? a : b; }); });
    case ElemOp::Minimum:
      return dispatch<Kinds::Numeric>(
          op, t, [&](auto tag) { map2<decltype(tag)>(it, [](auto a, auto b) { return (a != a || a < b) ? a : b; }); });
    case ElemOp::Eq:
      return dispatch<Kinds::All>(op, it.dtypes[1],
                                  [&](auto tag) { compare<decltype(tag)>(it, [](auto a, auto b) { return a == b; }); });
    case ElemOp::Ne:
      return dispatch<Kinds::All>(op, it.dtypes[1],
                                  [&](auto tag) { compare<decltype(tag)>(it, [](auto a, auto b) { return a != b; }); });
    case ElemOp::Lt:
      return dispatch<Kinds::All>(op, it.dtypes[1],
                                  [&](auto tag) { compare<decltype(tag)>(it, [](auto a, auto b) { return a < b; }); });
    case ElemOp::Le:
      return dispatch<Kinds::All>(op, it.dtypes[1],
                                  [&](auto tag) { compare<decltype(tag)>(it, [](auto a, auto b) { return a <= b; }); });
    case ElemOp::Gt:
      return dispatch<Kinds::All>(op, it.dtypes[1],
                                  [&](auto tag) { compare<decltype(tag)>(it, [](auto a, auto b) { return a > b; }); });
    case ElemOp::Ge:
      return dispatch<Kinds::All>(op, it.dtypes[1],
                                  [&](auto tag) { compare<decltype(tag)>(it, [](auto a, auto b) { return a >= b; }); });

    // ---- fused backward helpers: operand 1 is the incoming gradient g, operand 2 the saved tensor
    case ElemOp::ReluBackward:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) {
        using A = opmath_t<decltype(tag)>;
        map2<decltype(tag)>(it, [](A g, A x) { return x > A(0) ? g : A(0); });
      });
    case ElemOp::GeluBackward:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) {
        using A = opmath_t<decltype(tag)>;
        map2<decltype(tag)>(it, [](A g, A x) {
          const A kInvSqrt2Pi = A(0.3989422804014327);  // 1 / sqrt(2 pi)
          A cdf = A(0.5) * (A(1) + std::erf(x * A(M_SQRT1_2)));
          A pdf = kInvSqrt2Pi * std::exp(A(-0.5) * x * x);
          return g * (cdf + x * pdf);
        });
      });
    case ElemOp::SigmoidBackward:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) {
        using A = opmath_t<decltype(tag)>;
        map2<decltype(tag)>(it, [](A g, A y) { return g * y * (A(1) - y); });
      });
    case ElemOp::TanhBackward:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) {
        using A = opmath_t<decltype(tag)>;
        map2<decltype(tag)>(it, [](A g, A y) { return g * (A(1) - y * y); });
      });
    case ElemOp::ClampBackward:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) {
        using T = decltype(tag);
        using A = opmath_t<T>;
        const A lo = param<T>(it, 0), hi = param<T>(it, 1);
        map2<T>(it, [lo, hi](A g, A x) { return (x >= lo && x <= hi) ? g : A(0); });
      });
    case ElemOp::AbsBackward:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) {
        using A = opmath_t<decltype(tag)>;
        map2<decltype(tag)>(it, [](A g, A x) { return x > A(0) ? g : (x < A(0) ? -g : A(0)); });
      });
    case ElemOp::PowScalarBackward:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) { pow_scalar_backward<decltype(tag)>(it); });
    case ElemOp::SqrtBackward:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) {
        using A = opmath_t<decltype(tag)>;
        map2<decltype(tag)>(it, [](A g, A y) { return g / (y * A(2)); });
      });
    // ---- issue 15: general ops, backward helpers (operand 1 the gradient, 2 the saved tensor)
    case ElemOp::RsqrtBackward:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) {
        using A = opmath_t<decltype(tag)>;
        map2<decltype(tag)>(it, [](A g, A y) { return A(-0.5) * g * y * y * y; });
      });
    case ElemOp::SiluBackward:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) {
        using A = opmath_t<decltype(tag)>;
        map2<decltype(tag)>(it, [](A g, A x) {
          const A s = A(1) / (A(1) + std::exp(-x));
          return g * s * (A(1) + x * (A(1) - s));
        });
      });
    case ElemOp::GeluTanhBackward:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) {
        using A = opmath_t<decltype(tag)>;
        map2<decltype(tag)>(it, [](A g, A x) {
          const A kBeta = A(0.7978845608028654), kKappa = A(0.044715);
          const A inner = kBeta * (x + kKappa * x * x * x);
          const A th = std::tanh(inner);
          const A dinner = kBeta * (A(1) + A(3) * kKappa * x * x);
          return g * (A(0.5) * (A(1) + th) + A(0.5) * x * (A(1) - th * th) * dinner);
        });
      });
    case ElemOp::SoftplusBackward:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) {
        using T = decltype(tag);
        using A = opmath_t<T>;
        const A beta = param<T>(it, 0), threshold = param<T>(it, 1);
        map2<T>(it, [beta, threshold](A g, A x) {
          const A bx = beta * x;
          return bx > threshold ? g : g / (A(1) + std::exp(-bx));
        });
      });
    case ElemOp::LeakyReluBackward:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) {
        using T = decltype(tag);
        using A = opmath_t<T>;
        const A slope = param<T>(it, 0);
        map2<T>(it, [slope](A g, A x) { return x > A(0) ? g : g * slope; });
      });
    case ElemOp::EluBackward:
      return dispatch<Kinds::Float>(op, t, [&](auto tag) {
        using T = decltype(tag);
        using A = opmath_t<T>;
        const A alpha = param<T>(it, 0);
        map2<T>(it, [alpha](A g, A x) { return x > A(0) ? g : g * alpha * std::exp(x); });
      });

    case ElemOp::Where:
      return dispatch<Kinds::All>(op, t, [&](auto tag) {
        using T = decltype(tag);
        cpu_kernel<T, bool, T, T>(it, [](bool c, T a, T b) { return c ? a : b; });
      });
    default:
      TG_ERROR("cpu binary_kernel: ", op_name(op), " is not a two- or three-input op");
  }
}

}  // namespace tg::cpu
