// Shapes, dimension lists, scalars and the shape arithmetic shared by every op:
// broadcasting, contiguous strides, dim wrapping.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

namespace tg {

// A list of sizes or strides. A named type (not a bare std::vector) so that
// `std::cout << t.sizes()` finds tg's operator<< and prints "[2, 3]".
class Shape : public std::vector<int64_t> {
 public:
  using std::vector<int64_t>::vector;
  Shape() = default;
  Shape(std::initializer_list<int64_t> l) : std::vector<int64_t>(l) {}
  Shape(const std::vector<int64_t>& v) : std::vector<int64_t>(v) {}  // NOLINT
  Shape(std::vector<int64_t>&& v) : std::vector<int64_t>(std::move(v)) {}  // NOLINT
  // The element count. Unsigned arithmetic so that a shape nobody validated (a zero-element
  // [2^62, 4, 0], or an overflowing one that detail::check_sizes will refuse) is no undefined
  // behaviour; any zero dim gives 0.
  int64_t numel() const {
    uint64_t n = 1;
    bool zero = false;
    for (int64_t s : *this) {
      n *= static_cast<uint64_t>(s);
      zero = zero || s == 0;
    }
    return zero ? 0 : static_cast<int64_t>(n);
  }
  std::string str() const;
};
std::ostream& operator<<(std::ostream& os, const Shape& s);

// One dim or several: `x.mean(0)`, `x.sum({0, 2}, true)`. Empty means "all dims".
class DimList {
 public:
  DimList() = default;
  DimList(int64_t d) : dims_{d} {}  // NOLINT
  DimList(int d) : dims_{d} {}      // NOLINT
  DimList(std::initializer_list<int64_t> l) : dims_(l) {}
  DimList(std::vector<int64_t> v) : dims_(std::move(v)) {}  // NOLINT
  const std::vector<int64_t>& dims() const { return dims_; }
  bool empty() const { return dims_.empty(); }

 private:
  std::vector<int64_t> dims_;
};

// A number given to an op beside tensors (`x * 2`, `x.pow(0.5)`). Remembers
// whether it was an integer so `int_tensor * 2` stays integral and
// `int_tensor * 2.5` promotes to float32, as in PyTorch.
class Scalar {
 public:
  Scalar() = default;
  Scalar(double v) : d_(v), i_(saturate_to_int64(v)), integral_(false) {}  // NOLINT
  Scalar(float v) : Scalar(static_cast<double>(v)) {}                          // NOLINT
  Scalar(int v) : d_(v), i_(v), integral_(true) {}                             // NOLINT
  Scalar(long v) : d_(static_cast<double>(v)), i_(v), integral_(true) {}       // NOLINT
  Scalar(long long v) : d_(static_cast<double>(v)), i_(v), integral_(true) {}  // NOLINT
  Scalar(unsigned v) : d_(v), i_(v), integral_(true) {}                        // NOLINT
  Scalar(unsigned long v) : d_(static_cast<double>(v)), i_(static_cast<int64_t>(v)), integral_(true) {}  // NOLINT
  Scalar(bool v) : d_(v), i_(v), integral_(true), boolean_(true) {}  // NOLINT
  double to_double() const { return d_; }
  int64_t to_int() const { return i_; }
  bool is_integral() const { return integral_; }
  bool is_bool() const { return boolean_; }
  // double -> int64 without undefined behaviour (a file may carry any double): truncates toward
  // zero, saturates at INT64_MIN / INT64_MAX (±inf too), and NaN gives 0.
  static constexpr int64_t saturate_to_int64(double v) {
    if (!(v == v)) return 0;
    if (v >= 9223372036854775808.0) return INT64_MAX;
    if (v < -9223372036854775808.0) return INT64_MIN;
    return static_cast<int64_t>(v);
  }

 private:
  double d_ = 0;
  int64_t i_ = 0;
  bool integral_ = false;
  bool boolean_ = false;
};

namespace detail {
// Wraps a possibly negative dim into [0, ndim); throws naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);
// Row-major strides for a shape.
Shape contiguous_strides(const Shape& sizes);
// Broadcast two shapes; throws naming `op` and both shapes when they don't match.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Sorted unique wrapped dims of a reduction; an empty list means all dims.
std::vector<int64_t> reduce_dims(const DimList& dims, int64_t ndim, const char* op);
// Checks sizes are non-negative and the element count fits in int64.
void check_sizes(const Shape& sizes, const char* op);
// The largest storage tapegrad allocates, in bytes (2^62): every byte count derived from a shape
// is checked against it before an allocator sees it, so no product can wrap.
inline constexpr uint64_t kMaxStorageBytes = uint64_t{1} << 62;
// Bytes of a contiguous tensor of `sizes` with `element_size`-byte elements. Checks the sizes
// (check_sizes) and throws naming `op` and the shape when the byte count passes kMaxStorageBytes.
size_t storage_nbytes(const Shape& sizes, size_t element_size, const char* op);
// Bytes a strided layout reaches from its first element (0 for an empty one): 1 + sum of
// (size - 1) * stride elements. Throws naming `op` on a negative stride or a byte count past
// kMaxStorageBytes.
size_t storage_nbytes(const Shape& sizes, const Shape& strides, size_t element_size, const char* op);
}  // namespace detail

}  // namespace tg
