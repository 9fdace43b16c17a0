// Convolutions: functional::conv1d / conv2d (PyTorch's cross-correlation, groups and dilation
// included; CPU: im2col + gemm), conv_transpose1d / conv_transpose2d, and the modules nn::Conv1d,
// nn::Conv2d, nn::ConvTranspose1d, nn::ConvTranspose2d (one template per family, over the rank).
#pragma once
#include <array>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <vector>

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

// conv1d / conv2d options (libtorch's Conv1dFuncOptions / Conv2dFuncOptions).
template <size_t D>
struct ConvFuncOptions {
  ExpandingArray<D> stride = 1;
  ConvPadding<D> padding = 0;
  ExpandingArray<D> dilation = 1;
  int64_t groups = 1;
};
using Conv1dFuncOptions = ConvFuncOptions<1>;
using Conv2dFuncOptions = ConvFuncOptions<2>;

// conv_transpose1d / conv_transpose2d options, in PyTorch's argument order.
template <size_t D>
struct ConvTransposeFuncOptions {
  ExpandingArray<D> stride = 1;
  ExpandingArray<D> padding = 0;
  ExpandingArray<D> output_padding = 0;  // < stride or < dilation
  int64_t groups = 1;
  ExpandingArray<D> dilation = 1;
};
using ConvTranspose1dFuncOptions = ConvTransposeFuncOptions<1>;
using ConvTranspose2dFuncOptions = ConvTransposeFuncOptions<2>;

namespace functional {
// torch.nn.functional.conv1d: x [N, C_in, L] or unbatched [C_in, L]; weight [C_out, C_in / groups, k];
// bias [C_out] or undefined. Output [N, C_out, L_out] (unbatched: [C_out, L_out]) with
// L_out = (L + 2 * padding - dilation * (k - 1) - 1) / stride + 1. Differentiable in all three.
Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), Conv1dFuncOptions options = {});
// torch.nn.functional.conv2d: x [N, C_in, H, W] or [C_in, H, W]; weight [C_out, C_in / groups, kh, kw].
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), Conv2dFuncOptions options = {});
// relu(conv2d(x, weight, bias, options)) with the ReLU fused into the convolution's forward (cuDNN's
// conv + bias + ReLU graph; the CPU applies it as it adds the bias); backward masks the gradient
// by the output > 0, then is conv2d's. Same values as the two ops; a tracer records both.
Tensor conv2d_relu(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                   Conv2dFuncOptions options = {});
// torch.nn.functional.conv_transpose1d / conv_transpose2d (the gradient of conv with respect to its
// input): x [N, C_in, L] / [N, C_in, H, W] or unbatched; weight [C_in, C_out / groups, k...]; bias
// [C_out] or undefined. L_out = (L - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1.
// Runs on conv2d's backend kernels (wherever conv2d runs). Differentiable in all three.
Tensor conv_transpose1d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                        ConvTranspose1dFuncOptions options = {});
Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                        ConvTranspose2dFuncOptions options = {});
}  // namespace functional

template <size_t D>
struct ConvOptions {
  ExpandingArray<D> stride = 1;
  ConvPadding<D> padding = 0;
  ExpandingArray<D> dilation = 1;
  int64_t groups = 1;
  bool bias = true;
};
using Conv1dOptions = ConvOptions<1>;
using Conv2dOptions = ConvOptions<2>;

// Conv1d (D = 1) and Conv2d (D = 2): weight [out, in / groups, k...] and bias [out] drawn as
// PyTorch: kaiming_uniform(a = √5), i.e. U(±1/√fan_in) for both, fan_in = in / groups * prod(k).
// state_dict names "weight", "bias".
template <size_t D>
class ConvNd : public Module {
 public:
  ConvNd(int64_t in_channels, int64_t out_channels, ExpandingArray<D> kernel_size, ConvOptions<D> options = {},
         TensorOptions tensor_options = {});
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return D == 1 ? "Conv1d" : "Conv2d"; }
  void reset_parameters();

  int64_t in_channels = 0;
  int64_t out_channels = 0;
  ExpandingArray<D> kernel_size;
  ConvOptions<D> options;
  Tensor weight;
  Tensor bias;  // undefined with .bias = false
};
using Conv1d = ConvNd<1>;
using Conv2d = ConvNd<2>;
extern template class ConvNd<1>;
extern template class ConvNd<2>;

// Conv2d followed by ReLU as one module (torch.ao.nn.intrinsic.ConvReLU2d): Conv2d's parameters,
// initialisation and state_dict names; forward is functional::conv2d_relu.
class ConvReLU2d : public Conv2d {
 public:
  using Conv2d::Conv2d;
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "ConvReLU2d"; }
};

// PyTorch's ConvTranspose1d / ConvTranspose2d arguments after kernel_size, in order.
template <size_t D>
struct ConvTransposeOptions {
  ExpandingArray<D> stride = 1;
  ExpandingArray<D> padding = 0;
  ExpandingArray<D> output_padding = 0;
  int64_t groups = 1;
  bool bias = true;
  ExpandingArray<D> dilation = 1;
};
using ConvTranspose1dOptions = ConvTransposeOptions<1>;
using ConvTranspose2dOptions = ConvTransposeOptions<2>;

// ConvTranspose1d / ConvTranspose2d: weight [in, out / groups, k...] and bias [out], initialised as
// ConvNd (fan_in = out / groups * prod(k), PyTorch's fan of that layout). state_dict "weight", "bias".
template <size_t D>
class ConvTransposeNd : public Module {
 public:
  ConvTransposeNd(int64_t in_channels, int64_t out_channels, ExpandingArray<D> kernel_size,
                  ConvTransposeOptions<D> options = {}, TensorOptions tensor_options = {});
  Tensor forward(const Tensor& x) override;
  // PyTorch's forward(input, output_size): output_padding chosen so the output's spatial size is
  // output_size (the last D values of it; D or D + 2 values), within [smallest, smallest + stride - 1].
  Tensor forward(const Tensor& x, const std::vector<int64_t>& output_size);
  std::string name() const override { return D == 1 ? "ConvTranspose1d" : "ConvTranspose2d"; }
  void reset_parameters();

  int64_t in_channels = 0;
  int64_t out_channels = 0;
  ExpandingArray<D> kernel_size;
  ConvTransposeOptions<D> options;
  Tensor weight;
  Tensor bias;  // undefined with .bias = false
};
using ConvTranspose1d = ConvTransposeNd<1>;
using ConvTranspose2d = ConvTransposeNd<2>;
extern template class ConvTransposeNd<1>;
extern template class ConvTransposeNd<2>;

}  // namespace tg::nn
