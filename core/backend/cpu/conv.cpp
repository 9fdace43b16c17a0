// CPU conv2d forward and backward: im2col into a [C * KH * KW, OH * OW] buffer per sample, then
// the backend's gemm (one batched call over the groups); the input gradient goes back through
// col2im. Samples run in parallel when the batch can fill the pool (gemm then runs inline),
// otherwise one after the other with the gemm split across the threads. float16 / bfloat16
// convert to float on the way in and round once on the store.
#include <algorithm>
#include <vector>

#include <tapegrad/core/backend/cpu/cpu.h>
#include <tapegrad/core/backend/cpu/dispatch.h>
#include <tapegrad/core/backend/cpu/thread_pool.h>

namespace tg::cpu {

namespace {

struct Geom {
  int64_t n, c, h, w, co, kh, kw, oh, ow, groups;
  int64_t sh, sw, ph, pw, dh, dw;
  int64_t cg() const { return c / groups; }
  int64_t cog() const { return co / groups; }
  int64_t kg() const { return cg() * kh * kw; }  // column rows per group
  int64_t k() const { return c * kh * kw; }
  int64_t l() const { return oh * ow; }
};

Geom geometry(const backend::ConvArgs& a) {
  const auto& xs = a.x.sizes();
  const auto& ws = a.weight.sizes();
  Geom g{};
  g.n = xs[0], g.c = xs[1], g.h = xs[2], g.w = xs[3];
  g.co = ws[0], g.kh = ws[2], g.kw = ws[3];
  g.oh = a.out.sizes()[2], g.ow = a.out.sizes()[3];
  g.groups = a.groups;
  g.sh = a.stride[0], g.sw = a.stride[1], g.ph = a.pad[0], g.pw = a.pad[1], g.dh = a.dilation[0], g.dw = a.dilation[1];
  return g;
}

// The output columns [lo, hi) whose tap j lands inside the input row: ow * sw - pw + j * dw in [0, w).
struct Span {
  int64_t lo, hi;
};
Span inside(const Geom& g, int64_t j) {
  const int64_t off = j * g.dw - g.pw;  // iw = ow * sw + off
  const int64_t lo = off >= 0 ? 0 : (-off + g.sw - 1) / g.sw;
  const int64_t last = g.w - 1 - off;  // iw <= w - 1  <=>  ow <= last / sw
  const int64_t hi = last < 0 ? 0 : std::min(g.ow, last / g.sw + 1);
  return {std::min(lo, hi), hi};
}

// cols[(c * KH + i) * KW + j][oh * OW + ow] = x[c][oh * sh - ph + i * dh][ow * sw - pw + j * dw] (0 outside).
// The inside of each output row is one contiguous copy at stride 1, the rest zeros (no per-element
// bounds test: at a 3x3 convolution's sizes this loop is a third of the time with one).
// Output rows [oh0, oh1) only (cols then has (oh1 - oh0) * OW columns): the forward fills a
// tile of columns that stays in cache for the product that reads it next.
template <typename T, typename A>
void im2col(const Geom& g, const T* x, A* cols, int64_t oh0, int64_t oh1) {
  const int64_t L = (oh1 - oh0) * g.ow;
  for (int64_t j = 0; j < g.kw; ++j) {
    const Span in = inside(g, j);
    const int64_t off = j * g.dw - g.pw;
    for (int64_t c = 0; c < g.c; ++c) {
      const T* xc = x + c * g.h * g.w;
      for (int64_t i = 0; i < g.kh; ++i) {
        A* row = cols + ((c * g.kh + i) * g.kw + j) * L;
        for (int64_t oh = oh0; oh < oh1; ++oh) {
          const int64_t ih = oh * g.sh - g.ph + i * g.dh;
          A* dst = row + (oh - oh0) * g.ow;
          if (ih < 0 || ih >= g.h) {
            std::fill(dst, dst + g.ow, A(0));
            continue;
          }
          const T* xr = xc + ih * g.w;  // xr[ow * sw + off] for ow in the span
          std::fill(dst, dst + in.lo, A(0));
          if (g.sw == 1) {
            for (int64_t ow = in.lo; ow < in.hi; ++ow) dst[ow] = static_cast<A>(xr[ow + off]);
          } else {
            for (int64_t ow = in.lo; ow < in.hi; ++ow) dst[ow] = static_cast<A>(xr[ow * g.sw + off]);
          }
          std::fill(dst + in.hi, dst + g.ow, A(0));
        }
      }
    }
  }
}

template <typename T, typename A>
void im2col(const Geom& g, const T* x, A* cols) {
  im2col(g, x, cols, 0, g.oh);
}

// dx[c][ih][iw] += dcols[row][l] for every tap landing inside the input (dx zeroed by the caller).
template <typename A>
void col2im(const Geom& g, const A* dcols, A* dx) {
  const int64_t L = g.l();
  for (int64_t c = 0; c < g.c; ++c) {
    A* dxc = dx + c * g.h * g.w;
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        const Span in = inside(g, j);
        const int64_t off = j * g.dw - g.pw;
        const A* row = dcols + ((c * g.kh + i) * g.kw + j) * L;
        for (int64_t oh = 0; oh < g.oh; ++oh) {
          const int64_t ih = oh * g.sh - g.ph + i * g.dh;
          if (ih < 0 || ih >= g.h) continue;
          A* dr = dxc + ih * g.w;  // dr[ow * sw + off] for ow in the span
          const A* src = row + oh * g.ow;
          if (g.sw == 1) {
            for (int64_t ow = in.lo; ow < in.hi; ++ow) dr[ow + off] += src[ow];
          } else {
            for (int64_t ow = in.lo; ow < in.hi; ++ow) dr[ow * g.sw + off] += src[ow];
          }
        }
      }
    }
  }
}

template <typename A>
constexpr DType acc_dtype() {
  return std::is_same_v<A, double> ? DType::Float64 : DType::Float32;
}

// C[b] = op(A[b]) @ op(B[b]) for b < groups, through the backend's gemm.
template <typename Acc>
void gemm_groups(int64_t groups, int64_t m, int64_t n, int64_t k, const Acc* a, bool ta, int64_t lda, int64_t sa,
                 const Acc* b, bool tb, int64_t ldb, int64_t sb, Acc* c, int64_t sc, int64_t ldc = -1) {
  backend::GemmArgs args{};
  args.dtype = acc_dtype<Acc>();
  args.m = m, args.n = n, args.k = k, args.batch = groups;
  args.a = a, args.b = b, args.c = c;
  args.trans_a = ta, args.trans_b = tb;
  args.lda = lda, args.ldb = ldb, args.ldc = n;
  args.stride_a = sa, args.stride_b = sb, args.stride_c = sc;
  args.device = Device(kCPU);
  gemm(args);
}

template <typename T, typename A>
std::vector<A> widened(const T* p, int64_t n) {
  std::vector<A> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<A>(p[i]);
  return v;
}

// A per-thread scratch buffer of at least n elements, kept between calls: im2col's columns are
// megabytes per sample, and a fresh vector each time costs a zero fill and page faults.
template <typename A>
A* scratch(size_t n) {
  thread_local std::vector<A> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// Samples in parallel only when the batch fills the pool; else gemm splits each product.
template <typename F>
void over_batch(int64_t n, F&& f) {
  if (n >= get_num_threads()) {
    parallel(0, n, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) f(i);
    });
  } else {
    for (int64_t i = 0; i < n; ++i) f(i);
  }
}

template <typename T>
void conv2d_typed(const backend::ConvArgs& a, const Geom& g) {
  using A = opmath_t<T>;
  const T* x = static_cast<const T*>(a.x.data_ptr());
  const T* wt = static_cast<const T*>(a.weight.data_ptr());
  const T* bias = a.bias.defined() ? static_cast<const T*>(a.bias.data_ptr()) : nullptr;
  T* out = static_cast<T*>(a.out.data_ptr());
  std::vector<A> wbuf;
  const A* w = nullptr;
  if constexpr (std::is_same_v<T, A>) {
    w = wt;
  } else {
    wbuf = widened<T, A>(wt, a.weight.numel());
    w = wbuf.data();
  }
  const int64_t L = g.l(), K = g.k(), KG = g.kg(), COG = g.cog();
  // Columns in tiles of whole output rows of about kTileBytes: im2col writes a tile and the
  // product reads it at once, from cache (the whole [K, L] of a sample is megabytes).
  constexpr int64_t kTileBytes = 512 << 10;
  const int64_t tile_rows =
      std::clamp<int64_t>(kTileBytes / std::max<int64_t>(1, K * g.ow * static_cast<int64_t>(sizeof(A))), 1, g.oh);
  over_batch(g.n, [&](int64_t s) {
    A* cols = scratch<A>(static_cast<size_t>(K * tile_rows * g.ow));
    std::vector<A> obuf;
    A* o = nullptr;
    if constexpr (std::is_same_v<T, A>) {
      o = out + s * g.co * L;
    } else {
      obuf.resize(static_cast<size_t>(g.co * L));
      o = obuf.data();
    }
    for (int64_t oh0 = 0; oh0 < g.oh; oh0 += tile_rows) {
      const int64_t oh1 = std::min(g.oh, oh0 + tile_rows), lt = (oh1 - oh0) * g.ow;
      im2col(g, x + s * g.c * g.h * g.w, cols, oh0, oh1);
      gemm_groups<A>(g.groups, COG, lt, KG, w, false, KG, COG * KG, cols, false, lt, KG * lt, o + oh0 * g.ow, COG * L,
                     L);
    }
    if (std::is_same_v<T, A> && bias == nullptr && !a.relu) return;
    T* os = out + s * g.co * L;
    for (int64_t c = 0; c < g.co; ++c) {
      const A bc = bias ? static_cast<A>(bias[c]) : A(0);
      for (int64_t l = 0; l < L; ++l) {
        const A v = o[c * L + l] + bc;
        os[c * L + l] = static_cast<T>(a.relu && !(v > A(0) || v != v) ? A(0) : v);  // fused ReLU keeps NaN
      }
    }
  });
}

template <typename T>
void conv2d_backward_typed(const backend::ConvBackwardArgs& b, const Geom& g) {
  using A = opmath_t<T>;
  const backend::ConvArgs& a = b.conv;
  const T* x = static_cast<const T*>(a.x.data_ptr());
  const T* wt = static_cast<const T*>(a.weight.data_ptr());
  const T* gy = static_cast<const T*>(b.grad_out.data_ptr());
  const int64_t L = g.l(), K = g.k(), KG = g.kg(), COG = g.cog();
  const int64_t xsz = g.c * g.h * g.w, ysz = g.co * L;

  // The sample's gradient rows in the accumulation type (a copy only for float16 / bfloat16).
  auto dy_of = [&](int64_t s, std::vector<A>& buf) -> const A* {
    if constexpr (std::is_same_v<T, A>) {
      return gy + s * ysz;
    } else {
      buf = widened<T, A>(gy + s * ysz, ysz);
      return buf.data();
    }
  };

  if (b.grad_x.defined()) {
    std::vector<A> wbuf;
    const A* w = nullptr;
    if constexpr (std::is_same_v<T, A>) {
      w = wt;
    } else {
      wbuf = widened<T, A>(wt, a.weight.numel());
      w = wbuf.data();
    }
    T* gx = static_cast<T*>(b.grad_x.data_ptr());
    over_batch(g.n, [&](int64_t s) {
      std::vector<A> dybuf, dcols(static_cast<size_t>(K * L)), dx(static_cast<size_t>(xsz), A(0));
      const A* dy = dy_of(s, dybuf);
      // dcols_g [KG, L] = w_g^T [KG, COG] @ dy_g [COG, L]
      gemm_groups<A>(g.groups, KG, L, COG, w, true, KG, COG * KG, dy, false, L, COG * L, dcols.data(), KG * L);
      col2im(g, dcols.data(), dx.data());
      T* gxs = gx + s * xsz;
      for (int64_t i = 0; i < xsz; ++i) gxs[i] = static_cast<T>(dx[static_cast<size_t>(i)]);
    });
  }

  if (b.grad_weight.defined()) {
    // Fixed chunks of samples, each summing into its own buffer; the chunks add up in order.
    const int64_t chunks = g.n >= get_num_threads() ? std::max<int64_t>(1, get_num_threads()) : 1;
    const int64_t per = (g.n + chunks - 1) / chunks;
    const int64_t wsz = g.co * KG;
    std::vector<std::vector<A>> part(static_cast<size_t>(chunks));
    auto run_chunk = [&](int64_t ci) {
      std::vector<A> acc(static_cast<size_t>(wsz), A(0)), tmp(static_cast<size_t>(wsz)),
          cols(static_cast<size_t>(K * L)), dybuf;
      for (int64_t s = ci * per; s < std::min(g.n, (ci + 1) * per); ++s) {
        im2col(g, x + s * xsz, cols.data());
        const A* dy = dy_of(s, dybuf);
        // dw_g [COG, KG] = dy_g [COG, L] @ cols_g^T [L, KG]
        gemm_groups<A>(g.groups, COG, KG, L, dy, false, L, COG * L, cols.data(), true, L, KG * L, tmp.data(), COG * KG);
        for (int64_t i = 0; i < wsz; ++i) acc[static_cast<size_t>(i)] += tmp[static_cast<size_t>(i)];
      }
      part[static_cast<size_t>(ci)] = std::move(acc);
    };
    if (chunks > 1) {
      parallel(0, chunks, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t ci = lo; ci < hi; ++ci) run_chunk(ci);
      });
    } else {
      run_chunk(0);
    }
    T* gw = static_cast<T*>(b.grad_weight.data_ptr());
    for (int64_t i = 0; i < wsz; ++i) {
      A v(0);
      for (const auto& p : part) v += p[static_cast<size_t>(i)];
      gw[i] = static_cast<T>(v);
    }
  }
}

}  // namespace

void conv2d(const backend::ConvArgs& a) {
  const Geom g = geometry(a);
  dispatch<Kinds::Float>("conv2d", a.x.dtype(), [&](auto tag) { conv2d_typed<decltype(tag)>(a, g); });
}

void conv2d_backward(const backend::ConvBackwardArgs& b) {
  backend::ConvArgs a = b.conv;
  a.out = b.grad_out;
  const Geom g = geometry(a);
  dispatch<Kinds::Float>("conv2d backward", a.x.dtype(), [&](auto tag) { conv2d_backward_typed<decltype(tag)>(b, g); });
}

}  // namespace tg::cpu
