// dropout with its backward right below (the mask regenerated from the Philox counters), and
// nn::Dropout.
#include <tapegrad/nn/dropout.h>

#include <cmath>
#include <vector>

#include <tapegrad/autograd/function.h>
#include <tapegrad/core/native.h>
#include <tapegrad/core/trace.h>

namespace tg::nn {

namespace {
void check_p(double p, const char* op) {
  TG_CHECK(p >= 0 && p <= 1, op, ": dropout probability has to be between 0 and 1, got ", p);
}
// Dropout's backward, the same mask applied to g: a linear map that is its own adjoint, so
// under create_graph it is recorded with itself as its backward.
Tensor masked_grad(const Tensor& g, double p, uint64_t seed, uint64_t offset) {
  if (!autograd::creating_graph()) return native::dropout_mask_apply(g, p, seed, offset);
  return autograd::bw::linear_map(
      "dropout_backward", g, [&](const Tensor& t) { return native::dropout_mask_apply(t, p, seed, offset); },
      [p, seed, offset](const Tensor& gg) { return masked_grad(gg, p, seed, offset); });
}
}  // namespace

namespace functional {
Tensor dropout(const Tensor& x, double p, bool training) {
  check_p(p, "dropout");
  TG_CHECK(x.defined(), "dropout: input is undefined");
  if (!training || p == 0) return x;
  TG_CHECK(is_floating(x.dtype()), "dropout: expected a floating input, got ", x.dtype(), " of shape ", x.sizes());
  // One counter per element (the float32 uniform of core/philox.h), for every dtype.
  auto [seed, offset] = native::philox_reserve(x.device(), static_cast<uint64_t>(x.numel()));
  Tensor out = native::dropout_mask_apply(x, p, seed, offset);
  TG_TRACE(Dropout, out, {x}, {{"p", p}});
  if (!autograd::should_record(x)) return out;
  return autograd::record(
      "dropout", {x}, std::move(out),
      [p, seed, offset](const Tensor& g, const autograd::FunctionNode&) -> std::vector<Tensor> {
        return {masked_grad(g, p, seed, offset)};
      },
      autograd::kDifferentiable);
}
}  // namespace functional

Dropout::Dropout(double p_) : p(p_) { check_p(p, "Dropout"); }

Tensor Dropout::forward(const Tensor& x) { return functional::dropout(x, p, is_training()); }

}  // namespace tg::nn
