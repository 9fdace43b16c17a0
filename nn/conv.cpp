// conv1d / conv2d with their backward right below, and the modules Conv1d, Conv2d.
#include <tapegrad/nn/conv.h>

#include <cmath>
#include <vector>

#include <tapegrad/autograd/function.h>
#include <tapegrad/core/autocast_hook.h>
#include <tapegrad/core/native.h>
#include <tapegrad/core/trace.h>
#include <tapegrad/nn/init.h>

namespace tg::nn {

namespace {

// 1-d options in 2-d terms: the H dim is a unit one.
template <size_t D>
native::ConvParams params(const ExpandingArray<D>& stride, const ConvPadding<D>& padding,
                          const ExpandingArray<D>& dilation, int64_t groups) {
  native::ConvParams p;
  for (size_t i = 0; i < D; ++i) {
    p.stride[2 - D + i] = stride[i];
    p.padding[2 - D + i] = padding.values[i];
    p.dilation[2 - D + i] = dilation[i];
  }
  p.groups = groups;
  p.same = padding.same;
  return p;
}

template <size_t D>
std::vector<int64_t> ints(const ExpandingArray<D>& a) {
  return std::vector<int64_t>(a.values.begin(), a.values.end());
}

// The forward, and a node whose backward is one backend call (grad_x, grad_weight, grad_bias).
Tensor conv_op(const char* op, int spatial, const Tensor& x, const Tensor& w, const Tensor& b,
               const native::ConvParams& p) {
  Tensor out = native::conv(op, spatial, x, w, b, p);
  if (!autograd::should_record(x, w, b)) return out;
  autograd::SavedTensor sx(x, op), sw(w, op);
  return autograd::record(
      op, {x, w, b}, std::move(out), [sx, sw, p, spatial, op](const Tensor& g, const autograd::FunctionNode& n) {
        return native::conv_backward(op, spatial, g, sx.unpack(), sw.unpack(), p, n.needs_input_grad(0),
                                     n.needs_input_grad(1), n.needs_input_grad(2));
      });
}

std::vector<Tensor> operands(const Tensor& x, const Tensor& w, const Tensor& b) {
  return b.defined() ? std::vector<Tensor>{x, w, b} : std::vector<Tensor>{x, w};
}

}  // namespace

namespace functional {

Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias, Conv1dFuncOptions o) {
  TG_AUTOCAST(Conv1d, conv1d(x, weight, bias, o), x, weight, bias);
  Tensor out = conv_op("conv1d", 1, x, weight, bias, params<1>(o.stride, o.padding, o.dilation, o.groups));
  TG_TRACE(Conv1d, out, operands(x, weight, bias),
           {{"stride", ints(o.stride)},
            {"padding", ints(o.padding.values)},
            {"dilation", ints(o.dilation)},
            {"groups", o.groups},
            {"same", o.padding.same}});
  return out;
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Conv2dFuncOptions o) {
  TG_AUTOCAST(Conv2d, conv2d(x, weight, bias, o), x, weight, bias);
  Tensor out = conv_op("conv2d", 2, x, weight, bias, params<2>(o.stride, o.padding, o.dilation, o.groups));
  TG_TRACE(Conv2d, out, operands(x, weight, bias),
           {{"stride", ints(o.stride)},
            {"padding", ints(o.padding.values)},
            {"dilation", ints(o.dilation)},
            {"groups", o.groups},
            {"same", o.padding.same}});
  return out;
}

}  // namespace functional

namespace {

template <size_t D, typename Opts>
void check_module(const char* what, int64_t in, int64_t out, const ExpandingArray<D>& k, const Opts& o,
                  const TensorOptions& to) {
  TG_CHECK(in >= 0 && out >= 0, what, ": in_channels and out_channels must be >= 0, got ", in, " and ", out);
  TG_CHECK(o.groups >= 1, what, ": groups must be >= 1, got ", o.groups);
  TG_CHECK(in % o.groups == 0, what, ": in_channels ", in, " must be divisible by groups ", o.groups);
  TG_CHECK(out % o.groups == 0, what, ": out_channels ", out, " must be divisible by groups ", o.groups);
  for (size_t i = 0; i < D; ++i) {
    TG_CHECK(k[i] >= 1, what, ": kernel_size must be >= 1, got ", k[i]);
    TG_CHECK(o.stride[i] >= 1, what, ": stride must be >= 1, got ", o.stride[i]);
    TG_CHECK(o.dilation[i] >= 1, what, ": dilation must be >= 1, got ", o.dilation[i]);
    TG_CHECK(o.padding.values[i] >= 0, what, ": padding must be >= 0, got ", o.padding.values[i]);
    TG_CHECK(!o.padding.same || o.stride[i] == 1, what,
             ": padding='same' is not supported for strided convolutions (stride ", o.stride[i], ")");
  }
  TG_CHECK(is_floating(to.dtype()), what, ": parameters must be floating point, got ", to.dtype());
}

Shape weight_shape(int64_t in, int64_t out, int64_t groups, const int64_t* k, size_t d) {
  Shape s{out, in / groups};
  for (size_t i = 0; i < d; ++i) s.push_back(k[i]);
  return s;
}

// PyTorch's _ConvNd.reset_parameters: kaiming_uniform(a = √5) and U(±1/√fan_in) for the bias.
void reset_conv(const Tensor& weight, const Tensor& bias) {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const int64_t fan_in = init::calculate_fan_in_and_fan_out(weight).first;
    const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
    init::uniform_(bias, -bound, bound);
  }
}

TensorOptions param_options(const TensorOptions& t) { return TensorOptions().dtype(t.dtype()).device(t.device()); }

}  // namespace

Conv1d::Conv1d(int64_t in, int64_t out, ExpandingArray<1> k, Conv1dOptions o, TensorOptions to)
    : in_channels(in), out_channels(out), kernel_size(k), options(o) {
  check_module<1>("Conv1d", in, out, k, o, to);
  weight = register_parameter("weight", empty(weight_shape(in, out, o.groups, k.values.data(), 1), param_options(to)));
  if (o.bias) bias = register_parameter("bias", empty({out}, param_options(to)));
  reset_parameters();
}

void Conv1d::reset_parameters() { reset_conv(weight, bias); }

Tensor Conv1d::forward(const Tensor& x) {
  return functional::conv1d(
      x, weight, bias,
      {.stride = options.stride, .padding = options.padding, .dilation = options.dilation, .groups = options.groups});
}

Conv2d::Conv2d(int64_t in, int64_t out, ExpandingArray<2> k, Conv2dOptions o, TensorOptions to)
    : in_channels(in), out_channels(out), kernel_size(k), options(o) {
  check_module<2>("Conv2d", in, out, k, o, to);
  weight = register_parameter("weight", empty(weight_shape(in, out, o.groups, k.values.data(), 2), param_options(to)));
  if (o.bias) bias = register_parameter("bias", empty({out}, param_options(to)));
  reset_parameters();
}

void Conv2d::reset_parameters() { reset_conv(weight, bias); }

Tensor Conv2d::forward(const Tensor& x) {
  return functional::conv2d(
      x, weight, bias,
      {.stride = options.stride, .padding = options.padding, .dilation = options.dilation, .groups = options.groups});
}

}  // namespace tg::nn
