// Tensor methods that forward to the public ops, raw data access, and the
// in-place ops (not differentiable; they bump the version counter).
#include <tapegrad/core/tensor.h>

#include <cstring>

#include <tapegrad/autograd/autograd.h>
#include <tapegrad/core/native.h>
#include <tapegrad/core/trace.h>
#include <tapegrad/core/backend/backend.h>
#ifdef TG_WITH_CUDA
#include <tapegrad/core/backend/cuda/launch_queue.h>  // data_ptr() is one of the queue's flush points
#endif

namespace tg {
using backend::ElemOp;

int64_t Tensor::size(int64_t d) const { return sizes()[detail::wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[detail::wrap_dim(d, dim(), "stride")]; }

void* Tensor::data_ptr() const {
  const TensorImpl& i = impl();
#ifdef TG_WITH_CUDA
  // The pointer may go to the caller's own kernel or copy: small launches tapegrad deferred
  // (launch_queue.h) are sent to the GPU first, so work the caller enqueues comes after them.
  if (i.device.is_cuda()) cuda::detail::flush_launches();
#endif
  return static_cast<char*>(i.storage->data()) + i.offset * static_cast<int64_t>(element_size());
}

void Tensor::copy_to_host(void* dst) const {
  if (numel() == 0) return;
  Tensor src = native::contiguous(*this);
  if (src.is_cpu()) {
    std::memcpy(dst, src.data_ptr(), nbytes());
    return;
  }
  backend::get(device().type()).copy_bytes(dst, Device(kCPU), src.data_ptr(), device(), nbytes(), false);
}

Scalar Tensor::item() const {
  TG_CHECK(numel() == 1, "item: a tensor with ", numel(), " elements (shape ", sizes(),
           ") cannot be converted to a scalar; item() needs exactly one element");
  unsigned char buf[8] = {};
  copy_to_host(buf);
  return visit_dtype(dtype(), [&](auto v) -> Scalar {
    using T = decltype(v);
    T x;
    std::memcpy(&x, buf, sizeof(T));
    if constexpr (std::is_same_v<T, bool>) return Scalar(x);
    else if constexpr (std::is_integral_v<T>) return Scalar(static_cast<long long>(x));
    else return Scalar(static_cast<double>(x));
  });
}

// ---- elementwise and reductions forward to the differentiable free functions
Tensor Tensor::neg() const { return tg::neg(*this); }
Tensor Tensor::exp() const { return tg::exp(*this); }
Tensor Tensor::log() const { return tg::log(*this); }
Tensor Tensor::sqrt() const { return tg::sqrt(*this); }
Tensor Tensor::abs() const { return tg::abs(*this); }
Tensor Tensor::relu() const { return tg::relu(*this); }
Tensor Tensor::sigmoid() const { return tg::sigmoid(*this); }
Tensor Tensor::tanh() const { return tg::tanh(*this); }
Tensor Tensor::gelu() const { return tg::gelu(*this); }
Tensor Tensor::pow(Scalar e) const { return tg::pow(*this, e); }
Tensor Tensor::pow(const Tensor& e) const { return tg::pow(*this, e); }
Tensor Tensor::clamp(Scalar lo, Scalar hi) const { return tg::clamp(*this, lo, hi); }
Tensor Tensor::eq(const Tensor& o) const { return tg::eq(*this, o); }
Tensor Tensor::ne(const Tensor& o) const { return tg::ne(*this, o); }
Tensor Tensor::lt(const Tensor& o) const { return tg::lt(*this, o); }
Tensor Tensor::le(const Tensor& o) const { return tg::le(*this, o); }
Tensor Tensor::gt(const Tensor& o) const { return tg::gt(*this, o); }
Tensor Tensor::ge(const Tensor& o) const { return tg::ge(*this, o); }
Tensor Tensor::eq(Scalar o) const {
  Tensor out = native::scalar_op(ElemOp::EqScalar, *this, o);
  TG_TRACE(EqScalar, out, {*this}, {{"other", detail::trace_scalar(o)}});
  return out;
}
Tensor Tensor::ne(Scalar o) const {
  Tensor out = native::scalar_op(ElemOp::NeScalar, *this, o);
  TG_TRACE(NeScalar, out, {*this}, {{"other", detail::trace_scalar(o)}});
  return out;
}
Tensor Tensor::lt(Scalar o) const {
  Tensor out = native::scalar_op(ElemOp::LtScalar, *this, o);
  TG_TRACE(LtScalar, out, {*this}, {{"other", detail::trace_scalar(o)}});
  return out;
}
Tensor Tensor::le(Scalar o) const {
  Tensor out = native::scalar_op(ElemOp::LeScalar, *this, o);
  TG_TRACE(LeScalar, out, {*this}, {{"other", detail::trace_scalar(o)}});
  return out;
}
Tensor Tensor::gt(Scalar o) const {
  Tensor out = native::scalar_op(ElemOp::GtScalar, *this, o);
  TG_TRACE(GtScalar, out, {*this}, {{"other", detail::trace_scalar(o)}});
  return out;
}
Tensor Tensor::ge(Scalar o) const {
  Tensor out = native::scalar_op(ElemOp::GeScalar, *this, o);
  TG_TRACE(GeScalar, out, {*this}, {{"other", detail::trace_scalar(o)}});
  return out;
}

Tensor Tensor::sum() const { return tg::sum(*this); }
Tensor Tensor::sum(DimList d, bool k) const { return tg::sum(*this, std::move(d), k); }
Tensor Tensor::mean() const { return tg::mean(*this); }
Tensor Tensor::mean(DimList d, bool k) const { return tg::mean(*this, std::move(d), k); }
Tensor Tensor::var() const { return tg::var(*this); }
Tensor Tensor::var(DimList d, bool k, int64_t c) const { return tg::var(*this, std::move(d), k, c); }
Tensor Tensor::std() const { return tg::std(*this); }
Tensor Tensor::std(DimList d, bool k, int64_t c) const { return tg::std(*this, std::move(d), k, c); }
Tensor Tensor::max() const { return tg::amax(*this); }
Tensor Tensor::max(DimList d, bool k) const { return tg::amax(*this, std::move(d), k); }
Tensor Tensor::min() const { return tg::amin(*this); }
Tensor Tensor::min(DimList d, bool k) const { return tg::amin(*this, std::move(d), k); }
Tensor Tensor::argmax() const { return tg::argmax(*this); }
Tensor Tensor::argmax(int64_t d, bool k) const { return tg::argmax(*this, d, k); }
Tensor Tensor::matmul(const Tensor& o) const { return tg::matmul(*this, o); }

// ---- in place
namespace {
const Tensor& finish_inplace(const Tensor& t) {
  Storage& s = *t.impl().storage;
  if (!(s.is_inference() && detail::tls_inference_mode)) s.bump_version();  // tg::InferenceMode
  return t;
}
}  // namespace

const Tensor& Tensor::add_(const Tensor& o, Scalar alpha) const {
  autograd::check_inplace(*this, "add_");
  native::binary_out(ElemOp::Add, *this, *this, o, alpha.to_double());
  return finish_inplace(*this);
}
const Tensor& Tensor::add_(Scalar o) const {
  autograd::check_inplace(*this, "add_");
  native::scalar_op_out(ElemOp::AddScalar, *this, *this, o);
  return finish_inplace(*this);
}
const Tensor& Tensor::sub_(const Tensor& o, Scalar alpha) const {
  autograd::check_inplace(*this, "sub_");
  native::binary_out(ElemOp::Sub, *this, *this, o, alpha.to_double());
  return finish_inplace(*this);
}
const Tensor& Tensor::sub_(Scalar o) const {
  autograd::check_inplace(*this, "sub_");
  // Integral negation wraps (-INT64_MIN is INT64_MIN), as the integer kernels do.
  Scalar neg = o.is_integral() ? Scalar(static_cast<long long>(0ULL - static_cast<uint64_t>(o.to_int())))
                               : Scalar(-o.to_double());
  native::scalar_op_out(ElemOp::AddScalar, *this, *this, neg);
  return finish_inplace(*this);
}
const Tensor& Tensor::mul_(const Tensor& o) const {
  autograd::check_inplace(*this, "mul_");
  native::binary_out(ElemOp::Mul, *this, *this, o);
  return finish_inplace(*this);
}
const Tensor& Tensor::mul_(Scalar o) const {
  autograd::check_inplace(*this, "mul_");
  native::scalar_op_out(ElemOp::MulScalar, *this, *this, o);
  return finish_inplace(*this);
}
const Tensor& Tensor::div_(const Tensor& o) const {
  autograd::check_inplace(*this, "div_");
  TG_CHECK(is_floating(dtype()), "div_: true division cannot write into a tensor of dtype ", dtype());
  native::binary_out(ElemOp::Div, *this, *this, o);
  return finish_inplace(*this);
}
const Tensor& Tensor::div_(Scalar o) const {
  autograd::check_inplace(*this, "div_");
  TG_CHECK(is_floating(dtype()), "div_: true division cannot write into a tensor of dtype ", dtype());
  native::scalar_op_out(ElemOp::DivScalar, *this, *this, o);
  return finish_inplace(*this);
}
const Tensor& Tensor::zero_() const { return fill_(0); }
const Tensor& Tensor::fill_(Scalar v) const {
  autograd::check_inplace(*this, "fill_");
  native::fill_(*this, v);
  return finish_inplace(*this);
}
const Tensor& Tensor::uniform_(double from, double to) const {
  autograd::check_inplace(*this, "uniform_");
  native::uniform_(*this, from, to);
  return finish_inplace(*this);
}
const Tensor& Tensor::normal_(double mean, double std) const {
  autograd::check_inplace(*this, "normal_");
  native::normal_(*this, mean, std);
  return finish_inplace(*this);
}
const Tensor& Tensor::copy_(const Tensor& src, bool non_blocking) const {
  autograd::check_inplace(*this, "copy_");
  native::copy_(*this, src, non_blocking);
  return finish_inplace(*this);
}

}  // namespace tg
