// Native front-ends of batch_norm's kernels (issue 17): the layout (x's: channels-last NHWC kept as
// [N * H * W, C, 1], else row-major [N, C, prod(*)]), operands brought to it, outputs allocated in
// it, one backend call each. The public op and its backward: nn/batch_norm.cpp.
#include <tapegrad/core/native.h>

namespace tg {

namespace backend {
void Backend::batch_norm_stats(const Tensor& x, int64_t, int64_t, int64_t, const Tensor&, const Tensor&) {
  TG_ERROR("batch_norm: no kernel on ", x.device());
}
void Backend::batch_norm_elemt(const Tensor&, const Tensor& x, int64_t, int64_t, int64_t, const Tensor&, const Tensor&,
                               const Tensor&, bool) {
  TG_ERROR("batch_norm: no kernel on ", x.device());
}
void Backend::batch_norm_reduce(const Tensor&, const Tensor& x, int64_t, int64_t, int64_t, const Tensor&, const Tensor&,
                                const Tensor&, const Tensor&, const Tensor&) {
  TG_ERROR("batch_norm backward: no kernel on ", x.device());
}
void Backend::batch_norm_backward_elemt(const Tensor&, const Tensor&, const Tensor& x, int64_t, int64_t, int64_t,
                                        const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                        const Tensor&) {
  TG_ERROR("batch_norm backward: no kernel on ", x.device());
}
}  // namespace backend

namespace native {

namespace {
// The memory layout the kernels see, chosen from x: channels-last when x is NHWC-dense and not
// also row-major (then [outer = N * H * W, c = C, inner = 1]); row-major [N, C, prod(*)] otherwise.
// Every big operand (x, dy) is brought to that layout and the outputs (y, dx) are allocated in it.
struct Geometry {
  int64_t n, c, s;
  bool channels_last;
};
Geometry geometry(const char* op, const Tensor& x) {
  TG_CHECK(x.dim() >= 2 && x.sizes()[1] > 0 && x.numel() > 0, op, ": expected a non-empty [N, C, *] input, got ",
           x.sizes());
  const int64_t n = x.sizes()[0], c = x.sizes()[1];
  if (is_nhwc(x)) return {x.numel() / c, c, 1, true};
  return {n, c, x.numel() / (n * c), false};
}
Tensor empty_like_layout(const Tensor& x, const Geometry& g) {
  const Shape& s = x.sizes();
  if (!g.channels_last) return empty(s, x.dtype(), x.device());
  return empty_strided(s, {s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]}, x.dtype(), x.device());
}
// t (x's shape) in the layout g, of x's dtype: t itself when it already is.
Tensor in_layout(const Tensor& t, const Tensor& x, const Geometry& g) {
  const Tensor v = t.dtype() == x.dtype() ? t : native::to(t, x.device(), x.dtype());
  if (g.channels_last ? v.is_contiguous(MemoryFormat::ChannelsLast) : v.is_contiguous()) return v;
  Tensor out = empty_like_layout(x, g);
  copy_(out, v);
  return out;
}
DType acc_dtype(const Tensor& x) { return x.dtype() == kFloat64 ? kFloat64 : kFloat32; }
Tensor vec(const Tensor& v, const Tensor& x) {
  return v.defined() ? native::contiguous(native::to(v, x.device(), acc_dtype(x))) : Tensor();
}
}  // namespace

BatchNormStats batch_norm_stats(const Tensor& x) {
  const Geometry g = geometry("batch_norm", x);
  BatchNormStats r{empty({g.c}, acc_dtype(x), x.device()), empty({g.c}, acc_dtype(x), x.device())};
  backend::get(x.device().type()).batch_norm_stats(in_layout(x, x, g), g.n, g.c, g.s, r.mean, r.var);
  return r;
}

Tensor batch_norm_elemt(const Tensor& x, const Tensor& mean, const Tensor& scale, const Tensor& shift, bool relu) {
  const Geometry g = geometry("batch_norm", x);
  Tensor y = empty_like_layout(x, g);
  backend::get(x.device().type())
      .batch_norm_elemt(y, in_layout(x, x, g), g.n, g.c, g.s, vec(mean, x), vec(scale, x), vec(shift, x), relu);
  return y;
}

namespace {
// The fused ReLU's output in the kernels' layout (undefined: no ReLU).
Tensor relu_operand(const Tensor& relu_out, const Tensor& x, const Geometry& g) {
  if (!relu_out.defined()) return relu_out;
  TG_CHECK(relu_out.sizes() == x.sizes(), "batch_norm backward: relu output of shape ", relu_out.sizes(),
           " for input of shape ", x.sizes());
  return in_layout(relu_out, x, g);
}
}  // namespace

std::pair<Tensor, Tensor> batch_norm_reduce(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                            const Tensor& invstd, const Tensor& relu_out) {
  const Geometry g = geometry("batch_norm backward", x);
  TG_CHECK(dy.sizes() == x.sizes(), "batch_norm backward: grad of shape ", dy.sizes(), " for input of shape ",
           x.sizes());
  Tensor sum_dy = empty({g.c}, acc_dtype(x), x.device()), sum_dy_xhat = empty({g.c}, acc_dtype(x), x.device());
  backend::get(x.device().type())
      .batch_norm_reduce(in_layout(dy, x, g), in_layout(x, x, g), g.n, g.c, g.s, vec(mean, x), vec(invstd, x), sum_dy,
                         sum_dy_xhat, relu_operand(relu_out, x, g));
  return {sum_dy, sum_dy_xhat};
}

Tensor batch_norm_backward_elemt(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                                 const Tensor& scale, const Tensor& mean_dy, const Tensor& mean_dy_xhat,
                                 const Tensor& relu_out) {
  const Geometry g = geometry("batch_norm backward", x);
  TG_CHECK(dy.sizes() == x.sizes(), "batch_norm backward: grad of shape ", dy.sizes(), " for input of shape ",
           x.sizes());
  Tensor dx = empty_like_layout(x, g);
  backend::get(x.device().type())
      .batch_norm_backward_elemt(dx, in_layout(dy, x, g), in_layout(x, x, g), g.n, g.c, g.s, vec(mean, x),
                                 vec(invstd, x), vec(scale, x), vec(mean_dy, x), vec(mean_dy_xhat, x),
                                 relu_operand(relu_out, x, g));
  return dx;
}

Tensor batch_norm_operand(const Tensor& t, const Tensor& x) {
  if (x.numel() == 0 || x.dim() < 2) return t;
  return in_layout(t, x, geometry("batch_norm", x));
}

}  // namespace native
}  // namespace tg
