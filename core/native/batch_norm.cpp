// Native front-ends of batch_norm's kernels (issue 17): contiguous operands, [n, c, s] geometry,
// output allocation, one backend call each. The public op and its backward: nn/batch_norm.cpp.
#include <tapegrad/core/native.h>

namespace tg {

namespace backend {
void Backend::batch_norm_stats(const Tensor& x, int64_t, int64_t, int64_t, const Tensor&, const Tensor&) {
  TG_ERROR("batch_norm: no kernel on ", x.device());
}
void Backend::batch_norm_elemt(const Tensor&, const Tensor& x, int64_t, int64_t, int64_t, const Tensor&,
                               const Tensor&, const Tensor&) {
  TG_ERROR("batch_norm: no kernel on ", x.device());
}
void Backend::batch_norm_reduce(const Tensor&, const Tensor& x, int64_t, int64_t, int64_t, const Tensor&,
                                const Tensor&, const Tensor&, const Tensor&) {
  TG_ERROR("batch_norm backward: no kernel on ", x.device());
}
void Backend::batch_norm_backward_elemt(const Tensor&, const Tensor&, const Tensor& x, int64_t, int64_t, int64_t,
                                        const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  TG_ERROR("batch_norm backward: no kernel on ", x.device());
}
}  // namespace backend

namespace native {

namespace {
struct Geometry {
  int64_t n, c, s;
};
Geometry geometry(const char* op, const Tensor& x) {
  TG_CHECK(x.dim() >= 2 && x.sizes()[1] > 0 && x.numel() > 0, op, ": expected a non-empty [N, C, *] input, got ",
           x.sizes());
  const int64_t n = x.sizes()[0], c = x.sizes()[1];
  return {n, c, x.numel() / (n * c)};
}
DType acc_dtype(const Tensor& x) { return x.dtype() == kFloat64 ? kFloat64 : kFloat32; }
Tensor vec(const Tensor& v, const Tensor& x) {
  return v.defined() ? native::contiguous(native::to(v, x.device(), acc_dtype(x))) : Tensor();
}
Tensor like_x(const Tensor& t, const Tensor& x) {
  return native::contiguous(t.dtype() == x.dtype() ? t : native::to(t, x.device(), x.dtype()));
}
}  // namespace

BatchNormStats batch_norm_stats(const Tensor& x) {
  const Geometry g = geometry("batch_norm", x);
  BatchNormStats r{empty({g.c}, acc_dtype(x), x.device()), empty({g.c}, acc_dtype(x), x.device())};
  backend::get(x.device().type()).batch_norm_stats(native::contiguous(x), g.n, g.c, g.s, r.mean, r.var);
  return r;
}

Tensor batch_norm_elemt(const Tensor& x, const Tensor& mean, const Tensor& scale, const Tensor& shift) {
  const Geometry g = geometry("batch_norm", x);
  Tensor y = empty(x.sizes(), x.dtype(), x.device());
  backend::get(x.device().type())
      .batch_norm_elemt(y, native::contiguous(x), g.n, g.c, g.s, vec(mean, x), vec(scale, x), vec(shift, x));
  return y;
}

std::pair<Tensor, Tensor> batch_norm_reduce(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                            const Tensor& invstd) {
  const Geometry g = geometry("batch_norm backward", x);
  TG_CHECK(dy.sizes() == x.sizes(), "batch_norm backward: grad of shape ", dy.sizes(), " for input of shape ",
           x.sizes());
  Tensor sum_dy = empty({g.c}, acc_dtype(x), x.device()), sum_dy_xhat = empty({g.c}, acc_dtype(x), x.device());
  backend::get(x.device().type())
      .batch_norm_reduce(like_x(dy, x), native::contiguous(x), g.n, g.c, g.s, vec(mean, x), vec(invstd, x), sum_dy,
                         sum_dy_xhat);
  return {sum_dy, sum_dy_xhat};
}

Tensor batch_norm_backward_elemt(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                                 const Tensor& scale, const Tensor& mean_dy, const Tensor& mean_dy_xhat) {
  const Geometry g = geometry("batch_norm backward", x);
  TG_CHECK(dy.sizes() == x.sizes(), "batch_norm backward: grad of shape ", dy.sizes(), " for input of shape ",
           x.sizes());
  Tensor dx = empty(x.sizes(), x.dtype(), x.device());
  backend::get(x.device().type())
      .batch_norm_backward_elemt(dx, like_x(dy, x), native::contiguous(x), g.n, g.c, g.s, vec(mean, x),
                                 vec(invstd, x), vec(scale, x), vec(mean_dy, x), vec(mean_dy_xhat, x));
  return dx;
}

}  // namespace native
}  // namespace tg
