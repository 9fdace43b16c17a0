// CPU kernels of layer_norm / rms_norm (forward, backward), embedding backward and dropout
// (issue 15). Statistics and sums accumulate in float (double for float64). Everything is in a
// fixed order that does not depend on the thread count: the weight / bias gradients are per-chunk
// partial sums over a fixed chunking of the rows, added in chunk order.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include <tapegrad/core/backend/cpu/cpu.h>
#include <tapegrad/core/backend/cpu/dispatch.h>
#include <tapegrad/core/backend/cpu/thread_pool.h>
#include <tapegrad/core/error.h>
#include <tapegrad/core/philox.h>

namespace tg::cpu {

namespace {

constexpr int64_t kRowChunks = 64;  // fixed partial-sum chunks of the weight / bias gradients
}  // namespace

void norm_forward(const backend::NormArgs& a) {
  dispatch<Kinds::Float>(a.rms ? "rms_norm" : "layer_norm", a.x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = opmath_t<T>;
    const T* x = static_cast<const T*>(a.x.data_ptr());
    const T* w = a.weight.defined() ? static_cast<const T*>(a.weight.data_ptr()) : nullptr;
    const T* b = a.bias.defined() ? static_cast<const T*>(a.bias.data_ptr()) : nullptr;
    T* y = static_cast<T*>(a.y.data_ptr());
    A* mean_out = a.mean.defined() ? static_cast<A*>(a.mean.data_ptr()) : nullptr;
    A* rstd_out = static_cast<A*>(a.rstd.data_ptr());
    const int64_t n = a.cols;
    const A eps = static_cast<A>(a.eps);
    parallel(0, a.rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const T* xr = x + r * n;
        T* yr = y + r * n;
        A mean = 0, rstd;
        if (a.rms) {
          A ss = 0;
          for (int64_t j = 0; j < n; ++j) {
            const A v = static_cast<A>(xr[j]);
            ss += v * v;
          }
          rstd = A(1) / std::sqrt(ss / static_cast<A>(n) + eps);
        } else {
          A s = 0;
          for (int64_t j = 0; j < n; ++j) s += static_cast<A>(xr[j]);
          mean = s / static_cast<A>(n);
          A ss = 0;  // two passes: exact for rows with a large mean
          for (int64_t j = 0; j < n; ++j) {
            const A d = static_cast<A>(xr[j]) - mean;
            ss += d * d;
          }
          rstd = A(1) / std::sqrt(ss / static_cast<A>(n) + eps);
          mean_out[r] = mean;
        }
        rstd_out[r] = rstd;
        for (int64_t j = 0; j < n; ++j) {
          A v = (static_cast<A>(xr[j]) - mean) * rstd;
          if (w) v *= static_cast<A>(w[j]);
          if (b) v += static_cast<A>(b[j]);
          yr[j] = T(v);
        }
      }
    });
  });
}

void norm_backward(const backend::NormBackwardArgs& a) {
  dispatch<Kinds::Float>(a.rms ? "rms_norm backward" : "layer_norm backward", a.x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = opmath_t<T>;
    const T* x = static_cast<const T*>(a.x.data_ptr());
    const T* g = static_cast<const T*>(a.grad_out.data_ptr());
    const T* w = a.weight.defined() ? static_cast<const T*>(a.weight.data_ptr()) : nullptr;
    const A* mean = a.mean.defined() ? static_cast<const A*>(a.mean.data_ptr()) : nullptr;
    const A* rstd = static_cast<const A*>(a.rstd.data_ptr());
    T* gx = a.grad_x.defined() ? static_cast<T*>(a.grad_x.data_ptr()) : nullptr;
    const T* add = a.grad_x_addend.defined() ? static_cast<const T*>(a.grad_x_addend.data_ptr()) : nullptr;
    const bool want_w = a.grad_weight.defined(), want_b = a.grad_bias.defined();
    const int64_t n = a.cols, rows = a.rows;
    const int64_t chunks = std::min(rows, kRowChunks), per = (rows + chunks - 1) / chunks;
    std::vector<A> pw(want_w ? static_cast<size_t>(chunks * n) : 0), pb(want_b ? static_cast<size_t>(chunks * n) : 0);
    parallel(0, chunks, 1, [&](int64_t clo, int64_t chi) {
      std::vector<A> gy(static_cast<size_t>(n));
      for (int64_t c = clo; c < chi; ++c) {
        A* cw = want_w ? pw.data() + c * n : nullptr;
        A* cb = want_b ? pb.data() + c * n : nullptr;
        for (int64_t r = c * per; r < std::min(rows, (c + 1) * per); ++r) {
          const T* xr = x + r * n;
          const T* gr = g + r * n;
          const A m = mean ? mean[r] : A(0), rs = rstd[r];
          A s1 = 0, s2 = 0;  // sum(gy), sum(gy * xhat)
          for (int64_t j = 0; j < n; ++j) {
            const A gv = static_cast<A>(gr[j]);
            const A xh = (static_cast<A>(xr[j]) - m) * rs;
            if (cw) cw[j] += gv * xh;
            if (cb) cb[j] += gv;
            const A v = w ? gv * static_cast<A>(w[j]) : gv;
            gy[j] = v;
            s1 += v;
            s2 += v * xh;
          }
          if (!gx) continue;
          const A inv_n = A(1) / static_cast<A>(n);
          const A c1 = a.rms ? A(0) : s1 * inv_n, c2 = s2 * inv_n;
          T* gxr = gx + r * n;
          const T* ar = add ? add + r * n : nullptr;
          for (int64_t j = 0; j < n; ++j) {
            const A xh = (static_cast<A>(xr[j]) - m) * rs;
            const A v = rs * (gy[j] - c1 - xh * c2);
            gxr[j] = T(ar ? v + static_cast<A>(ar[j]) : v);
          }
        }
      }
    });
    auto finish = [&](const std::vector<A>& part, const Tensor& out) {
      T* o = static_cast<T*>(out.data_ptr());
      parallel(0, n, 1024, [&](int64_t lo, int64_t hi) {
        for (int64_t j = lo; j < hi; ++j) {
          A s = 0;
          for (int64_t c = 0; c < chunks; ++c) s += part[static_cast<size_t>(c * n + j)];
          o[j] = T(s);
        }
      });
    };
    if (want_w) finish(pw, a.grad_weight);
    if (want_b) finish(pb, a.grad_bias);
  });
}

void embedding_backward(const Tensor& grad_weight, const Tensor& grad, const Tensor& index, int64_t padding_idx) {
  dispatch<Kinds::Float>("embedding backward", grad.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = opmath_t<T>;
    const int64_t n = index.numel(), dim = grad.sizes()[1], num = grad_weight.sizes()[0];
    const bool is64 = index.dtype() == kInt64;
    const void* ip = index.data_ptr();
    auto idx = [&](int64_t j) {
      return is64 ? static_cast<const int64_t*>(ip)[j] : static_cast<int64_t>(static_cast<const int32_t*>(ip)[j]);
    };
    const T* g = static_cast<const T*>(grad.data_ptr());
    T* out = static_cast<T*>(grad_weight.data_ptr());
    // Parallel over blocks of columns, serial over the indices: a fixed order per element.
    constexpr int64_t kCols = 64;
    const int64_t blocks = (dim + kCols - 1) / kCols;
    parallel(0, blocks, 1, [&](int64_t blo, int64_t bhi) {
      std::vector<A> acc;
      for (int64_t bk = blo; bk < bhi; ++bk) {
        const int64_t c0 = bk * kCols, c1 = std::min(dim, c0 + kCols), w = c1 - c0;
        acc.assign(static_cast<size_t>(num * w), A(0));
        for (int64_t j = 0; j < n; ++j) {
          const int64_t r = idx(j);
          if (r == padding_idx) continue;
          A* dst = acc.data() + r * w;
          const T* src = g + j * dim + c0;
          for (int64_t c = 0; c < w; ++c) dst[c] += static_cast<A>(src[c]);
        }
        for (int64_t r = 0; r < num; ++r)
          for (int64_t c = 0; c < w; ++c) out[r * dim + c0 + c] = T(acc[static_cast<size_t>(r * w + c)]);
      }
    });
  });
}

void dropout(const Tensor& out, const Tensor& x, double p, double scale, uint64_t seed, uint64_t offset) {
  dispatch<Kinds::Float>("dropout", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = opmath_t<T>;
    const T* src = static_cast<const T*>(x.data_ptr());
    T* dst = static_cast<T*>(out.data_ptr());
    const float pf = static_cast<float>(p);
    const A s = static_cast<A>(scale);
    const int64_t numel = x.numel();
    // Chunks of whole Philox blocks (offset is a multiple of 4): each block generated once.
    parallel(0, (numel + 3) / 4, kGrain / 4, [&](int64_t lo, int64_t hi) {
      for (int64_t bk = lo; bk < hi; ++bk) {
        const philox::Block blk = philox::generate(seed, (offset >> 2) + static_cast<uint64_t>(bk));
        for (int l = 0; l < 4; ++l) {
          const int64_t i = bk * 4 + l;
          if (i >= numel) break;
          const bool keep = philox::to_unit_f32(blk.w[l]) >= pf;
          dst[i] = keep ? T(static_cast<A>(src[i]) * s) : T(A(0));
        }
      }
    });
  });
}

}  // namespace tg::cpu
