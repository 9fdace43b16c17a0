// Native front-end of 2-d pooling (issue 17): validation with PyTorch's checks and output sizes,
// contiguous working copies, then one backend call each way. A channels-last input (is_nhwc) gets
// its output back in channels-last (and pool2d_backward its gradient, when asked), so the layers
// after a pool keep running NHWC; the kernels themselves work on row-major planes. The public ops
// and their backward are in nn/pooling.cpp.
#include <tapegrad/core/native.h>

namespace tg {

namespace backend {
void Backend::pool2d(const Pool2dArgs&, const Tensor& out, const Tensor&, const Tensor&) {
  TG_ERROR("pool2d: no kernel on ", out.device());
}
void Backend::pool2d_backward(const Pool2dArgs&, const Tensor& grad_in, const Tensor&, const Tensor&) {
  TG_ERROR("pool2d backward: no kernel on ", grad_in.device());
}
}  // namespace backend

namespace native {

namespace {
// PyTorch's pooling_output_shape.
int64_t pooled_size(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dilation, bool ceil_mode) {
  const int64_t num = in + 2 * pad - dilation * (k - 1) - 1 + (ceil_mode ? stride - 1 : 0);
  const int64_t q = num >= 0 ? num / stride : -((-num + stride - 1) / stride);
  int64_t out = q + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}
}  // namespace

std::pair<Tensor, Tensor> pool2d(const char* op, const Tensor& x, backend::Pool2dArgs& a, bool ceil_mode) {
  TG_CHECK(x.defined(), op, ": input is undefined");
  TG_CHECK((x.dim() == 3 || x.dim() == 4), op, ": expected a 3-d [C, H, W] or 4-d [N, C, H, W] input, got shape ",
           x.sizes());
  const int64_t d = x.dim();
  const int64_t C = x.sizes()[d - 3], H = x.sizes()[d - 2], W = x.sizes()[d - 1];
  TG_CHECK(C > 0 && H > 0 && W > 0, op, ": input of shape ", x.sizes(),
           " has an empty channel or spatial dim (only the batch dim may be 0)");
  TG_CHECK(is_floating(x.dtype()), op, ": expected a floating input, got ", x.dtype(), " of shape ", x.sizes());
  if (a.kind == backend::PoolKind::AdaptiveAvg) {
    TG_CHECK(a.OH > 0 && a.OW > 0, op, ": output_size must be positive, got (", a.OH, ", ", a.OW, ") for input of shape ",
             x.sizes());
  } else {
    TG_CHECK(a.kh > 0 && a.kw > 0, op, ": kernel_size must be positive, got (", a.kh, ", ", a.kw, ")");
    TG_CHECK(a.sh > 0 && a.sw > 0, op, ": stride must be positive, got (", a.sh, ", ", a.sw, ")");
    TG_CHECK(a.dh > 0 && a.dw > 0, op, ": dilation must be positive, got (", a.dh, ", ", a.dw, ")");
    TG_CHECK(a.ph >= 0 && a.pw >= 0, op, ": padding must be non-negative, got (", a.ph, ", ", a.pw, ")");
    TG_CHECK(a.ph <= a.kh / 2 && a.pw <= a.kw / 2, op,
             ": padding should be at most half of kernel size, got padding (", a.ph, ", ", a.pw, ") for kernel_size (",
             a.kh, ", ", a.kw, ")");
    TG_CHECK(a.divisor >= 0, op, ": divisor_override must be positive, got ", a.divisor);
    a.OH = pooled_size(H, a.kh, a.ph, a.sh, a.dh, ceil_mode);
    a.OW = pooled_size(W, a.kw, a.pw, a.sw, a.dw, ceil_mode);
    TG_CHECK(a.OH > 0 && a.OW > 0, op, ": input of shape ", x.sizes(), " gives output size (", a.OH, ", ", a.OW,
             ") with kernel_size (", a.kh, ", ", a.kw, "), stride (", a.sh, ", ", a.sw, "), padding (", a.ph, ", ",
             a.pw, "), dilation (", a.dh, ", ", a.dw, "): output size is too small");
  }
  a.H = H;
  a.W = W;
  a.planes = x.numel() / (H * W);
  Shape out_shape = x.sizes();
  out_shape[d - 2] = a.OH;
  out_shape[d - 1] = a.OW;
  Tensor out = empty(out_shape, x.dtype(), x.device());
  Tensor indices = a.kind == backend::PoolKind::Max ? empty(out_shape, kInt64, x.device()) : Tensor();
  if (a.planes == 0) return {out, indices};
  backend::get(x.device().type()).pool2d(a, out, indices, contiguous(x));
  if (is_nhwc(x)) out = contiguous_channels_last(out);
  return {out, indices};
}

Tensor pool2d_backward(const backend::Pool2dArgs& a, const Tensor& grad, const Tensor& indices, const Shape& in_shape,
                       bool channels_last) {
  Shape out_shape = in_shape;
  out_shape[out_shape.size() - 2] = a.OH;
  out_shape[out_shape.size() - 1] = a.OW;
  TG_CHECK(grad.sizes() == out_shape, "pool2d backward: grad of shape ", grad.sizes(), " for output of shape ",
           out_shape);
  Tensor gi = empty(in_shape, grad.dtype(), grad.device());
  if (a.planes == 0) return gi;
  backend::get(grad.device().type())
      .pool2d_backward(a, gi, contiguous(grad), indices.defined() ? contiguous(indices) : Tensor());
  return channels_last && gi.dim() == 4 ? contiguous_channels_last(gi) : gi;
}

}  // namespace native
}  // namespace tg
