// CPU reductions: Sum, Mean, Var, Std, Max, Min, ArgMax over any set of dims and
// any input strides. The input is walked in memory order (dims sorted by
// stride, adjacent dims coalesced) and each element is folded into the
// accumulator of its output; this reads each input byte once whether the
// reduced dims are inner or outer. Work is split over rows when rows map to
// distinct outputs, else each thread folds a slice into a private copy of the
// accumulators, merged at the end. Floating sums accumulate in double, integer
// sums in int64; Var/Std take two passes (mean, then squared deviations).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <type_traits>
#include <vector>

#include <tapegrad/core/backend/cpu/cpu.h>
#include <tapegrad/core/backend/cpu/loops.h>
#include <tapegrad/core/backend/cpu/thread_pool.h>
#include <tapegrad/core/error.h>

namespace tg::cpu {

using backend::ReduceArgs;
using backend::ReduceOp;

namespace {

struct Dim {
  int64_t size;
  int64_t in_stride;   // elements of the input
  int64_t out_stride;  // into the (contiguous) output; 0 on reduced dims
  int64_t red_stride;  // into the row-major flattened reduced index; 0 on kept dims
};

// The loop nest over the input in memory order, outermost first.
std::vector<Dim> make_geometry(const ReduceArgs& args) {
  const Tensor& in = args.in;
  const int64_t nd = in.dim();
  std::vector<bool> reduced(static_cast<size_t>(nd), false);
  for (int64_t d : args.dims)
    if (d < nd) reduced[static_cast<size_t>(d)] = true;  // a 0-dim input may list dim 0
  // Row-major strides of the keepdim output, and of the reduced index.
  std::vector<int64_t> out_stride(static_cast<size_t>(nd)), red_stride(static_cast<size_t>(nd));
  int64_t os = 1, rs = 1;
  for (int64_t d = nd - 1; d >= 0; --d) {
    const size_t i = static_cast<size_t>(d);
    if (reduced[i]) {
      out_stride[i] = 0;
      red_stride[i] = rs;
      rs *= in.sizes()[i];
    } else {
      out_stride[i] = os;
      red_stride[i] = 0;
      os *= in.sizes()[i];
    }
  }
  std::vector<Dim> dims;
  for (int64_t d = 0; d < nd; ++d) {
    const size_t i = static_cast<size_t>(d);
    if (in.sizes()[i] == 1) continue;  // contributes nothing to any index
    dims.push_back({in.sizes()[i], in.strides()[i], out_stride[i], red_stride[i]});
  }
  std::stable_sort(dims.begin(), dims.end(),
                   [](const Dim& a, const Dim& b) { return std::abs(a.in_stride) > std::abs(b.in_stride); });
  // Coalesce an outer dim into the next inner one when all three index maps agree.
  std::vector<Dim> merged;
  for (const Dim& d : dims) {
    if (!merged.empty()) {
      Dim& o = merged.back();
      if (o.in_stride == d.in_stride * d.size && o.out_stride == d.out_stride * d.size &&
          o.red_stride == d.red_stride * d.size) {
        o = {o.size * d.size, d.in_stride, d.out_stride, d.red_stride};
        continue;
      }
    }
    merged.push_back(d);
  }
  if (merged.empty()) merged.push_back({1, 0, 0, 0});
  return merged;
}

// ---- accumulation policies: init, step (fold one element), merge (fold two accumulators)

template <typename T, typename Acc>
struct SumPolicy {
  using AccT = Acc;
  static constexpr bool kSum = true;
  static constexpr bool kArgMax = false;
  Acc init() const { return Acc(0); }
  void step(Acc& a, T x, int64_t, int64_t) const { a += static_cast<Acc>(x); }
  void merge(Acc& a, const Acc& b) const { a += b; }
};

template <typename T>
struct SqDevPolicy {
  using AccT = double;
  static constexpr bool kSum = false;
  static constexpr bool kArgMax = false;
  const double* mean;
  double init() const { return 0; }
  void step(double& a, T x, int64_t o, int64_t) const {
    const double d = static_cast<double>(x) - mean[o];
    a += d * d;
  }
  void merge(double& a, const double& b) const { a += b; }
};

template <typename T>
using ValueAcc = std::conditional_t<kIsFloat<T>, double, int64_t>;  // exact for every dtype

template <typename T, bool kMax>
struct ExtremePolicy {
  using AccT = ValueAcc<T>;
  static constexpr bool kSum = false;
  static constexpr bool kArgMax = false;
  AccT init() const {
    if constexpr (kIsFloat<T>) {
      return kMax ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
    } else {
      return kMax ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int64_t>::max();
    }
  }
  void merge(AccT& a, const AccT& v) const {
    if ((kMax ? v > a : v < a) || v != v) a = v;  // once NaN, stays NaN
  }
  void step(AccT& a, T x, int64_t, int64_t) const { merge(a, static_cast<AccT>(x)); }
};

template <typename T>
struct ArgMaxAcc {
  ValueAcc<T> v;
  int64_t i;
};

// NaN ranks above everything; ties go to the smaller index, so the result does
// not depend on the order elements are visited in.
template <typename T>
struct ArgMaxPolicy {
  using AccT = ArgMaxAcc<T>;
  static constexpr bool kSum = false;
  static constexpr bool kArgMax = true;
  AccT init() const { return {ValueAcc<T>(0), -1}; }
  static bool better(ValueAcc<T> v, int64_t i, const AccT& a) {
    if (a.i < 0) return true;
    const bool vn = v != v, an = a.v != a.v;
    if (vn || an) return vn && (!an || i < a.i);
    return v > a.v || (v == a.v && i < a.i);
  }
  void step(AccT& a, T x, int64_t, int64_t r) const {
    const auto v = static_cast<ValueAcc<T>>(x);
    if (better(v, r, a)) a = {v, r};
  }
  void merge(AccT& a, const AccT& b) const {
    if (b.i >= 0 && better(b.v, b.i, a)) a = b;
  }
};

// Folds input elements [lo, hi) (flattened over the loop nest) into acc.
template <typename T, typename P>
void fold_range(const std::vector<Dim>& g, const T* data, int64_t lo, int64_t hi, typename P::AccT* acc, const P& p) {
  using Acc = typename P::AccT;
  const int nd = static_cast<int>(g.size());
  int64_t idx[64];
  int64_t io = 0, oo = 0, ro = 0;
  int64_t rem = lo;
  for (int d = nd - 1; d >= 0; --d) {
    idx[d] = rem % g[d].size;
    rem /= g[d].size;
    io += idx[d] * g[d].in_stride;
    oo += idx[d] * g[d].out_stride;
    ro += idx[d] * g[d].red_stride;
  }
  const Dim in_dim = g[nd - 1];
  const int64_t is = in_dim.in_stride, os = in_dim.out_stride, rs = in_dim.red_stride;
  int64_t left = hi - lo;
  while (left > 0) {
    const int64_t cnt = std::min(in_dim.size - idx[nd - 1], left);
    const T* x = data + io;
    if (os == 0) {  // the inner dim is reduced: fold the segment into one register
      Acc local = p.init();
      if constexpr (P::kSum) {
        if (is == 1) {  // four independent sums keep the adds pipelined
          Acc s1 = p.init(), s2 = p.init(), s3 = p.init();
          int64_t j = 0;
          for (; j + 4 <= cnt; j += 4) {
            local += static_cast<Acc>(x[j]);
            s1 += static_cast<Acc>(x[j + 1]);
            s2 += static_cast<Acc>(x[j + 2]);
            s3 += static_cast<Acc>(x[j + 3]);
          }
          for (; j < cnt; ++j) local += static_cast<Acc>(x[j]);
          local += s1 + s2 + s3;
        } else {
          for (int64_t j = 0; j < cnt; ++j) p.step(local, x[j * is], oo, ro + j * rs);
        }
      } else if constexpr (P::kArgMax) {
        // First maximum of the segment with one compare per element; the first NaN ends it.
        auto best = static_cast<ValueAcc<T>>(x[0]);
        int64_t bj = 0;
        if (best == best) {
          for (int64_t j = 1; j < cnt; ++j) {
            const auto v = static_cast<ValueAcc<T>>(x[j * is]);
            if (v > best) {
              best = v;
              bj = j;
            } else if (v != v) {
              best = v;
              bj = j;
              break;
            }
          }
        }
        local = {best, ro + bj * rs};
      } else {
        for (int64_t j = 0; j < cnt; ++j) p.step(local, x[j * is], oo, ro + j * rs);
      }
      p.merge(acc[oo], local);
    } else if (is == 1 && os == 1) {
      Acc* a = acc + oo;
      for (int64_t j = 0; j < cnt; ++j) p.step(a[j], x[j], oo + j, ro + j * rs);
    } else {
      for (int64_t j = 0; j < cnt; ++j) p.step(acc[oo + j * os], x[j * is], oo + j * os, ro + j * rs);
    }
    left -= cnt;
    idx[nd - 1] += cnt;
    io += cnt * is;
    oo += cnt * os;
    ro += cnt * rs;
    if (idx[nd - 1] < in_dim.size) continue;
    idx[nd - 1] = 0;
    io -= in_dim.size * is;
    oo -= in_dim.size * os;
    ro -= in_dim.size * rs;
    for (int d = nd - 2; d >= 0; --d) {
      ++idx[d];
      io += g[d].in_stride;
      oo += g[d].out_stride;
      ro += g[d].red_stride;
      if (idx[d] < g[d].size) break;
      io -= g[d].size * g[d].in_stride;
      oo -= g[d].size * g[d].out_stride;
      ro -= g[d].size * g[d].red_stride;
      idx[d] = 0;
    }
  }
}

// Returns the accumulators of every output, folded over the whole input.
template <typename T, typename P>
std::vector<typename P::AccT> fold(const std::vector<Dim>& g, const T* data, int64_t total, int64_t n_out, const P& p) {
  using Acc = typename P::AccT;
  std::vector<Acc> acc(static_cast<size_t>(n_out), p.init());
  const int threads = get_num_threads();
  if (total < kGrain || threads <= 1 || in_parallel_region()) {
    fold_range(g, data, 0, total, acc.data(), p);
    return acc;
  }
  const int64_t inner = g.back().size;
  const int64_t rows = total / inner;
  bool outer_reduced = false;
  for (size_t d = 0; d + 1 < g.size(); ++d) outer_reduced = outer_reduced || g[d].out_stride == 0;
  if (!outer_reduced && rows >= 2 * threads) {
    // Distinct rows write distinct outputs: split over whole rows, shared accumulators.
    parallel(0, rows, std::max<int64_t>(1, kGrain / inner),
             [&](int64_t lo, int64_t hi) { fold_range(g, data, lo * inner, hi * inner, acc.data(), p); });
    return acc;
  }
  // Slices may share outputs: each folds into its own accumulators.
  constexpr int64_t kMaxPrivateAccs = int64_t{1} << 25;
  int64_t nchunks = std::min<int64_t>(threads, total / kGrain);
  nchunks = std::min<int64_t>(nchunks, std::max<int64_t>(1, kMaxPrivateAccs / n_out));
  if (nchunks <= 1) {
    fold_range(g, data, 0, total, acc.data(), p);
    return acc;
  }
  std::vector<std::vector<Acc>> priv(static_cast<size_t>(nchunks - 1));
  parallel(0, nchunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      Acc* a = acc.data();
      if (c > 0) {
        priv[static_cast<size_t>(c - 1)].assign(static_cast<size_t>(n_out), p.init());
        a = priv[static_cast<size_t>(c - 1)].data();
      }
      fold_range(g, data, total * c / nchunks, total * (c + 1) / nchunks, a, p);
    }
  });
  parallel(0, n_out, kGrain, [&](int64_t lo, int64_t hi) {
    for (const auto& b : priv)
      for (int64_t o = lo; o < hi; ++o) p.merge(acc[static_cast<size_t>(o)], b[static_cast<size_t>(o)]);
  });
  return acc;
}

// out[o] = value(o), converted to out's dtype.
template <typename F>
void write_out(const Tensor& out, F value) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using O = decltype(tag);
    O* dst = static_cast<O*>(out.data_ptr());
    parallel(0, out.numel(), kGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t o = lo; o < hi; ++o) {
        const auto v = value(o);
        if constexpr (std::is_same_v<O, Half> || std::is_same_v<O, BFloat16>) {
          dst[o] = O(static_cast<float>(v));
        } else {
          dst[o] = static_cast<O>(v);
        }
      }
    });
  });
}

template <typename T>
void reduce_typed(const ReduceArgs& args, const std::vector<Dim>& g, int64_t n_reduced) {
  const T* data = static_cast<const T*>(args.in.data_ptr());
  const int64_t total = args.in.numel(), n_out = args.out.numel();
  const Tensor& out = args.out;
  const double n = static_cast<double>(n_reduced);
  switch (args.op) {
    case ReduceOp::Sum:
    case ReduceOp::Mean: {
      if constexpr (kIsFloat<T>) {
        auto acc = fold(g, data, total, n_out, SumPolicy<T, double>{});
        if (args.op == ReduceOp::Sum) {
          write_out(out, [&](int64_t o) { return acc[static_cast<size_t>(o)]; });
        } else {
          write_out(out, [&](int64_t o) { return acc[static_cast<size_t>(o)] / n; });
        }
      } else {
        auto acc = fold(g, data, total, n_out, SumPolicy<T, int64_t>{});
        if (args.op == ReduceOp::Sum) {
          write_out(out, [&](int64_t o) { return acc[static_cast<size_t>(o)]; });
        } else {
          write_out(out, [&](int64_t o) { return static_cast<double>(acc[static_cast<size_t>(o)]) / n; });
        }
      }
      return;
    }
    case ReduceOp::Var:
    case ReduceOp::Std: {
      auto mean = fold(g, data, total, n_out, SumPolicy<T, double>{});
      for (double& m : mean) m /= n;
      auto m2 = fold(g, data, total, n_out, SqDevPolicy<T>{mean.data()});
      // PyTorch's divisor: max(0, N - correction); 0 gives NaN (or inf).
      const double div = std::max(0.0, n - static_cast<double>(args.correction));
      const bool take_sqrt = args.op == ReduceOp::Std;
      write_out(out, [&](int64_t o) {
        const double v = m2[static_cast<size_t>(o)] / div;
        return take_sqrt ? std::sqrt(v) : v;
      });
      return;
    }
    case ReduceOp::Max: {
      auto acc = fold(g, data, total, n_out, ExtremePolicy<T, true>{});
      write_out(out, [&](int64_t o) { return acc[static_cast<size_t>(o)]; });
      return;
    }
    case ReduceOp::Min: {
      auto acc = fold(g, data, total, n_out, ExtremePolicy<T, false>{});
      write_out(out, [&](int64_t o) { return acc[static_cast<size_t>(o)]; });
      return;
    }
    case ReduceOp::ArgMax: {
      auto acc = fold(g, data, total, n_out, ArgMaxPolicy<T>{});
      write_out(out, [&](int64_t o) { return acc[static_cast<size_t>(o)].i; });
      return;
    }
  }
}

}  // namespace

void reduce(const ReduceArgs& args) {
  const Tensor& in = args.in;
  if (args.out.numel() == 0) return;
  int64_t n_reduced = 1;
  for (int64_t d : args.dims)
    if (d < in.dim()) n_reduced *= in.sizes()[static_cast<size_t>(d)];
  if (n_reduced == 0) {
    switch (args.op) {
      case ReduceOp::Sum:
        write_out(args.out, [](int64_t) { return 0.0; });
        return;
      case ReduceOp::Mean:
      case ReduceOp::Var:
      case ReduceOp::Std:
        write_out(args.out, [](int64_t) { return std::numeric_limits<double>::quiet_NaN(); });
        return;
      default:
        TG_ERROR(backend::reduce_op_name(args.op), "(): cannot reduce over a zero-size dim (input shape ", in.sizes(), ")");
    }
  }
  TG_CHECK(in.dim() <= 64, backend::reduce_op_name(args.op), "(): at most 64 dims are supported, got ", in.dim());
  const std::vector<Dim> g = make_geometry(args);
  visit_dtype(in.dtype(), [&](auto tag) { reduce_typed<decltype(tag)>(args, g, n_reduced); });
}

}  // namespace tg::cpu
