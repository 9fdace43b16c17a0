// The CPU kernels of gradient clipping (issue 16): the total norm of a list of tensors, and the
// in-place scale / clamp of every tensor of a list. The front-end is core/native/clip_grad.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <tapegrad/core/backend/cpu/cpu.h>
#include <tapegrad/core/backend/cpu/dispatch.h>
#include <tapegrad/core/ops.h>

namespace tg::cpu {

namespace {

// Elements per partial: fixed, so the partials (and their sum) do not depend on the thread count.
constexpr int64_t kChunk = 1 << 16;

enum class NormKind { L1, L2, Inf, P };

NormKind norm_kind(double p) {
  if (std::isinf(p)) return NormKind::Inf;
  if (p == 1.0) return NormKind::L1;
  if (p == 2.0) return NormKind::L2;
  return NormKind::P;
}

// NaN-propagating max (std::max would drop a NaN in its second argument).
double nan_max(double a, double b) { return (std::isnan(a) || a > b) ? a : b; }

// One partial per kChunk elements of t, in float64.
template <class T>
void tensor_partials(const Tensor& t, NormKind kind, double p, std::vector<double>& out) {
  const T* x = static_cast<const T*>(t.data_ptr());
  const int64_t n = t.numel();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const size_t base = out.size();
  out.resize(base + static_cast<size_t>(chunks), 0.0);
  double* part = out.data() + base;
  tg::parallel_for(0, chunks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) {
      const int64_t b = c * kChunk, e = std::min(n, b + kChunk);
      double acc = 0.0;
      for (int64_t i = b; i < e; ++i) {
        const double a = std::abs(static_cast<double>(static_cast<opmath_t<T>>(x[i])));
        switch (kind) {
          case NormKind::L1: acc += a; break;
          case NormKind::L2: acc += a * a; break;
          case NormKind::Inf: acc = nan_max(acc, a); break;
          case NormKind::P: acc += std::pow(a, p); break;
        }
      }
      part[c] = acc;
    }
  });
}

}  // namespace

void total_norm(const std::vector<Tensor>& tensors, double norm_type, const Tensor& total, const Tensor& coef,
                double max_norm) {
  const NormKind kind = norm_kind(norm_type);
  std::vector<double> partials;
  for (const Tensor& t : tensors) {
    dispatch<Kinds::Float>("clip_grad_norm_", t.dtype(), [&](auto tag) {
      tensor_partials<decltype(tag)>(t, kind, norm_type, partials);
    });
  }
  double acc = 0.0;
  for (double v : partials) acc = kind == NormKind::Inf ? nan_max(acc, v) : acc + v;
  double norm = acc;
  if (kind == NormKind::L2)
    norm = std::sqrt(acc);
  else if (kind == NormKind::P)
    norm = std::pow(acc, 1.0 / norm_type);
  // Stored in total's dtype; the coefficient is computed from the stored value.
  double stored = 0.0;
  dispatch<Kinds::Float>("clip_grad_norm_", total.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T v = static_cast<T>(norm);
    *static_cast<T*>(total.data_ptr()) = v;
    stored = static_cast<double>(static_cast<opmath_t<T>>(v));
  });
  if (!coef.defined()) return;
  double c;
  if (total.dtype() == kFloat64) {
    c = max_norm / (stored + 1e-6);
    if (c > 1.0) c = 1.0;
  } else {
    float f = static_cast<float>(max_norm) / (static_cast<float>(stored) + 1e-6f);
    if (f > 1.f) f = 1.f;
    c = f;
  }
  *static_cast<double*>(coef.data_ptr()) = c;
}

void multi_tensor_scale(const std::vector<Tensor>& tensors, const Tensor& factor) {
  const double f = *static_cast<const double*>(factor.data_ptr());
  for (const Tensor& t : tensors) {
    dispatch<Kinds::Float>("clip_grad_norm_", t.dtype(), [&](auto tag) {
      using T = decltype(tag);
      using M = opmath_t<T>;
      T* x = static_cast<T*>(t.data_ptr());
      const M m = static_cast<M>(f);
      tg::parallel_for(0, t.numel(), kGrain, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) x[i] = static_cast<T>(static_cast<M>(x[i]) * m);
      });
    });
  }
}

void multi_tensor_clamp(const std::vector<Tensor>& tensors, double lo, double hi) {
  for (const Tensor& t : tensors) {
    dispatch<Kinds::Float>("clip_grad_value_", t.dtype(), [&](auto tag) {
      using T = decltype(tag);
      using M = opmath_t<T>;
      T* x = static_cast<T*>(t.data_ptr());
      const M l = static_cast<M>(lo), h = static_cast<M>(hi);
      tg::parallel_for(0, t.numel(), kGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          M v = static_cast<M>(x[i]);
          v = v < l ? l : v;  // clamp_min then clamp_max, as PyTorch; NaN compares false and stays
          v = v > h ? h : v;
          x[i] = static_cast<T>(v);
        }
      });
    });
  }
}

}  // namespace tg::cpu
