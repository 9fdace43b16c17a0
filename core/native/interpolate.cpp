// Native front-end of interpolate (issue 17): the resolved problem as planes of H x W, a contiguous
// input, then one backend call each way. The public op (PyTorch's argument checks, output sizes)
// and its backward are in nn/upsample.cpp.
#include <tapegrad/core/native.h>

namespace tg {

namespace backend {
void Backend::upsample2d(const Upsample2dArgs&, const Tensor& out, const Tensor&) {
  TG_ERROR("interpolate: no kernel on ", out.device());
}
void Backend::upsample2d_backward(const Upsample2dArgs&, const Tensor& grad_in, const Tensor&) {
  TG_ERROR("interpolate backward: no kernel on ", grad_in.device());
}
}  // namespace backend

namespace native {

Tensor upsample2d(const char* op, const Tensor& x, backend::Upsample2dArgs& a) {
  TG_CHECK(x.defined(), op, ": input is undefined");
  TG_CHECK(x.dim() == 3 || x.dim() == 4, op, ": expected a 3-d [N, C, W] or 4-d [N, C, H, W] input, got shape ",
           x.sizes());
  TG_CHECK(is_floating(x.dtype()), op, ": expected a floating input, got ", x.dtype(), " of shape ", x.sizes());
  const int64_t d = x.dim();
  const int64_t H = d == 4 ? x.sizes()[2] : 1, W = x.sizes()[d - 1];
  if (d == 3) a.OH = 1;
  TG_CHECK(H > 0 && W > 0 && a.OH > 0 && a.OW > 0, op,
           ": input and output sizes should be greater than 0, got input of shape ", x.sizes(), " and output size (",
           a.OH, ", ", a.OW, ")");
  a.H = H;
  a.W = W;
  a.planes = x.numel() / (H * W);
  Shape out_shape = x.sizes();
  if (d == 4) out_shape[2] = a.OH;
  out_shape[d - 1] = a.OW;
  Tensor out = empty(out_shape, x.dtype(), x.device());
  if (a.planes == 0) return out;
  backend::get(x.device().type()).upsample2d(a, out, contiguous(x));
  return out;
}

Tensor upsample2d_backward(const backend::Upsample2dArgs& a, const Tensor& grad, const Shape& in_shape) {
  Shape out_shape = in_shape;
  if (out_shape.size() == 4) out_shape[2] = a.OH;
  out_shape[out_shape.size() - 1] = a.OW;
  TG_CHECK(grad.sizes() == out_shape, "interpolate backward: grad of shape ", grad.sizes(), " for output of shape ",
           out_shape);
  Tensor gi = empty(in_shape, grad.dtype(), grad.device());
  if (a.planes == 0) return gi;
  backend::get(grad.device().type()).upsample2d_backward(a, gi, contiguous(grad));
  return gi;
}

}  // namespace native
}  // namespace tg
