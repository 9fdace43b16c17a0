// Classification losses. cross_entropy over class indices flattens the logits to [rows, C] rows
// (class dim last, contiguous; a view for [N, C]) and runs the fused backend op: one kernel
// forward (per-row loss, logsumexp and target weight) and one backward (grad = s (softmax -
// smoothed one-hot) straight from the logits and the saved logsumexp). Probability targets,
// nll_loss and binary_cross_entropy_with_logits are compositions of differentiable tg ops.
#include <tapegrad/nn/classification.h>

#include <cstdlib>
#include <limits>
#include <memory>
#include <vector>

#include <tapegrad/autograd/function.h>
#include <tapegrad/core/autocast_hook.h>
#include <tapegrad/core/native.h>
#include <tapegrad/core/trace.h>

namespace tg::nn {

namespace {
using backend::LossReduction;

bool& eager_flag() {
  static bool on = [] {
    const char* e = std::getenv("TG_CE_EAGER_GRAD");
    return !(e && std::string(e) == "0");
  }();
  return on;
}
bool eager_cross_entropy_grad() { return eager_flag(); }

LossReduction parse_reduction(const std::string& r, const char* op) {
  TG_CHECK(r == "mean" || r == "sum" || r == "none", op, ": reduction must be 'mean', 'sum' or 'none', got '", r,
           "'");
  return r == "mean" ? LossReduction::Mean : r == "sum" ? LossReduction::Sum : LossReduction::None;
}

// The class dim of logits-like input: 0 for a 1-D (unbatched) input, else 1.
int64_t class_dim(const Tensor& x) { return x.dim() == 1 ? 0 : 1; }

// Checks the class-index target's shape against input's: input without its class dim.
void check_index_target(const Tensor& input, const Tensor& target, const char* op) {
  TG_CHECK(target.dtype() == kInt64 || target.dtype() == kInt32, op,
           ": class-index targets must be int64 (or int32), got ", target.dtype(), " of shape ", target.sizes());
  Shape want;
  for (int64_t d = 0; d < input.dim(); ++d)
    if (d != class_dim(input)) want.push_back(input.size(d));
  TG_CHECK(target.sizes() == want, op, ": input of shape ", input.sizes(), " needs a target of shape ", want,
           ", got ", target.sizes());
}

void check_weight(const Tensor& w, int64_t c, const Tensor& input, const char* op) {
  if (!w.defined()) return;
  TG_CHECK(is_floating(w.dtype()) && w.dim() == 1 && w.size(0) == c, op, ": weight must be a floating [", c,
           "] tensor (one per class), got ", w.sizes(), " ", w.dtype());
  TG_CHECK(w.device() == input.device(), op, ": weight on ", w.device(), " but input on ", input.device());
}

// Targets out of [0, C) other than ignore_index are an error (a host check; on CUDA the fused
// kernel instead makes such a row's loss NaN, without a synchronisation).
void check_target_range(const Tensor& t, int64_t c, int64_t ignore_index, const char* op) {
  if (t.numel() == 0) return;
  Tensor t64 = t.to(kCPU).to(kInt64).contiguous();
  const int64_t* p = t64.data_ptr<int64_t>();
  for (int64_t i = 0; i < t64.numel(); ++i)
    TG_CHECK(p[i] == ignore_index || (p[i] >= 0 && p[i] < c), op, ": target ", p[i], " is out of bounds for ", c,
             " classes");
}

// [N, C, d...] -> [N * d..., C] (class dim last), differentiable; [N, C] and [C] as [rows, C].
Tensor to_rows(const Tensor& x) {
  if (x.dim() == 1) return x.unsqueeze(0);
  if (x.dim() == 2) return x;
  Shape perm{0};
  for (int64_t d = 2; d < x.dim(); ++d) perm.push_back(d);
  perm.push_back(1);
  return x.permute(perm).reshape({-1, x.size(1)});
}

// The fused op over rows: per-row values from the kernel, reduced; backward one kernel. On CUDA,
// when the logits need a gradient and the loss is reduced, the forward kernel also writes the
// gradient for an upstream gradient of 1 (reading each row of logits from DRAM once for both);
// a backward that receives exactly that 1 (loss.backward()) hands it over without a launch, any
// other upstream gradient runs the backward kernel from the saved logsumexp.
// The rows' gradient with recorded ops (create_graph), the kernel's formula: for a row i with target
// t (not ignored), (A_i softmax(x_i) - B_i) g_i / denom, A_i = (1 - eps) w_t + eps W / C,
// B_ic = (1 - eps) w_t [c == t] + eps w_c / C (w = 1 without weights, W = sum w).
Tensor cross_entropy_grad_recorded(const Tensor& x, const backend::Backend::CrossEntropyArgs& a, const Tensor& denom,
                                   const Tensor& g) {
  const int64_t c = x.size(1);
  const double eps = a.label_smoothing;
  const DType dt = x.dtype();
  const TensorOptions opts = TensorOptions().dtype(dt).device(x.device());
  Tensor valid_b = a.target.ne(Scalar(a.ignore_index));
  Tensor t = where(valid_b, a.target, zeros_like(a.target));
  Tensor valid = valid_b.to(dt).unsqueeze(1);  // [N, 1]
  Tensor w = a.weight.defined() ? a.weight.to(dt) : ones({c}, opts);
  Tensor wt = w.index_select(0, t).unsqueeze(1);  // [N, 1]
  Tensor onehot = eq(t.unsqueeze(1), arange(c, TensorOptions().dtype(kInt64).device(x.device())).unsqueeze(0)).to(dt);
  const double k = eps / static_cast<double>(c);
  Tensor A = (wt * (1 - eps) + w.sum() * k) * valid;
  Tensor B = (wt * onehot * (1 - eps) + w.unsqueeze(0) * k) * valid;
  Tensor v = A * softmax(x, 1) - B;
  Tensor s = denom.defined() ? g / denom.to(g.dtype()) : g;
  return v * (s.dim() > 0 ? s.unsqueeze(1) : s);
}

Tensor cross_entropy_rows(const Tensor& x, const Tensor& target, const Tensor& weight, int64_t ignore_index,
                          double eps, LossReduction r, DType out_dtype) {
  const DType acc = native::cross_entropy_acc_dtype(x.dtype());
  backend::Backend::CrossEntropyArgs a;
  Tensor logits = x.contiguous();  // differentiable (the tensor itself when already contiguous)
  a.logits = logits.detach();
  a.target = native::contiguous(native::to(target.reshape({-1}), x.device(), kInt64));
  if (weight.defined()) {
    a.weight = native::contiguous(native::to(weight.detach(), x.device(), acc));
    a.weight_sum = native::reduce(backend::ReduceOp::Sum, a.weight, {}, false);
  }
  a.ignore_index = ignore_index;
  a.label_smoothing = eps;
  const bool rec = autograd::should_record(logits);
  const bool eager = rec && r != LossReduction::None && logits.is_cuda() && eager_cross_entropy_grad();
  Tensor out, denom, lse, grad;
  native::CrossEntropyReduced one;
  if (r != LossReduction::None && native::cross_entropy_reduced(a, r == LossReduction::Mean, eager, one)) {
    // small problems on CUDA: the whole forward (and the eager gradient) in one launch
    out = one.out;
    denom = one.denom;
    lse = one.lse;
    grad = one.grad;
  } else {
    denom = r == LossReduction::Mean ? native::cross_entropy_denominator(a) : Tensor();
    auto rows = native::cross_entropy_rows(a, eager, denom);
    if (r == LossReduction::None) {
      out = rows.loss;
    } else {
      out = native::reduce(backend::ReduceOp::Sum, rows.loss, {}, false);
      if (r == LossReduction::Mean) out = native::div(out, denom);
    }
    lse = rows.lse;
    grad = rows.grad;
  }
  out = native::to(out, out.device(), out_dtype);
  if (!rec) return out;
  autograd::SavedTensor sx(logits, "cross_entropy");
  a.logits = Tensor();
  auto ready = std::make_shared<Tensor>(std::move(grad));  // moved out once: the leaf may keep it
  return autograd::record(
      "cross_entropy", {logits}, std::move(out),
      [sx, a, lse, denom, acc, ready](const Tensor& g, const autograd::FunctionNode&) -> std::vector<Tensor> {
        backend::Backend::CrossEntropyArgs b = a;
        b.logits = sx.unpack();
        if (autograd::creating_graph()) return {cross_entropy_grad_recorded(b.logits, b, denom, g)};
        if (ready->defined() && autograd::is_implicit_one(g)) {
          Tensor gx = std::move(*ready);
          *ready = Tensor();
          return {gx};
        }
        Tensor gg = native::contiguous(native::to(g, b.logits.device(), acc));
        return {native::cross_entropy_rows_backward(b, lse, gg, denom)};
      },
      autograd::kDifferentiable);
}

Tensor reduce_loss(const Tensor& per, LossReduction r) {
  return r == LossReduction::Mean ? per.mean() : r == LossReduction::Sum ? per.sum() : per;
}

// weight [C] shaped to broadcast along input's class dim.
Tensor class_view(const Tensor& w, const Tensor& input) {
  Shape s(static_cast<size_t>(input.dim()), 1);
  s[static_cast<size_t>(class_dim(input))] = w.size(0);
  return w.reshape(s);
}
}  // namespace

namespace functional {

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& o) {
  const char* op = "cross_entropy";
  const LossReduction r = parse_reduction(o.reduction, op);
  TG_CHECK(logits.defined() && target.defined(), op, ": input and target must be defined");
  TG_CHECK(is_floating(logits.dtype()), op, ": expected floating logits, got ", logits.dtype(), " of shape ",
           logits.sizes());
  TG_CHECK(logits.dim() >= 1, op, ": expected logits of shape [C], [N, C] or [N, C, d...], got a 0-d tensor");
  TG_CHECK(target.device() == logits.device(), op, ": input on ", logits.device(), " but target on ",
           target.device());
  TG_CHECK(o.label_smoothing >= 0.0 && o.label_smoothing <= 1.0, op, ": label_smoothing must be in [0, 1], got ",
           o.label_smoothing);
  const int64_t c = logits.size(class_dim(logits));
  check_weight(o.weight, c, logits, op);
  Tensor out;
  if (is_floating(target.dtype())) {
    // Probability targets: -(sum_c w_c t_c log_softmax(x)_c), smoothed t = t (1 - eps) + eps / C;
    // the mean divides by the number of samples (PyTorch's rule for this form).
    TG_AUTOCAST_AS(AutocastCategory::Fp32, cross_entropy(logits, target, o), logits, target);
    TG_CHECK(target.sizes() == logits.sizes(), op, ": probability targets must have the logits' shape ",
             logits.sizes(), ", got ", target.sizes());
    tg::detail::TracerGuard untraced(nullptr);
    const int64_t cd = class_dim(logits);
    Tensor logp = log_softmax(logits, cd);
    Tensor t = o.label_smoothing > 0 ? target * (1.0 - o.label_smoothing) + o.label_smoothing / static_cast<double>(c)
                                     : target;
    Tensor prod = logp * t;
    if (o.weight.defined()) prod = prod * class_view(o.weight, logits);
    if (r == LossReduction::None) {
      out = -prod.sum(cd);
    } else {
      out = -prod.sum();
      if (r == LossReduction::Mean) out = out / static_cast<double>(c == 0 ? 0 : logits.numel() / c);
    }
  } else {
    check_index_target(logits, target, op);
    if (logits.is_cpu()) check_target_range(target, c, o.ignore_index, op);
    // Autocast's float32 policy: the fused kernel reads float16 / bfloat16 logits as they are and
    // accumulates in float; only the loss comes out in float32 (the gradient in the logits' dtype).
    DType out_dtype = logits.dtype();
    if (amp::detail::fp32_reads_reduced(logits)) out_dtype = kFloat32;
    tg::detail::TracerGuard untraced(nullptr);
    out = cross_entropy_rows(to_rows(logits), target, o.weight, o.ignore_index, o.label_smoothing, r, out_dtype);
    if (r == LossReduction::None) out = out.reshape(target.sizes());
  }
  std::vector<Tensor> ins{logits, target};
  if (o.weight.defined()) ins.push_back(o.weight);
  TG_TRACE(CrossEntropy, out, std::move(ins),
           {{"reduction", static_cast<int64_t>(r)},
            {"ignore_index", o.ignore_index},
            {"label_smoothing", o.label_smoothing}});
  return out;
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const NllLossOptions& o) {
  const char* op = "nll_loss";
  const LossReduction r = parse_reduction(o.reduction, op);
  TG_CHECK(log_probs.defined() && target.defined(), op, ": input and target must be defined");
  TG_CHECK(is_floating(log_probs.dtype()), op, ": expected floating log-probabilities, got ", log_probs.dtype(),
           " of shape ", log_probs.sizes());
  TG_CHECK(log_probs.dim() >= 1, op, ": expected input of shape [C], [N, C] or [N, C, d...], got a 0-d tensor");
  TG_CHECK(target.device() == log_probs.device(), op, ": input on ", log_probs.device(), " but target on ",
           target.device());
  TG_AUTOCAST_AS(AutocastCategory::Fp32, nll_loss(log_probs, target, o), log_probs);
  check_index_target(log_probs, target, op);
  const int64_t cd = class_dim(log_probs);
  const int64_t c = log_probs.size(cd);
  check_weight(o.weight, c, log_probs, op);
  check_target_range(target, c, o.ignore_index, op);
  Tensor out;
  {
    tg::detail::TracerGuard untraced(nullptr);
    // A [.., C, ..] selection mask: class == target and target != ignore_index, times the weight.
    Tensor t = target.to(kInt64).unsqueeze(cd);
    Shape cls_shape(static_cast<size_t>(log_probs.dim()), 1);
    cls_shape[static_cast<size_t>(cd)] = c;
    Tensor cls = arange(c, TensorOptions().dtype(kInt64).device(log_probs.device())).reshape(cls_shape);
    Tensor sel = eq(t, cls).to(log_probs.dtype()) * t.ne(Scalar(o.ignore_index)).to(log_probs.dtype());
    if (o.weight.defined()) sel = sel * class_view(o.weight.to(log_probs.dtype()), log_probs);
    Tensor per = -(log_probs * sel).sum(cd);
    if (r == LossReduction::None) out = per;
    else if (r == LossReduction::Sum) out = per.sum();
    else out = per.sum() / sel.sum();
  }
  std::vector<Tensor> ins{log_probs, target};
  if (o.weight.defined()) ins.push_back(o.weight);
  TG_TRACE(NllLoss, out, std::move(ins), {{"reduction", static_cast<int64_t>(r)}, {"ignore_index", o.ignore_index}});
  return out;
}

Tensor binary_cross_entropy_with_logits(const Tensor& x, const Tensor& target, const BCEWithLogitsOptions& o) {
  const char* op = "binary_cross_entropy_with_logits";
  const LossReduction r = parse_reduction(o.reduction, op);
  TG_CHECK(x.defined() && target.defined(), op, ": input and target must be defined");
  TG_CHECK(is_floating(x.dtype()) && is_floating(target.dtype()), op, ": expected floating input and target, got ",
           x.dtype(), " and ", target.dtype());
  TG_CHECK(target.sizes() == x.sizes(), op, ": target size ", target.sizes(), " must be the same as input size ",
           x.sizes());
  TG_CHECK(target.device() == x.device(), op, ": input on ", x.device(), " but target on ", target.device());
  for (const Tensor* w : {&o.weight, &o.pos_weight})
    if (w->defined()) {
      TG_CHECK(w->device() == x.device(), op, ": weight on ", w->device(), " but input on ", x.device());
      tg::detail::broadcast_shapes(w->sizes(), x.sizes(), op);
    }
  TG_AUTOCAST_AS(AutocastCategory::Fp32, binary_cross_entropy_with_logits(x, target, o), x, target);
  Tensor out;
  {
    tg::detail::TracerGuard untraced(nullptr);
    // PyTorch's stable form: (1 - y) x + lw (log(1 + exp(-|x|)) + max(-x, 0)), lw = (p - 1) y + 1.
    // softplus(-x) = log(1 + exp(-|x|)) + max(-x, 0); its derivative at x = 0 must be -1/2, which the
    // composite of abs / relu gets wrong, so the value is computed without recording and the
    // gradient recorded explicitly: dx = (lw sigmoid(x) - p y) ... = ((p - 1) y + 1) s(x) - p y.
    Tensor per;
    {
      NoGradGuard ng;
      Tensor sp = (((-x.abs()).exp() + 1.0).log() + (-x).relu());
      Tensor lw = o.pos_weight.defined() ? (o.pos_weight - 1.0) * target + 1.0 : Tensor();
      per = (1.0 - target) * x + (lw.defined() ? lw * sp : sp);
      if (o.weight.defined()) per = per * o.weight;
    }
    const bool rec = autograd::should_record(x, target);
    if (rec) {
      autograd::SavedTensor sx(x, op), st(target, op);
      Tensor w = o.weight.defined() ? o.weight.detach() : Tensor();
      Tensor p = o.pos_weight.defined() ? o.pos_weight.detach() : Tensor();
      per = autograd::record(op, {x, target}, per,
                             [sx, st, w, p](const Tensor& g, const autograd::FunctionNode& n) -> std::vector<Tensor> {
                               Tensor xv = sx.unpack(), yv = st.unpack();
                               Tensor gx, gy;
                               NoGradGuard ng;
                               Tensor gw = w.defined() ? g * w : g;
                               if (n.needs_input_grad(0)) {
                                 Tensor s = xv.sigmoid();
                                 Tensor d = p.defined() ? ((p - 1.0) * yv + 1.0) * s - p * yv : s - yv;
                                 gx = native::sum_to(d * gw, xv.sizes());
                               }
                               if (n.needs_input_grad(1)) {
                                 // d/dy = -x + (p - 1) softplus(-x) (the second term only with pos_weight)
                                 Tensor d = -xv;
                                 if (p.defined())
                                   d = d + (p - 1.0) * (((-xv.abs()).exp() + 1.0).log() + (-xv).relu());
                                 gy = native::sum_to(d * gw, yv.sizes());
                               }
                               return {gx, gy};
                             });
    }
    out = reduce_loss(per, r);
  }
  std::vector<Tensor> ins{x, target};
  if (o.weight.defined()) ins.push_back(o.weight);
  if (o.pos_weight.defined()) ins.push_back(o.pos_weight);
  TG_TRACE(BceWithLogits, out, std::move(ins),
           {{"reduction", static_cast<int64_t>(r)},
            {"has_weight", o.weight.defined()},
            {"has_pos_weight", o.pos_weight.defined()}});
  return out;
}

}  // namespace functional

CrossEntropyLoss::CrossEntropyLoss(functional::CrossEntropyOptions options) : options_(std::move(options)) {
  parse_reduction(options_.reduction, "CrossEntropyLoss");
  if (options_.weight.defined()) weight = register_buffer("weight", options_.weight);
}
Tensor CrossEntropyLoss::forward(const Tensor& input, const Tensor& target) const {
  functional::CrossEntropyOptions o = options_;
  o.weight = weight;
  return functional::cross_entropy(input, target, o);
}
Tensor CrossEntropyLoss::forward(const Tensor&) {
  TG_ERROR("CrossEntropyLoss: forward needs (input, target); call loss(input, target)");
}

NLLLoss::NLLLoss(functional::NllLossOptions options) : options_(std::move(options)) {
  parse_reduction(options_.reduction, "NLLLoss");
  if (options_.weight.defined()) weight = register_buffer("weight", options_.weight);
}
Tensor NLLLoss::forward(const Tensor& input, const Tensor& target) const {
  functional::NllLossOptions o = options_;
  o.weight = weight;
  return functional::nll_loss(input, target, o);
}
Tensor NLLLoss::forward(const Tensor&) { TG_ERROR("NLLLoss: forward needs (input, target); call loss(input, target)"); }

BCEWithLogitsLoss::BCEWithLogitsLoss(functional::BCEWithLogitsOptions options) : options_(std::move(options)) {
  parse_reduction(options_.reduction, "BCEWithLogitsLoss");
  if (options_.weight.defined()) weight = register_buffer("weight", options_.weight);
  if (options_.pos_weight.defined()) pos_weight = register_buffer("pos_weight", options_.pos_weight);
}
Tensor BCEWithLogitsLoss::forward(const Tensor& input, const Tensor& target) const {
  functional::BCEWithLogitsOptions o = options_;
  o.weight = weight;
  o.pos_weight = pos_weight;
  return functional::binary_cross_entropy_with_logits(input, target, o);
}
Tensor BCEWithLogitsLoss::forward(const Tensor&) {
  TG_ERROR("BCEWithLogitsLoss: forward needs (input, target); call loss(input, target)");
}

}  // namespace tg::nn
