// The per-element update rules of SGD and Adam/AdamW (PyTorch's formulas), shared
// by the CPU loops and the fused CUDA kernels so that both compute the same thing
// in the same order. M is the "opmath" type: float for float32/float16/bfloat16
// parameters, double for float64. Scalars derived from the step count are computed
// in double and rounded to M once.
#pragma once
#include <cmath>
#include <cstdint>
#include <tuple>
#include <type_traits>

#include <tapegrad/core/half.h>

namespace tg::optim::detail {

// sqrt in M itself (sqrtf for float) on both host and device, so the CPU and CUDA paths agree.
template <class M>
TG_HOST_DEVICE inline M opmath_sqrt(M x) {
  if constexpr (std::is_same_v<M, float>)
    return ::sqrtf(x);
  else
    return ::sqrt(x);
}

struct SgdHyper {
  double lr = 0;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool maximize = false;
};

struct AdamHyper {
  double lr = 0;
  double beta1 = 0;
  double beta2 = 0;
  double eps = 0;
  double weight_decay = 0;
  bool amsgrad = false;
  bool maximize = false;
  bool decoupled = false;  // AdamW
};

template <class M>
struct SgdCoeffs {
  M neg_lr, momentum, one_minus_dampening, weight_decay;
  bool nesterov, maximize, use_momentum, first_step;
};

template <class M>
TG_HOST_DEVICE inline SgdCoeffs<M> sgd_coeffs(const SgdHyper& h, float step) {
  return SgdCoeffs<M>{static_cast<M>(-h.lr),
                      static_cast<M>(h.momentum),
                      static_cast<M>(1.0 - h.dampening),
                      static_cast<M>(h.weight_decay),
                      h.nesterov,
                      h.maximize,
                      h.momentum != 0,
                      step <= 1.0f};
}

// g: the gradient already divided by grad_scale. buf is ignored without momentum.
template <class M>
TG_HOST_DEVICE inline void sgd_update(M& p, M g, M& buf, const SgdCoeffs<M>& c) {
  if (c.maximize) g = -g;
  if (c.weight_decay != M(0)) g = g + c.weight_decay * p;
  if (c.use_momentum) {
    buf = c.first_step ? g : c.momentum * buf + c.one_minus_dampening * g;
    g = c.nesterov ? g + c.momentum * buf : buf;
  }
  p = p + c.neg_lr * g;
}

template <class M>
struct AdamCoeffs {
  M lr, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, decay_factor, neg_step_size,
      bias_correction2_sqrt;
  bool amsgrad, maximize, decoupled;
};

// beta^step for a bias correction. A step count is a whole number: by squaring, about 2 log2(step)
// float64 multiplies (1 - beta^step within 3e-12 relative of pow's for betas 0.9-0.99999 and steps
// to 2^24: invisible in float32), the same bits on CPU and GPU. CUDA's float64 pow is a long
// dependent chain every block of a fused step ran before touching its chunk (ncu, the MNIST MLP's
// Adam kernel on an H100: 13.7 -> 12.5 us). Other counts (fractional, or past 2^24) take pow.
TG_HOST_DEVICE inline double step_power(double beta, double step) {
  if (!(step >= 0.0 && step <= 16777216.0) || step != static_cast<double>(static_cast<int64_t>(step)))
    return ::pow(beta, step);
  auto n = static_cast<uint32_t>(step);
  double r = 1.0, b = beta;
  while (n != 0) {
    if (n & 1u) r *= b;
    b *= b;
    n >>= 1;
  }
  return r;
}

template <class M>
TG_HOST_DEVICE inline AdamCoeffs<M> adam_coeffs(const AdamHyper& h, float step) {
  double s = static_cast<double>(step);
  double bc1 = 1.0 - step_power(h.beta1, s);
  double bc2 = 1.0 - step_power(h.beta2, s);
  return AdamCoeffs<M>{static_cast<M>(h.lr),
                       static_cast<M>(h.beta1),
                       static_cast<M>(1.0 - h.beta1),
                       static_cast<M>(h.beta2),
                       static_cast<M>(1.0 - h.beta2),
                       static_cast<M>(h.eps),
                       static_cast<M>(h.weight_decay),
                       static_cast<M>(1.0 - h.lr * h.weight_decay),
                       static_cast<M>(-(h.lr / bc1)),
                       static_cast<M>(::sqrt(bc2)),
                       h.amsgrad,
                       h.maximize,
                       h.decoupled};
}

// g: the gradient already divided by grad_scale. vmax is used only with amsgrad.
template <class M>
TG_HOST_DEVICE inline void adam_update(M& p, M g, M& m, M& v, M& vmax, const AdamCoeffs<M>& c) {
  if (c.maximize) g = -g;
  if (c.weight_decay != M(0)) {
    if (c.decoupled)
      p = p * c.decay_factor;  // AdamW: param.mul_(1 - lr * weight_decay)
    else
      g = g + c.weight_decay * p;
  }
  m = m + c.one_minus_beta1 * (g - m);  // exp_avg.lerp_(grad, 1 - beta1)
  v = c.beta2 * v + c.one_minus_beta2 * g * g;
  M second = v;
  if (c.amsgrad) {
    if (v > vmax || v != v) vmax = v;  // torch.maximum propagates NaN
    second = vmax;
  }
  M denom = opmath_sqrt(second) / c.bias_correction2_sqrt + c.eps;
  p = p + c.neg_step_size * (m / denom);
}

// The rules as the one elementwise step runs them (optim/elementwise_step.h on the CPU,
// optim/cuda/fused_step.cuh on CUDA): a parameter, its gradient and K state values per element,
// coefficients from the hyper-parameters and the step count; the Variants are the (K, step
// counted) forms an optimizer uses. RMSprop and Adagrad join as rules of their own.
template <int K, bool Counted>
struct StepVariant {
  static constexpr int kStates = K;
  static constexpr bool kCounted = Counted;  // a float32 step count per parameter, advanced by the step
};

struct SgdRule {
  using Hyper = SgdHyper;
  template <class M>
  using Coeffs = SgdCoeffs<M>;
  static constexpr int64_t kCpuGrain = 1 << 15;
  // Without momentum no state and no count; with it the momentum buffer and the count.
  using Variants = std::tuple<StepVariant<0, false>, StepVariant<1, true>>;
  template <class M>
  TG_HOST_DEVICE static Coeffs<M> coeffs(const Hyper& h, float step) {
    return sgd_coeffs<M>(h, step);
  }
  template <int K, class M>
  TG_HOST_DEVICE static void update(M& p, M g, M* state, const Coeffs<M>& c) {
    if constexpr (K == 1) {
      sgd_update(p, g, state[0], c);
    } else {
      M unused = 0;
      sgd_update(p, g, unused, c);
    }
  }
};

struct AdamRule {  // and AdamW (AdamHyper::decoupled)
  using Hyper = AdamHyper;
  template <class M>
  using Coeffs = AdamCoeffs<M>;
  static constexpr int64_t kCpuGrain = 1 << 14;
  // exp_avg, exp_avg_sq (and max_exp_avg_sq with amsgrad), always counted.
  using Variants = std::tuple<StepVariant<2, true>, StepVariant<3, true>>;
  template <class M>
  TG_HOST_DEVICE static Coeffs<M> coeffs(const Hyper& h, float step) {
    return adam_coeffs<M>(h, step);
  }
  template <int K, class M>
  TG_HOST_DEVICE static void update(M& p, M g, M* state, const Coeffs<M>& c) {
    if constexpr (K == 3) {
      adam_update(p, g, state[0], state[1], state[2], c);
    } else {
      M unused = 0;
      adam_update(p, g, state[0], state[1], unused, c);
    }
  }
};

// ---- RMSprop and Adagrad (torch.optim.RMSprop / Adagrad, single-tensor path)

struct RmspropHyper {
  double lr = 0;
  double alpha = 0;
  double eps = 0;
  double weight_decay = 0;
  double momentum = 0;
  bool centered = false;
  bool maximize = false;
};

template <class M>
struct RmspropCoeffs {
  M neg_lr, alpha, one_minus_alpha, eps, weight_decay, momentum;
  bool centered, use_momentum, maximize;
};

template <class M>
TG_HOST_DEVICE inline RmspropCoeffs<M> rmsprop_coeffs(const RmspropHyper& h, float /*step*/) {
  return RmspropCoeffs<M>{static_cast<M>(-h.lr),
                          static_cast<M>(h.alpha),
                          static_cast<M>(1.0 - h.alpha),
                          static_cast<M>(h.eps),
                          static_cast<M>(h.weight_decay),
                          static_cast<M>(h.momentum),
                          h.centered,
                          h.momentum > 0,
                          h.maximize};
}

// g: the gradient already divided by grad_scale. grad_avg is used only when centered, buf only
// with momentum.
template <class M>
TG_HOST_DEVICE inline void rmsprop_update(M& p, M g, M& square_avg, M& grad_avg, M& buf, const RmspropCoeffs<M>& c) {
  if (c.maximize) g = -g;
  if (c.weight_decay != M(0)) g = g + c.weight_decay * p;
  square_avg = c.alpha * square_avg + c.one_minus_alpha * g * g;  // mul_(alpha).addcmul_(g, g, 1 - alpha)
  M avg;
  if (c.centered) {
    grad_avg = grad_avg + c.one_minus_alpha * (g - grad_avg);  // grad_avg.lerp_(grad, 1 - alpha)
    avg = opmath_sqrt(square_avg - grad_avg * grad_avg);
  } else {
    avg = opmath_sqrt(square_avg);
  }
  avg = avg + c.eps;
  if (c.use_momentum) {
    buf = c.momentum * buf + g / avg;  // buf.mul_(momentum).addcdiv_(grad, avg)
    p = p + c.neg_lr * buf;
  } else {
    p = p + c.neg_lr * (g / avg);
  }
}

struct AdagradHyper {
  double lr = 0;
  double lr_decay = 0;
  double weight_decay = 0;
  double eps = 0;
  bool maximize = false;
};

template <class M>
struct AdagradCoeffs {
  M neg_clr, weight_decay, eps;
  bool maximize;
};

template <class M>
TG_HOST_DEVICE inline AdagradCoeffs<M> adagrad_coeffs(const AdagradHyper& h, float step) {
  const double clr = h.lr / (1.0 + (static_cast<double>(step) - 1.0) * h.lr_decay);
  return AdagradCoeffs<M>{static_cast<M>(-clr), static_cast<M>(h.weight_decay), static_cast<M>(h.eps), h.maximize};
}

// g: the gradient already divided by grad_scale.
template <class M>
TG_HOST_DEVICE inline void adagrad_update(M& p, M g, M& sum, const AdagradCoeffs<M>& c) {
  if (c.maximize) g = -g;
  if (c.weight_decay != M(0)) g = g + c.weight_decay * p;
  sum = sum + g * g;  // state_sum.addcmul_(grad, grad, value=1)
  const M denom = opmath_sqrt(sum) + c.eps;
  p = p + c.neg_clr * (g / denom);  // param.addcdiv_(grad, std, value=-clr)
}

struct RmspropRule {
  using Hyper = RmspropHyper;
  template <class M>
  using Coeffs = RmspropCoeffs<M>;
  static constexpr int64_t kCpuGrain = 1 << 14;
  // square_avg, then grad_avg (centered), then momentum_buffer (momentum > 0); always counted.
  using Variants = std::tuple<StepVariant<1, true>, StepVariant<2, true>, StepVariant<3, true>>;
  template <class M>
  TG_HOST_DEVICE static Coeffs<M> coeffs(const Hyper& h, float step) {
    return rmsprop_coeffs<M>(h, step);
  }
  template <int K, class M>
  TG_HOST_DEVICE static void update(M& p, M g, M* state, const Coeffs<M>& c) {
    if constexpr (K == 3) {
      rmsprop_update(p, g, state[0], state[1], state[2], c);
    } else if constexpr (K == 2) {
      M unused = 0;
      if (c.centered)
        rmsprop_update(p, g, state[0], state[1], unused, c);
      else
        rmsprop_update(p, g, state[0], unused, state[1], c);
    } else {
      M unused[2] = {0, 0};
      rmsprop_update(p, g, state[0], unused[0], unused[1], c);
    }
  }
};

struct AdagradRule {
  using Hyper = AdagradHyper;
  template <class M>
  using Coeffs = AdagradCoeffs<M>;
  static constexpr int64_t kCpuGrain = 1 << 14;
  // sum; counted (the step decays lr).
  using Variants = std::tuple<StepVariant<1, true>>;
  template <class M>
  TG_HOST_DEVICE static Coeffs<M> coeffs(const Hyper& h, float step) {
    return adagrad_coeffs<M>(h, step);
  }
  template <int K, class M>
  TG_HOST_DEVICE static void update(M& p, M g, M* state, const Coeffs<M>& c) {
    static_assert(K == 1);
    adagrad_update(p, g, state[0], c);
  }
};

}  // namespace tg::optim::detail
