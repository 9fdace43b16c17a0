// CPU mse_loss forward and backward: direct loops over contiguous input and
// target. Reductions accumulate in double over fixed chunks merged in order, so
// the result does not depend on the number of threads.
#include <algorithm>
#include <cstdint>
#include <vector>

#include <tapegrad/core/backend/cpu/cpu.h>
#include <tapegrad/core/backend/cpu/dispatch.h>
#include <tapegrad/core/backend/cpu/loops.h>
#include <tapegrad/core/backend/cpu/thread_pool.h>
#include <tapegrad/core/error.h>

namespace tg::cpu {

namespace {

using backend::LossReduction;

constexpr int64_t kChunk = 1 << 16;  // elements per partial sum of a reduction

}  // namespace

void mse_loss(const Tensor& out, const Tensor& input, const Tensor& target, LossReduction r) {
  const int64_t n = input.numel();
  dispatch<Kinds::Float>("mse_loss", input.dtype(), [&](auto zero) {
    using T = decltype(zero);
    using A = opmath_t<T>;
    const T* a = static_cast<const T*>(input.data_ptr());
    const T* b = static_cast<const T*>(target.data_ptr());
    T* o = static_cast<T*>(out.data_ptr());
    if (r == LossReduction::None) {
      parallel(0, n, kGrain, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          const A d = static_cast<A>(a[i]) - static_cast<A>(b[i]);
          o[i] = static_cast<T>(d * d);
        }
      });
      return;
    }
    const int64_t chunks = std::max<int64_t>(1, (n + kChunk - 1) / kChunk);
    std::vector<double> part(static_cast<size_t>(chunks), 0.0);
    parallel(0, chunks, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t c = lo; c < hi; ++c) {
        double s = 0;
        for (int64_t i = c * kChunk, e = std::min(n, (c + 1) * kChunk); i < e; ++i) {
          const double d = static_cast<double>(static_cast<A>(a[i])) - static_cast<double>(static_cast<A>(b[i]));
          s += d * d;
        }
        part[static_cast<size_t>(c)] = s;
      }
    });
    double total = 0;
    for (double s : part) total += s;
    if (r == LossReduction::Mean) total /= static_cast<double>(n);  // 0 / 0 = NaN for an empty input
    if constexpr (std::is_same_v<T, double>)
      o[0] = total;
    else
      o[0] = static_cast<T>(static_cast<float>(total));
  });
}

void mse_loss_backward(const Tensor& grad_input, const Tensor& grad_target, const Tensor& grad, const Tensor& input,
                       const Tensor& target, LossReduction r) {
  const int64_t n = input.numel();
  const bool per_element = r == LossReduction::None && grad.numel() == n;
  const double norm = r == LossReduction::Mean ? 2.0 / static_cast<double>(n) : 2.0;
  dispatch<Kinds::Float>("mse_loss_backward", input.dtype(), [&](auto zero) {
    using T = decltype(zero);
    using A = opmath_t<T>;
    const T* a = static_cast<const T*>(input.data_ptr());
    const T* b = static_cast<const T*>(target.data_ptr());
    const T* g = static_cast<const T*>(grad.data_ptr());
    T* gi = grad_input.defined() ? static_cast<T*>(grad_input.data_ptr()) : nullptr;
    T* gt = grad_target.defined() ? static_cast<T*>(grad_target.data_ptr()) : nullptr;
    const A c = static_cast<A>(norm);
    const A g0 = static_cast<A>(g[0]);
    parallel(0, n, kGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const A gv = per_element ? static_cast<A>(g[i]) : g0;
        const A v = c * (static_cast<A>(a[i]) - static_cast<A>(b[i])) * gv;
        if (gi) gi[i] = static_cast<T>(v);
        if (gt) gt[i] = static_cast<T>(-v);
      }
    });
  });
}

}  // namespace tg::cpu
