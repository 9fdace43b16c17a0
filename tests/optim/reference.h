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

}  // namespace tg::testing
