// A tiny, independent float64 reference for the op tests: host tensors of
// doubles with broadcasting, reductions, matmul (naive loops), plus helpers to
// build device/dtype/layout test inputs and compare a tg::Tensor against a
// reference. Nothing here calls the library's kernels to compute a result: a
// tensor is read element by element through its strides after .cpu().
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.h>

namespace tg::testing {

using Dims = std::vector<int64_t>;

inline int64_t numel_of(const Dims& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

inline std::string dims_str(const Dims& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

// Row-major multi-index of flat index i.
inline Dims unravel(int64_t i, const Dims& shape) {
  Dims idx(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    idx[d] = shape[d] ? i % shape[d] : 0;
    i = shape[d] ? i / shape[d] : 0;
  }
  return idx;
}

template <typename T>
double as_double(T x) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    return static_cast<double>(static_cast<float>(x));
  else
    return static_cast<double>(x);
}

// Host value of type T nearest to x (as a cast in C++: ints truncate, bool is x != 0).
template <typename T>
T from_double(double x) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    return T(static_cast<float>(x));
  else if constexpr (std::is_same_v<T, bool>)
    return x != 0;
  else
    return static_cast<T>(x);
}

struct RefTensor {
  Dims shape;
  std::vector<double> v;

  RefTensor() = default;
  RefTensor(Dims s, std::vector<double> vals) : shape(std::move(s)), v(std::move(vals)) {}
  explicit RefTensor(Dims s, double fill = 0) : shape(std::move(s)), v(static_cast<size_t>(numel_of(shape)), fill) {}

  int64_t numel() const { return static_cast<int64_t>(v.size()); }
  int64_t dim() const { return static_cast<int64_t>(shape.size()); }

  // Reads any tensor element by element through its sizes/strides (on the host).
  static RefTensor from(const Tensor& t) {
    Tensor h = t.cpu();
    RefTensor r;
    r.shape.assign(h.sizes().begin(), h.sizes().end());
    r.v.resize(static_cast<size_t>(h.numel()));
    if (h.numel() == 0) return r;
    const auto& st = h.strides();
    visit_dtype(h.dtype(), [&](auto zero) {
      using T = decltype(zero);
      const T* base = static_cast<const T*>(h.data_ptr());
      for (int64_t i = 0; i < h.numel(); ++i) {
        Dims idx = unravel(i, r.shape);
        int64_t off = 0;
        for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * st[d];
        r.v[i] = as_double(base[off]);
      }
    });
    return r;
  }

  double at(const Dims& idx) const {
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d) off = off * shape[d] + idx[d];
    return v[off];
  }
};

// Broadcast shape as NumPy does (shapes assumed compatible).
inline Dims broadcast(const Dims& a, const Dims& b) {
  size_t n = std::max(a.size(), b.size());
  Dims out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Element of `t` seen broadcast to `out_shape` at out index idx.
inline double bcast_at(const RefTensor& t, const Dims& idx) {
  int64_t off = 0;
  size_t lead = idx.size() - t.shape.size();
  for (size_t d = 0; d < t.shape.size(); ++d) off = off * t.shape[d] + (t.shape[d] == 1 ? 0 : idx[lead + d]);
  return t.v[off];
}

inline RefTensor ref_unary(const RefTensor& a, const std::function<double(double)>& f) {
  RefTensor r(a.shape);
  for (size_t i = 0; i < a.v.size(); ++i) r.v[i] = f(a.v[i]);
  return r;
}

inline RefTensor ref_binary(const RefTensor& a, const RefTensor& b, const std::function<double(double, double)>& f) {
  RefTensor r(broadcast(a.shape, b.shape));
  for (int64_t i = 0; i < r.numel(); ++i) {
    Dims idx = unravel(i, r.shape);
    r.v[i] = f(bcast_at(a, idx), bcast_at(b, idx));
  }
  return r;
}

inline RefTensor ref_where(const RefTensor& c, const RefTensor& a, const RefTensor& b) {
  RefTensor r(broadcast(broadcast(c.shape, a.shape), b.shape));
  for (int64_t i = 0; i < r.numel(); ++i) {
    Dims idx = unravel(i, r.shape);
    r.v[i] = bcast_at(c, idx) != 0 ? bcast_at(a, idx) : bcast_at(b, idx);
  }
  return r;
}

// Reduction over a set of dims (empty = all). `f` gets the reduced values in
// row-major order and returns the result.
inline RefTensor ref_reduce(const RefTensor& a, Dims dims, bool keepdim,
                            const std::function<double(const std::vector<double>&)>& f) {
  int64_t nd = a.dim();
  std::vector<bool> red(static_cast<size_t>(nd), dims.empty());
  for (int64_t d : dims) red[static_cast<size_t>(d < 0 ? d + nd : d)] = true;
  Dims out_shape, kept_shape;
  for (int64_t d = 0; d < nd; ++d) {
    if (red[d]) {
      if (keepdim) out_shape.push_back(1);
    } else {
      out_shape.push_back(a.shape[d]);
    }
    kept_shape.push_back(red[d] ? 1 : a.shape[d]);
  }
  int64_t nout = numel_of(kept_shape);
  std::vector<std::vector<double>> groups(static_cast<size_t>(nout));
  for (int64_t i = 0; i < a.numel(); ++i) {
    Dims idx = unravel(i, a.shape);
    int64_t o = 0;
    for (int64_t d = 0; d < nd; ++d) o = o * kept_shape[d] + (red[d] ? 0 : idx[d]);
    groups[o].push_back(a.v[i]);
  }
  RefTensor r(out_shape);
  for (int64_t o = 0; o < nout; ++o) r.v[o] = f(groups[o]);
  return r;
}

inline double ref_sum_of(const std::vector<double>& x) {
  double s = 0;
  for (double e : x) s += e;
  return s;
}
inline double ref_mean_of(const std::vector<double>& x) { return ref_sum_of(x) / static_cast<double>(x.size()); }
inline double ref_var_of(const std::vector<double>& x, int64_t correction) {
  double m = ref_mean_of(x), s = 0;
  for (double e : x) s += (e - m) * (e - m);
  return s / static_cast<double>(static_cast<int64_t>(x.size()) - correction);
}
inline double ref_max_of(const std::vector<double>& x) { return *std::max_element(x.begin(), x.end()); }
inline double ref_min_of(const std::vector<double>& x) { return *std::min_element(x.begin(), x.end()); }
// First index of the maximum, as torch.argmax.
inline double ref_argmax_of(const std::vector<double>& x) {
  return static_cast<double>(std::max_element(x.begin(), x.end()) - x.begin());
}

// torch.matmul semantics in double: 1-D operands are promoted then squeezed,
// batch dims broadcast.
inline RefTensor ref_matmul(const RefTensor& a0, const RefTensor& b0) {
  RefTensor a = a0, b = b0;
  bool a_vec = a.dim() == 1, b_vec = b.dim() == 1;
  if (a_vec) a.shape.insert(a.shape.begin(), 1);
  if (b_vec) b.shape.push_back(1);
  int64_t m = a.shape[a.dim() - 2], k = a.shape[a.dim() - 1], n = b.shape[b.dim() - 1];
  Dims ab(a.shape.begin(), a.shape.end() - 2), bb(b.shape.begin(), b.shape.end() - 2);
  Dims batch = broadcast(ab, bb);
  Dims out_shape = batch;
  out_shape.push_back(m);
  out_shape.push_back(n);
  RefTensor r(out_shape);
  int64_t nb = numel_of(batch);
  for (int64_t bi = 0; bi < nb; ++bi) {
    Dims bidx = unravel(bi, batch);
    auto base_off = [&](const Dims& bs, int64_t mat) {
      int64_t off = 0;
      size_t lead = bidx.size() - bs.size();
      for (size_t d = 0; d < bs.size(); ++d) off = off * bs[d] + (bs[d] == 1 ? 0 : bidx[lead + d]);
      return off * mat;
    };
    int64_t ao = base_off(ab, m * k), bo = base_off(bb, k * n);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) s += a.v[ao + i * k + p] * b.v[bo + p * n + j];
        r.v[bi * m * n + i * n + j] = s;
      }
  }
  Dims final_shape = batch;
  if (!a_vec) final_shape.push_back(m);
  if (!b_vec) final_shape.push_back(n);
  r.shape = final_shape;
  return r;
}

// ---- tolerances, with the reasoning in one place.
struct Tol {
  double atol, rtol;
};
// The reference sees the inputs exactly as the tensor holds them (already
// rounded to the dtype), so the tolerance only has to cover the op's own error:
//  - float64: accumulated rounding of a few double ops: 1e-12.
//  - float32: a few ulps (2^-24 ~ 6e-8) of float math, transcendentals within
//    ~2 ulp on CPU libm and CUDA's fast paths: rtol 1e-5, atol 1e-6 for results near 0.
//  - float16: computed in float ("opmath") then rounded once to half: half an ulp is
//    2^-11 ~ 4.9e-4, so rtol 1e-3 gives one rounding plus float error; atol covers subnormals.
//  - bfloat16: same reasoning with 8 mantissa bits: 2^-8 ~ 3.9e-3, rtol 8e-3.
//  - integers and bool: exact.
inline Tol tol_for(DType t) {
  switch (t) {
    case kFloat64:
      return {1e-12, 1e-12};
    case kFloat32:
      return {1e-6, 1e-5};
    case kFloat16:
      return {1e-5, 1e-3};
    case kBFloat16:
      return {1e-5, 8e-3};
    default:
      return {0, 0};
  }
}

// Compares values and shape; prints the first mismatching index and how many differ.
inline ::testing::AssertionResult close_to(const Tensor& got, const RefTensor& want, double atol, double rtol) {
  Dims gs(got.sizes().begin(), got.sizes().end());
  if (gs != want.shape)
    return ::testing::AssertionFailure() << "shape: got " << dims_str(gs) << ", want " << dims_str(want.shape);
  RefTensor g = RefTensor::from(got);
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < g.numel(); ++i) {
    double x = g.v[i], y = want.v[i];
    bool ok = (std::isnan(x) && std::isnan(y)) || (x == y) || std::abs(x - y) <= atol + rtol * std::abs(y);
    if (!ok) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(10);
  os << bad << " of " << g.numel() << " elements differ (atol " << atol << ", rtol " << rtol << "); first at index "
     << dims_str(unravel(first, want.shape)) << ": got " << g.v[first] << ", want " << want.v[first] << " (dtype "
     << got.dtype() << ", device " << got.device() << ")";
  return ::testing::AssertionFailure() << os.str();
}

inline void expect_close(const Tensor& got, const RefTensor& want, double atol, double rtol) {
  EXPECT_TRUE(close_to(got, want, atol, rtol));
}
inline void expect_close(const Tensor& got, const RefTensor& want, Tol t) { expect_close(got, want, t.atol, t.rtol); }
inline void expect_close(const Tensor& got, const RefTensor& want) { expect_close(got, want, tol_for(got.dtype())); }

// ---- devices and inputs

inline std::vector<Device> devices() {
  std::vector<Device> d{Device(kCPU)};
  if (cuda::is_available()) d.emplace_back(kCUDA);
  return d;
}

#define TG_SKIP_IF_NO_CUDA(dev)                                                           \
  do {                                                                                    \
    if ((dev).is_cuda() && !::tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

// Where input values are drawn from. `grid` > 0 snaps values to multiples of
// 1/grid (exact in every float dtype for small ranges; makes ties for comparisons).
struct Domain {
  double lo = -2, hi = 2;
  bool avoid_zero = false;  // |x| >= 0.25 (denominators)
  double grid = 0;
  bool distinct = false;  // all values distinct multiples of 1/8 (exact in bfloat16 for up to 256 values)
};

// A contiguous CPU tensor of `shape` and `dtype` with reproducible values, moved to `dev`.
inline Tensor make_values(const Dims& shape, DType dtype, Device dev, Domain dom, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(dom.lo, dom.hi);
  int64_t n = numel_of(shape);
  std::vector<double> vals(static_cast<size_t>(n));
  for (auto& x : vals) {
    double y = u(gen);
    if (is_integral(dtype)) y = std::round(y);
    if (dom.grid > 0) y = std::round(y * dom.grid) / dom.grid;
    if (dom.avoid_zero && std::abs(y) < 0.25) y = y < 0 ? -0.25 - (0.25 + y) : 0.25 + y;
    x = y;
  }
  if (dom.distinct) {
    std::vector<int64_t> k(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) k[i] = i - n / 2;
    std::shuffle(k.begin(), k.end(), gen);
    for (int64_t i = 0; i < n; ++i) vals[i] = is_integral(dtype) ? static_cast<double>(k[i]) : k[i] / 8.0;
  }
  Tensor t = visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    std::vector<T> h;
    h.reserve(vals.size());
    for (double x : vals) h.push_back(from_double<T>(x));
    return tg::tensor(h, Shape(shape));
  });
  return t.to(dev);
}

// The layouts every op is run on.
enum class Layout { kContiguous, kTransposed, kStep2, kExpanded };
inline const char* layout_name(Layout l) {
  switch (l) {
    case Layout::kContiguous:
      return "contiguous";
    case Layout::kTransposed:
      return "transposed";
    case Layout::kStep2:
      return "slice-step-2";
    case Layout::kExpanded:
      return "expanded";
  }
  return "?";
}

// An input of logical `shape` in the given layout, built on `dev` so the view
// itself lives on the device under test.
inline Tensor make_input(const Dims& shape, Layout layout, DType dtype, Device dev, Domain dom = {},
                         uint32_t seed = 1) {
  int64_t nd = static_cast<int64_t>(shape.size());
  if (nd < 2 && layout == Layout::kTransposed) layout = Layout::kContiguous;
  if (nd < 1 && layout != Layout::kContiguous) layout = Layout::kContiguous;
  switch (layout) {
    case Layout::kContiguous:
      return make_values(shape, dtype, dev, dom, seed);
    case Layout::kTransposed: {
      Dims s = shape;
      std::swap(s[nd - 1], s[nd - 2]);
      return make_values(s, dtype, dev, dom, seed).transpose(nd - 1, nd - 2);
    }
    case Layout::kStep2: {
      Dims s = shape;
      s[nd - 1] *= 2;
      return make_values(s, dtype, dev, dom, seed).slice(nd - 1, 0, s[nd - 1], 2);
    }
    case Layout::kExpanded: {
      Dims s = shape;
      s[0] = 1;
      return make_values(s, dtype, dev, dom, seed).expand(Shape(shape));
    }
  }
  return {};
}

inline std::string describe(const Tensor& t) {
  std::ostringstream os;
  os << t.sizes() << " strides " << t.strides() << " " << t.dtype() << " " << t.device();
  return os.str();
}

}  // namespace tg::testing
