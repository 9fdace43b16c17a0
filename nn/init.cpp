// Parameter initialisers: random fills through the native ops, copied into the
// target under NoGradGuard so a parameter stays a leaf.
#include <tapegrad/nn/init.h>

#include <cmath>

#include <tapegrad/autograd/autograd.h>
#include <tapegrad/core/native.h>

namespace tg::nn::init {

namespace {
void check_floating(const Tensor& t, const char* op) {
  TG_CHECK(t.defined(), "nn::init::", op, ": the tensor is undefined");
  TG_CHECK(is_floating(t.dtype()), "nn::init::", op, ": expected a floating tensor, got ", t.dtype(), " of shape ",
           t.sizes());
}
// Fills t from a float32/float64 draw made on t's device, then copies it in.
const Tensor& assign(const Tensor& t, const Tensor& values) {
  NoGradGuard guard;
  t.copy_(values);
  return t;
}
DType draw_dtype(const Tensor& t) { return t.dtype() == kFloat64 ? kFloat64 : kFloat32; }
}  // namespace

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t) {
  TG_CHECK(t.dim() >= 2, "nn::init: fan in and fan out need a tensor of at least 2 dims, got shape ", t.sizes());
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

double calculate_gain(std::string_view nl, double param) {
  if (nl == "linear" || nl == "sigmoid" || nl == "conv1d" || nl == "conv2d" || nl == "conv3d") return 1.0;
  if (nl == "tanh") return 5.0 / 3.0;
  if (nl == "relu") return std::sqrt(2.0);
  if (nl == "leaky_relu") return std::sqrt(2.0 / (1.0 + param * param));
  if (nl == "selu") return 3.0 / 4.0;
  TG_ERROR("nn::init::calculate_gain: unknown nonlinearity '", nl, "'");
}

const Tensor& uniform_(const Tensor& t, double a, double b) {
  check_floating(t, "uniform_");
  TG_CHECK(a <= b, "nn::init::uniform_: expected a <= b, got [", a, ", ", b, ")");
  if (t.numel() == 0) return t;
  Tensor u = native::rand(t.sizes(), draw_dtype(t), t.device());
  return assign(t, native::add(native::mul(u, Scalar(b - a)), Scalar(a)));
}

const Tensor& normal_(const Tensor& t, double mean, double std) {
  check_floating(t, "normal_");
  TG_CHECK(std >= 0, "nn::init::normal_: std must be non-negative, got ", std);
  if (t.numel() == 0) return t;
  Tensor z = native::randn(t.sizes(), draw_dtype(t), t.device());
  return assign(t, native::add(native::mul(z, Scalar(std)), Scalar(mean)));
}

const Tensor& constant_(const Tensor& t, double value) {
  TG_CHECK(t.defined(), "nn::init::constant_: the tensor is undefined");
  NoGradGuard guard;
  t.fill_(value);
  return t;
}
const Tensor& zeros_(const Tensor& t) { return constant_(t, 0); }
const Tensor& ones_(const Tensor& t) { return constant_(t, 1); }

const Tensor& kaiming_uniform_(const Tensor& t, double a, std::string_view mode, std::string_view nonlinearity) {
  check_floating(t, "kaiming_uniform_");
  TG_CHECK(mode == "fan_in" || mode == "fan_out",
           "nn::init::kaiming_uniform_: mode must be 'fan_in' or 'fan_out', got '", mode, "'");
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  const int64_t fan = mode == "fan_in" ? fan_in : fan_out;
  if (fan == 0) return t;  // PyTorch warns and leaves an empty tensor alone
  const double bound = calculate_gain(nonlinearity, a) * std::sqrt(3.0 / static_cast<double>(fan));
  return uniform_(t, -bound, bound);
}

const Tensor& kaiming_normal_(const Tensor& t, double a, std::string_view mode, std::string_view nonlinearity) {
  check_floating(t, "kaiming_normal_");
  TG_CHECK(mode == "fan_in" || mode == "fan_out",
           "nn::init::kaiming_normal_: mode must be 'fan_in' or 'fan_out', got '", mode, "'");
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  const int64_t fan = mode == "fan_in" ? fan_in : fan_out;
  if (fan == 0) return t;
  return normal_(t, 0, calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan)));
}

const Tensor& xavier_uniform_(const Tensor& t, double gain) {
  check_floating(t, "xavier_uniform_");
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  const double bound = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return uniform_(t, -bound, bound);
}

}  // namespace tg::nn::init
