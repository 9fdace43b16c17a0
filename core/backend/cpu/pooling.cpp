// CPU kernels of 2-d pooling (issue 17): the shared per-element math of core/backend/pool_window.h,
// parallel over output (forward) or input (backward) rows; each element in a fixed order.
#include <algorithm>
#include <type_traits>

#include <tapegrad/core/backend/cpu/cpu.h>
#include <tapegrad/core/backend/cpu/dispatch.h>
#include <tapegrad/core/backend/cpu/thread_pool.h>
#include <tapegrad/core/backend/pool_window.h>
#include <tapegrad/core/error.h>

namespace tg::cpu {


void pool2d(const backend::Pool2dArgs& a, const Tensor& out, const Tensor& indices, const Tensor& x) {
  dispatch<Kinds::Float>("pool2d", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = opmath_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
    int64_t* ip = indices.defined() ? static_cast<int64_t*>(indices.data_ptr()) : nullptr;
    const int64_t rows = a.planes * a.OH;
    parallel(0, rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, a.OW * a.kh * a.kw)),
             [&](int64_t lo, int64_t hi) {
               for (int64_t r = lo; r < hi; ++r) {
                 const int64_t p = r / a.OH, oh = r % a.OH;
                 const T* plane = xp + p * a.H * a.W;
                 for (int64_t ow = 0; ow < a.OW; ++ow) {
                   int64_t idx = 0;
                   const A v = backend::pool::forward_at<A>(a, plane, oh, ow, idx);
                   op[r * a.OW + ow] = T(v);
                   if (ip) ip[r * a.OW + ow] = idx;
                 }
               }
             });
  });
}

void pool2d_backward(const backend::Pool2dArgs& a, const Tensor& grad_in, const Tensor& grad_out,
                     const Tensor& indices) {
  dispatch<Kinds::Float>("pool2d backward", grad_out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = opmath_t<T>;
    const T* gp = static_cast<const T*>(grad_out.data_ptr());
    T* gi = static_cast<T*>(grad_in.data_ptr());
    const int64_t* ip = indices.defined() ? static_cast<const int64_t*>(indices.data_ptr()) : nullptr;
    const int64_t rows = a.planes * a.H;
    parallel(0, rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, a.W)), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t p = r / a.H, h = r % a.H;
        const T* g = gp + p * a.OH * a.OW;
        const int64_t* pi = ip ? ip + p * a.OH * a.OW : nullptr;
        for (int64_t w = 0; w < a.W; ++w) gi[r * a.W + w] = T(backend::pool::backward_at<A>(a, g, pi, h, w));
      }
    });
  });
}

}  // namespace tg::cpu
