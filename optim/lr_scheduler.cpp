// The lr schedulers of optim/lr_scheduler.h: torch.optim.lr_scheduler's get_lr (chainable) and
// _get_closed_form_lr formulas, written with the same operations in the same order so that the
// doubles agree with PyTorch's.
#include <tapegrad/optim/lr_scheduler.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <numbers>
#include <set>
#include <utility>

#include <tapegrad/core/error.h>
#include <tapegrad/core/ops.h>

namespace tg::optim::lr_scheduler {

namespace {

constexpr double kPi = std::numbers::pi;

Tensor i64(int64_t v) { return tg::full({}, v, kInt64); }
Tensor f64(double v) { return tg::full({}, v, kFloat64); }
Tensor f64s(const std::vector<double>& v) { return tg::tensor(v); }
Tensor i64s(const std::vector<int64_t>& v) { return tg::tensor(v); }

const Tensor& entry(const nn::StateDict& in, const std::string& key) {
  const Tensor* t = in.find(key);
  TG_CHECK(t != nullptr, "LRScheduler.load_state_dict: missing entry '", key, "'");
  return *t;
}
int64_t get_i64(const nn::StateDict& in, const std::string& key) { return entry(in, key).item<int64_t>(); }
double get_f64(const nn::StateDict& in, const std::string& key) { return entry(in, key).item<double>(); }
std::vector<double> get_f64s(const nn::StateDict& in, const std::string& key) {
  return entry(in, key).contiguous().to_vector<double>();
}
std::vector<int64_t> get_i64s(const nn::StateDict& in, const std::string& key) {
  return entry(in, key).contiguous().to_vector<int64_t>();
}

std::string type_of(const nn::StateDict& sd) {
  const Tensor* t = sd.find("type");
  if (t == nullptr || !t->defined() || t->dtype() != kUInt8 || t->dim() != 1 || t->numel() > 256) return {};
  std::vector<uint8_t> bytes = t->contiguous().to_vector<uint8_t>();
  return std::string(bytes.begin(), bytes.end());
}

// One value for every group, or one per group.
std::vector<double> per_group(const char* op, const char* what, const std::vector<double>& v, size_t groups) {
  TG_CHECK(v.size() == 1 || v.size() == groups, op, ": ", what, " must have one value or one per parameter group (",
           groups, "), got ", v.size());
  return v.size() == 1 ? std::vector<double>(groups, v[0]) : v;
}

// Python's a % b for b > 0 (non-negative).
int64_t py_mod(int64_t a, int64_t b) {
  int64_t r = a % b;
  return r < 0 ? r + b : r;
}

}  // namespace

// ---- LRScheduler

LRScheduler::LRScheduler(Optimizer& optimizer, bool track_initial_lr) : optimizer_(&optimizer) {
  const size_t n = optimizer.num_param_groups();
  if (track_initial_lr) {
    for (size_t g = 0; g < n; ++g) {
      if (std::isnan(optimizer.initial_lr(g))) optimizer.set_initial_lr(g, optimizer.lr(g));  // setdefault
      base_lrs_.push_back(optimizer.initial_lr(g));
    }
  }
  last_lr_ = current_lrs();
}

std::vector<double> LRScheduler::current_lrs() const {
  std::vector<double> out;
  for (size_t g = 0; g < optimizer_->num_param_groups(); ++g) out.push_back(optimizer_->lr(g));
  return out;
}

void LRScheduler::check_group_count(const char* what) const {
  TG_CHECK(optimizer_->num_param_groups() == base_lrs_.size() || base_lrs_.empty(), name(), ".", what,
           ": the optimizer has ", optimizer_->num_param_groups(), " parameter groups but the scheduler was built for ",
           base_lrs_.size());
}

void LRScheduler::set_lrs(const std::vector<double>& lrs) {
  for (size_t g = 0; g < lrs.size(); ++g) optimizer_->set_lr(g, lrs[g]);
  last_lr_ = current_lrs();
}

void LRScheduler::initial_step() {
  step_count_ = 0;
  is_initial_ = true;
  try {
    step();
  } catch (...) {
    is_initial_ = false;
    throw;
  }
  is_initial_ = false;
}

void LRScheduler::step() {
  check_group_count("step");
  ++step_count_;
  ++last_epoch_;
  std::vector<double> lrs;
  try {
    lrs = get_lr();
  } catch (...) {
    --last_epoch_;  // a refused step (OneCycleLR past its end) changes nothing
    --step_count_;
    throw;
  }
  set_lrs(lrs);
}

void LRScheduler::step_to(int64_t epoch) {
  check_group_count("step");
  ++step_count_;
  last_epoch_ = epoch;
  std::optional<std::vector<double>> closed = closed_form_lr();
  set_lrs(closed ? *closed : get_lr());
}

nn::StateDict LRScheduler::state_dict() const {
  nn::StateDict out;
  const std::string type = name();
  out.insert("type", tg::tensor(std::vector<uint8_t>(type.begin(), type.end())));
  out.insert("base_lrs", f64s(base_lrs_));
  out.insert("last_epoch", i64(last_epoch_));
  out.insert("_step_count", i64(step_count_));
  out.insert("_last_lr", f64s(last_lr_));
  save_extra(out);
  return out;
}

void LRScheduler::load_state_dict(const nn::StateDict& sd) {
  const std::string op = std::string(name()) + ".load_state_dict";
  const std::string type = type_of(sd);
  TG_CHECK(!type.empty(), op, ": the state dict has no 'type' entry naming its scheduler class (expected '", name(),
           "')");
  TG_CHECK(type == name(), op, ": the state dict is a ", type, "'s, not a ", name(), "'s");
  // Every key of our own state, with its dtype and shape (lists of per-group values must match the
  // optimizer's group count); nested schedulers (SequentialLR) check their own entries.
  const nn::StateDict mine = state_dict();
  auto nested = [](const std::string& key) { return key.rfind("_schedulers.", 0) == 0; };
  for (const auto& [key, t] : mine) {
    if (nested(key)) continue;
    const Tensor* in = sd.find(key);
    TG_CHECK(in != nullptr && in->defined(), op, ": missing entry '", key, "'");
    TG_CHECK(in->dtype() == t.dtype() && in->dim() == t.dim(), op, ": entry '", key, "' must be ", t.dtype(), " with ",
             t.dim(), " dims, got ", in->dtype(), " ", in->sizes());
    TG_CHECK(key == "type" || in->sizes() == t.sizes() || variable_length(key), op, ": entry '", key, "' has shape ",
             in->sizes(), ", expected ", t.sizes());
    TG_CHECK(in->numel() <= (int64_t{1} << 20), op, ": entry '", key, "' has ", in->numel(), " elements");
  }
  for (const auto& [key, t] : sd) TG_CHECK(nested(key) || mine.contains(key), op, ": unexpected entry '", key, "'");
  const int64_t last_epoch = get_i64(sd, "last_epoch");
  const int64_t step_count = get_i64(sd, "_step_count");
  TG_CHECK(last_epoch >= -1 && step_count >= 0, op, ": bad counters (last_epoch ", last_epoch, ", _step_count ",
           step_count, ")");
  std::vector<double> base = get_f64s(sd, "base_lrs"), last = get_f64s(sd, "_last_lr");
  // The class's entries (validated inside), then the common ones; a failure puts the old state back.
  try {
    load_extra(sd);
  } catch (...) {
    load_extra(mine);
    throw;
  }
  base_lrs_ = std::move(base);
  last_lr_ = std::move(last);
  last_epoch_ = last_epoch;
  step_count_ = step_count;
}

// ---- LambdaLR

LambdaLR::LambdaLR(Optimizer& optimizer, std::function<double(int64_t)> lr_lambda)
    : LambdaLR(optimizer, std::vector<std::function<double(int64_t)>>(optimizer.num_param_groups(), lr_lambda)) {}

LambdaLR::LambdaLR(Optimizer& optimizer, std::vector<std::function<double(int64_t)>> lr_lambdas)
    : LRScheduler(optimizer, true), lr_lambdas_(std::move(lr_lambdas)) {
  TG_CHECK(lr_lambdas_.size() == optimizer.num_param_groups(), "LambdaLR: expected ", optimizer.num_param_groups(),
           " lr_lambdas, but got ", lr_lambdas_.size());
  for (size_t i = 0; i < lr_lambdas_.size(); ++i)
    TG_CHECK(static_cast<bool>(lr_lambdas_[i]), "LambdaLR: lr_lambda ", i, " is empty");
  initial_step();
}

std::vector<double> LambdaLR::get_lr() {
  std::vector<double> out;
  for (size_t g = 0; g < base_lrs_.size(); ++g) out.push_back(base_lrs_[g] * lr_lambdas_[g](last_epoch_));
  return out;
}

// ---- StepLR

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer, true), step_size_(step_size), gamma_(gamma) {
  TG_CHECK(step_size > 0, "StepLR: step_size must be positive, got ", step_size);
  TG_CHECK(gamma >= 0 && std::isfinite(gamma), "StepLR: gamma must be finite and >= 0, got ", gamma);
  initial_step();
}

std::vector<double> StepLR::get_lr() {
  std::vector<double> lrs = current_lrs();
  if (last_epoch_ == 0 || last_epoch_ % step_size_ != 0) return lrs;
  for (double& lr : lrs) lr = lr * gamma_;
  return lrs;
}

std::optional<std::vector<double>> StepLR::closed_form_lr() const {
  std::vector<double> out;
  for (double b : base_lrs_)
    out.push_back(b * std::pow(gamma_, static_cast<double>(last_epoch_ / step_size_)));  // // on last_epoch >= 0
  return out;
}

void StepLR::save_extra(nn::StateDict& out) const {
  out.insert("step_size", i64(step_size_));
  out.insert("gamma", f64(gamma_));
}

void StepLR::load_extra(const nn::StateDict& in) {
  const int64_t step_size = get_i64(in, "step_size");
  const double gamma = get_f64(in, "gamma");
  TG_CHECK(step_size > 0 && gamma >= 0 && std::isfinite(gamma), "StepLR.load_state_dict: bad step_size ", step_size,
           " or gamma ", gamma);
  step_size_ = step_size;
  gamma_ = gamma;
}

// ---- MultiStepLR

namespace {
void check_milestones(const char* op, const std::vector<int64_t>& m) {
  for (size_t i = 0; i < m.size(); ++i) {
    TG_CHECK(m[i] >= 0, op, ": milestones must be >= 0, got ", m[i], " at index ", i);
    TG_CHECK(i == 0 || m[i - 1] <= m[i], op, ": milestones must be sorted (increasing), got ", m[i - 1], " before ",
             m[i]);
  }
}
}  // namespace

MultiStepLR::MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma)
    : LRScheduler(optimizer, true), milestones_(std::move(milestones)), gamma_(gamma) {
  check_milestones("MultiStepLR", milestones_);
  TG_CHECK(gamma >= 0 && std::isfinite(gamma), "MultiStepLR: gamma must be finite and >= 0, got ", gamma);
  initial_step();
}

std::vector<double> MultiStepLR::get_lr() {
  std::vector<double> lrs = current_lrs();
  const auto count = std::count(milestones_.begin(), milestones_.end(), last_epoch_);
  if (count == 0) return lrs;
  for (double& lr : lrs) lr = lr * std::pow(gamma_, static_cast<double>(count));
  return lrs;
}

std::optional<std::vector<double>> MultiStepLR::closed_form_lr() const {
  const auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) - milestones_.begin();
  std::vector<double> out;
  for (double b : base_lrs_) out.push_back(b * std::pow(gamma_, static_cast<double>(passed)));
  return out;
}

void MultiStepLR::save_extra(nn::StateDict& out) const {
  out.insert("milestones", i64s(milestones_));
  out.insert("gamma", f64(gamma_));
}

void MultiStepLR::load_extra(const nn::StateDict& in) {
  std::vector<int64_t> milestones = get_i64s(in, "milestones");
  const double gamma = get_f64(in, "gamma");
  check_milestones("MultiStepLR.load_state_dict", milestones);
  TG_CHECK(gamma >= 0 && std::isfinite(gamma), "MultiStepLR.load_state_dict: bad gamma ", gamma);
  milestones_ = std::move(milestones);
  gamma_ = gamma;
}

// ---- ConstantLR

ConstantLR::ConstantLR(Optimizer& optimizer, double factor, int64_t total_iters)
    : LRScheduler(optimizer, true), factor_(factor), total_iters_(total_iters) {
  // PyTorch admits factor 0, whose lr at total_iters is 0 * (1 / 0) = NaN.
  TG_CHECK(factor > 0 && factor <= 1, "ConstantLR: factor must be in (0, 1], got ", factor);
  TG_CHECK(total_iters > 0, "ConstantLR: total_iters must be positive, got ", total_iters);
  initial_step();
}

std::vector<double> ConstantLR::get_lr() {
  std::vector<double> lrs = current_lrs();
  if (last_epoch_ == 0) {
    for (double& lr : lrs) lr = lr * factor_;
  } else if (last_epoch_ == total_iters_) {
    for (double& lr : lrs) lr = lr * (1.0 / factor_);
  }
  return lrs;
}

std::optional<std::vector<double>> ConstantLR::closed_form_lr() const {
  std::vector<double> out;
  const double reached = last_epoch_ >= total_iters_ ? 1.0 : 0.0;
  for (double b : base_lrs_) out.push_back(b * (factor_ + reached * (1 - factor_)));
  return out;
}

void ConstantLR::save_extra(nn::StateDict& out) const {
  out.insert("factor", f64(factor_));
  out.insert("total_iters", i64(total_iters_));
}

void ConstantLR::load_extra(const nn::StateDict& in) {
  const double factor = get_f64(in, "factor");
  const int64_t total = get_i64(in, "total_iters");
  TG_CHECK(factor > 0 && factor <= 1 && total > 0, "ConstantLR.load_state_dict: bad factor ", factor,
           " or total_iters ", total);
  factor_ = factor;
  total_iters_ = total;
}

// ---- LinearLR

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor, int64_t total_iters)
    : LRScheduler(optimizer, true), start_factor_(start_factor), end_factor_(end_factor), total_iters_(total_iters) {
  TG_CHECK(start_factor > 0 && start_factor <= 1, "LinearLR: start_factor must be in (0, 1], got ", start_factor);
  TG_CHECK(end_factor >= 0 && end_factor <= 1, "LinearLR: end_factor must be in [0, 1], got ", end_factor);
  TG_CHECK(total_iters > 0, "LinearLR: total_iters must be positive, got ", total_iters);
  initial_step();
}

std::vector<double> LinearLR::get_lr() {
  std::vector<double> lrs = current_lrs();
  if (last_epoch_ == 0) {
    for (double& lr : lrs) lr = lr * start_factor_;
    return lrs;
  }
  if (is_initial_ || last_epoch_ > total_iters_) return lrs;
  const double d = end_factor_ - start_factor_;
  const double f =
      1.0 + d / (static_cast<double>(total_iters_) * start_factor_ + static_cast<double>(last_epoch_ - 1) * d);
  for (double& lr : lrs) lr = lr * f;
  return lrs;
}

std::optional<std::vector<double>> LinearLR::closed_form_lr() const {
  std::vector<double> out;
  const double m = static_cast<double>(std::min(total_iters_, last_epoch_));
  for (double b : base_lrs_)
    out.push_back(b * (start_factor_ + (end_factor_ - start_factor_) * m / static_cast<double>(total_iters_)));
  return out;
}

void LinearLR::save_extra(nn::StateDict& out) const {
  out.insert("start_factor", f64(start_factor_));
  out.insert("end_factor", f64(end_factor_));
  out.insert("total_iters", i64(total_iters_));
}

void LinearLR::load_extra(const nn::StateDict& in) {
  const double s = get_f64(in, "start_factor"), e = get_f64(in, "end_factor");
  const int64_t total = get_i64(in, "total_iters");
  TG_CHECK(s > 0 && s <= 1 && e >= 0 && e <= 1 && total > 0, "LinearLR.load_state_dict: bad start_factor ", s,
           ", end_factor ", e, " or total_iters ", total);
  start_factor_ = s;
  end_factor_ = e;
  total_iters_ = total;
}

// ---- ExponentialLR

ExponentialLR::ExponentialLR(Optimizer& optimizer, double gamma) : LRScheduler(optimizer, true), gamma_(gamma) {
  TG_CHECK(gamma >= 0 && std::isfinite(gamma), "ExponentialLR: gamma must be finite and >= 0, got ", gamma);
  initial_step();
}

std::vector<double> ExponentialLR::get_lr() {
  std::vector<double> lrs = current_lrs();
  if (is_initial_ || last_epoch_ == 0) return lrs;
  for (double& lr : lrs) lr = lr * gamma_;
  return lrs;
}

std::optional<std::vector<double>> ExponentialLR::closed_form_lr() const {
  std::vector<double> out;
  for (double b : base_lrs_) out.push_back(b * std::pow(gamma_, static_cast<double>(last_epoch_)));
  return out;
}

void ExponentialLR::save_extra(nn::StateDict& out) const { out.insert("gamma", f64(gamma_)); }

void ExponentialLR::load_extra(const nn::StateDict& in) {
  const double gamma = get_f64(in, "gamma");
  TG_CHECK(gamma >= 0 && std::isfinite(gamma), "ExponentialLR.load_state_dict: bad gamma ", gamma);
  gamma_ = gamma;
}

// ---- CosineAnnealingLR

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min)  // NOLINT
    : LRScheduler(optimizer, true), T_max_(T_max), eta_min_(eta_min) {
  TG_CHECK(T_max > 0, "CosineAnnealingLR: T_max must be positive, got ", T_max);
  TG_CHECK(std::isfinite(eta_min), "CosineAnnealingLR: eta_min must be finite, got ", eta_min);
  initial_step();
}

std::vector<double> CosineAnnealingLR::get_lr() {
  std::vector<double> lrs = current_lrs();
  const double e = static_cast<double>(last_epoch_), t = static_cast<double>(T_max_);
  if (is_initial_ || last_epoch_ == 0) return lrs;
  if (step_count_ == 1 && last_epoch_ > 0) {
    for (size_t g = 0; g < lrs.size(); ++g)
      lrs[g] = eta_min_ + (base_lrs_[g] - eta_min_) * (1 + std::cos(e * kPi / t)) / 2;
    return lrs;
  }
  if (py_mod(last_epoch_ - 1 - T_max_, 2 * T_max_) == 0) {
    for (size_t g = 0; g < lrs.size(); ++g) lrs[g] = lrs[g] + (base_lrs_[g] - eta_min_) * (1 - std::cos(kPi / t)) / 2;
    return lrs;
  }
  const double ratio = (1 + std::cos(kPi * e / t)) / (1 + std::cos(kPi * (e - 1) / t));
  for (double& lr : lrs) lr = ratio * (lr - eta_min_) + eta_min_;
  return lrs;
}

std::optional<std::vector<double>> CosineAnnealingLR::closed_form_lr() const {
  std::vector<double> out;
  const double e = static_cast<double>(last_epoch_), t = static_cast<double>(T_max_);
  for (double b : base_lrs_) out.push_back(eta_min_ + (b - eta_min_) * (1 + std::cos(kPi * e / t)) / 2);
  return out;
}

void CosineAnnealingLR::save_extra(nn::StateDict& out) const {
  out.insert("T_max", i64(T_max_));
  out.insert("eta_min", f64(eta_min_));
}

void CosineAnnealingLR::load_extra(const nn::StateDict& in) {
  const int64_t t = get_i64(in, "T_max");
  const double eta = get_f64(in, "eta_min");
  TG_CHECK(t > 0 && std::isfinite(eta), "CosineAnnealingLR.load_state_dict: bad T_max ", t, " or eta_min ", eta);
  T_max_ = t;
  eta_min_ = eta;
}

// ---- CosineAnnealingWarmRestarts

CosineAnnealingWarmRestarts::CosineAnnealingWarmRestarts(Optimizer& optimizer, int64_t T_0, int64_t T_mult,  // NOLINT
                                                         double eta_min)
    : LRScheduler(optimizer, true), T_0_(T_0), T_i_(T_0), T_mult_(T_mult), T_cur_(-1), eta_min_(eta_min) {
  TG_CHECK(T_0 > 0, "CosineAnnealingWarmRestarts: expected positive integer T_0, but got ", T_0);
  TG_CHECK(T_mult >= 1, "CosineAnnealingWarmRestarts: expected integer T_mult >= 1, but got ", T_mult);
  TG_CHECK(std::isfinite(eta_min), "CosineAnnealingWarmRestarts: eta_min must be finite, got ", eta_min);
  initial_step();
}

std::vector<double> CosineAnnealingWarmRestarts::get_lr() {
  std::vector<double> out;
  for (double b : base_lrs_)
    out.push_back(eta_min_ +
                  (b - eta_min_) * (1 + std::cos(kPi * static_cast<double>(T_cur_) / static_cast<double>(T_i_))) / 2);
  return out;
}

void CosineAnnealingWarmRestarts::step() {
  // PyTorch's step(None): the first call (last_epoch < 0) is step(0); it leaves _step_count alone.
  if (last_epoch_ < 0) {
    step_to(0);
    return;
  }
  check_group_count("step");
  int64_t t_cur = T_cur_ + 1, t_i = T_i_;
  if (t_cur >= t_i) {
    t_cur = t_cur % t_i;
    TG_CHECK(t_i <= std::numeric_limits<int64_t>::max() / T_mult_, "CosineAnnealingWarmRestarts.step: the period ", t_i,
             " * T_mult ", T_mult_, " overflows");
    t_i = t_i * T_mult_;
  }
  T_cur_ = t_cur;
  T_i_ = t_i;
  last_epoch_ += 1;
  set_lrs(get_lr());
}

void CosineAnnealingWarmRestarts::step_to(int64_t epoch) {
  // step(epoch) for an integer epoch >= 0 (SequentialLR passes 0).
  TG_CHECK(epoch >= 0, "CosineAnnealingWarmRestarts.step: expected non-negative epoch, but got ", epoch);
  if (epoch >= T_0_) {
    if (T_mult_ == 1) {
      T_cur_ = epoch % T_0_;
    } else {
      const auto n = static_cast<int64_t>(
          std::log(static_cast<double>(epoch) / static_cast<double>(T_0_) * static_cast<double>(T_mult_ - 1) + 1) /
          std::log(static_cast<double>(T_mult_)));
      const auto p = static_cast<int64_t>(std::pow(static_cast<double>(T_mult_), static_cast<double>(n)));
      T_cur_ = epoch - T_0_ * (p - 1) / (T_mult_ - 1);
      T_i_ = T_0_ * p;
    }
  } else {
    T_i_ = T_0_;
    T_cur_ = epoch;
  }
  last_epoch_ = epoch;
  set_lrs(get_lr());
}

void CosineAnnealingWarmRestarts::save_extra(nn::StateDict& out) const {
  out.insert("T_0", i64(T_0_));
  out.insert("T_i", i64(T_i_));
  out.insert("T_mult", i64(T_mult_));
  out.insert("eta_min", f64(eta_min_));
  out.insert("T_cur", i64(T_cur_));
}

void CosineAnnealingWarmRestarts::load_extra(const nn::StateDict& in) {
  const int64_t t0 = get_i64(in, "T_0"), ti = get_i64(in, "T_i"), tm = get_i64(in, "T_mult"), tc = get_i64(in, "T_cur");
  const double eta = get_f64(in, "eta_min");
  TG_CHECK(t0 > 0 && ti > 0 && tm >= 1 && tc >= -1 && std::isfinite(eta),
           "CosineAnnealingWarmRestarts.load_state_dict: bad T_0 ", t0, ", T_i ", ti, ", T_mult ", tm, ", T_cur ", tc,
           " or eta_min ", eta);
  T_0_ = t0;
  T_i_ = ti;
  T_mult_ = tm;
  T_cur_ = tc;
  eta_min_ = eta;
}

// ---- SequentialLR

SequentialLR::SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler(optimizer, false), schedulers_(std::move(schedulers)), milestones_(std::move(milestones)) {
  TG_CHECK(!schedulers_.empty(), "SequentialLR: expects at least one scheduler, but got no scheduler");
  for (size_t i = 0; i < schedulers_.size(); ++i) {
    TG_CHECK(schedulers_[i] != nullptr, "SequentialLR: scheduler ", i, " is null");
    TG_CHECK(dynamic_cast<ReduceLROnPlateau*>(schedulers_[i].get()) == nullptr,
             "SequentialLR: does not support a ReduceLROnPlateau (scheduler ", i, "): its step needs a metric");
    TG_CHECK(&schedulers_[i]->optimizer() == &optimizer, "SequentialLR: scheduler ", i, " (", schedulers_[i]->name(),
             ") belongs to a different optimizer");
  }
  TG_CHECK(milestones_.size() == schedulers_.size() - 1,
           "SequentialLR: expects one milestone fewer than schedulers, but got ", schedulers_.size(),
           " schedulers and ", milestones_.size(), " milestones");
  for (size_t i = 0; i < milestones_.size(); ++i)
    TG_CHECK(milestones_[i] > 0 && (i == 0 || milestones_[i - 1] < milestones_[i]),
             "SequentialLR: milestones must be positive and strictly increasing, got ", milestones_[i], " at index ",
             i);
  last_epoch_ = 0;
  // Reset the lrs to the initial ones, undo the schedulers' constructor steps, and step the first.
  for (size_t g = 0; g < optimizer.num_param_groups(); ++g) {
    const double initial = optimizer.initial_lr(g);
    TG_CHECK(!std::isnan(initial), "SequentialLR: parameter group ", g, " has no initial_lr");
    optimizer.set_lr(g, initial);
    base_lrs_.push_back(initial);
  }
  undo_initial_step();
  last_epoch_ = 0;
  schedulers_[0]->initial_step();
  last_lr_ = schedulers_[0]->get_last_lr();
}

void SequentialLR::undo_initial_step() {
  for (auto& s : schedulers_) s->undo_initial_step();
}

std::vector<double> SequentialLR::get_lr() { return current_lrs(); }

void SequentialLR::step() {
  last_epoch_ += 1;
  const auto idx =
      static_cast<size_t>(std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) - milestones_.begin());
  LRScheduler& s = *schedulers_[idx];
  if (idx > 0 && milestones_[idx - 1] == last_epoch_)
    s.step_to(0);
  else
    s.step();
  last_lr_ = s.get_last_lr();
}

void SequentialLR::save_extra(nn::StateDict& out) const {
  out.insert("_milestones", i64s(milestones_));
  for (size_t i = 0; i < schedulers_.size(); ++i)
    for (const auto& [k, t] : schedulers_[i]->state_dict()) out.insert("_schedulers." + std::to_string(i) + "." + k, t);
}

void SequentialLR::load_extra(const nn::StateDict& in) {
  std::vector<int64_t> milestones = get_i64s(in, "_milestones");
  for (size_t i = 0; i < milestones.size(); ++i)
    TG_CHECK(milestones[i] > 0 && (i == 0 || milestones[i - 1] < milestones[i]),
             "SequentialLR.load_state_dict: milestones must be positive and strictly increasing");
  // Each child's entries (its own load checks them; a failure restores the children loaded before).
  std::vector<nn::StateDict> parts(schedulers_.size());
  for (const auto& [k, t] : in) {
    if (k.rfind("_schedulers.", 0) != 0) continue;
    const size_t dot = k.find('.', 12);
    size_t i = 0;
    const char* first = k.data() + 12;
    const char* last = dot == std::string::npos ? k.data() + k.size() : k.data() + dot;
    auto [ptr, ec] = std::from_chars(first, last, i);
    TG_CHECK(dot != std::string::npos && ec == std::errc() && ptr == last && first != last && i < schedulers_.size(),
             "SequentialLR.load_state_dict: unexpected entry '", k, "' (", schedulers_.size(), " schedulers)");
    parts[i].insert(k.substr(dot + 1), t);
  }
  std::vector<nn::StateDict> before;
  for (auto& s : schedulers_) before.push_back(s->state_dict());
  size_t done = 0;
  try {
    for (; done < schedulers_.size(); ++done) schedulers_[done]->load_state_dict(parts[done]);
  } catch (...) {
    for (size_t i = 0; i < done; ++i) schedulers_[i]->load_state_dict(before[i]);
    throw;
  }
  milestones_ = std::move(milestones);
}

// ---- OneCycleLR

OneCycleLR::OneCycleLR(Optimizer& optimizer, double max_lr, OneCycleLROptions options)
    : OneCycleLR(optimizer, std::vector<double>{max_lr}, std::move(options)) {}

OneCycleLR::OneCycleLR(Optimizer& optimizer, std::vector<double> max_lr, OneCycleLROptions o)
    : LRScheduler(optimizer, false) {
  const size_t n = optimizer.num_param_groups();
  if (o.total_steps != 0) {
    TG_CHECK(o.total_steps > 0, "OneCycleLR: expected positive integer total_steps, but got ", o.total_steps);
    total_steps_ = o.total_steps;
  } else {
    TG_CHECK(o.epochs != 0 || o.steps_per_epoch != 0,
             "OneCycleLR: you must define either total_steps OR (epochs AND steps_per_epoch)");
    TG_CHECK(o.epochs > 0, "OneCycleLR: expected positive integer epochs, but got ", o.epochs);
    TG_CHECK(o.steps_per_epoch > 0, "OneCycleLR: expected positive integer steps_per_epoch, but got ",
             o.steps_per_epoch);
    TG_CHECK(o.epochs <= std::numeric_limits<int64_t>::max() / o.steps_per_epoch, "OneCycleLR: epochs ", o.epochs,
             " * steps_per_epoch ", o.steps_per_epoch, " overflows");
    total_steps_ = o.epochs * o.steps_per_epoch;
  }
  TG_CHECK(o.pct_start >= 0 && o.pct_start <= 1, "OneCycleLR: expected float between 0 and 1 pct_start, but got ",
           o.pct_start);
  TG_CHECK(o.anneal_strategy == "cos" || o.anneal_strategy == "linear",
           "OneCycleLR: anneal_strategy must be one of 'cos' or 'linear', instead got '", o.anneal_strategy, "'");
  TG_CHECK(o.div_factor > 0 && std::isfinite(o.div_factor), "OneCycleLR: div_factor must be positive, got ",
           o.div_factor);
  TG_CHECK(o.final_div_factor > 0 && std::isfinite(o.final_div_factor),
           "OneCycleLR: final_div_factor must be positive, got ", o.final_div_factor);
  pct_start_ = o.pct_start;
  linear_ = o.anneal_strategy == "linear";
  three_phase_ = o.three_phase;
  cycle_momentum_ = o.cycle_momentum;
  div_factor_ = o.div_factor;
  final_div_factor_ = o.final_div_factor;
  max_lrs_ = per_group("OneCycleLR", "max_lr", max_lr, n);
  for (size_t g = 0; g < n; ++g) {
    TG_CHECK(max_lrs_[g] >= 0 && std::isfinite(max_lrs_[g]), "OneCycleLR: max_lr must be finite and >= 0, got ",
             max_lrs_[g]);
    initial_lrs_.push_back(max_lrs_[g] / div_factor_);
    min_lrs_.push_back(initial_lrs_[g] / final_div_factor_);
  }
  if (cycle_momentum_) {
    std::vector<double> probe;
    const bool has_betas = optimizer.group_option(0, "betas", probe);
    TG_CHECK(has_betas || optimizer.group_option(0, "momentum", probe), "OneCycleLR: optimizer ", optimizer.name(),
             " must support momentum or beta1 with the cycle_momentum option enabled");
    use_beta1_ = has_betas;
    max_momentums_ = per_group("OneCycleLR", "max_momentum", o.max_momentum, n);
    base_momentums_ = per_group("OneCycleLR", "base_momentum", o.base_momentum, n);
  }
  build_phases();
  // Only now, every argument checked: PyTorch's group["initial_lr"] and the starting momentum.
  for (size_t g = 0; g < n; ++g) {
    optimizer.set_initial_lr(g, initial_lrs_[g]);
    if (cycle_momentum_) {
      if (use_beta1_) {
        std::vector<double> betas;
        optimizer.group_option(g, "betas", betas);
        optimizer.set_group_option(g, "betas", {max_momentums_[g], betas[1]});
      } else {
        optimizer.set_group_option(g, "momentum", {max_momentums_[g]});
      }
    }
  }
  base_lrs_ = initial_lrs_;
  initial_step();
}

void OneCycleLR::build_phases() {
  const double total = static_cast<double>(total_steps_);
  if (three_phase_) {
    phases_ = {{pct_start_ * total - 1, 0, 1, 0, 1}, {2 * pct_start_ * total - 2, 1, 0, 1, 0}, {total - 1, 0, 2, 0, 0}};
  } else {
    phases_ = {{pct_start_ * total - 1, 0, 1, 0, 1}, {total - 1, 1, 2, 1, 0}};
  }
}

double OneCycleLR::anneal(double start, double end, double pct) const {
  if (linear_) return (end - start) * pct + start;
  const double cos_out = std::cos(kPi * pct) + 1;
  return end + (start - end) / 2.0 * cos_out;
}

std::vector<double> OneCycleLR::get_lr() {
  const int64_t step_num = last_epoch_;
  TG_CHECK(step_num <= total_steps_, "OneCycleLR.step: Tried to step ", step_num,
           " times. The specified number of total steps is ", total_steps_);
  std::vector<double> lrs;
  for (size_t g = 0; g < max_lrs_.size(); ++g) {
    const double lr_of[3] = {initial_lrs_[g], max_lrs_[g], min_lrs_[g]};
    const double mom_of[2] = {cycle_momentum_ ? max_momentums_[g] : 0, cycle_momentum_ ? base_momentums_[g] : 0};
    double start_step = 0;
    for (size_t i = 0; i < phases_.size(); ++i) {
      const Phase& p = phases_[i];
      if (static_cast<double>(step_num) <= p.end_step || i + 1 == phases_.size()) {
        TG_CHECK(p.end_step != start_step, "OneCycleLR.step: phase ", i, " is empty (it starts and ends at step ",
                 start_step, "; total_steps ", total_steps_, ", pct_start ", pct_start_, ")");
        const double pct = (static_cast<double>(step_num) - start_step) / (p.end_step - start_step);
        lrs.push_back(anneal(lr_of[p.start_lr], lr_of[p.end_lr], pct));
        if (cycle_momentum_) {
          const double m = anneal(mom_of[p.start_momentum], mom_of[p.end_momentum], pct);
          if (use_beta1_) {
            std::vector<double> betas;
            optimizer_->group_option(g, "betas", betas);
            optimizer_->set_group_option(g, "betas", {m, betas[1]});
          } else {
            optimizer_->set_group_option(g, "momentum", {m});
          }
        }
        break;
      }
      start_step = p.end_step;
    }
  }
  return lrs;
}

void OneCycleLR::save_extra(nn::StateDict& out) const {
  out.insert("total_steps", i64(total_steps_));
  out.insert("pct_start", f64(pct_start_));
  out.insert("anneal_strategy_linear", i64(linear_ ? 1 : 0));
  out.insert("three_phase", i64(three_phase_ ? 1 : 0));
  out.insert("cycle_momentum", i64(cycle_momentum_ ? 1 : 0));
  out.insert("use_beta1", i64(use_beta1_ ? 1 : 0));
  out.insert("div_factor", f64(div_factor_));
  out.insert("final_div_factor", f64(final_div_factor_));
  out.insert("max_lr", f64s(max_lrs_));
  out.insert("initial_lr", f64s(initial_lrs_));
  out.insert("min_lr", f64s(min_lrs_));
  out.insert("max_momentum", f64s(max_momentums_));
  out.insert("base_momentum", f64s(base_momentums_));
}

void OneCycleLR::load_extra(const nn::StateDict& in) {
  const int64_t total = get_i64(in, "total_steps");
  const double pct = get_f64(in, "pct_start"), div = get_f64(in, "div_factor"), fdiv = get_f64(in, "final_div_factor");
  const int64_t lin = get_i64(in, "anneal_strategy_linear"), three = get_i64(in, "three_phase");
  const int64_t cyc = get_i64(in, "cycle_momentum"), beta1 = get_i64(in, "use_beta1");
  std::vector<double> max_lr = get_f64s(in, "max_lr"), init = get_f64s(in, "initial_lr"),
                      min_lr = get_f64s(in, "min_lr");
  std::vector<double> max_m = get_f64s(in, "max_momentum"), base_m = get_f64s(in, "base_momentum");
  TG_CHECK(total > 0 && pct >= 0 && pct <= 1 && div > 0 && fdiv > 0, "OneCycleLR.load_state_dict: bad total_steps ",
           total, ", pct_start ", pct, ", div_factor ", div, " or final_div_factor ", fdiv);
  TG_CHECK((lin | three | cyc | beta1) >= 0 && lin <= 1 && three <= 1 && cyc <= 1 && beta1 <= 1,
           "OneCycleLR.load_state_dict: flags must be 0 or 1");
  TG_CHECK(cyc == (cycle_momentum_ ? 1 : 0) && beta1 == (use_beta1_ ? 1 : 0),
           "OneCycleLR.load_state_dict: the saved scheduler cycles momentum differently (cycle_momentum ", cyc,
           ", use_beta1 ", beta1, ") from this one");
  total_steps_ = total;
  pct_start_ = pct;
  div_factor_ = div;
  final_div_factor_ = fdiv;
  linear_ = lin != 0;
  three_phase_ = three != 0;
  max_lrs_ = std::move(max_lr);
  initial_lrs_ = std::move(init);
  min_lrs_ = std::move(min_lr);
  max_momentums_ = std::move(max_m);
  base_momentums_ = std::move(base_m);
  build_phases();
}

// ---- ReduceLROnPlateau

ReduceLROnPlateau::ReduceLROnPlateau(Optimizer& optimizer, ReduceLROnPlateauOptions o) : LRScheduler(optimizer, false) {
  TG_CHECK(o.factor < 1.0 && o.factor >= 0, "ReduceLROnPlateau: factor should be in [0, 1), got ", o.factor);
  TG_CHECK(o.mode == "min" || o.mode == "max", "ReduceLROnPlateau: mode '", o.mode, "' is unknown (min or max)");
  TG_CHECK(o.threshold_mode == "rel" || o.threshold_mode == "abs", "ReduceLROnPlateau: threshold mode '",
           o.threshold_mode, "' is unknown (rel or abs)");
  TG_CHECK(o.patience >= 0, "ReduceLROnPlateau: patience must be >= 0, got ", o.patience);
  TG_CHECK(o.cooldown >= 0, "ReduceLROnPlateau: cooldown must be >= 0, got ", o.cooldown);
  TG_CHECK(o.eps >= 0, "ReduceLROnPlateau: eps must be >= 0, got ", o.eps);
  TG_CHECK(std::isfinite(o.threshold), "ReduceLROnPlateau: threshold must be finite, got ", o.threshold);
  min_lrs_ = per_group("ReduceLROnPlateau", "min_lr", o.min_lr, optimizer.num_param_groups());
  for (double m : min_lrs_) TG_CHECK(m >= 0, "ReduceLROnPlateau: min_lr must be >= 0, got ", m);
  max_mode_ = o.mode == "max";
  abs_threshold_ = o.threshold_mode == "abs";
  factor_ = o.factor;
  threshold_ = o.threshold;
  eps_ = o.eps;
  patience_ = o.patience;
  cooldown_ = o.cooldown;
  best_ = max_mode_ ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  last_epoch_ = 0;
  base_lrs_ = current_lrs();  // not PyTorch's (it has none): the lrs at construction
}

std::vector<double> ReduceLROnPlateau::get_lr() { return current_lrs(); }

void ReduceLROnPlateau::step() { TG_ERROR("ReduceLROnPlateau.step: needs the metric, step(metric)"); }

void ReduceLROnPlateau::step(const Tensor& metric) {
  TG_CHECK(metric.defined() && metric.numel() == 1 && metric.dtype() != kBool,
           "ReduceLROnPlateau.step: the metric must be a numeric tensor with one element, got ",
           metric.defined() ? metric.sizes() : Shape{});
  step(metric.detach().to(Device(kCPU), kFloat64).item<double>());
}

bool ReduceLROnPlateau::is_better(double a, double best) const {
  if (!max_mode_ && !abs_threshold_) return a < best * (1.0 - threshold_);
  if (!max_mode_) return a < best - threshold_;
  if (!abs_threshold_) return a > best * (threshold_ + 1.0);
  return a > best + threshold_;
}

void ReduceLROnPlateau::step(double metric) {
  check_group_count("step");
  last_epoch_ += 1;
  if (is_better(metric, best_)) {
    best_ = metric;
    num_bad_epochs_ = 0;
  } else {
    num_bad_epochs_ += 1;
  }
  if (cooldown_counter_ > 0) {
    cooldown_counter_ -= 1;
    num_bad_epochs_ = 0;  // bad epochs in cooldown are ignored
  }
  if (num_bad_epochs_ > patience_) {
    for (size_t g = 0; g < optimizer_->num_param_groups(); ++g) {
      const double old_lr = optimizer_->lr(g);
      const double new_lr = std::max(old_lr * factor_, min_lrs_[g]);
      if (old_lr - new_lr > eps_) optimizer_->set_lr(g, new_lr);
    }
    cooldown_counter_ = cooldown_;
    num_bad_epochs_ = 0;
  }
  last_lr_ = current_lrs();
}

void ReduceLROnPlateau::save_extra(nn::StateDict& out) const {
  out.insert("mode_max", i64(max_mode_ ? 1 : 0));
  out.insert("threshold_mode_abs", i64(abs_threshold_ ? 1 : 0));
  out.insert("factor", f64(factor_));
  out.insert("threshold", f64(threshold_));
  out.insert("eps", f64(eps_));
  out.insert("patience", i64(patience_));
  out.insert("cooldown", i64(cooldown_));
  out.insert("min_lrs", f64s(min_lrs_));
  out.insert("best", f64(best_));
  out.insert("num_bad_epochs", i64(num_bad_epochs_));
  out.insert("cooldown_counter", i64(cooldown_counter_));
}

void ReduceLROnPlateau::load_extra(const nn::StateDict& in) {
  const int64_t mode = get_i64(in, "mode_max"), tmode = get_i64(in, "threshold_mode_abs");
  const double factor = get_f64(in, "factor"), threshold = get_f64(in, "threshold"), eps = get_f64(in, "eps");
  const int64_t patience = get_i64(in, "patience"), cooldown = get_i64(in, "cooldown");
  std::vector<double> min_lrs = get_f64s(in, "min_lrs");
  const double best = get_f64(in, "best");
  const int64_t bad = get_i64(in, "num_bad_epochs"), counter = get_i64(in, "cooldown_counter");
  TG_CHECK((mode == 0 || mode == 1) && (tmode == 0 || tmode == 1) && factor >= 0 && factor < 1 &&
               std::isfinite(threshold) && eps >= 0 && patience >= 0 && cooldown >= 0 && bad >= 0 && counter >= 0,
           "ReduceLROnPlateau.load_state_dict: bad values (mode_max ", mode, ", threshold_mode_abs ", tmode,
           ", factor ", factor, ", threshold ", threshold, ", eps ", eps, ", patience ", patience, ", cooldown ",
           cooldown, ", num_bad_epochs ", bad, ", cooldown_counter ", counter, ")");
  for (double m : min_lrs) TG_CHECK(m >= 0, "ReduceLROnPlateau.load_state_dict: min_lr must be >= 0, got ", m);
  max_mode_ = mode == 1;
  abs_threshold_ = tmode == 1;
  factor_ = factor;
  threshold_ = threshold;
  eps_ = eps;
  patience_ = patience;
  cooldown_ = cooldown;
  min_lrs_ = std::move(min_lrs);
  best_ = best;
  num_bad_epochs_ = bad;
  cooldown_counter_ = counter;
}

}  // namespace tg::optim::lr_scheduler
