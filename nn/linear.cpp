// tg::nn::Linear.
#include <tapegrad/nn/linear.h>

#include <cmath>

#include <tapegrad/nn/init.h>

namespace tg::nn {

Linear::Linear(int64_t in, int64_t out, bool with_bias, TensorOptions options) : in_features(in), out_features(out) {
  TG_CHECK(in >= 0 && out >= 0, "Linear: in_features and out_features must be non-negative, got ", in, " and ", out);
  TG_CHECK(is_floating(options.dtype()), "Linear: parameters must be floating point, got ", options.dtype());
  const TensorOptions opts = TensorOptions().dtype(options.dtype()).device(options.device());
  weight = register_parameter("weight", empty({out, in}, opts));
  if (with_bias) bias = register_parameter("bias", empty({out}, opts));
  reset_parameters();
}

void Linear::reset_parameters() {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const double bound = in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(in_features)) : 0.0;
    init::uniform_(bias, -bound, bound);
  }
}

Tensor Linear::forward(const Tensor& x) {
  TG_CHECK(x.dim() >= 1 && x.size(-1) == in_features, "Linear(", in_features, ", ", out_features,
           "): expected input with last dim ", in_features, ", got shape ", x.sizes());
  return tg::linear(x, weight, bias);
}

}  // namespace tg::nn
