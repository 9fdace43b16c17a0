// gradcheck: the analytic vector-Jacobian product from backward against central
// differences, all in float64 on the inputs' own device. The output is projected
// on a fixed pseudo-random direction v, so one backward gives v^T J for every
// input element and each numerical entry costs two forward calls.
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <random>
#include <sstream>
#include <vector>

#include <tapegrad/autograd/function.h>

namespace tg::autograd {

namespace {
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled) : prev_(GradMode::is_enabled()) { GradMode::set_enabled(enabled); }
  ~GradModeGuard() { GradMode::set_enabled(prev_); }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool prev_;
};

std::vector<double> host_f64(const Tensor& t) {
  return native::contiguous(native::to(t, Device(kCPU), kFloat64)).to_vector<double>();
}
}  // namespace

std::ostream& operator<<(std::ostream& os, const GradcheckReport& r) {
  os << "GradcheckReport{ok=" << (r.ok ? "true" : "false") << ", max_abs_err=" << r.max_abs_err
     << ", max_rel_err=" << r.max_rel_err;
  if (!r.ok) os << ", input=" << r.input_index << ", element=" << r.element;
  if (!r.message.empty()) os << ", " << r.message;
  return os << "}";
}

namespace {
// Which inputs to differentiate: those that require grad, else every floating one.
std::vector<size_t> inputs_to_differentiate(const std::vector<Tensor>& inputs, const char* op) {
  std::vector<size_t> diff;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (requires_grad(inputs[i])) diff.push_back(i);
  if (diff.empty())
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].defined() && is_floating(inputs[i].dtype())) diff.push_back(i);
  TG_CHECK(!diff.empty(), op, ": none of the ", inputs.size(), " inputs is a floating tensor to differentiate");
  return diff;
}
}  // namespace

GradcheckReport gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, GradcheckOptions options) {
  const std::vector<size_t> diff = inputs_to_differentiate(inputs, "gradcheck");

  // Private float64 copies (never the caller's memory: they get perturbed).
  std::vector<Tensor> xs = inputs;
  std::vector<Tensor> leaves;
  for (size_t i : diff) {
    xs[i] = native::clone(native::to(inputs[i], inputs[i].device(), kFloat64));
    xs[i].requires_grad_(true);
    leaves.push_back(xs[i]);
  }

  GradcheckReport report;
  // ---- analytic
  Tensor y;
  std::vector<Tensor> analytic;
  Tensor v64;
  {
    GradModeGuard on(true);
    y = fn(xs);
    TG_CHECK(y.defined() && is_floating(y.dtype()), "gradcheck: fn must return a floating tensor, got ",
             y.defined() ? dtype_name(y.dtype()) : "an undefined tensor");
    std::mt19937_64 gen(0x7a9e5eedULL);
    std::uniform_real_distribution<double> dist(-1.0, 1.0);
    std::vector<double> v(static_cast<size_t>(y.numel()));
    for (double& e : v) e = dist(gen);
    v64 = tensor_from_host(v.data(), kFloat64, y.sizes(), TensorOptions(kFloat64).device(y.device()));
    if (requires_grad(y))
      analytic = grad({y}, leaves, {native::to(v64, y.device(), y.dtype())});
    else
      analytic.resize(leaves.size());
  }

  // ---- numerical, one element at a time
  GradModeGuard off(false);
  auto loss = [&]() {
    Tensor out = fn(xs);
    Tensor prod = native::mul(native::to(out, v64.device(), kFloat64), v64);
    return native::reduce(backend::ReduceOp::Sum, prod, DimList(), false).item<double>();
  };
  const double eps = options.eps;
  for (size_t k = 0; k < leaves.size(); ++k) {
    const Tensor& x = leaves[k];
    std::vector<double> host = host_f64(x);
    std::vector<double> ana = analytic[k].defined() ? host_f64(analytic[k]) : std::vector<double>(host.size(), 0.0);
    TG_CHECK(ana.size() == host.size(), "gradcheck: gradient of input ", diff[k], " has ", ana.size(),
             " elements, the input has ", host.size());
    Tensor flat = native::view(alias(x), Shape{x.numel()});
    for (int64_t j = 0; j < x.numel(); ++j) {
      Tensor elem = native::slice(flat, 0, j, j + 1, 1);
      native::fill_(elem, host[j] + eps);
      const double plus = loss();
      native::fill_(elem, host[j] - eps);
      const double minus = loss();
      native::fill_(elem, host[j]);
      const double num = (plus - minus) / (2 * eps);
      const double err = std::abs(ana[j] - num);
      const double scale = std::max(std::abs(num), std::abs(ana[j]));
      report.max_abs_err = std::max(report.max_abs_err, err);
      if (scale > 0) report.max_rel_err = std::max(report.max_rel_err, err / scale);
      const bool bad = !(err <= options.atol + options.rtol * std::abs(num));  // NaN fails too
      if (bad && report.ok) {
        report.ok = false;
        report.input_index = static_cast<int>(diff[k]);
        report.element = j;
        std::ostringstream os;
        os << std::setprecision(10) << "input " << diff[k] << " (shape " << x.sizes() << ") element " << j
           << ": analytic " << ana[j] << " vs numerical " << num << " (abs err " << err << " > atol " << options.atol
           << " + rtol " << options.rtol << " * |numerical|)";
        report.message = os.str();
      }
    }
  }
  return report;
}

}  // namespace tg::autograd

namespace tg::autograd {

GradcheckReport gradgradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                              const std::vector<Tensor>& inputs, GradcheckOptions options) {
  const std::vector<size_t> diff = inputs_to_differentiate(inputs, "gradgradcheck");

  // float64 copies of the differentiated inputs, and u, the direction the first gradient is taken
  // along (grad_outputs), shaped as fn's output.
  std::vector<Tensor> xs = inputs;
  for (size_t i : diff) {
    xs[i] = native::clone(native::to(inputs[i], inputs[i].device(), kFloat64));
    xs[i].requires_grad_(true);
  }
  Tensor y;
  {
    GradModeGuard on(true);
    y = fn(xs);
  }
  TG_CHECK(y.defined() && is_floating(y.dtype()), "gradgradcheck: fn must return a floating tensor, got ",
           y.defined() ? dtype_name(y.dtype()) : "an undefined tensor");
  std::mt19937_64 gen(0x5eed2badULL);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<double> u(static_cast<size_t>(y.numel()));
  for (double& e : u) e = dist(gen);
  Tensor u64 = tensor_from_host(u.data(), kFloat64, y.sizes(), TensorOptions(kFloat64).device(y.device()));
  u64.requires_grad_(true);
  xs.push_back(u64);

  // The analytic first gradient as one flat vector: gradcheck differentiates it again (its own
  // analytic pass runs with grad mode on, so create_graph is on there; its finite differences
  // evaluate it without recording).
  auto first = [&fn, &diff](const std::vector<Tensor>& all) {
    const bool outer = GradMode::is_enabled();
    std::vector<Tensor> ins(all.begin(), all.end() - 1);
    std::vector<Tensor> wrt;
    for (size_t i : diff) wrt.push_back(ins[i]);
    Tensor out;
    std::vector<Tensor> gs;
    {
      GradModeGuard on(true);
      out = fn(ins);
      if (!requires_grad(out)) return native::full(Shape{0}, 0, kFloat64, all.back().device());
      Tensor dir = all.back();
      if (!outer) dir = alias(dir);
      gs = grad({out}, wrt, GradOptions{.grad_outputs = {dir.to(out.dtype())}, .create_graph = outer,
                                        .allow_unused = true});
    }
    std::vector<Tensor> flat;
    for (size_t k = 0; k < gs.size(); ++k)
      flat.push_back(gs[k].defined() ? gs[k].reshape({-1}).to(kFloat64)
                                     : native::full(Shape{wrt[k].numel()}, 0, kFloat64, wrt[k].device()));
    return cat(flat, 0);
  };
  GradcheckReport r = gradcheck(first, xs, options);
  if (!r.ok && r.input_index == static_cast<int>(inputs.size()))
    r.message = "grad_outputs (the direction u): " + r.message;
  return r;
}

}  // namespace tg::autograd
