// The per-element math of 2-d pooling (backend::Pool2dArgs), shared by the CPU loops and the CUDA
// kernels so both give the same answer: one output element forward, one input element backward
// (a gather over the windows that contain it, in a fixed order). T: the storage type (float,
// double, tg::Half, tg::BFloat16), A: the accumulation type (double for double, else float).
#pragma once
#include <cstdint>
#include <type_traits>

#include <tapegrad/core/backend/backend.h>
#include <tapegrad/core/half.h>

namespace tg::backend::pool {

TG_HOST_DEVICE inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
TG_HOST_DEVICE inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
// floor(a / b) for b > 0 and any a.
TG_HOST_DEVICE inline int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

template <class A, class T>
TG_HOST_DEVICE inline A load(T v) {
  if constexpr (std::is_same_v<T, double>)
    return v;
  else
    return static_cast<A>(static_cast<float>(v));
}

// Avg: the divisor of output (oh, ow), and its in-range window [h0, h1) x [w0, w1).
TG_HOST_DEVICE inline int64_t avg_window(const Pool2dArgs& a, int64_t oh, int64_t ow, int64_t& h0, int64_t& h1,
                                         int64_t& w0, int64_t& w1) {
  h0 = oh * a.sh - a.ph;
  w0 = ow * a.sw - a.pw;
  h1 = imin(h0 + a.kh, a.H + a.ph);
  w1 = imin(w0 + a.kw, a.W + a.pw);
  const int64_t padded = (h1 - h0) * (w1 - w0);
  h0 = imax(h0, 0);
  w0 = imax(w0, 0);
  h1 = imin(h1, a.H);
  w1 = imin(w1, a.W);
  if (a.divisor > 0) return a.divisor;
  return a.count_include_pad ? padded : (h1 - h0) * (w1 - w0);
}

TG_HOST_DEVICE inline int64_t adaptive_start(int64_t o, int64_t in, int64_t out) { return (o * in) / out; }
TG_HOST_DEVICE inline int64_t adaptive_end(int64_t o, int64_t in, int64_t out) {
  return ((o + 1) * in + out - 1) / out;
}

// Output element (oh, ow) of plane x; idx receives the argmax (Max only).
template <class A, class T>
TG_HOST_DEVICE A forward_at(const Pool2dArgs& a, const T* x, int64_t oh, int64_t ow, int64_t& idx) {
  if (a.kind == PoolKind::Max) {
    const int64_t h0 = oh * a.sh - a.ph, w0 = ow * a.sw - a.pw;
    A best = 0;
    idx = -1;
    for (int64_t i = 0; i < a.kh; ++i) {
      const int64_t h = h0 + i * a.dh;
      if (h < 0 || h >= a.H) continue;
      for (int64_t j = 0; j < a.kw; ++j) {
        const int64_t w = w0 + j * a.dw;
        if (w < 0 || w >= a.W) continue;
        const A v = load<A>(x[h * a.W + w]);
        if (idx < 0 || v > best || v != v) {  // as PyTorch: a later NaN takes over
          best = v;
          idx = h * a.W + w;
        }
      }
    }
    return best;
  }
  int64_t h0, h1, w0, w1, div;
  if (a.kind == PoolKind::Avg) {
    div = avg_window(a, oh, ow, h0, h1, w0, w1);
  } else {
    h0 = adaptive_start(oh, a.H, a.OH);
    h1 = adaptive_end(oh, a.H, a.OH);
    w0 = adaptive_start(ow, a.W, a.OW);
    w1 = adaptive_end(ow, a.W, a.OW);
    div = (h1 - h0) * (w1 - w0);
  }
  if (h0 >= h1 || w0 >= w1) return A(0);
  A s = 0;
  for (int64_t h = h0; h < h1; ++h)
    for (int64_t w = w0; w < w1; ++w) s += load<A>(x[h * a.W + w]);
  return s / static_cast<A>(div);
}

// The gradient of input element (h, w) of a plane from that plane's grad_out g (and indices).
template <class A, class T>
TG_HOST_DEVICE A backward_at(const Pool2dArgs& a, const T* g, const int64_t* indices, int64_t h, int64_t w) {
  A s = 0;
  if (a.kind == PoolKind::AdaptiveAvg) {
    for (int64_t oh = (h * a.OH) / a.H; oh < a.OH && adaptive_start(oh, a.H, a.OH) <= h; ++oh) {
      const int64_t h0 = adaptive_start(oh, a.H, a.OH), h1 = adaptive_end(oh, a.H, a.OH);
      if (h >= h1) continue;
      for (int64_t ow = (w * a.OW) / a.W; ow < a.OW && adaptive_start(ow, a.W, a.OW) <= w; ++ow) {
        const int64_t w0 = adaptive_start(ow, a.W, a.OW), w1 = adaptive_end(ow, a.W, a.OW);
        if (w >= w1) continue;
        s += load<A>(g[oh * a.OW + ow]) / static_cast<A>((h1 - h0) * (w1 - w0));
      }
    }
    return s;
  }
  // Windows whose row span oh * sh - ph + [0, (kh - 1) * dh] holds h (likewise for w).
  const int64_t oh_lo = imax(0, floor_div(h + a.ph - (a.kh - 1) * a.dh + a.sh - 1, a.sh));
  const int64_t oh_hi = imin(a.OH - 1, floor_div(h + a.ph, a.sh));
  const int64_t ow_lo = imax(0, floor_div(w + a.pw - (a.kw - 1) * a.dw + a.sw - 1, a.sw));
  const int64_t ow_hi = imin(a.OW - 1, floor_div(w + a.pw, a.sw));
  const int64_t self = h * a.W + w;
  for (int64_t oh = oh_lo; oh <= oh_hi; ++oh)
    for (int64_t ow = ow_lo; ow <= ow_hi; ++ow) {
      const int64_t o = oh * a.OW + ow;
      if (a.kind == PoolKind::Max) {
        if (indices[o] == self) s += load<A>(g[o]);
      } else {
        int64_t h0, h1, w0, w1;
        const int64_t div = avg_window(a, oh, ow, h0, h1, w0, w1);
        s += load<A>(g[o]) / static_cast<A>(div);
      }
    }
  return s;
}

}  // namespace tg::backend::pool
