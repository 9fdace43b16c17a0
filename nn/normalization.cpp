// layer_norm / rms_norm with their backward right below, and the modules.
#include <tapegrad/nn/normalization.h>

#include <limits>
#include <vector>

#include <tapegrad/autograd/function.h>
#include <tapegrad/core/autocast_hook.h>
#include <tapegrad/core/native.h>
#include <tapegrad/core/trace.h>
#include <tapegrad/nn/init.h>

namespace tg::nn {

namespace {
double machine_eps(DType dt) {
  switch (dt) {
    case kFloat64:
      return std::numeric_limits<double>::epsilon();
    case kFloat16:
      return 0.0009765625;  // 2^-10
    case kBFloat16:
      return 0.0078125;  // 2^-7
    default:
      return std::numeric_limits<float>::epsilon();
  }
}

// The norm's gradients with recorded ops (create_graph): mean and rstd recomputed from x, then
// gx = rstd (gh - mean(gh) - xh mean(gh xh)) with gh = g w (rms: no mean terms), gw = sum(g xh), gb = sum(g).
std::vector<Tensor> norm_backward_recorded(const Tensor& g, const Tensor& x, const Shape& ns, const Tensor& w,
                                           double eps, bool rms, bool need_x, bool need_w, bool need_b) {
  const int64_t lead = x.dim() - static_cast<int64_t>(ns.size());
  std::vector<int64_t> norm_dims, batch_dims;
  for (int64_t d = 0; d < x.dim(); ++d) (d < lead ? batch_dims : norm_dims).push_back(d);
  Tensor xc = rms ? x : tg::sub(x, x.mean(DimList(norm_dims), true));
  Tensor rstd = tg::rsqrt(tg::add(tg::mul(xc, xc).mean(DimList(norm_dims), true), Scalar(eps)));
  Tensor xh = tg::mul(xc, rstd);
  Tensor gx, gw, gb;
  if (need_x) {
    Tensor gh = w.defined() ? tg::mul(g, w) : g;
    Tensor inner = tg::sub(gh, tg::mul(xh, tg::mul(gh, xh).mean(DimList(norm_dims), true)));
    if (!rms) inner = tg::sub(inner, gh.mean(DimList(norm_dims), true));
    gx = tg::mul(rstd, inner);
  }
  auto over_batch = [&](const Tensor& t) { return batch_dims.empty() ? t : t.sum(DimList(batch_dims)); };
  if (need_w) gw = over_batch(tg::mul(g, xh));
  if (need_b) gb = over_batch(g);
  return {gx, gw, gb};
}

// The fused forward, and a node whose backward is one fused kernel (grad_x, grad_weight,
// grad_bias from the saved x, weight, mean and rstd).
Tensor norm_op(const char* op, const Tensor& x, const Shape& ns, const Tensor& weight, const Tensor& bias, double eps,
               bool rms) {
  // Under autocast a float32 norm's output is nearly always lowered next (the Linear after it): the
  // kernel writes that cast too, and the cast takes it (core/cast_copies.h: twins).
  native::NormResult r = native::norm_forward(op, x, ns, weight, bias, eps, rms, amp::detail::lowered_dtype(x));
  if (!autograd::should_record(x, weight, bias)) return r.y;
  autograd::SavedTensor sx(x, op), sw = weight.defined() ? autograd::SavedTensor(weight, op) : autograd::SavedTensor();
  Tensor mean = r.mean, rstd = r.rstd;
  const bool has_w = weight.defined();
  return autograd::record(
      op, {x, weight, bias}, std::move(r.y),
      [sx, sw, has_w, mean, rstd, ns, rms, eps](const Tensor& g,
                                                const autograd::FunctionNode& n) -> std::vector<Tensor> {
        if (autograd::creating_graph())
          return norm_backward_recorded(g, sx.unpack(), ns, has_w ? sw.unpack() : Tensor(), eps, rms,
                                        n.needs_input_grad(0), n.needs_input_grad(1), n.needs_input_grad(2));
        const Tensor x = sx.unpack();
        // x's gradient from its other consumers (a residual connection's) is added as it is written.
        const Tensor pending = n.needs_input_grad(0)
                                   ? autograd::take_pending_grad(n, 0, x.sizes(), x.dtype(), x.device())
                                   : Tensor();
        return native::norm_backward(g, x, ns, has_w ? sw.unpack() : Tensor(), mean, rstd, rms,
                                     n.needs_input_grad(0), n.needs_input_grad(1), n.needs_input_grad(2), pending,
                                     autograd::grad_twin_dtype(n, 0));
      },
      autograd::kDifferentiable);
}
// layer_norm's traced operands: x[, weight[, bias]], trailing ones only; a bias without a weight
// traces a weight of ones. (Evaluated by TG_TRACE only while tracing.)
std::vector<Tensor> traced_operands(const Tensor& x, const Shape& ns, const Tensor& weight, const Tensor& bias) {
  std::vector<Tensor> ins{x};
  if (weight.defined() || bias.defined())
    ins.push_back(weight.defined() ? weight : native::full(ns, 1, x.dtype(), x.device()));
  if (bias.defined()) ins.push_back(bias);
  return ins;
}
}  // namespace

namespace functional {

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  TG_AUTOCAST(LayerNorm, layer_norm(x, normalized_shape, weight, bias, eps), x, weight, bias);
  Tensor out = norm_op("layer_norm", x, normalized_shape, weight, bias, eps, false);
  TG_TRACE(LayerNorm, out, traced_operands(x, normalized_shape, weight, bias),
           {{"normalized_shape", std::vector<int64_t>(normalized_shape)}, {"eps", eps}});
  return out;
}

Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, std::optional<double> eps) {
  TG_AUTOCAST(RmsNorm, rms_norm(x, normalized_shape, weight, eps), x, weight);
  TG_CHECK(x.defined(), "rms_norm: input is undefined");
  const double e = eps ? *eps : machine_eps(x.dtype());
  Tensor out = norm_op("rms_norm", x, normalized_shape, weight, Tensor(), e, true);
  if (weight.defined()) {
    TG_TRACE(RmsNorm, out, {x, weight}, {{"normalized_shape", std::vector<int64_t>(normalized_shape)}, {"eps", e}});
  } else {
    TG_TRACE(RmsNorm, out, {x}, {{"normalized_shape", std::vector<int64_t>(normalized_shape)}, {"eps", e}});
  }
  return out;
}

}  // namespace functional

namespace {
void check_shape(const char* what, const Shape& s) {
  TG_CHECK(!s.empty(), what, ": normalized_shape must have at least one dim");
  for (int64_t d : s) TG_CHECK(d >= 0, what, ": normalized_shape must be non-negative, got ", s);
}
}  // namespace

LayerNorm::LayerNorm(Shape shape, LayerNormOptions opts, TensorOptions tensor_options)
    : normalized_shape(std::move(shape)), options(opts) {
  check_shape("LayerNorm", normalized_shape);
  TG_CHECK(is_floating(tensor_options.dtype()), "LayerNorm: parameters must be floating point, got ",
           tensor_options.dtype());
  const TensorOptions to = TensorOptions().dtype(tensor_options.dtype()).device(tensor_options.device());
  if (options.elementwise_affine) {
    weight = register_parameter("weight", empty(normalized_shape, to));
    if (options.bias) bias = register_parameter("bias", empty(normalized_shape, to));
  }
  reset_parameters();
}

void LayerNorm::reset_parameters() {
  if (weight.defined()) init::ones_(weight);
  if (bias.defined()) init::zeros_(bias);
}

Tensor LayerNorm::forward(const Tensor& x) {
  return functional::layer_norm(x, normalized_shape, weight, bias, options.eps);
}

RMSNorm::RMSNorm(Shape shape, RMSNormOptions opts, TensorOptions tensor_options)
    : normalized_shape(std::move(shape)), options(opts) {
  check_shape("RMSNorm", normalized_shape);
  TG_CHECK(is_floating(tensor_options.dtype()), "RMSNorm: parameters must be floating point, got ",
           tensor_options.dtype());
  const TensorOptions to = TensorOptions().dtype(tensor_options.dtype()).device(tensor_options.device());
  if (options.elementwise_affine) weight = register_parameter("weight", empty(normalized_shape, to));
  reset_parameters();
}

void RMSNorm::reset_parameters() {
  if (weight.defined()) init::ones_(weight);
}

Tensor RMSNorm::forward(const Tensor& x) { return functional::rms_norm(x, normalized_shape, weight, options.eps); }

}  // namespace tg::nn
