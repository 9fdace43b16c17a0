// matmul with its backward: gradients are matmuls against transposed VIEWS
// (native::matmul hands the transpose to the BLAS, no copy); broadcast batch
// dims are reduced by the engine's central sum_to.
#include <vector>

#include "amp/hook.h"
#include "autograd/function.h"
#include "core/trace.h"

namespace tg {

using autograd::FunctionNode;
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
      // (..., m, k); for a column-major a, computed as (b g^T)^T to land in a's layout
      ga = !a1 && a_col ? mT(native::matmul(b2, mT(g2))) : native::matmul(g2, mT(b2));
      if (a1) ga = native::squeeze(ga, ga.dim() - 2);
    }
    if (n.needs_input_grad(1)) {
      Tensor av = sa.unpack();
      Tensor a2 = a1 ? native::unsqueeze(av, 0) : av;
      // (..., k, n); for a column-major b, computed as (g^T a)^T to land in b's layout
      gb = !b1 && b_col ? mT(native::matmul(mT(g2), a2)) : native::matmul(mT(a2), g2);
      if (b1) gb = native::squeeze(gb, gb.dim() - 1);
    }
    return {ga, gb};
  });
}

}  // namespace tg
