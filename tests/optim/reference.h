// Independent float64 references of PyTorch's SGD / Adam / AdamW updates (written
// from the formulas in torch.optim's documentation, on plain std::vector<double>),
// and helpers to run an optimizer and its reference over the same gradients.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.h>

#include <tapegrad/optim/optim.h>

namespace tg::testing {

using Vec = std::vector<double>;

inline Vec host(const Tensor& t) { return t.to(Device(kCPU), kFloat64).contiguous().to_vector<double>(); }

inline bool has_cuda() { return tg::cuda::is_available(); }

// One parameter tensor's reference update rule.
class RefOptimizer {
 public:
  virtual ~RefOptimizer() = default;
  virtual void step(Vec& p, const Vec& g) = 0;
};

struct RefSgd final : RefOptimizer {
  double lr, momentum, dampening, wd;
  bool nesterov, maximize;
  Vec buf;
  RefSgd(const optim::SGDOptions& o)
      : lr(o.lr), momentum(o.momentum), dampening(o.dampening), wd(o.weight_decay), nesterov(o.nesterov),
        maximize(o.maximize) {}
  void step(Vec& p, const Vec& grad) override {
    Vec g = grad;
    for (size_t i = 0; i < p.size(); ++i) {
      if (maximize) g[i] = -g[i];
      g[i] += wd * p[i];
    }
    if (momentum != 0) {
      if (buf.empty()) {
        buf = g;
      } else {
        for (size_t i = 0; i < p.size(); ++i) buf[i] = momentum * buf[i] + (1 - dampening) * g[i];
      }
      for (size_t i = 0; i < p.size(); ++i) g[i] = nesterov ? g[i] + momentum * buf[i] : buf[i];
    }
    for (size_t i = 0; i < p.size(); ++i) p[i] -= lr * g[i];
  }
};

struct RefAdam final : RefOptimizer {
  double lr, b1, b2, eps, wd;
  bool amsgrad, maximize, decoupled;
  Vec m, v, vmax;
  int t = 0;
  template <class O>
  RefAdam(const O& o, bool decoupled_)
      : lr(o.lr), b1(o.betas.first), b2(o.betas.second), eps(o.eps), wd(o.weight_decay), amsgrad(o.amsgrad),
        maximize(o.maximize), decoupled(decoupled_) {}
  void step(Vec& p, const Vec& grad) override {
    const size_t n = p.size();
    if (m.empty()) m = v = vmax = Vec(n, 0.0);
    ++t;
    const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    for (size_t i = 0; i < n; ++i) {
      double g = maximize ? -grad[i] : grad[i];
      if (decoupled)
        p[i] *= 1 - lr * wd;
      else
        g += wd * p[i];
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      double second = v[i];
      if (amsgrad) {
        vmax[i] = std::max(vmax[i], v[i]);
        second = vmax[i];
      }
      const double denom = std::sqrt(second) / std::sqrt(bc2) + eps;
      p[i] -= lr / bc1 * m[i] / denom;
    }
  }
};

// ---- RMSprop and Adagrad: torch/optim/rmsprop.py and adagrad.py's single-tensor paths, in float64.

struct RefRmsprop final : RefOptimizer {
  double lr, alpha, eps, wd, momentum;
  bool centered, maximize;
  Vec square_avg, grad_avg, buf;
  explicit RefRmsprop(const optim::RMSpropOptions& o)
      : lr(o.lr), alpha(o.alpha), eps(o.eps), wd(o.weight_decay), momentum(o.momentum), centered(o.centered),
        maximize(o.maximize) {}
  void step(Vec& p, const Vec& grad) override {
    const size_t n = p.size();
    if (square_avg.empty()) square_avg = grad_avg = buf = Vec(n, 0.0);
    for (size_t i = 0; i < n; ++i) {
      double g = maximize ? -grad[i] : grad[i];
      if (wd != 0) g += wd * p[i];
      square_avg[i] = alpha * square_avg[i] + (1 - alpha) * g * g;
      double avg;
      if (centered) {
        grad_avg[i] = alpha * grad_avg[i] + (1 - alpha) * g;
        avg = std::sqrt(square_avg[i] - grad_avg[i] * grad_avg[i]);
      } else {
        avg = std::sqrt(square_avg[i]);
      }
      avg += eps;
      if (momentum > 0) {
        buf[i] = momentum * buf[i] + g / avg;
        p[i] -= lr * buf[i];
      } else {
        p[i] -= lr * g / avg;
      }
    }
  }
};

struct RefAdagrad final : RefOptimizer {
  double lr, lr_decay, wd, init, eps;
  bool maximize;
  Vec sum;
  int t = 0;
  explicit RefAdagrad(const optim::AdagradOptions& o)
      : lr(o.lr), lr_decay(o.lr_decay), wd(o.weight_decay), init(o.initial_accumulator_value), eps(o.eps),
        maximize(o.maximize) {}
  void step(Vec& p, const Vec& grad) override {
    const size_t n = p.size();
    if (sum.empty()) sum = Vec(n, init);
    ++t;
    const double clr = lr / (1 + (t - 1) * lr_decay);
    for (size_t i = 0; i < n; ++i) {
      double g = maximize ? -grad[i] : grad[i];
      if (wd != 0) g += wd * p[i];
      sum[i] += g * g;
      p[i] -= clr * g / (std::sqrt(sum[i]) + eps);
    }
  }
};

// Shapes of the test parameters: tiny, odd-sized, and one spanning two CUDA chunks.
inline std::vector<Shape> test_shapes() { return {{3, 5}, {7}, {257, 300}}; }

inline std::vector<Tensor> make_params(Device dev, DType dtype, uint64_t seed) {
  tg::manual_seed(seed);
  std::vector<Tensor> ps;
  for (const auto& s : test_shapes()) ps.push_back(tg::randn(s).to(dtype).to(dev).requires_grad_());
  return ps;
}

// The gradients of step k (CPU, float32 values; the same on every device).
inline std::vector<Tensor> make_grads(int k, uint64_t seed) {
  tg::manual_seed(seed * 1000 + static_cast<uint64_t>(k));
  std::vector<Tensor> gs;
  for (const auto& s : test_shapes()) gs.push_back(tg::randn(s));
  return gs;
}

inline void set_grads(const std::vector<Tensor>& params, const std::vector<Tensor>& grads) {
  for (size_t i = 0; i < params.size(); ++i)
    params[i].mutable_grad() = grads[i].to(params[i].device(), params[i].dtype());
}

inline void expect_close(const Vec& got, const Vec& want, double atol, double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::abs(want[i])) << what << " element " << i;
}

// Runs `opt` over `steps` steps of make_grads and checks every parameter against
// one reference per parameter (fresh from make_ref) fed the same gradients,
// rounded to the parameter dtype.
inline void check_against_reference(Device dev, DType dtype, const std::function<std::unique_ptr<optim::Optimizer>(
                                                                  const std::vector<Tensor>&)>& make_opt,
                                    const std::function<std::unique_ptr<RefOptimizer>()>& make_ref, int steps,
                                    double atol, double rtol, const std::string& what) {
  auto params = make_params(dev, dtype, 7);
  std::vector<Vec> ref_p;
  std::vector<std::unique_ptr<RefOptimizer>> refs;
  for (const auto& p : params) {
    ref_p.push_back(host(p));
    refs.push_back(make_ref());
  }
  auto opt = make_opt(params);
  for (int k = 0; k < steps; ++k) {
    auto grads = make_grads(k, 11);
    set_grads(params, grads);
    opt->step();
    for (size_t i = 0; i < params.size(); ++i) refs[i]->step(ref_p[i], host(grads[i].to(dtype)));
  }
  for (size_t i = 0; i < params.size(); ++i)
    expect_close(host(params[i]), ref_p[i], atol, rtol, what + " param " + std::to_string(i));
}

// Bytes of a tensor's elements, for bit-exact comparisons.
inline std::vector<unsigned char> bytes_of(const Tensor& t) {
  Tensor c = t.cpu().contiguous();
  std::vector<unsigned char> out(c.nbytes());
  c.copy_to_host(out.data());
  return out;
}

// ---- Shared checks of any optimizer (used by the RMSprop and Adagrad tests).

using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(const std::vector<Tensor>&)>;

// Parameters, state and step counts of an optimizer, as bytes.
inline std::vector<std::vector<unsigned char>> snapshot_bytes(const optim::Optimizer& opt) {
  std::vector<std::vector<unsigned char>> out;
  for (const auto& kv : opt.state_dict()) out.push_back(bytes_of(kv.second));
  for (const auto& p : opt.parameters()) out.push_back(bytes_of(p));
  return out;
}

// AMP inputs on `dev`: a skipped step (found_inf set, garbage gradients) changes nothing bit for
// bit, also as the very first step; gradients scaled by 1024 with grad_scale = 1024 give the
// unscaled twin's result bit for bit. Every "step" count ends at 3.
// exact = false compares the scaled run with its twin to 1e-6 relative instead of bit for bit.
inline void check_amp_step_args(Device dev, const MakeOptimizer& make_opt, const std::string& what, bool exact = true) {
  SCOPED_TRACE(what + " on " + dev.str());
  auto params = make_params(dev, kFloat32, 3);
  auto twins = make_params(dev, kFloat32, 3);
  auto opt = make_opt(params), twin = make_opt(twins);
  const auto opts = TensorOptions().device(dev);
  Tensor no_inf = tg::zeros({}, opts), inf = tg::ones({}, opts), scale = tg::full({}, 1024.0, opts);
  // A skipped first step (on CUDA it may create zero state first) leaves the parameters and counts.
  set_grads(params, make_grads(0, 5));
  std::vector<std::vector<unsigned char>> initial;
  for (const auto& p : params) initial.push_back(bytes_of(p));
  opt->step({.grad_scale = scale, .found_inf = inf});
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(bytes_of(params[i]), initial[i]) << "a skipped first step changed parameter " << i;
    if (const optim::ParamState* st = opt->state(params[i])) EXPECT_EQ(st->at("step").item<float>(), 0.f);
  }
  for (int k = 0; k < 3; ++k) {
    auto grads = make_grads(k, 5);
    std::vector<Tensor> scaled, garbage;
    for (auto& g : grads) {
      scaled.push_back(g * 1024.0);  // exact: a power of two
      garbage.push_back(g * 1e30);
    }
    set_grads(twins, grads);
    twin->step();
    set_grads(params, scaled);
    opt->step({.grad_scale = scale, .found_inf = no_inf});
    const auto before = snapshot_bytes(*opt);
    set_grads(params, garbage);
    opt->step({.grad_scale = scale, .found_inf = inf});
    EXPECT_EQ(snapshot_bytes(*opt), before) << "a skipped step changed something (step " << k << ")";
  }
  {
    const auto a = snapshot_bytes(*opt), b = snapshot_bytes(*twin);
    std::vector<std::string> names;
    for (const auto& kv : opt->state_dict()) names.push_back(kv.first);
    for (size_t i = 0; i < params.size(); ++i) names.push_back("parameter " + std::to_string(i));
    ASSERT_EQ(a.size(), b.size());
    if (exact) {
      for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "scaled run and its twin differ in " << names[i];
    } else {
      const auto sa = opt->state_dict(), sb = twin->state_dict();
      for (const auto& [k, v] : sa)
        if (is_floating(v.dtype())) expect_close(host(v), host(sb.at(k)), 1e-7, 1e-6, "scaled vs twin " + k);
      const auto pa = opt->parameters(), pb = twin->parameters();
      for (size_t i = 0; i < pa.size(); ++i) expect_close(host(pa[i]), host(pb[i]), 1e-7, 1e-6, "scaled vs twin param");
    }
  }
  for (const auto& p : params) EXPECT_EQ(opt->state(p)->at("step").item<float>(), 3.f);
}

// state_dict / load_state_dict: an optimizer loaded (from CPU copies) after 3 of 6 steps, over
// copies of the parameters, ends bit-identical to the uninterrupted one. `make_other` builds the
// fresh optimizer, with other options: the loaded ones must win.
inline void check_state_dict_continues(Device dev, const MakeOptimizer& make_opt, const MakeOptimizer& make_other,
                                       const std::string& what) {
  SCOPED_TRACE(what + " on " + dev.str());
  auto params = make_params(dev, kFloat32, 21);
  auto opt = make_opt(params);
  for (int k = 0; k < 3; ++k) {
    set_grads(params, make_grads(k, 2));
    opt->step();
  }
  optim::OptimizerStateDict saved;
  for (const auto& [k, v] : opt->state_dict()) saved.insert(k, v.cpu().clone());
  std::vector<Tensor> copies;
  for (auto& p : params) copies.push_back(p.detach().clone().requires_grad_());
  auto other = make_other(copies);
  other->load_state_dict(saved);
  EXPECT_EQ(other->lr(), opt->lr());
  for (int k = 3; k < 6; ++k) {
    set_grads(params, make_grads(k, 2));
    set_grads(copies, make_grads(k, 2));
    opt->step();
    other->step();
  }
  EXPECT_EQ(snapshot_bytes(*opt), snapshot_bytes(*other));
  EXPECT_EQ(opt->state_dict().size(), other->state_dict().size());
}

}  // namespace tg::testing
