// Device functors of the elementwise ops (over opmath values) and the entry points
// of the per-family translation units (split so they compile in parallel).
#pragma once
#include <cmath>

#include <tapegrad/core/backend/cuda/loops.cuh>

namespace tg::cuda::kern {

// Accurate math (not the __expf-style intrinsics) so results agree with the CPU backend.
__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return ::exp(x); }
__device__ __forceinline__ float m_log(float x) { return logf(x); }
__device__ __forceinline__ double m_log(double x) { return ::log(x); }
__device__ __forceinline__ float m_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double m_sqrt(double x) { return ::sqrt(x); }
__device__ __forceinline__ float m_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double m_tanh(double x) { return ::tanh(x); }
__device__ __forceinline__ float m_erf(float x) { return erff(x); }
__device__ __forceinline__ double m_erf(double x) { return ::erf(x); }
__device__ __forceinline__ float m_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double m_pow(double x, double y) { return ::pow(x, y); }
template <class T>
__device__ __forceinline__ bool m_isnan(T x) {
  if constexpr (std::is_floating_point_v<T>) return x != x;
  else return false;
}

// x ^ p with the exactly rounded forms of the common exponents.
template <class T>
__device__ __forceinline__ T pow_scalar(T x, T p) {
  if (p == T(2)) return x * x;
  if (p == T(1)) return x;
  if (p == T(0.5)) return m_sqrt(x);
  if (p == T(0)) return T(1);
  return m_pow(x, p);
}

// ---- unary (T -> T)
template <class T> struct NegF { __device__ T operator()(T a) const { return -a; } };
template <class T> struct ExpF { __device__ T operator()(T a) const { return m_exp(a); } };
template <class T> struct LogF { __device__ T operator()(T a) const { return m_log(a); } };
template <class T> struct SqrtF { __device__ T operator()(T a) const { return m_sqrt(a); } };
template <class T> struct AbsF {
  __device__ T operator()(T a) const {
    if constexpr (std::is_floating_point_v<T>) return ::fabs(a);
    else return a < T(0) ? -a : a;
  }
};
template <class T> struct ReluF { __device__ T operator()(T a) const { return a < T(0) ? T(0) : a; } };  // NaN stays
template <class T> struct SigmoidF { __device__ T operator()(T a) const { return T(1) / (T(1) + m_exp(-a)); } };
template <class T> struct TanhF { __device__ T operator()(T a) const { return m_tanh(a); } };
template <class T> struct GeluF {
  __device__ T operator()(T a) const { return T(0.5) * a * (T(1) + m_erf(a * T(0.70710678118654752440))); }
};
template <class T> struct PowScalarF {
  T p;
  __device__ T operator()(T a) const { return pow_scalar(a, p); }
};
template <class T> struct ClampF {
  T lo, hi;
  __device__ T operator()(T a) const { return a < lo ? lo : (a > hi ? hi : a); }  // NaN stays
};
template <class T> struct AddScalarF { T p; __device__ T operator()(T a) const { return a + p; } };
template <class T> struct RSubScalarF { T p; __device__ T operator()(T a) const { return p - a; } };
template <class T> struct MulScalarF { T p; __device__ T operator()(T a) const { return a * p; } };
template <class T> struct DivScalarF { T p; __device__ T operator()(T a) const { return a / p; } };
template <class T> struct RDivScalarF { T p; __device__ T operator()(T a) const { return p / a; } };

// ---- comparisons (-> bool)
template <class T> struct EqScalarF { T p; __device__ bool operator()(T a) const { return a == p; } };
template <class T> struct NeScalarF { T p; __device__ bool operator()(T a) const { return a != p; } };
template <class T> struct LtScalarF { T p; __device__ bool operator()(T a) const { return a < p; } };
template <class T> struct LeScalarF { T p; __device__ bool operator()(T a) const { return a <= p; } };
template <class T> struct GtScalarF { T p; __device__ bool operator()(T a) const { return a > p; } };
template <class T> struct GeScalarF { T p; __device__ bool operator()(T a) const { return a >= p; } };
template <class T> struct EqF { __device__ bool operator()(T a, T b) const { return a == b; } };
template <class T> struct NeF { __device__ bool operator()(T a, T b) const { return a != b; } };
template <class T> struct LtF { __device__ bool operator()(T a, T b) const { return a < b; } };
template <class T> struct LeF { __device__ bool operator()(T a, T b) const { return a <= b; } };
template <class T> struct GtF { __device__ bool operator()(T a, T b) const { return a > b; } };
template <class T> struct GeF { __device__ bool operator()(T a, T b) const { return a >= b; } };

// ---- binary (T, T -> T)
template <class T> struct AddF { T alpha; __device__ T operator()(T a, T b) const { return a + alpha * b; } };
template <class T> struct SubF { T alpha; __device__ T operator()(T a, T b) const { return a - alpha * b; } };
template <class T> struct MulF { __device__ T operator()(T a, T b) const { return a * b; } };
template <class T> struct DivF { __device__ T operator()(T a, T b) const { return a / b; } };
template <class T> struct PowF { __device__ T operator()(T a, T b) const { return m_pow(a, b); } };
template <class T> struct MaximumF {  // NaN propagates
  __device__ T operator()(T a, T b) const { return m_isnan(a) ? a : (m_isnan(b) ? b : (a > b ? a : b)); }
};
template <class T> struct MinimumF {
  __device__ T operator()(T a, T b) const { return m_isnan(a) ? a : (m_isnan(b) ? b : (a < b ? a : b)); }
};

// ---- fused backward helpers: (grad, saved) -> grad_in
template <class T> struct ReluBackwardF { __device__ T operator()(T g, T x) const { return x > T(0) ? g : T(0); } };
template <class T> struct GeluBackwardF {
  __device__ T operator()(T g, T x) const {
    T cdf = T(0.5) * (T(1) + m_erf(x * T(0.70710678118654752440)));
    T pdf = m_exp(T(-0.5) * x * x) * T(0.39894228040143267794);  // 1 / sqrt(2 pi)
    return g * (cdf + x * pdf);
  }
};
template <class T> struct SigmoidBackwardF { __device__ T operator()(T g, T y) const { return g * y * (T(1) - y); } };
template <class T> struct TanhBackwardF { __device__ T operator()(T g, T y) const { return g * (T(1) - y * y); } };
template <class T> struct ClampBackwardF {
  T lo, hi;
  __device__ T operator()(T g, T x) const { return (lo <= x && x <= hi) ? g : T(0); }
};
template <class T> struct AbsBackwardF {
  __device__ T operator()(T g, T x) const { return x > T(0) ? g : (x < T(0) ? -g : T(0)); }
};
template <class T> struct PowScalarBackwardF {
  T p;
  __device__ T operator()(T g, T x) const { return p == T(0) ? T(0) : g * p * pow_scalar(x, p - T(1)); }
};
template <class T> struct SqrtBackwardF { __device__ T operator()(T g, T y) const { return g / (y * T(2)); } };

// ---- issue 15: general ops (unary math, activations and their backward helpers)
__device__ __forceinline__ float m_sin(float x) { return sinf(x); }
__device__ __forceinline__ double m_sin(double x) { return ::sin(x); }
__device__ __forceinline__ float m_cos(float x) { return cosf(x); }
__device__ __forceinline__ double m_cos(double x) { return ::cos(x); }
__device__ __forceinline__ float m_log1p(float x) { return log1pf(x); }
__device__ __forceinline__ double m_log1p(double x) { return ::log1p(x); }
__device__ __forceinline__ float m_expm1(float x) { return expm1f(x); }
__device__ __forceinline__ double m_expm1(double x) { return ::expm1(x); }
template <class T> struct SinF { __device__ T operator()(T a) const { return m_sin(a); } };
template <class T> struct CosF { __device__ T operator()(T a) const { return m_cos(a); } };
template <class T> struct RsqrtF { __device__ T operator()(T a) const { return T(1) / m_sqrt(a); } };
template <class T> struct SiluF { __device__ T operator()(T a) const { return a / (T(1) + m_exp(-a)); } };
// GELU's tanh form and its derivative. Half = the tensors are float16 / bfloat16 (computed in
// float): then as 0.5 x (1 + tanh u) = x sigma(2u) = x / (1 + e^-2u), with the derivative
// sigma(2u) + 2 x sigma(2u) (1 - sigma(2u)) u', on the hardware exp2 and reciprocal (__expf,
// __fdividef: about 1e-5 relative, far below the storage's rounding; no cancellation, 1 + tanh u for
// u << 0 being a small quotient): no branch, so the kernel runs at bandwidth where tanhf's
// accurate two-range evaluation made it compute-bound (GPT-2's [32768, 3072] bf16: 130 us, 3.1
// TB/s). float / double tensors keep tanhf (the CPU's values).
template <class T, bool Half = false> struct GeluTanhF {
  __device__ T operator()(T a) const {
    return T(0.5) * a * (T(1) + m_tanh(T(0.79788456080286535588) * (a + T(0.044715) * a * a * a)));
  }
};
template <> struct GeluTanhF<float, true> {
  __device__ float operator()(float a) const {
    const float u = 0.79788456080286535588f * (a + 0.044715f * a * a * a);
    return __fdividef(a, 1.f + __expf(-2.f * u));  // e^-2u = inf: a * 0 = -0, as 0.5 a (1 + tanh u)
  }
};
template <class T> struct SoftplusF {
  T beta, threshold;
  __device__ T operator()(T a) const {
    const T bx = beta * a;
    return bx > threshold ? a : m_log1p(m_exp(bx)) / beta;
  }
};
template <class T> struct LeakyReluF {
  T slope;
  __device__ T operator()(T a) const { return a > T(0) ? a : a * slope; }
};
template <class T> struct EluF {
  T alpha;
  __device__ T operator()(T a) const { return a > T(0) ? a : alpha * m_expm1(a); }
};
template <class T> struct RsqrtBackwardF {
  __device__ T operator()(T g, T y) const { return T(-0.5) * g * y * y * y; }
};
template <class T> struct SiluBackwardF {
  __device__ T operator()(T g, T x) const {
    const T s = T(1) / (T(1) + m_exp(-x));
    return g * s * (T(1) + x * (T(1) - s));
  }
};
template <class T, bool Half = false> struct GeluTanhBackwardF {
  __device__ T operator()(T g, T x) const {
    const T kBeta = T(0.79788456080286535588), kKappa = T(0.044715);
    const T th = m_tanh(kBeta * (x + kKappa * x * x * x));
    const T dinner = kBeta * (T(1) + T(3) * kKappa * x * x);
    return g * (T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * dinner);
  }
};
template <> struct GeluTanhBackwardF<float, true> {
  __device__ float operator()(float g, float x) const {
    const float u = 0.79788456080286535588f * (x + 0.044715f * x * x * x);
    const float du = 0.79788456080286535588f * (1.f + 3.f * 0.044715f * x * x);
    // u < -40: sigma(2u) < 2e-35, the derivative 0 as the tanh form gives it (1 + tanh u == 0);
    // clamped so that e and e * s stay finite for the others.
    const float e = __expf(-2.f * fmaxf(u, -40.f));
    const float s = __fdividef(1.f, 1.f + e);  // sigma(2u); 1 - sigma(2u) = e s
    return u < -40.f ? g * 0.f : g * (s * (1.f + 2.f * x * (e * s) * du));
  }
};
template <class T> struct SoftplusBackwardF {
  T beta, threshold;
  __device__ T operator()(T g, T x) const {
    const T bx = beta * x;
    return bx > threshold ? g : g / (T(1) + m_exp(-bx));
  }
};
template <class T> struct LeakyReluBackwardF {
  T slope;
  __device__ T operator()(T g, T x) const { return x > T(0) ? g : g * slope; }
};
template <class T> struct EluBackwardF {
  T alpha;
  __device__ T operator()(T g, T x) const { return x > T(0) ? g : g * alpha * m_exp(x); }
};

// ---- ternary / nullary / copy
template <class T> struct WhereF { __device__ T operator()(bool c, T a, T b) const { return c ? a : b; } };
template <class T> struct FillF { T v; __device__ T operator()() const { return v; } };
template <class T> struct IdentityF { __device__ T operator()(T a) const { return a; } };

// Entry points, one per translation unit; each returns false when op is not its family.
bool elementwise_unary(backend::ElemOp op, const ElementwiseIter& it);
bool elementwise_binary(backend::ElemOp op, const ElementwiseIter& it);
bool elementwise_compare(backend::ElemOp op, const ElementwiseIter& it);
bool elementwise_copy(backend::ElemOp op, const ElementwiseIter& it);

}  // namespace tg::cuda::kern
