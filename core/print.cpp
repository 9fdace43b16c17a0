// std::ostream << Tensor, in PyTorch's layout: one shared number format, rows
// aligned, the middle of large tensors elided, and a suffix naming the size,
// dtype and device.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <tapegrad/core/native.h>

namespace tg {

namespace {

constexpr int64_t kThreshold = 1000;  // elide beyond this many elements
constexpr int64_t kEdge = 3;          // elements kept at each end of an elided dim

struct Formatter {
  enum Kind { Int, Bool, FloatInt, Fixed, Sci } kind = Fixed;
  int width = 1;

  std::string fmt(double v) const {
    char buf[64];
    if (kind == Bool) return v != 0 ? "True" : "False";
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    switch (kind) {
      case Int: std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v)); break;
      case FloatInt: std::snprintf(buf, sizeof buf, "%.0f.", v); break;
      case Fixed: std::snprintf(buf, sizeof buf, "%.4f", v); break;
      default: std::snprintf(buf, sizeof buf, "%.4e", v); break;
    }
    return buf;
  }
};

Formatter make_formatter(const std::vector<double>& vals, DType dtype) {
  Formatter f;
  if (dtype == kBool) f.kind = Formatter::Bool;
  else if (!is_floating(dtype)) f.kind = Formatter::Int;
  else {
    bool all_int = true;
    double max_abs = 0, min_abs = INFINITY;
    for (double v : vals) {
      if (!std::isfinite(v)) continue;
      all_int = all_int && v == std::nearbyint(v);
      max_abs = std::max(max_abs, std::fabs(v));
      if (v != 0) min_abs = std::min(min_abs, std::fabs(v));
    }
    if (all_int && max_abs < 1e8) f.kind = Formatter::FloatInt;
    else if (max_abs >= 1e8 || (min_abs < 1e-4) || (min_abs != INFINITY && max_abs / min_abs > 1000)) f.kind = Formatter::Sci;
    else f.kind = Formatter::Fixed;
  }
  for (double v : vals) f.width = std::max<int>(f.width, static_cast<int>(f.fmt(v).size()));
  return f;
}

// Indices shown along a dim of size n.
std::vector<int64_t> shown(int64_t n, bool elide) {
  std::vector<int64_t> idx;
  if (!elide || n <= 2 * kEdge) {
    for (int64_t i = 0; i < n; ++i) idx.push_back(i);
  } else {
    for (int64_t i = 0; i < kEdge; ++i) idx.push_back(i);
    idx.push_back(-1);  // the ellipsis
    for (int64_t i = n - kEdge; i < n; ++i) idx.push_back(i);
  }
  return idx;
}

void print_rec(std::ostream& os, const std::vector<double>& vals, const Shape& sizes, const Shape& strides, int64_t base,
               int dim, bool elide, const Formatter& f, int indent) {
  const int nd = static_cast<int>(sizes.size());
  os << '[';
  auto idx = shown(sizes[dim], elide);
  for (size_t j = 0; j < idx.size(); ++j) {
    if (j > 0) {
      os << ',';
      if (dim == nd - 1) os << ' ';
      else os << std::string(static_cast<size_t>(nd - dim - 1), '\n') << std::string(static_cast<size_t>(indent + 1), ' ');
    }
    if (idx[j] < 0) {
      os << "...";
      continue;
    }
    int64_t at = base + idx[j] * strides[dim];
    if (dim == nd - 1) {
      std::string s = f.fmt(vals[static_cast<size_t>(at)]);
      os << std::string(static_cast<size_t>(f.width) - s.size(), ' ') << s;
    } else {
      print_rec(os, vals, sizes, strides, at, dim + 1, elide, f, indent + 1);
    }
  }
  os << ']';
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "tensor(undefined)";
  Tensor host = native::contiguous(native::to(t, Device(kCPU), t.dtype() == kBool || is_integral(t.dtype()) ? kInt64 : kFloat64));
  std::vector<double> vals(static_cast<size_t>(t.numel()));
  if (host.dtype() == kInt64) {
    const int64_t* p = host.data_ptr<int64_t>();
    for (size_t i = 0; i < vals.size(); ++i) vals[i] = static_cast<double>(p[i]);
  } else {
    const double* p = host.data_ptr<double>();
    std::copy(p, p + vals.size(), vals.begin());
  }
  const bool elide = t.numel() > kThreshold;
  Shape strides = detail::contiguous_strides(t.sizes());
  // Only the shown values decide the number format.
  std::vector<double> sample;
  if (elide) {
    std::vector<int64_t> pos(static_cast<size_t>(t.dim()), 0);
    std::function<void(int, int64_t)> walk = [&](int d, int64_t base) {
      if (d == t.dim()) {
        sample.push_back(vals[static_cast<size_t>(base)]);
        return;
      }
      for (int64_t i : shown(t.sizes()[d], true))
        if (i >= 0) walk(d + 1, base + i * strides[d]);
    };
    walk(0, 0);
  }
  Formatter f = make_formatter(elide ? sample : vals, t.dtype());
  os << "tensor(";
  if (t.dim() == 0) {
    os << f.fmt(vals[0]);
  } else if (t.numel() == 0) {
    os << "[]";
  } else {
    print_rec(os, vals, t.sizes(), strides, 0, 0, elide, f, 7);
  }
  os << ", size=" << t.sizes() << ", dtype=" << t.dtype() << ", device=" << t.device();
  if (t.requires_grad()) os << ", requires_grad=True";
  return os << ')';
}

}  // namespace tg
