// The public factories: each resolves options, calls the native op, and marks
// the result as a leaf that requires grad when asked.
#include <cstring>

#include <tapegrad/core/native.h>

#ifndef TG_VERSION
#define TG_VERSION "0.0.0"
#endif

namespace tg {

namespace {
Tensor finish(Tensor t, const TensorOptions& o) {
  if (o.requires_grad()) {
    TG_CHECK(is_floating(t.dtype()), "requires_grad: only floating tensors can require grad, got ", t.dtype());
    t.requires_grad_(true);
  }
  return t;
}
}  // namespace

const char* version() { return TG_VERSION; }

Tensor empty(Shape sizes, TensorOptions o) { return finish(native::empty(sizes, o.dtype(), o.device()), o); }
Tensor zeros(Shape sizes, TensorOptions o) { return finish(native::full(sizes, 0, o.dtype(), o.device()), o); }
Tensor ones(Shape sizes, TensorOptions o) { return finish(native::full(sizes, 1, o.dtype(), o.device()), o); }
Tensor full(Shape sizes, Scalar v, TensorOptions o) {
  DType d = o.dtype_opt().value_or(v.is_bool() ? kBool : v.is_integral() ? kInt64 : kFloat32);
  return finish(native::full(sizes, v, d, o.device()), o);
}
Tensor rand(Shape sizes, TensorOptions o) { return finish(native::rand(sizes, o.dtype(), o.device()), o); }
Tensor randn(Shape sizes, TensorOptions o) { return finish(native::randn(sizes, o.dtype(), o.device()), o); }
Tensor arange(int64_t end, TensorOptions o) {
  return finish(native::arange(0, static_cast<double>(end), 1, o.dtype_opt().value_or(kInt64), o.device()), o);
}
Tensor arange(Scalar start, Scalar end, Scalar step, TensorOptions o) {
  bool integral = start.is_integral() && end.is_integral() && step.is_integral();
  DType d = o.dtype_opt().value_or(integral ? kInt64 : kFloat32);
  return finish(native::arange(start.to_double(), end.to_double(), step.to_double(), d, o.device()), o);
}
Tensor randperm(int64_t n, TensorOptions o) {
  return finish(native::randperm(n, o.dtype_opt().value_or(kInt64), o.device()), o);
}
Tensor empty_like(const Tensor& t, TensorOptions o) {
  return native::empty(t.sizes(), o.dtype_opt().value_or(t.dtype()), o.device());
}
Tensor empty_like(const Tensor& t) { return native::empty(t.sizes(), t.dtype(), t.device()); }
Tensor zeros_like(const Tensor& t) { return native::full(t.sizes(), 0, t.dtype(), t.device()); }
Tensor ones_like(const Tensor& t) { return native::full(t.sizes(), 1, t.dtype(), t.device()); }
Tensor full_like(const Tensor& t, Scalar v) { return native::full(t.sizes(), v, t.dtype(), t.device()); }
Tensor rand_like(const Tensor& t) { return native::rand(t.sizes(), t.dtype(), t.device()); }
Tensor randn_like(const Tensor& t) { return native::randn(t.sizes(), t.dtype(), t.device()); }

Tensor tensor_from_host(const void* data, DType src_dtype, Shape sizes, TensorOptions o) {
  detail::check_sizes(sizes, "tensor");
  Tensor host = native::empty(sizes, src_dtype, Device(kCPU));
  if (host.nbytes() > 0) std::memcpy(host.data_ptr(), data, host.nbytes());
  Tensor t = native::to(host, o.device(), o.dtype_opt().value_or(src_dtype));
  if (t.is_same(host) && o.requires_grad()) t = native::clone(host);
  return finish(t, o);
}

Tensor from_blob(void* data, Shape sizes, TensorOptions o) {
  return from_blob(data, sizes, detail::contiguous_strides(sizes), nullptr, nullptr, o);
}

Tensor from_blob(void* data, Shape sizes, Shape strides, DataPtr::Deleter deleter, void* ctx, TensorOptions o) {
  DType dt = o.dtype();
  const size_t nbytes = detail::storage_nbytes(sizes, strides, element_size(dt), "from_blob");
  Device dev = native::resolve(o.device());
  auto storage = std::make_shared<Storage>(DataPtr(data, ctx, deleter, dev), nbytes, dev);
  return finish(Tensor(std::make_shared<TensorImpl>(std::move(storage), sizes, strides, 0, dt)), o);
}

}  // namespace tg
