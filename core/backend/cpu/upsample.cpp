// CPU kernels of interpolate (issue 17): the shared per-element math of
// core/backend/upsample_index.h, parallel over output (forward) or input (backward) rows; each
// element in a fixed order, so the CPU and CUDA give the same answer.
#include <algorithm>
#include <type_traits>

#include <tapegrad/core/backend/cpu/cpu.h>
#include <tapegrad/core/backend/cpu/dispatch.h>
#include <tapegrad/core/backend/cpu/thread_pool.h>
#include <tapegrad/core/backend/upsample_index.h>
#include <tapegrad/core/error.h>

namespace tg::cpu {


void upsample2d(const backend::Upsample2dArgs& a, const Tensor& out, const Tensor& x) {
  dispatch<Kinds::Float>("interpolate", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = opmath_t<T>;
    namespace up = backend::upsample;
    const auto ah = up::make_axis<A>(a, a.H, a.OH, a.scale_h), aw = up::make_axis<A>(a, a.W, a.OW, a.scale_w);
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
    parallel(0, a.planes * a.OH, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, a.OW)), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t p = r / a.OH, oh = r % a.OH;
        const T* plane = xp + p * a.H * a.W;
        for (int64_t ow = 0; ow < a.OW; ++ow) op[r * a.OW + ow] = T(up::forward_at<A>(ah, aw, plane, a.W, oh, ow));
      }
    });
  });
}

void upsample2d_backward(const backend::Upsample2dArgs& a, const Tensor& grad_in, const Tensor& grad_out) {
  dispatch<Kinds::Float>("interpolate backward", grad_out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = opmath_t<T>;
    namespace up = backend::upsample;
    const auto ah = up::make_axis<A>(a, a.H, a.OH, a.scale_h), aw = up::make_axis<A>(a, a.W, a.OW, a.scale_w);
    const T* gp = static_cast<const T*>(grad_out.data_ptr());
    T* gi = static_cast<T*>(grad_in.data_ptr());
    parallel(0, a.planes * a.H, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, a.W)), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t p = r / a.H, h = r % a.H;
        const T* g = gp + p * a.OH * a.OW;
        for (int64_t w = 0; w < a.W; ++w) gi[r * a.W + w] = T(up::backward_at<A>(ah, aw, g, a.OW, h, w));
      }
    });
  });
}

}  // namespace tg::cpu
