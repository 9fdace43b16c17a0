// CPU kernels of batch_norm (issue 17) on contiguous [n, c, s]: per-channel statistics and
// gradient sums (parallel over channels, each channel summed in a fixed order), and the two
// elementwise passes (parallel over (sample, channel) planes). Float accumulation (double for
// float64). s == 1 (channels-last, or no spatial dims) reads rows of c channels: the sums go over
// fixed chunks of rows (partial sums per (chunk, channel), added in chunk order, so the result
// does not depend on the thread count), the elementwise passes over rows. batch_norm + ReLU
// (fused): the forward pass clamps at 0 as it writes; backward counts dy only where the ReLU's
// output is > 0.
#include <algorithm>
#include <array>
#include <cmath>
#include <type_traits>
#include <vector>

#include <tapegrad/core/backend/cpu/cpu.h>
#include <tapegrad/core/backend/cpu/dispatch.h>
#include <tapegrad/core/backend/cpu/thread_pool.h>

namespace tg::cpu {

namespace {
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class A>
const A* vec_ptr(const Tensor& t) {
  return t.defined() ? static_cast<const A*>(t.data_ptr()) : nullptr;
}
// relu(v) (NaN stays NaN), and ReLU's backward: g where the output r is > 0.
template <class A>
A relu_of(A v) {
  return v > A(0) || v != v ? v : A(0);
}
template <class T, class A>
A masked(A g, const T* r, int64_t i) {
  return r == nullptr || static_cast<A>(r[i]) > A(0) ? g : A(0);
}
// Planes of s elements per parallel chunk.
int64_t plane_grain(int64_t s) { return std::max<int64_t>(1, kGrain / std::max<int64_t>(s, 1)); }

// s == 1: the n rows of c channels in fixed chunks of rows (from the sizes only).
struct RowChunks {
  int64_t rows, count;
};
RowChunks row_chunks(int64_t n, int64_t c) {
  constexpr int64_t kMaxChunks = 256;
  int64_t rows = std::max<int64_t>(1, kGrain / std::max<int64_t>(c, 1));
  rows = std::max(rows, (n + kMaxChunks - 1) / kMaxChunks);
  return {rows, (n + rows - 1) / rows};
}

// Per-channel sums over rows for s == 1: row_fn(row pointer index r, acc pointers) adds row r's
// terms into K accumulators per channel (acc[k * c + ch]); out[k][ch] gets the total.
template <int K, class A, class RowFn>
void sum_rows(int64_t n, int64_t c, RowFn&& row_fn, std::array<A*, K> out) {
  const RowChunks ch = row_chunks(n, c);
  std::vector<A> part(static_cast<size_t>(ch.count * K * c), A(0));
  parallel(0, ch.count, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      A* acc = part.data() + b * K * c;
      const int64_t r1 = std::min(n, (b + 1) * ch.rows);
      for (int64_t r = b * ch.rows; r < r1; ++r) row_fn(r, acc);
    }
  });
  for (int k = 0; k < K; ++k)
    for (int64_t j = 0; j < c; ++j) {
      A t = 0;
      for (int64_t b = 0; b < ch.count; ++b) t += part[static_cast<size_t>((b * K + k) * c + j)];
      out[k][j] = t;
    }
}
}  // namespace

void batch_norm_stats(const Tensor& xt, int64_t n, int64_t c, int64_t s, const Tensor& mean, const Tensor& var) {
  dispatch<Kinds::Float>("batch_norm", xt.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* x = static_cast<const T*>(xt.data_ptr());
    A* m = static_cast<A*>(mean.data_ptr());
    A* v = static_cast<A*>(var.data_ptr());
    const A inv = A(1) / static_cast<A>(n * s);
    if (s == 1) {
      sum_rows<1, A>(
          n, c,
          [&](int64_t r, A* acc) {
            const T* p = x + r * c;
            for (int64_t j = 0; j < c; ++j) acc[j] += static_cast<A>(p[j]);
          },
          std::array<A*, 1>{m});
      for (int64_t j = 0; j < c; ++j) m[j] *= inv;
      sum_rows<1, A>(
          n, c,
          [&](int64_t r, A* acc) {
            const T* p = x + r * c;
            for (int64_t j = 0; j < c; ++j) {
              const A d = static_cast<A>(p[j]) - m[j];
              acc[j] += d * d;
            }
          },
          std::array<A*, 1>{v});
      for (int64_t j = 0; j < c; ++j) v[j] *= inv;
      return;
    }
    parallel(0, c, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t ch = lo; ch < hi; ++ch) {
        A sum = 0;
        for (int64_t i = 0; i < n; ++i) {
          const T* p = x + (i * c + ch) * s;
          for (int64_t k = 0; k < s; ++k) sum += static_cast<A>(p[k]);
        }
        const A mu = sum * inv;
        A ss = 0;
        for (int64_t i = 0; i < n; ++i) {
          const T* p = x + (i * c + ch) * s;
          for (int64_t k = 0; k < s; ++k) {
            const A d = static_cast<A>(p[k]) - mu;
            ss += d * d;
          }
        }
        m[ch] = mu;
        v[ch] = ss * inv;
      }
    });
  });
}

void batch_norm_elemt(const Tensor& yt, const Tensor& xt, int64_t n, int64_t c, int64_t s, const Tensor& mean,
                      const Tensor& scale, const Tensor& shift, bool relu) {
  dispatch<Kinds::Float>("batch_norm", xt.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* x = static_cast<const T*>(xt.data_ptr());
    T* y = static_cast<T*>(yt.data_ptr());
    const A *m = vec_ptr<A>(mean), *sc = vec_ptr<A>(scale), *sh = vec_ptr<A>(shift);
    if (s == 1) {
      parallel(0, n, plane_grain(c), [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
          const T* xp = x + r * c;
          T* yp = y + r * c;
          for (int64_t j = 0; j < c; ++j) {
            const A v = (static_cast<A>(xp[j]) - m[j]) * sc[j] + (sh ? sh[j] : A(0));
            yp[j] = T(relu ? relu_of(v) : v);
          }
        }
      });
      return;
    }
    parallel(0, n * c, plane_grain(s), [&](int64_t lo, int64_t hi) {
      for (int64_t plane = lo; plane < hi; ++plane) {
        const int64_t ch = plane % c;
        const A mu = m[ch], a = sc[ch], b = sh ? sh[ch] : A(0);
        const T* xp = x + plane * s;
        T* yp = y + plane * s;
        for (int64_t k = 0; k < s; ++k) {
          const A v = (static_cast<A>(xp[k]) - mu) * a + b;
          yp[k] = T(relu ? relu_of(v) : v);
        }
      }
    });
  });
}

void batch_norm_reduce(const Tensor& dyt, const Tensor& xt, int64_t n, int64_t c, int64_t s, const Tensor& mean,
                       const Tensor& invstd, const Tensor& sum_dy, const Tensor& sum_dy_xhat, const Tensor& relu_out) {
  dispatch<Kinds::Float>("batch_norm backward", xt.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* x = static_cast<const T*>(xt.data_ptr());
    const T* dy = static_cast<const T*>(dyt.data_ptr());
    const T* ro = vec_ptr<T>(relu_out);
    const A *m = vec_ptr<A>(mean), *is = vec_ptr<A>(invstd);
    A* o1 = static_cast<A*>(sum_dy.data_ptr());
    A* o2 = static_cast<A*>(sum_dy_xhat.data_ptr());
    if (s == 1) {
      sum_rows<2, A>(
          n, c,
          [&](int64_t r, A* acc) {
            const T* xp = x + r * c;
            const T* gp = dy + r * c;
            const T* rp = ro ? ro + r * c : nullptr;
            for (int64_t j = 0; j < c; ++j) {
              const A g = masked(static_cast<A>(gp[j]), rp, j);
              acc[j] += g;
              acc[c + j] += g * (static_cast<A>(xp[j]) - m[j]);
            }
          },
          std::array<A*, 2>{o1, o2});
      for (int64_t j = 0; j < c; ++j) o2[j] *= is[j];
      return;
    }
    parallel(0, c, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t ch = lo; ch < hi; ++ch) {
        A s1 = 0, s2 = 0;
        const A mu = m[ch];
        for (int64_t i = 0; i < n; ++i) {
          const T* xp = x + (i * c + ch) * s;
          const T* gp = dy + (i * c + ch) * s;
          const T* rp = ro ? ro + (i * c + ch) * s : nullptr;
          for (int64_t k = 0; k < s; ++k) {
            const A g = masked(static_cast<A>(gp[k]), rp, k);
            s1 += g;
            s2 += g * (static_cast<A>(xp[k]) - mu);
          }
        }
        o1[ch] = s1;
        o2[ch] = s2 * is[ch];
      }
    });
  });
}

void batch_norm_backward_elemt(const Tensor& dxt, const Tensor& dyt, const Tensor& xt, int64_t n, int64_t c, int64_t s,
                               const Tensor& mean, const Tensor& invstd, const Tensor& scale, const Tensor& mean_dy,
                               const Tensor& mean_dy_xhat, const Tensor& relu_out) {
  dispatch<Kinds::Float>("batch_norm backward", xt.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* x = static_cast<const T*>(xt.data_ptr());
    const T* dy = static_cast<const T*>(dyt.data_ptr());
    const T* ro = vec_ptr<T>(relu_out);
    T* dx = static_cast<T*>(dxt.data_ptr());
    const A *m = vec_ptr<A>(mean), *is = vec_ptr<A>(invstd), *sc = vec_ptr<A>(scale);
    const A *mdy = vec_ptr<A>(mean_dy), *mdx = vec_ptr<A>(mean_dy_xhat);
    if (s == 1) {
      parallel(0, n, plane_grain(c), [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
          const T* xp = x + r * c;
          const T* gp = dy + r * c;
          const T* rp = ro ? ro + r * c : nullptr;
          T* op = dx + r * c;
          for (int64_t j = 0; j < c; ++j)
            op[j] = T((masked(static_cast<A>(gp[j]), rp, j) - mdy[j] - (static_cast<A>(xp[j]) - m[j]) * (is[j] * mdx[j])) *
                      sc[j]);
        }
      });
      return;
    }
    parallel(0, n * c, plane_grain(s), [&](int64_t lo, int64_t hi) {
      for (int64_t plane = lo; plane < hi; ++plane) {
        const int64_t ch = plane % c;
        const A a = sc[ch];
        const T* xp = x + plane * s;
        const T* gp = dy + plane * s;
        const T* rp = ro ? ro + plane * s : nullptr;
        T* op = dx + plane * s;
        const A mu = m[ch], r = is[ch] * mdx[ch], md = mdy[ch];
        for (int64_t k = 0; k < s; ++k)
          op[k] = T((masked(static_cast<A>(gp[k]), rp, k) - md - (static_cast<A>(xp[k]) - mu) * r) * a);
      }
    });
  });
}

}  // namespace tg::cpu
