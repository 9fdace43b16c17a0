// CPU index_add: out[o, index[j], i] += src[o, j, i] over contiguous [outer, n, inner]
// views. Parallel over outer*inner columns, serial over j, so repeated indices never race.
#include <tapegrad/core/backend/cpu/cpu.h>
#include <tapegrad/core/backend/cpu/thread_pool.h>
#include <tapegrad/core/dtype.h>
#include <tapegrad/core/error.h>

#include <vector>

namespace tg::cpu {

void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  TG_CHECK(out.dtype() == src.dtype() && is_floating(out.dtype()), "index_add: dtypes ", out.dtype(), " and ",
           src.dtype(), " (expected one floating dtype)");
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= out.sizes()[d];
  for (int64_t d = dim + 1; d < out.dim(); ++d) inner *= out.sizes()[d];
  const int64_t out_dim = out.dim() > 0 ? out.sizes()[dim] : 1, n = index.numel();
  const bool is64 = index.dtype() == kInt64;
  const void* ip = index.data_ptr();
  auto idx = [&](int64_t j) {
    return is64 ? static_cast<const int64_t*>(ip)[j] : static_cast<int64_t>(static_cast<const int32_t*>(ip)[j]);
  };
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, Half> ||
                  std::is_same_v<T, BFloat16>) {
      using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
      T* o = static_cast<T*>(out.data_ptr());
      const T* s = static_cast<const T*>(src.data_ptr());
      parallel_for(0, outer * inner, 4096, [&](int64_t lo, int64_t hi) {
        for (int64_t c = lo; c < hi; ++c) {
          const int64_t a = c / inner, i = c % inner;
          for (int64_t j = 0; j < n; ++j) {
            T& dst = o[(a * out_dim + idx(j)) * inner + i];
            dst = T(static_cast<Acc>(dst) + static_cast<Acc>(s[(a * n + j) * inner + i]));
          }
        }
      });
    }
  });
}

void add_n(const Tensor& out, const std::vector<Tensor>& inputs) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, Half> ||
                  std::is_same_v<T, BFloat16>) {
      using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
      T* o = static_cast<T*>(out.data_ptr());
      std::vector<const T*> in;
      in.reserve(inputs.size());
      for (const Tensor& t : inputs) in.push_back(static_cast<const T*>(t.data_ptr()));
      parallel_for(0, out.numel(), 16384, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          Acc acc = 0;
          for (const T* p : in) acc += static_cast<Acc>(p[i]);
          o[i] = T(acc);
        }
      });
    } else {
      TG_ERROR("add_n: dtype ", out.dtype(), " is not floating");
    }
  });
}

}  // namespace tg::cpu
