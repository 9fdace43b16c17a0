// batch_norm (training: the native batch_norm kernels with the backward right below, recorded ops
// under create_graph; eval: x * scale
// + shift as broadcast ops), group_norm (layer_norm's fused kernels on [N * groups, rest], then the
// per-channel affine as broadcast mul / add), and the modules.
#include <tapegrad/nn/batch_norm.h>

#include <cmath>

#include <tapegrad/autograd/autograd.h>
#include <tapegrad/autograd/function.h>
#include <tapegrad/core/native.h>
#include <tapegrad/core/ops.h>
#include <tapegrad/core/trace.h>
#include <tapegrad/nn/init.h>
#include <tapegrad/nn/normalization.h>

namespace tg::nn {

namespace {
// Statistics and the affine in float32 (float64 for float64), as PyTorch's opmath.
DType compute_dtype(DType x) { return x == kFloat64 ? kFloat64 : kFloat32; }

void check_channel_vec(const char* op, const char* what, const Tensor& t, const Tensor& x, int64_t c) {
  if (!t.defined()) return;
  TG_CHECK(t.dim() == 1 && t.numel() == c, op, ": ", what, " should contain ", c, " elements (one per channel of ",
           "input of shape ", x.sizes(), "), got shape ", t.sizes());
  TG_CHECK(is_floating(t.dtype()), op, ": ", what, " must be floating point, got ", t.dtype());
  TG_CHECK(t.device() == x.device(), op, ": input on ", x.device(), " but ", what, " on ", t.device());
}

void check_input(const char* op, const Tensor& x, double eps) {
  TG_CHECK(x.defined(), op, ": input is undefined");
  TG_CHECK(is_floating(x.dtype()), op, ": expected a floating input, got ", x.dtype(), " of shape ", x.sizes());
  TG_CHECK(x.dim() >= 2, op, ": expected input [N, C, *] with at least 2 dims, got shape ", x.sizes());
  TG_CHECK(std::isfinite(eps) && eps >= 0, op, ": eps must be finite and >= 0, got ", eps);
}

// [1, C, 1, ...] with x's rank: a per-channel vector broadcast against x.
Tensor per_channel(const Tensor& v, const Tensor& x, DType dt) {
  Shape s(static_cast<size_t>(x.dim()), 1);
  s[1] = x.sizes()[1];
  return v.to(dt).reshape(s);
}

// y itself when dense row-major or channels-last (the layouts results keep), else a row-major copy.
Tensor dense(const Tensor& y) {
  return y.is_contiguous() || y.is_contiguous(MemoryFormat::ChannelsLast) ? y : y.contiguous();
}

// y * weight + bias per channel (each optional), then the input's dtype; y's layout (the
// broadcast ops follow a channels-last y).
Tensor affine_out(Tensor y, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const DType dt = y.dtype();
  if (weight.defined()) y = y * per_channel(weight, x, dt);
  if (bias.defined()) y = y + per_channel(bias, x, dt);
  return dense(y.to(x.dtype()));
}

// batch_norm's gradients (training mode) with recorded ops, for create_graph: the statistics
// recomputed from x, then with xh = (x - mean) rstd over every dim but the channel's and
// gh = g weight: gx = rstd (gh - mean(gh) - xh mean(gh xh)), gw = sum(g xh), gb = sum(g).
std::vector<Tensor> batch_norm_backward_recorded(const Tensor& g, const Tensor& x, const Tensor& weight, double eps,
                                                 DType wdt, DType bdt, bool need_x, bool need_w, bool need_b) {
  const DType dt = compute_dtype(x.dtype());
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d != 1) dims.push_back(d);
  const DimList red(dims);
  Tensor xf = x.to(dt), gf = g.to(dt);
  Tensor xc = xf - xf.mean(red, true);
  Tensor rstd = tg::rsqrt((xc * xc).mean(red, true) + eps);
  Tensor xh = xc * rstd;
  std::vector<Tensor> out(3);
  if (need_x) {
    Tensor gh = weight.defined() ? gf * per_channel(weight, x, dt) : gf;
    out[0] = (rstd * (gh - gh.mean(red, true) - xh * (gh * xh).mean(red, true))).to(x.dtype());
  }
  if (need_w) out[1] = (gf * xh).sum(red).to(wdt);
  if (need_b) out[2] = gf.sum(red).to(bdt);
  return out;
}

// Training mode on a non-empty x: the fused kernels (native::batch_norm_*), batch statistics,
// the running-stat update, and a node whose backward is one per-channel reduction and one
// elementwise pass. Per-channel vectors in the accumulation dtype. relu: relu(batch_norm(x)) in
// the same passes (the forward clamps as it writes; backward masks dy by the saved output > 0,
// ReLU's own rule, which that output's next consumer keeps alive anyway).
Tensor batch_norm_train(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                        const Tensor& bias, double momentum, double eps, bool relu) {
  const DType dt = compute_dtype(x.dtype());
  const double count = static_cast<double>(x.numel() / x.sizes()[1]);
  Tensor mean, invstd, scale, shift;
  {
    NoGradGuard no_grad;
    native::BatchNormStats st = native::batch_norm_stats(x);
    if (running_mean.defined()) {
      running_mean.copy_(running_mean.to(dt) * (1 - momentum) + st.mean * momentum);
      // unbiased variance, as PyTorch's running_var
      running_var.copy_(running_var.to(dt) * (1 - momentum) + st.var * (momentum * count / (count - 1)));
    }
    mean = st.mean;
    invstd = tg::rsqrt(st.var + eps);
    scale = weight.defined() ? invstd * weight.detach().to(dt) : invstd;
    if (bias.defined()) shift = bias.detach().to(dt);
  }
  Tensor y = native::batch_norm_elemt(x, mean, scale, shift, relu);
  if (!autograd::should_record(x, weight, bias)) return y;
  const char* op = relu ? "batch_norm_relu" : "batch_norm";
  autograd::SavedTensor sx(x, op);  // x itself (its history: the create_graph branch differentiates through it)
  autograd::SavedTensor sy = relu ? autograd::SavedTensor(y, op, autograd::Saved::kOutput) : autograd::SavedTensor();
  const DType wdt = weight.defined() ? weight.dtype() : dt, bdt = bias.defined() ? bias.dtype() : dt;
  autograd::SavedTensor sw = weight.defined() ? autograd::SavedTensor(weight, op) : autograd::SavedTensor();
  const bool has_w = weight.defined();
  return autograd::record(
      op, {x, weight, bias}, std::move(y),
      [sx, sw, sy, relu, has_w, mean, invstd, scale, count, eps, wdt, bdt](
          const Tensor& g, const autograd::FunctionNode& n) -> std::vector<Tensor> {
        if (autograd::creating_graph()) {
          const Tensor gz = relu ? autograd::bw::elementwise_backward("relu_backward", backend::ElemOp::ReluBackward, g,
                                                                      sy.unpack())
                                 : g;
          return batch_norm_backward_recorded(gz, sx.unpack(), has_w ? sw.unpack() : Tensor(), eps, wdt, bdt,
                                              n.needs_input_grad(0), n.needs_input_grad(1), n.needs_input_grad(2));
        }
        NoGradGuard no_grad;
        // x, g (and the ReLU's output) in the kernels' layout once (x's: channels-last stays so),
        // for both passes.
        const Tensor x0 = sx.unpack();
        const Tensor xv = native::batch_norm_operand(x0, x0), gv = native::batch_norm_operand(g, x0);
        const Tensor rv = relu ? native::batch_norm_operand(sy.unpack(), x0) : Tensor();
        auto [sum_dy, sum_dy_xhat] = native::batch_norm_reduce(gv, xv, mean, invstd, rv);
        std::vector<Tensor> out(3);
        if (n.needs_input_grad(0))
          out[0] = native::batch_norm_backward_elemt(gv, xv, mean, invstd, scale, sum_dy * (1 / count),
                                                     sum_dy_xhat * (1 / count), rv);
        if (n.needs_input_grad(1)) out[1] = sum_dy_xhat.to(wdt);
        if (n.needs_input_grad(2)) out[2] = sum_dy.to(bdt);
        return out;
      },
      autograd::kDifferentiable);
}

// Traced operands: x[, weight[, bias]]; a bias without a weight traces a weight of ones.
std::vector<Tensor> traced_operands(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  std::vector<Tensor> ins{x};
  if (weight.defined() || bias.defined())
    ins.push_back(weight.defined() ? weight : native::full({x.sizes()[1]}, 1, bias.dtype(), x.device()));
  if (bias.defined()) ins.push_back(bias);
  return ins;
}

// batch_norm, then ReLU when relu (fused in training mode unless a tracer records the two ops).
Tensor batch_norm_impl(const char* op, const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, bool training, double momentum, double eps,
                       bool relu) {
  check_input(op, x, eps);
  const int64_t c = x.sizes()[1];
  const int64_t per_channel_count = c == 0 ? 0 : x.numel() / c;  // N * prod(spatial)
  check_channel_vec(op, "weight", weight, x, c);
  check_channel_vec(op, "bias", bias, x, c);
  check_channel_vec(op, "running_mean", running_mean, x, c);
  check_channel_vec(op, "running_var", running_var, x, c);
  TG_CHECK(running_mean.defined() == running_var.defined(), op,
           ": running_mean and running_var must be both defined or both undefined");
  TG_CHECK(std::isfinite(momentum), op, ": momentum must be finite, got ", momentum);
  if (training)
    TG_CHECK(per_channel_count != 1, op, ": Expected more than 1 value per channel when training, got input of shape ",
             x.sizes());
  const DType dt = compute_dtype(x.dtype());
  const bool use_batch_stats = training || !running_mean.defined();
  if (!use_batch_stats) {
    // Broadcast ops, which tracing records (so an exported eval-mode model keeps batch_norm).
    Tensor xc = x.to(dt);
    // y = x * scale + shift, scale = rsqrt(running_var + eps) [* weight], shift = [bias] - mean * scale.
    Tensor scale = tg::rsqrt(running_var.to(dt) + eps);
    if (weight.defined()) scale = scale * weight.to(dt);
    Tensor shift = running_mean.to(dt) * scale;
    shift = bias.defined() ? bias.to(dt) - shift : -shift;
    Tensor y = xc * per_channel(scale, x, dt) + per_channel(shift, x, dt);  // x's layout when channels-last
    y = dense(y.to(x.dtype()));
    return relu ? tg::relu(y) : y;
  }
  // A tracer sees batch_norm and relu as the two ops they are: unfused while one records.
  const bool fuse = relu && x.numel() > 0 && detail::tls_tracer == nullptr;
  Tensor out;
  {
    // Traced as one batch_norm node (batch statistics); the running-stat update is not part of it.
    detail::TracerGuard inner(nullptr);
    out = x.numel() == 0 ? affine_out(x.to(dt), x, weight, bias)  // nothing to normalize
                         : batch_norm_train(x, running_mean, running_var, weight, bias, momentum, eps, fuse);
  }
  if (fuse) return out;
  TG_TRACE(BatchNorm, out, traced_operands(x, weight, bias), {{"eps", eps}});
  return relu ? tg::relu(out) : out;
}
}  // namespace

namespace functional {

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps) {
  return batch_norm_impl("batch_norm", x, running_mean, running_var, weight, bias, training, momentum, eps, false);
}

Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, double momentum, double eps) {
  return batch_norm_impl("batch_norm_relu", x, running_mean, running_var, weight, bias, training, momentum, eps, true);
}

Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias, double eps) {
  const char* op = "group_norm";
  check_input(op, x, eps);
  const int64_t n = x.sizes()[0], c = x.sizes()[1];
  TG_CHECK(groups > 0 && c % groups == 0, op,
           ": expected the number of channels to be divisible by groups, got input of shape ", x.sizes(),
           " and groups = ", groups);
  check_channel_vec(op, "weight", weight, x, c);
  check_channel_vec(op, "bias", bias, x, c);
  const DType dt = compute_dtype(x.dtype());
  const int64_t cols = n * groups == 0 ? 0 : x.numel() / (n * groups);
  Tensor out;
  {
    detail::TracerGuard inner(nullptr);  // traced as one group_norm node
    Tensor rows = x.to(dt).reshape({n * groups, cols});
    Tensor normed = layer_norm(rows, {cols}, Tensor(), Tensor(), eps);
    out = affine_out(normed.reshape(x.sizes()), x, weight, bias);
  }
  TG_TRACE(GroupNorm, out, traced_operands(x, weight, bias), {{"num_groups", groups}, {"eps", eps}});
  return out;
}

}  // namespace functional

namespace {
TensorOptions param_options(const char* cls, const TensorOptions& tensor_options) {
  TG_CHECK(is_floating(tensor_options.dtype()), cls, ": parameters must be floating point, got ",
           tensor_options.dtype());
  return TensorOptions().dtype(tensor_options.dtype()).device(tensor_options.device());
}
}  // namespace

BatchNormBase::BatchNormBase(int64_t features, BatchNormOptions opts, TensorOptions tensor_options)
    : num_features(features), options(opts) {
  TG_CHECK(features > 0, "BatchNorm: num_features must be positive, got ", features);
  const TensorOptions to = param_options("BatchNorm", tensor_options);
  if (options.affine) {
    weight = register_parameter("weight", empty({features}, to));
    bias = register_parameter("bias", empty({features}, to));
  }
  if (options.track_running_stats) {
    running_mean = register_buffer("running_mean", empty({features}, to));
    running_var = register_buffer("running_var", empty({features}, to));
    num_batches_tracked = register_buffer("num_batches_tracked",
                                          zeros({}, TensorOptions().dtype(kInt64).device(tensor_options.device())));
  }
  reset_parameters();
}

void BatchNormBase::reset_running_stats() {
  if (!options.track_running_stats) return;
  NoGradGuard no_grad;
  init::zeros_(running_mean);
  init::ones_(running_var);
  num_batches_tracked.copy_(zeros({}, TensorOptions().dtype(kInt64).device(num_batches_tracked.device())));
}

void BatchNormBase::reset_parameters() {
  reset_running_stats();
  if (weight.defined()) init::ones_(weight);
  if (bias.defined()) init::zeros_(bias);
}

Tensor BatchNormBase::forward(const Tensor& x) { return normalize(x, false); }

Tensor BatchNormReLU2d::forward(const Tensor& x) { return normalize(x, true); }

Tensor BatchNormBase::normalize(const Tensor& x, bool relu) {
  check_input_dim(x);
  double factor = options.momentum.value_or(0.0);
  if (is_training() && options.track_running_stats) {
    NoGradGuard no_grad;
    num_batches_tracked.add_(1);
    if (!options.momentum) factor = 1.0 / static_cast<double>(num_batches_tracked.item<int64_t>());
  }
  const bool bn_training = is_training() || !running_mean.defined();
  const bool pass_stats = !is_training() || options.track_running_stats;
  return (relu ? functional::batch_norm_relu : functional::batch_norm)(
      x, pass_stats ? running_mean : Tensor(), pass_stats ? running_var : Tensor(), weight, bias, bn_training, factor,
      options.eps);
}

void BatchNorm1d::check_input_dim(const Tensor& x) const {
  TG_CHECK(x.defined() && (x.dim() == 2 || x.dim() == 3), "BatchNorm1d: expected 2D or 3D input, got shape ",
           x.defined() ? x.sizes() : Shape{});
}

void BatchNorm2d::check_input_dim(const Tensor& x) const {
  TG_CHECK(x.defined() && x.dim() == 4, "BatchNorm2d: expected 4D input, got shape ",
           x.defined() ? x.sizes() : Shape{});
}

GroupNorm::GroupNorm(int64_t groups, int64_t channels, GroupNormOptions opts, TensorOptions tensor_options)
    : num_groups(groups), num_channels(channels), options(opts) {
  TG_CHECK(groups > 0 && channels >= 0 && channels % groups == 0,
           "GroupNorm: num_channels must be divisible by num_groups, got num_groups = ", groups,
           " and num_channels = ", channels);
  const TensorOptions to = param_options("GroupNorm", tensor_options);
  if (options.affine) {
    weight = register_parameter("weight", empty({channels}, to));
    bias = register_parameter("bias", empty({channels}, to));
  }
  reset_parameters();
}

void GroupNorm::reset_parameters() {
  if (weight.defined()) init::ones_(weight);
  if (bias.defined()) init::zeros_(bias);
}

Tensor GroupNorm::forward(const Tensor& x) { return functional::group_norm(x, num_groups, weight, bias, options.eps); }

}  // namespace tg::nn
