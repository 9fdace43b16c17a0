// Tensor methods that forward to the public ops, and raw data access.
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

bool Tensor::is_contiguous(MemoryFormat format) const {
  if (format != MemoryFormat::ChannelsLast) return is_contiguous();
  if (dim() != 4) return false;
  // Innermost first: C, W, H, N; a size-1 dim may have any stride.
  static constexpr int kOrder[4] = {1, 3, 2, 0};
  int64_t expected = 1;
  for (int d : kOrder) {
    if (sizes()[d] != 1 && strides()[d] != expected) return false;
    expected *= sizes()[d];
  }
  return true;
}

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

// The in-place methods (add_, mul_, copy_, relu_, ...) live in autograd/functions/inplace.cpp,
// beside their backward.

}  // namespace tg
