// Native ops: validated, device-dispatched, no autograd. The public ops in
// core/ops.h (defined in autograd/functions/) call these and record the graph
// around them; autograd's backward functions call them too. Not installed.
#pragma once
#include <optional>
#include <vector>

#include "core/backend/backend.h"
#include "core/ops.h"
#include "core/tensor.h"

namespace tg::native {

// ---- construction
Tensor empty(const Shape& sizes, DType dtype, Device device);  // device index resolved
Tensor empty_strided(const Shape& sizes, const Shape& strides, DType dtype, Device device);
Tensor make_view(const Tensor& base, Shape sizes, Shape strides, int64_t offset);  // shares storage
Device resolve(Device d);  // cuda without index -> current device; checks the device exists

// ---- elementwise engine front-end
// Builds the iter (broadcast, coalesce, promote) and runs op on the inputs' device.
// Output dtype: the promoted input dtype, or Bool for comparisons. Inputs of
// another dtype are converted first. Mixed devices are an error naming `op`.
Tensor unary(backend::ElemOp op, const Tensor& a, double p0 = 0, double p1 = 0);
Tensor binary(backend::ElemOp op, const Tensor& a, const Tensor& b, double p0 = 1, double p1 = 0);
Tensor scalar_op(backend::ElemOp op, const Tensor& a, Scalar s);  // AddScalar, MulScalar, EqScalar, ...
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// In place: writes the result into `self` (no broadcasting of self; result cast to self's dtype).
void unary_out(backend::ElemOp op, const Tensor& self, const Tensor& a, double p0 = 0, double p1 = 0);
void binary_out(backend::ElemOp op, const Tensor& self, const Tensor& a, const Tensor& b, double p0 = 1);
void scalar_op_out(backend::ElemOp op, const Tensor& self, const Tensor& a, Scalar s);
void fill_(const Tensor& self, Scalar v);
void copy_(const Tensor& dst, const Tensor& src, bool non_blocking = false);  // any devices, dtypes, strides
Tensor to(const Tensor& a, Device device, DType dtype, bool non_blocking = false);  // a itself when nothing changes
Tensor contiguous(const Tensor& a);
Tensor clone(const Tensor& a);
// The dtype an op computes in, PyTorch's rules (result_type) for tensor/scalar operands.
DType result_type(const Tensor& a, const Tensor& b);
DType result_type(const Tensor& a, const Scalar& s);

// ---- named elementwise helpers
inline Tensor add(const Tensor& a, const Tensor& b, double alpha = 1) { return binary(backend::ElemOp::Add, a, b, alpha); }
inline Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1) { return binary(backend::ElemOp::Sub, a, b, alpha); }
inline Tensor mul(const Tensor& a, const Tensor& b) { return binary(backend::ElemOp::Mul, a, b); }
inline Tensor div(const Tensor& a, const Tensor& b) { return binary(backend::ElemOp::Div, a, b); }
inline Tensor mul(const Tensor& a, Scalar s) { return scalar_op(backend::ElemOp::MulScalar, a, s); }
inline Tensor add(const Tensor& a, Scalar s) { return scalar_op(backend::ElemOp::AddScalar, a, s); }
// The sum of several tensors of one shape, dtype and device in as few launches as possible
// (autograd's gradient accumulation: one kernel per kMaxAddN inputs instead of one per input).
Tensor add_n(const std::vector<Tensor>& ts);

// ---- reductions (dims wrapped by the callee; empty = all)
Tensor reduce(backend::ReduceOp op, const Tensor& a, const DimList& dims, bool keepdim, int64_t correction = 1);
Tensor argmax(const Tensor& a, std::optional<int64_t> dim, bool keepdim);
// Sums `grad` down to `shape` (the inverse of broadcasting): the one place
// autograd reduces a broadcast gradient.
Tensor sum_to(const Tensor& grad, const Shape& shape);

// ---- linear algebra: 1-D, 2-D and batched with broadcasting batch dims
Tensor matmul(const Tensor& a, const Tensor& b);

// ---- views (share storage)
Tensor view(const Tensor& a, Shape shape);      // error if strides are incompatible
Tensor reshape(const Tensor& a, Shape shape);   // view when possible, else a copy
Tensor transpose(const Tensor& a, int64_t d0, int64_t d1);
Tensor permute(const Tensor& a, const Shape& dims);
Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end, int64_t step);
Tensor select(const Tensor& a, int64_t dim, int64_t index);
Tensor unsqueeze(const Tensor& a, int64_t dim);
Tensor squeeze(const Tensor& a, std::optional<int64_t> dim);
Tensor expand(const Tensor& a, const Shape& sizes);
Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index, bool check_bounds = true);
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim);
// zeros(shape) with src's slices added at `index` along dim (index_select's backward).
Tensor index_add_zeros(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src);

// ---- factories and random (a global Philox generator per device)
Tensor full(const Shape& sizes, Scalar v, DType dtype, Device device);
Tensor rand(const Shape& sizes, DType dtype, Device device);
Tensor randn(const Shape& sizes, DType dtype, Device device);
Tensor randperm(int64_t n, DType dtype, Device device);
// The same with an explicit Philox (seed, offset) instead of the device's generator:
// reproducible streams of permutations (DataLoader's seeded shuffle). Uses counters
// [offset, offset + 2n); offset must be a multiple of 4.
Tensor randperm(int64_t n, DType dtype, Device device, uint64_t seed, uint64_t offset);
Tensor arange(double start, double end, double step, DType dtype, Device device);
// Reserves `count` Philox counters of the device's generator; returns (seed, offset).
std::pair<uint64_t, uint64_t> philox_reserve(Device device, uint64_t count);

}  // namespace tg::native
