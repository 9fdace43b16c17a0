// CPU kernels of issue 15's general ops: gather / scatter along a dim over strided operands,
// row-wise inclusive prefix sums, and the stable row sort behind sort / argsort / topk.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

#include <tapegrad/core/backend/cpu/cpu.h>
#include <tapegrad/core/backend/cpu/thread_pool.h>
#include <tapegrad/core/dtype.h>
#include <tapegrad/core/error.h>

namespace tg::cpu {

namespace {

char* base_of(const Tensor& t) {
  return static_cast<char*>(t.impl().storage->data()) + t.storage_offset() * static_cast<int64_t>(t.element_size());
}

// Walks the positions of index's shape in row-major order from flat position `lo`, calling
// f(flat, coord) for each of [lo, hi).
template <class F>
void for_positions(const Shape& sizes, int64_t lo, int64_t hi, F&& f) {
  const int nd = static_cast<int>(sizes.size());
  std::vector<int64_t> coord(static_cast<size_t>(nd), 0);
  int64_t rest = lo;
  for (int d = nd - 1; d >= 0; --d) {
    coord[d] = rest % sizes[d];
    rest /= sizes[d];
  }
  for (int64_t i = lo; i < hi; ++i) {
    f(i, coord.data());
    for (int d = nd - 1; d >= 0; --d) {
      if (++coord[d] < sizes[d]) break;
      coord[d] = 0;
    }
  }
}

// Element offset of `coord` in t, with coord[dim] replaced by `at`.
int64_t offset_with(const Tensor& t, const int64_t* coord, int64_t dim, int64_t at) {
  int64_t off = 0;
  for (int64_t d = 0; d < t.dim(); ++d) off += (d == dim ? at : coord[d]) * t.strides()[d];
  return off;
}
int64_t offset_of(const Tensor& t, const int64_t* coord) {
  int64_t off = 0;
  for (int64_t d = 0; d < t.dim(); ++d) off += coord[d] * t.strides()[d];
  return off;
}

}  // namespace

void gather(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index) {
  const size_t es = in.element_size();
  const char* src = base_of(in);
  char* dst = base_of(out);
  const int64_t* idx = reinterpret_cast<const int64_t*>(base_of(index));
  parallel_for(0, index.numel(), 16384, [&](int64_t lo, int64_t hi) {
    for_positions(index.sizes(), lo, hi, [&](int64_t i, const int64_t* c) {
      const int64_t at = idx[offset_of(index, c)];
      std::memcpy(dst + i * static_cast<int64_t>(es), src + offset_with(in, c, dim, at) * static_cast<int64_t>(es), es);
    });
  });
}

void scatter(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate) {
  const int64_t* idx = reinterpret_cast<const int64_t*>(base_of(index));
  char* dst = base_of(out);
  const char* s = base_of(src);
  // Serial: repeated indices must not race (and for the set form the last write wins, as on
  // PyTorch's CPU).
  if (!accumulate) {
    const size_t es = out.element_size();
    for_positions(index.sizes(), 0, index.numel(), [&](int64_t, const int64_t* c) {
      const int64_t at = idx[offset_of(index, c)];
      std::memcpy(dst + offset_with(out, c, dim, at) * static_cast<int64_t>(es),
                  s + offset_of(src, c) * static_cast<int64_t>(es), es);
    });
    return;
  }
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      TG_ERROR("scatter_add: dtype bool is not supported");
    } else {
      using Acc = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;
      T* o = reinterpret_cast<T*>(dst);
      const T* v = reinterpret_cast<const T*>(s);
      for_positions(index.sizes(), 0, index.numel(), [&](int64_t, const int64_t* c) {
        T& d = o[offset_with(out, c, dim, idx[offset_of(index, c)])];
        d = T(static_cast<Acc>(d) + static_cast<Acc>(v[offset_of(src, c)]));
      });
    }
  });
}

void cumsum(const Tensor& out, const Tensor& in) {
  const int64_t rows = in.size(0), n = in.size(1);
  auto run = [&](auto in_tag, auto out_tag, auto acc_tag) {
    using I = decltype(in_tag);
    using O = decltype(out_tag);
    using A = decltype(acc_tag);
    const I* x = static_cast<const I*>(in.data_ptr());
    O* y = static_cast<O*>(out.data_ptr());
    parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        A acc = 0;
        for (int64_t j = 0; j < n; ++j) {
          acc += static_cast<A>(x[r * n + j]);
          y[r * n + j] = O(acc);
        }
      }
    });
  };
  visit_dtype(in.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {  // int64 / int32 / bool into int64
      TG_CHECK(out.dtype() == kInt64, "cumsum: integer input needs an int64 output, got ", out.dtype());
      run(T{}, int64_t{}, int64_t{});
    } else {
      TG_CHECK(out.dtype() == in.dtype(), "cumsum: output dtype ", out.dtype(), " for input ", in.dtype());
      using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
      run(T{}, T{}, A{});
    }
  });
}

void sort(const Tensor& values, const Tensor& indices, const Tensor& in, bool descending) {
  const int64_t rows = in.size(0), n = in.size(1);
  visit_dtype(in.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using K = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;
    const T* x = static_cast<const T*>(in.data_ptr());
    T* v = static_cast<T*>(values.data_ptr());
    int64_t* ix = static_cast<int64_t*>(indices.data_ptr());
    parallel_for(0, rows, 1, [&](int64_t lo, int64_t hi) {
      std::vector<int64_t> perm(static_cast<size_t>(n));
      for (int64_t r = lo; r < hi; ++r) {
        const T* row = x + r * n;
        std::iota(perm.begin(), perm.end(), int64_t{0});
        // NaN is the largest value (PyTorch's order); ties keep their order (stable).
        auto less = [&](int64_t a, int64_t b) {
          const K ka = static_cast<K>(row[a]), kb = static_cast<K>(row[b]);
          if constexpr (std::is_floating_point_v<K>) {
            if (std::isnan(kb)) return !std::isnan(ka);
            if (std::isnan(ka)) return false;
          }
          return ka < kb;
        };
        if (descending)
          std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) { return less(b, a); });
        else
          std::stable_sort(perm.begin(), perm.end(), less);
        for (int64_t j = 0; j < n; ++j) {
          v[r * n + j] = row[perm[j]];
          ix[r * n + j] = perm[j];
        }
      }
    });
  });
}

}  // namespace tg::cpu
