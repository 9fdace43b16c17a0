// Shape printing and the shape arithmetic shared by all ops.
#include <tapegrad/core/shape.h>

#include <algorithm>
#include <cstdint>
#include <sstream>

#include <tapegrad/core/error.h>

namespace tg {

std::string Shape::str() const {
  std::ostringstream os;
  os << *this;
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Shape& s) {
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  return os << ']';
}

namespace detail {

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  int64_t n = ndim == 0 ? 1 : ndim;  // a 0-d tensor accepts dim 0 / -1, as PyTorch
  TG_CHECK(dim >= -n && dim < n, op, ": dim ", dim, " is out of range for a tensor with ", ndim, " dims (expected in [",
           -n, ", ", n - 1, "])");
  return dim < 0 ? dim + n : dim;
}

Shape contiguous_strides(const Shape& sizes) {
  // A zero-element tensor may have dims whose product overflows ([0, 2^62, 4]); its strides
  // address nothing, so they saturate at INT64_MAX instead of wrapping (undefined behaviour).
  Shape st(sizes.size());
  int64_t s = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    st[i] = s;
    if (__builtin_mul_overflow(s, std::max<int64_t>(sizes[i], 1), &s)) s = INT64_MAX;
  }
  return st;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    TG_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", a, " and ", b, " cannot be broadcast together (dim ", i,
             ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::vector<int64_t> reduce_dims(const DimList& dims, int64_t ndim, const char* op) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t i = 0; i < ndim; ++i) out.push_back(i);
    return out;
  }
  for (int64_t d : dims.dims()) {
    int64_t w = wrap_dim(d, ndim, op);
    TG_CHECK(std::find(out.begin(), out.end(), w) == out.end(), op, ": dim ", d, " appears more than once");
    out.push_back(w);
  }
  std::sort(out.begin(), out.end());
  if (ndim == 0) out.clear();
  return out;
}

void check_sizes(const Shape& sizes, const char* op) {
  bool zero = false;
  for (int64_t s : sizes) {
    TG_CHECK(s >= 0, op, ": negative dimension ", s, " in shape ", sizes);
    zero = zero || s == 0;
  }
  if (zero) return;  // no elements, whatever the other dims (as PyTorch)
  int64_t n = 1;
  for (int64_t s : sizes) {
    TG_CHECK(n <= INT64_MAX / s, op, ": shape ", sizes, " has too many elements");
    n *= s;
  }
}

size_t storage_nbytes(const Shape& sizes, size_t element_size, const char* op) {
  check_sizes(sizes, op);
  uint64_t bytes = 0;
  TG_CHECK(!__builtin_mul_overflow(static_cast<uint64_t>(sizes.numel()), element_size, &bytes) &&
               bytes <= kMaxStorageBytes,
           op, ": shape ", sizes, " of ", element_size, "-byte elements needs more than 2^62 bytes");
  return static_cast<size_t>(bytes);
}

size_t storage_nbytes(const Shape& sizes, const Shape& strides, size_t element_size, const char* op) {
  check_sizes(sizes, op);
  TG_CHECK(sizes.size() == strides.size(), op, ": sizes ", sizes, " and strides ", strides, " differ in length");
  if (sizes.numel() == 0) return 0;
  uint64_t span = 1;  // elements from the first to one past the last, at most 2^62 each step
  bool ok = true;
  for (size_t i = 0; i < sizes.size() && ok; ++i) {
    TG_CHECK(strides[i] >= 0, op, ": negative stride ", strides[i], " in strides ", strides, " (sizes ", sizes, ")");
    uint64_t step = 0;
    ok = !__builtin_mul_overflow(static_cast<uint64_t>(sizes[i] - 1), static_cast<uint64_t>(strides[i]), &step) &&
         !__builtin_add_overflow(span, step, &span) && span <= kMaxStorageBytes;
  }
  uint64_t bytes = 0;
  ok = ok && !__builtin_mul_overflow(span, element_size, &bytes) && bytes <= kMaxStorageBytes;
  TG_CHECK(ok, op, ": sizes ", sizes, " with strides ", strides, " of ", element_size,
           "-byte elements span more than 2^62 bytes");
  return static_cast<size_t>(bytes);
}

}  // namespace detail
}  // namespace tg
