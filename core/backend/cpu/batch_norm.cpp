// CPU kernels of batch_norm (issue 17) on contiguous [n, c, s]: per-channel statistics and
// gradient sums (parallel over channels, each channel summed in a fixed order), and the two
// elementwise passes (parallel over (sample, channel) planes). Float accumulation (double for
// float64).
#include <algorithm>
#include <cmath>
#include <type_traits>

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
// Planes of s elements per parallel chunk.
int64_t plane_grain(int64_t s) { return std::max<int64_t>(1, kGrain / std::max<int64_t>(s, 1)); }
}  // namespace

void batch_norm_stats(const Tensor& xt, int64_t n, int64_t c, int64_t s, const Tensor& mean, const Tensor& var) {
  dispatch<Kinds::Float>("batch_norm", xt.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* x = static_cast<const T*>(xt.data_ptr());
    A* m = static_cast<A*>(mean.data_ptr());
    A* v = static_cast<A*>(var.data_ptr());
    const A inv = A(1) / static_cast<A>(n * s);
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
                      const Tensor& scale, const Tensor& shift) {
  dispatch<Kinds::Float>("batch_norm", xt.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* x = static_cast<const T*>(xt.data_ptr());
    T* y = static_cast<T*>(yt.data_ptr());
    const A *m = vec_ptr<A>(mean), *sc = vec_ptr<A>(scale), *sh = vec_ptr<A>(shift);
    parallel(0, n * c, plane_grain(s), [&](int64_t lo, int64_t hi) {
      for (int64_t plane = lo; plane < hi; ++plane) {
        const int64_t ch = plane % c;
        const A mu = m[ch], a = sc[ch], b = sh ? sh[ch] : A(0);
        const T* xp = x + plane * s;
        T* yp = y + plane * s;
        for (int64_t k = 0; k < s; ++k) yp[k] = T((static_cast<A>(xp[k]) - mu) * a + b);
      }
    });
  });
}

void batch_norm_reduce(const Tensor& dyt, const Tensor& xt, int64_t n, int64_t c, int64_t s, const Tensor& mean,
                       const Tensor& invstd, const Tensor& sum_dy, const Tensor& sum_dy_xhat) {
  dispatch<Kinds::Float>("batch_norm backward", xt.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* x = static_cast<const T*>(xt.data_ptr());
    const T* dy = static_cast<const T*>(dyt.data_ptr());
    const A *m = vec_ptr<A>(mean), *is = vec_ptr<A>(invstd);
    A* o1 = static_cast<A*>(sum_dy.data_ptr());
    A* o2 = static_cast<A*>(sum_dy_xhat.data_ptr());
    parallel(0, c, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t ch = lo; ch < hi; ++ch) {
        A s1 = 0, s2 = 0;
        const A mu = m[ch];
        for (int64_t i = 0; i < n; ++i) {
          const T* xp = x + (i * c + ch) * s;
          const T* gp = dy + (i * c + ch) * s;
          for (int64_t k = 0; k < s; ++k) {
            const A g = static_cast<A>(gp[k]);
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

void batch_norm_backward_elemt(const Tensor& dxt, const Tensor& dyt, const Tensor& xt, int64_t n, int64_t c,
                               int64_t s, const Tensor& mean, const Tensor& invstd, const Tensor& scale,
                               const Tensor& mean_dy, const Tensor& mean_dy_xhat) {
  dispatch<Kinds::Float>("batch_norm backward", xt.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* x = static_cast<const T*>(xt.data_ptr());
    const T* dy = static_cast<const T*>(dyt.data_ptr());
    T* dx = static_cast<T*>(dxt.data_ptr());
    const A *m = vec_ptr<A>(mean), *is = vec_ptr<A>(invstd), *sc = vec_ptr<A>(scale);
    const A *mdy = vec_ptr<A>(mean_dy), *mdx = vec_ptr<A>(mean_dy_xhat);
    parallel(0, n * c, plane_grain(s), [&](int64_t lo, int64_t hi) {
      for (int64_t plane = lo; plane < hi; ++plane) {
        const int64_t ch = plane % c;
        const A a = sc[ch];
        const T* xp = x + plane * s;
        const T* gp = dy + plane * s;
        T* op = dx + plane * s;
        const A mu = m[ch], r = is[ch] * mdx[ch], md = mdy[ch];
        for (int64_t k = 0; k < s; ++k)
          op[k] = T((static_cast<A>(gp[k]) - md - (static_cast<A>(xp[k]) - mu) * r) * a);
      }
    });
  });
}

}  // namespace tg::cpu
