// Convolutions: functional::conv1d / conv2d (PyTorch's cross-correlation, groups and dilation
// included; CPU: im2col + gemm) and the modules nn::Conv1d, nn::Conv2d.
#pragma once
#include <array>
#include <cstddef>
#include <initializer_list>
#include <string>

#include <tapegrad/nn/module.h>

namespace tg::nn {

// One value per spatial dim; a single value is repeated (`.stride = 2` is `{2, 2}`), as PyTorch's
// int-or-tuple arguments.
template <size_t D>
struct ExpandingArray {
  ExpandingArray(int64_t v) { values.fill(v); }  // NOLINT(google-explicit-constructor)
  ExpandingArray(std::initializer_list<int64_t> l) {
    TG_CHECK(l.size() == D || l.size() == 1, "conv options: expected ", D, " value(s) (one per spatial dim) or 1, got ",
             l.size());
    size_t i = 0;
    for (int64_t v : l) values[i++] = v;
    if (l.size() == 1) values.fill(*l.begin());
  }
  int64_t operator[](size_t i) const { return values[i]; }
  std::array<int64_t, D> values{};
};

// padding: ints (one per spatial dim, or one for all), "valid" (none) or "same" (output as large as
// the input; stride 1 only; an odd total puts the extra element at the end, as PyTorch).
template <size_t D>
struct ConvPadding {
  ConvPadding(int64_t v) : values(v) {}                                // NOLINT(google-explicit-constructor)
  ConvPadding(std::initializer_list<int64_t> l) : values(l) {}         // NOLINT(google-explicit-constructor)
  template <size_t N>
  ConvPadding(const char (&mode)[N]) : ConvPadding(std::string(mode)) {}  // NOLINT(google-explicit-constructor)
  ConvPadding(const std::string& mode) : values(0) {                    // NOLINT(google-explicit-constructor)
    TG_CHECK(mode == "same" || mode == "valid", "conv options: padding must be ints, \"same\" or \"valid\", got \"",
             mode, "\"");
    same = mode == "same";
  }
  ExpandingArray<D> values;
  bool same = false;
};

struct Conv1dFuncOptions {
  ExpandingArray<1> stride = 1;
  ConvPadding<1> padding = 0;
  ExpandingArray<1> dilation = 1;
  int64_t groups = 1;
};
struct Conv2dFuncOptions {
  ExpandingArray<2> stride = 1;
  ConvPadding<2> padding = 0;
  ExpandingArray<2> dilation = 1;
  int64_t groups = 1;
};

namespace functional {
// torch.nn.functional.conv1d: x [N, C_in, L] or unbatched [C_in, L]; weight [C_out, C_in / groups, k];
// bias [C_out] or undefined. Output [N, C_out, L_out] (unbatched: [C_out, L_out]) with
// L_out = (L + 2 * padding - dilation * (k - 1) - 1) / stride + 1. Differentiable in all three.
Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), Conv1dFuncOptions options = {});
// torch.nn.functional.conv2d: x [N, C_in, H, W] or [C_in, H, W]; weight [C_out, C_in / groups, kh, kw].
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), Conv2dFuncOptions options = {});
}  // namespace functional

struct Conv1dOptions {
  ExpandingArray<1> stride = 1;
  ConvPadding<1> padding = 0;
  ExpandingArray<1> dilation = 1;
  int64_t groups = 1;
  bool bias = true;
};
struct Conv2dOptions {
  ExpandingArray<2> stride = 1;
  ConvPadding<2> padding = 0;
  ExpandingArray<2> dilation = 1;
  int64_t groups = 1;
  bool bias = true;
};

// weight [out, in / groups, k] and bias [out] drawn as PyTorch: kaiming_uniform(a = √5), i.e.
// U(±1/√fan_in) for both, fan_in = in / groups * k. state_dict names "weight", "bias".
class Conv1d : public Module {
 public:
  Conv1d(int64_t in_channels, int64_t out_channels, ExpandingArray<1> kernel_size, Conv1dOptions options = {},
         TensorOptions tensor_options = {});
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Conv1d"; }
  void reset_parameters();

  int64_t in_channels = 0;
  int64_t out_channels = 0;
  ExpandingArray<1> kernel_size;
  Conv1dOptions options;
  Tensor weight;
  Tensor bias;  // undefined with .bias = false
};

// weight [out, in / groups, kh, kw] and bias [out], initialised as Conv1d (fan_in = in / groups * kh * kw).
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, ExpandingArray<2> kernel_size, Conv2dOptions options = {},
         TensorOptions tensor_options = {});
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Conv2d"; }
  void reset_parameters();

  int64_t in_channels = 0;
  int64_t out_channels = 0;
  ExpandingArray<2> kernel_size;
  Conv2dOptions options;
  Tensor weight;
  Tensor bias;  // undefined with .bias = false
};

}  // namespace tg::nn
