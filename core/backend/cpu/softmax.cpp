// CPU softmax / log_softmax (forward and backward) over the last dim of contiguous rows, and
// cross_entropy over class indices straight from the logits (per-row logsumexp saved for the
// backward). Rows run in parallel; each row accumulates in double, so float16 / bfloat16 / float32
// results are rounded once and do not depend on the number of threads.
#include <cmath>
#include <cstdint>
#include <limits>

#include <tapegrad/core/backend/cpu/cpu.h>
#include <tapegrad/core/backend/cpu/dispatch.h>
#include <tapegrad/core/backend/cpu/loops.h>
#include <tapegrad/core/backend/cpu/thread_pool.h>
#include <tapegrad/core/error.h>

namespace tg::cpu {

namespace {
int64_t grain_rows(int64_t cols) { return std::max<int64_t>(1, kGrain / std::max<int64_t>(1, cols)); }

// max and log(sum(exp(x - max))) + max of one row, in double; a row of -inf gives -inf.
template <typename T>
double row_lse(const T* x, int64_t cols) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < cols; ++j) m = std::max(m, static_cast<double>(static_cast<float>(x[j])));
  if (std::isinf(m)) return m;  // all -inf (or a +inf: the result is +inf / NaN as PyTorch's)
  double s = 0;
  for (int64_t j = 0; j < cols; ++j) s += std::exp(static_cast<double>(static_cast<float>(x[j])) - m);
  return m + std::log(s);
}
template <>
double row_lse<double>(const double* x, int64_t cols) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < cols; ++j) m = std::max(m, x[j]);
  if (std::isinf(m)) return m;
  double s = 0;
  for (int64_t j = 0; j < cols; ++j) s += std::exp(x[j] - m);
  return m + std::log(s);
}
template <typename T>
double ld(T v) {
  if constexpr (std::is_same_v<T, double>) return v;
  else return static_cast<double>(static_cast<float>(v));
}
template <typename T>
T st(double v) {
  if constexpr (std::is_same_v<T, double>) return v;
  else if constexpr (std::is_same_v<T, float>) return static_cast<float>(v);
  else return static_cast<T>(static_cast<float>(v));
}
}  // namespace

void softmax(const Tensor& out, const Tensor& in, bool log) {
  const int64_t cols = in.dim() == 0 ? 1 : in.size(-1);
  const int64_t rows = cols == 0 ? 0 : in.numel() / cols;
  dispatch<Kinds::Float>(log ? "log_softmax" : "softmax", in.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* x = static_cast<const T*>(in.data_ptr());
    T* y = static_cast<T*>(out.data_ptr());
    parallel(0, rows, grain_rows(cols), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const T* xr = x + r * cols;
        T* yr = y + r * cols;
        const double lse = row_lse(xr, cols);
        for (int64_t j = 0; j < cols; ++j) {
          const double v = ld(xr[j]) - lse;
          yr[j] = st<T>(log ? v : std::exp(v));
        }
      }
    });
  });
}

void softmax_backward(const Tensor& grad_in, const Tensor& grad, const Tensor& out, bool log) {
  const int64_t cols = out.dim() == 0 ? 1 : out.size(-1);
  const int64_t rows = cols == 0 ? 0 : out.numel() / cols;
  dispatch<Kinds::Float>(log ? "log_softmax_backward" : "softmax_backward", out.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* g = static_cast<const T*>(grad.data_ptr());
    const T* y = static_cast<const T*>(out.data_ptr());
    T* gi = static_cast<T*>(grad_in.data_ptr());
    parallel(0, rows, grain_rows(cols), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const T* gr = g + r * cols;
        const T* yr = y + r * cols;
        T* o = gi + r * cols;
        double s = 0;
        if (log) {
          for (int64_t j = 0; j < cols; ++j) s += ld(gr[j]);
          for (int64_t j = 0; j < cols; ++j) o[j] = st<T>(ld(gr[j]) - std::exp(ld(yr[j])) * s);
        } else {
          for (int64_t j = 0; j < cols; ++j) s += ld(gr[j]) * ld(yr[j]);
          for (int64_t j = 0; j < cols; ++j) o[j] = st<T>(ld(yr[j]) * (ld(gr[j]) - s));
        }
      }
    });
  });
}

namespace {
// The accumulation-dtype buffers (float32 or float64) read / written as double.
double acc_at(const Tensor& t, int64_t i) {
  return t.dtype() == kFloat64 ? static_cast<const double*>(t.data_ptr())[i]
                               : static_cast<double>(static_cast<const float*>(t.data_ptr())[i]);
}
void acc_set(const Tensor& t, int64_t i, double v) {
  if (t.dtype() == kFloat64)
    static_cast<double*>(t.data_ptr())[i] = v;
  else
    static_cast<float*>(t.data_ptr())[i] = static_cast<float>(v);
}
}  // namespace

void cross_entropy(const backend::Backend::CrossEntropyArgs& a, const Tensor& loss, const Tensor& lse_out,
                   const Tensor& wt, const Tensor& grad_logits, const Tensor& denom) {
  const int64_t n = a.logits.size(0), c = a.logits.size(1);
  const int64_t* tgt = static_cast<const int64_t*>(a.target.data_ptr());
  const bool has_w = a.weight.defined();
  const double eps = a.label_smoothing;
  const double wsum = has_w ? acc_at(a.weight_sum, 0) : static_cast<double>(c);
  dispatch<Kinds::Float>("cross_entropy", a.logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* x = static_cast<const T*>(a.logits.data_ptr());
    parallel(0, n, grain_rows(c), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const T* xr = x + i * c;
        const double lse = row_lse(xr, c);
        acc_set(lse_out, i, lse);
        const int64_t t = tgt[i];
        if (t == a.ignore_index) {
          acc_set(loss, i, 0.0);
          acc_set(wt, i, 0.0);
          continue;
        }
        if (t < 0 || t >= c) {
          acc_set(loss, i, std::numeric_limits<double>::quiet_NaN());
          acc_set(wt, i, std::numeric_limits<double>::quiet_NaN());
          continue;
        }
        const double w_t = has_w ? acc_at(a.weight, t) : 1.0;
        double l = (1 - eps) * w_t * (lse - ld(xr[t]));
        if (eps > 0) {
          double s = 0;  // sum_j w_j x_j
          for (int64_t j = 0; j < c; ++j) s += (has_w ? acc_at(a.weight, j) : 1.0) * ld(xr[j]);
          l += eps / static_cast<double>(c) * (wsum * lse - s);
        }
        acc_set(loss, i, l);
        acc_set(wt, i, w_t);
      }
    });
  });
  if (grad_logits.defined()) {
    Tensor one = Tensor();  // an upstream gradient of 1
    cross_entropy_backward(a, grad_logits, lse_out, one, denom);
  }
}

void cross_entropy_backward(const backend::Backend::CrossEntropyArgs& a, const Tensor& grad_logits,
                            const Tensor& lse_in, const Tensor& grad, const Tensor& denom) {
  const int64_t n = a.logits.size(0), c = a.logits.size(1);
  const int64_t* tgt = static_cast<const int64_t*>(a.target.data_ptr());
  const bool has_w = a.weight.defined();
  const double eps = a.label_smoothing;
  const double wsum = has_w ? acc_at(a.weight_sum, 0) : static_cast<double>(c);
  const bool per_row = grad.defined() && grad.dim() > 0;  // undefined grad: 1
  const double d = denom.defined() ? acc_at(denom, 0) : 1.0;
  dispatch<Kinds::Float>("cross_entropy_backward", a.logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* x = static_cast<const T*>(a.logits.data_ptr());
    T* gx = static_cast<T*>(grad_logits.data_ptr());
    parallel(0, n, grain_rows(c), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const T* xr = x + i * c;
        T* o = gx + i * c;
        const int64_t t = tgt[i];
        if (t == a.ignore_index) {
          for (int64_t j = 0; j < c; ++j) o[j] = st<T>(0.0);
          continue;
        }
        const double s = (grad.defined() ? acc_at(grad, per_row ? i : 0) : 1.0) / d;
        if (t < 0 || t >= c) {
          for (int64_t j = 0; j < c; ++j) o[j] = st<T>(std::numeric_limits<double>::quiet_NaN());
          continue;
        }
        const double lse = acc_at(lse_in, i);
        const double w_t = has_w ? acc_at(a.weight, t) : 1.0;
        const double pcoef = (1 - eps) * w_t + eps * wsum / static_cast<double>(c);
        for (int64_t j = 0; j < c; ++j) {
          const double p = std::exp(ld(xr[j]) - lse);
          double v = pcoef * p - eps / static_cast<double>(c) * (has_w ? acc_at(a.weight, j) : 1.0);
          if (j == t) v -= (1 - eps) * w_t;
          o[j] = st<T>(s * v);
        }
      }
    });
  });
}

}  // namespace tg::cpu
