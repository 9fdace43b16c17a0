// matmul and linear with their backward: gradients are matmuls against transposed
// VIEWS (native::matmul hands the transpose to the BLAS, no copy); broadcast batch
// dims are reduced by the engine's central sum_to. A gradient headed for a cast from
// float32 (autocast's weights) is stored by the gemm in float32 directly.
#include <tuple>
#include <vector>

#include <tapegrad/core/autocast_hook.h>
#include <tapegrad/autograd/function.h>
#include <tapegrad/core/finite_proxy.h>
#include <tapegrad/core/trace.h>

namespace tg {

using autograd::FunctionNode;
using autograd::grad_dtype_for;
using autograd::kDifferentiable;
using autograd::record;
using autograd::SavedTensor;
using autograd::should_record;
using Grads = std::vector<Tensor>;

namespace {
Tensor mT(const Tensor& t) { return native::transpose(t, t.dim() - 2, t.dim() - 1); }
// A 2-D operand stored transposed (column-major, like Linear's weight.t()): its gradient is
// produced in the same layout, so the gradient reaching the stored tensor needs no
// transposing copy.
bool col_major(const Tensor& t) { return t.dim() == 2 && t.stride(0) == 1 && t.size(0) > 1 && t.stride(1) != 1; }

// matmul's gradients with recorded ops (create_graph): g @ b^T and a^T @ g, 1-D operands as in forward.
std::vector<Tensor> matmul_backward_recorded(const Tensor& g, const Tensor& a, const Tensor& b, bool need_a,
                                            bool need_b, bool a1, bool b1) {
  Tensor ga, gb;
  if (a1 && b1) return {need_a ? tg::mul(b, g) : Tensor(), need_b ? tg::mul(a, g) : Tensor()};
  Tensor g2 = g;
  if (b1) g2 = g2.unsqueeze(g2.dim());
  if (a1) g2 = g2.unsqueeze(g2.dim() - 1);
  auto mt = [](const Tensor& t) { return t.transpose(t.dim() - 2, t.dim() - 1); };
  if (need_a) {
    ga = tg::matmul(g2, mt(b1 ? b.unsqueeze(1) : b));
    if (a1) ga = ga.squeeze(ga.dim() - 2);
  }
  if (need_b) {
    gb = tg::matmul(mt(a1 ? a.unsqueeze(0) : a), g2);
    if (b1) gb = gb.squeeze(gb.dim() - 1);
  }
  return {ga, gb};
}

// A float32 gradient just computed from float16 operands (a GEMM of g and other, or with other
// undefined the sum of g over rows: a linear's bias) is finite iff they are: an inf/NaN check
// may read them instead (core/finite_proxy.h).
void note_wide_gemm(const Tensor& grad, const Tensor& g, const Tensor& other) {
  if (!grad.defined() || grad.dtype() != kFloat32 || g.dtype() != kFloat16) return;
  if (other.defined()) {
    if (other.dtype() != kFloat16) return;
    detail::set_finite_proxy(grad, {g, other});
  } else {
    detail::set_finite_proxy(grad, {g});
  }
}
}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  TG_AUTOCAST(Matmul, tg::matmul(a, b), a, b);
  Tensor out = native::matmul(a, b);
  TG_TRACE(Matmul, out, {a, b}, {});
  if (!should_record(a, b)) return out;
  SavedTensor sa = autograd::requires_grad(b) ? SavedTensor(a, "matmul") : SavedTensor();
  SavedTensor sb = autograd::requires_grad(a) ? SavedTensor(b, "matmul") : SavedTensor();
  const bool a1 = a.dim() == 1, b1 = b.dim() == 1, a_col = col_major(a), b_col = col_major(b);
  return record("matmul", {a, b}, std::move(out),
                [sa, sb, a1, b1, a_col, b_col](const Tensor& g, const FunctionNode& n) -> Grads {
    if (autograd::creating_graph())
      return matmul_backward_recorded(g, sa.unpack(), sb.unpack(), n.needs_input_grad(0), n.needs_input_grad(1), a1, b1);
    Tensor ga, gb;
    if (a1 && b1) {  // dot product: g is a scalar
      if (n.needs_input_grad(0)) ga = native::mul(sb.unpack(), g);
      if (n.needs_input_grad(1)) gb = native::mul(sa.unpack(), g);
      return {ga, gb};
    }
    // Put the dims that 1-D operands dropped back: a (k) -> (1, k), b (k) -> (k, 1).
    Tensor g2 = g;
    if (b1) g2 = native::unsqueeze(g2, g2.dim());
    if (a1) g2 = native::unsqueeze(g2, g2.dim() - 1);
    if (n.needs_input_grad(0)) {
      Tensor bv = sb.unpack();
      Tensor b2 = b1 ? native::unsqueeze(bv, 1) : bv;
      const DType dt = grad_dtype_for(n, 0, g.dtype());
      // (..., m, k); for a column-major a, computed as (b g^T)^T to land in a's layout
      ga = !a1 && a_col ? mT(native::matmul(b2, mT(g2), dt)) : native::matmul(g2, mT(b2), dt);
      if (a1) ga = native::squeeze(ga, ga.dim() - 2);
      note_wide_gemm(ga, g, bv);
    }
    if (n.needs_input_grad(1)) {
      Tensor av = sa.unpack();
      Tensor a2 = a1 ? native::unsqueeze(av, 0) : av;
      const DType dt = grad_dtype_for(n, 1, g.dtype());
      // (..., k, n); for a column-major b, computed as (g^T a)^T to land in b's layout
      gb = !b1 && b_col ? mT(native::matmul(mT(g2), a2, dt)) : native::matmul(mT(a2), g2, dt);
      if (b1) gb = native::squeeze(gb, gb.dim() - 1);
      note_wide_gemm(gb, g, av);
    }
    return {ga, gb};
  }, kDifferentiable);
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  TG_AUTOCAST(Linear, tg::linear(x, weight, bias), x, weight, bias);
  Tensor out = native::linear(x, weight, bias);
  if (bias.defined()) {
    TG_TRACE(Linear, out, {x, weight, bias}, {});
  } else {
    TG_TRACE(Linear, out, {x, weight}, {});
  }
  if (!should_record(x, weight, bias)) return out;
  SavedTensor sx = autograd::requires_grad(weight) ? SavedTensor(x, "linear") : SavedTensor();
  SavedTensor sw = autograd::requires_grad(x) ? SavedTensor(weight, "linear") : SavedTensor();
  const bool w_col = col_major(weight);
  return record("linear", {x, weight, bias}, std::move(out),
                [sx, sw, w_col](const Tensor& g, const FunctionNode& n) -> Grads {
    Tensor gx, gw, gb;
    if (autograd::creating_graph()) {  // composite, recorded: g W, g^T x over the flattened batch, sum of g
      if (n.needs_input_grad(0)) gx = tg::matmul(g, sw.unpack());
      if (n.needs_input_grad(1) || n.needs_input_grad(2)) {
        const int64_t out_f = g.dim() == 0 ? 1 : g.size(-1);
        Tensor g2 = g.reshape({-1, out_f});
        if (n.needs_input_grad(1)) {
          Tensor x = sx.unpack();
          gw = tg::matmul(g2.t(), x.reshape({-1, x.dim() == 0 ? 1 : x.size(-1)}));
        }
        if (n.needs_input_grad(2)) gb = g2.sum(DimList{0});
      }
      return {gx, gw, gb};
    }
    if (const autograd::PointwiseGrad* pw = n.needs_input_grad(0) ? autograd::pointwise_next(n, 0) : nullptr) {
      // The input came from an activation whose backward only this gradient feeds: apply it here,
      // in the GEMM's epilogue where the backend has one (GELU's tanh form on cuBLASLt), so the
      // activation's gradient is never stored; else right after the GEMM, as that node would.
      const Tensor w = sw.unpack(), saved = pw->saved.unpack();
      gx = native::linear_grad_input_pointwise(g, w, pw->op, saved);
      if (!gx.defined())
        gx = autograd::bw::elementwise_backward(pw->name, pw->op, native::linear_grad_input(g, w, g.dtype()), saved,
                                                pw->p0, pw->p1);
      autograd::absorb_next(n, 0);
    } else if (n.needs_input_grad(0)) {
      gx = native::linear_grad_input(g, sw.unpack(), grad_dtype_for(n, 0, g.dtype()));
    }
    const bool need_w = n.needs_input_grad(1), need_b = n.needs_input_grad(2);
    if (need_w || need_b) {
      std::tie(gw, gb) = native::linear_grad_weight_bias(g, need_w ? sx.unpack() : Tensor(), need_w, w_col,
                                                         grad_dtype_for(n, 1, g.dtype()), need_b,
                                                         grad_dtype_for(n, 2, g.dtype()));
      if (need_w) note_wide_gemm(gw, g, sx.unpack());
      if (need_b) note_wide_gemm(gb, g, Tensor());
    }
    return {gx, gw, gb};
  }, kDifferentiable);
}

}  // namespace tg
