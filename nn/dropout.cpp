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
  return autograd::record("dropout", {x}, std::move(out),
                          [p, seed, offset](const Tensor& g, const autograd::FunctionNode&) -> std::vector<Tensor> {
                            return {native::dropout_mask_apply(g, p, seed, offset)};
                          });
}
}  // namespace functional

Dropout::Dropout(double p_) : p(p_) { check_p(p, "Dropout"); }

Tensor Dropout::forward(const Tensor& x) { return functional::dropout(x, p, is_training()); }

}  // namespace tg::nn
