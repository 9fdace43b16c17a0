// The per-element math of interpolate (backend::Upsample2dArgs), shared by the CPU loops and the
// CUDA kernels so both give the same answer. Index formulas are PyTorch's CPU ones
// (UpSample.h: nearest_idx, area_pixel_compute_scale / _source_index, guard_index_and_lambda):
// nearest reads floor(o * s) in float with s = 1 / scale_factor or in / out; linear reads
// src = r * (o + 0.5) - 0.5 (clamped at 0), or r * o with align_corners and r = (in - 1) / (out - 1),
// in the accumulation type A (double for float64, else float). Backward gathers: an input element
// sums over the (contiguous, since the maps are monotone) range of outputs that read it.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include <tapegrad/core/backend/backend.h>
#include <tapegrad/core/half.h>

namespace tg::backend::upsample {

// One axis: `in` elements read by `out` outputs.
template <class A>
struct Axis {
  int64_t in = 1, out = 1;
  bool nearest = true, align_corners = false;
  float nearest_scale = 1;  // PyTorch computes the nearest index in float
  A ratio = 1;
};

template <class A>
TG_HOST_DEVICE inline Axis<A> make_axis(const Upsample2dArgs& a, int64_t in, int64_t out, double scale) {
  Axis<A> ax;
  ax.in = in;
  ax.out = out;
  ax.nearest = a.mode == UpsampleMode::Nearest;
  ax.align_corners = a.align_corners;
  ax.nearest_scale = scale > 0 ? static_cast<float>(1.0 / scale) : static_cast<float>(in) / static_cast<float>(out);
  if (a.align_corners)
    ax.ratio = out > 1 ? static_cast<A>(in - 1) / static_cast<A>(out - 1) : A(0);
  else
    ax.ratio = scale > 0 ? static_cast<A>(1.0 / scale) : static_cast<A>(in) / static_cast<A>(out);
  return ax;
}

// The inputs i0 <= i1 that output o reads, with weights l0, l1 (nearest: i0 = i1, l0 = 1, l1 = 0).
template <class A>
TG_HOST_DEVICE inline void tap(const Axis<A>& ax, int64_t o, int64_t& i0, int64_t& i1, A& l0, A& l1) {
  if (ax.out == ax.in) {  // equal sizes: a copy (PyTorch's CPU shortcut)
    i0 = i1 = o;
    l0 = A(1);
    l1 = A(0);
    return;
  }
  if (ax.nearest) {
    int64_t i = ax.out == 2 * ax.in ? (o >> 1)
                                    : static_cast<int64_t>(floorf(static_cast<float>(o) * ax.nearest_scale));
    i0 = i1 = i < ax.in - 1 ? i : ax.in - 1;
    l0 = A(1);
    l1 = A(0);
    return;
  }
  A src = ax.align_corners ? ax.ratio * static_cast<A>(o) : ax.ratio * (static_cast<A>(o) + A(0.5)) - A(0.5);
  if (!ax.align_corners && src < A(0)) src = A(0);
  int64_t i;
  if constexpr (std::is_same_v<A, double>)
    i = static_cast<int64_t>(floor(src));
  else
    i = static_cast<int64_t>(floorf(src));
  i0 = i < ax.in - 1 ? i : ax.in - 1;
  A l = src - static_cast<A>(i0);
  l1 = l < A(0) ? A(0) : (l > A(1) ? A(1) : l);
  l0 = A(1) - l1;
  i1 = i0 + (i0 < ax.in - 1 ? 1 : 0);
}

// The weight with which output o reads input i (0 when it does not).
template <class A>
TG_HOST_DEVICE inline A weight_of(const Axis<A>& ax, int64_t o, int64_t i, int64_t& i0) {
  int64_t i1;
  A l0, l1;
  tap(ax, o, i0, i1, l0, l1);
  A w(0);
  if (i0 == i) w += l0;
  if (i1 == i) w += l1;
  return w;
}

// The first output whose taps reach input i or beyond (i1(o) >= i; i1 is nondecreasing in o).
template <class A>
TG_HOST_DEVICE inline int64_t first_output(const Axis<A>& ax, int64_t i) {
  int64_t lo = 0, hi = ax.out;  // answer in [lo, hi]
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    int64_t i0, i1;
    A l0, l1;
    tap(ax, mid, i0, i1, l0, l1);
    if (i1 >= i)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

template <class A, class T>
TG_HOST_DEVICE inline A load(T v) {
  if constexpr (std::is_same_v<T, double>)
    return v;
  else
    return static_cast<A>(static_cast<float>(v));
}

// Output (oh, ow) of one plane.
template <class A, class T>
TG_HOST_DEVICE inline A forward_at(const Axis<A>& ah, const Axis<A>& aw, const T* plane, int64_t W, int64_t oh,
                                   int64_t ow) {
  int64_t h0, h1, w0, w1;
  A lh0, lh1, lw0, lw1;
  tap(ah, oh, h0, h1, lh0, lh1);
  tap(aw, ow, w0, w1, lw0, lw1);
  if (ah.nearest) return load<A>(plane[h0 * W + w0]);
  const T* r0 = plane + h0 * W;
  const T* r1 = plane + h1 * W;
  return lh0 * (lw0 * load<A>(r0[w0]) + lw1 * load<A>(r0[w1])) + lh1 * (lw0 * load<A>(r1[w0]) + lw1 * load<A>(r1[w1]));
}

// The gradient of input (h, w) of one plane from that plane's grad_out g [OH, OW]: rows in order,
// each row's columns in order.
template <class A, class T>
TG_HOST_DEVICE inline A backward_at(const Axis<A>& ah, const Axis<A>& aw, const T* g, int64_t OW, int64_t h,
                                    int64_t w) {
  A acc(0);
  const int64_t ow_first = first_output(aw, w);
  for (int64_t oh = first_output(ah, h); oh < ah.out; ++oh) {
    int64_t hi0;
    const A wh = weight_of(ah, oh, h, hi0);
    if (hi0 > h) break;
    A row(0);
    for (int64_t ow = ow_first; ow < aw.out; ++ow) {
      int64_t wi0;
      const A ww = weight_of(aw, ow, w, wi0);
      if (wi0 > w) break;
      row += ww * load<A>(g[oh * OW + ow]);
    }
    acc += wh * row;
  }
  return acc;
}

}  // namespace tg::backend::upsample
