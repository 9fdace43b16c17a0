// conv1d / conv2d and conv_transpose1d / conv_transpose2d with their backward right below, and the
// modules ConvNd (Conv1d, Conv2d) and ConvTransposeNd (ConvTranspose1d, ConvTranspose2d).
// Double backward (create_graph): the closures then compute the gradients with the recorded
// public 2-d ops instead of the native kernels: conv's grad_x is a conv_transpose2d of g, its
// grad_weight a conv2d of x and g with stride and dilation swapped (conv_weight_grad below), and
// conv_transpose's the same with x and g in swapped roles; grad_bias is a sum of g.
#include <tapegrad/nn/conv.h>

#include <cmath>
#include <vector>

#include <tapegrad/autograd/function.h>
#include <tapegrad/core/autocast_hook.h>
#include <tapegrad/core/native.h>
#include <tapegrad/core/ops.h>
#include <tapegrad/core/trace.h>
#include <tapegrad/nn/init.h>

namespace tg::nn {

namespace {

// D-d options in 2-d terms: a 1-d op has a unit H dim (index 0).
template <size_t D>
void put(std::array<int64_t, 2>& dst, const ExpandingArray<D>& src) {
  for (size_t i = 0; i < D; ++i) dst[2 - D + i] = src[i];
}

template <size_t D>
native::ConvParams params(const ConvFuncOptions<D>& o) {
  native::ConvParams p;
  put<D>(p.stride, o.stride);
  put<D>(p.padding, o.padding.values);
  put<D>(p.dilation, o.dilation);
  p.groups = o.groups;
  p.same = o.padding.same;
  return p;
}

template <size_t D>
native::ConvTransposeParams params(const ConvTransposeFuncOptions<D>& o) {
  native::ConvTransposeParams p;
  put<D>(p.conv.stride, o.stride);
  put<D>(p.conv.padding, o.padding);
  put<D>(p.conv.dilation, o.dilation);
  put<D>(p.output_padding, o.output_padding);
  p.conv.groups = o.groups;
  return p;
}

template <size_t D>
std::vector<int64_t> ints(const ExpandingArray<D>& a) {
  return std::vector<int64_t>(a.values.begin(), a.values.end());
}

std::vector<Tensor> operands(const Tensor& x, const Tensor& w, const Tensor& b) {
  return b.defined() ? std::vector<Tensor>{x, w, b} : std::vector<Tensor>{x, w};
}

// ---- the recorded backward (create_graph), in 2-d terms: [N, C, H, W] operands (1-d: H = 1).

// t (a conv operand or gradient of `spatial` spatial dims, batched or not) as a 4-d view or copy.
Tensor as4d(const Tensor& t, int spatial, bool batched) {
  const Shape& s = t.sizes();
  const int64_t n = batched ? s[0] : 1;
  const int64_t c = s[batched ? 1 : 0];
  const int64_t h = spatial == 2 ? s[s.size() - 2] : 1;
  return t.reshape({n, c, h, s.back()});
}
Tensor weight4d(const Tensor& w, int spatial) {
  const Shape& s = w.sizes();
  return w.reshape({s[0], s[1], spatial == 2 ? s[2] : 1, s.back()});
}

// The weight gradient of out = conv2d(in, W) (symmetric padding `pad`, groups G) given gout = dL/dout:
// dW[o, c, a, b] = sum over n, i, j of gout[n, o, i, j] in[n, G(o) c, i s - pad + a d, j s - pad + b d]
// is itself a conv2d: batch = c, channels = (group, n), weight gout [(group, o), n, OH, OW], with the
// stride and dilation swapped; its output [C / G, Co, >= KH, >= KW] narrowed to the kernel.
Tensor conv_weight_grad(const Tensor& in, const Tensor& gout, const std::array<int64_t, 2>& stride,
                        const std::array<int64_t, 2>& pad, const std::array<int64_t, 2>& dilation, int64_t groups,
                        int64_t kh, int64_t kw) {
  const int64_t n = in.size(0), ci = in.size(1), h = in.size(2), w = in.size(3);
  const int64_t co = gout.size(1), oh = gout.size(2), ow = gout.size(3);
  const int64_t cg = ci / groups, cog = co / groups;
  Tensor a = in.reshape({n, groups, cg, h, w}).permute({2, 1, 0, 3, 4}).reshape({cg, groups * n, h, w});
  Tensor b = gout.reshape({n, groups, cog, oh, ow}).permute({1, 2, 0, 3, 4}).reshape({co, n, oh, ow});
  Tensor r = functional::conv2d(a, b, Tensor(),
                                {.stride = {dilation[0], dilation[1]},
                                 .padding = {pad[0], pad[1]},
                                 .dilation = {stride[0], stride[1]},
                                 .groups = groups});
  if (r.size(2) != kh) r = r.narrow(2, 0, kh);
  if (r.size(3) != kw) r = r.narrow(3, 0, kw);
  return r.transpose(0, 1);
}

// conv's {grad_x, grad_weight, grad_bias} with recorded ops. Padding "same" (stride 1) pads
// (span - 1) / 2 before and the rest after: x is taken as zero-extended at the end by the
// difference, so the padding is symmetric, and grad_x narrowed back.
std::vector<Tensor> conv_backward_recorded(int spatial, const Tensor& grad, const Tensor& x, const Tensor& w,
                                           const native::ConvParams& p, bool need_x, bool need_w, bool need_b) {
  const bool batched = x.dim() == spatial + 2;
  const Tensor g = as4d(grad.dtype() == x.dtype() ? grad : grad.to(x.dtype()), spatial, batched);
  const Tensor w4 = weight4d(w, spatial);
  const int64_t k[2] = {w4.size(2), w4.size(3)};
  Tensor x4 = as4d(x, spatial, batched);
  std::array<int64_t, 2> pad = p.padding, extra{0, 0};
  for (int d = 0; d < 2; ++d) {
    if (!p.same) continue;
    const int64_t span = p.dilation[d] * (k[d] - 1) + 1;
    pad[d] = (span - 1) / 2;
    extra[d] = span - 1 - 2 * pad[d];
  }
  const int64_t in[2] = {x4.size(2) + extra[0], x4.size(3) + extra[1]};
  std::vector<Tensor> out(3);
  if (need_x) {
    std::array<int64_t, 2> op{};
    for (int d = 0; d < 2; ++d)
      op[d] = in[d] - ((g.size(2 + d) - 1) * p.stride[d] - 2 * pad[d] + p.dilation[d] * (k[d] - 1) + 1);
    Tensor gx = functional::conv_transpose2d(g, w4, Tensor(),
                                             {.stride = {p.stride[0], p.stride[1]},
                                              .padding = {pad[0], pad[1]},
                                              .output_padding = {op[0], op[1]},
                                              .groups = p.groups,
                                              .dilation = {p.dilation[0], p.dilation[1]}});
    if (extra[0]) gx = gx.narrow(2, 0, x4.size(2));
    if (extra[1]) gx = gx.narrow(3, 0, x4.size(3));
    out[0] = gx.reshape(x.sizes());
  }
  if (need_w) {
    Tensor xp = x4;
    for (int d = 0; d < 2; ++d) {
      if (!extra[d]) continue;
      Shape zs = xp.sizes();
      zs[2 + d] = extra[d];
      xp = tg::cat({xp, tg::zeros(zs, xp.options())}, 2 + d);
    }
    out[1] = conv_weight_grad(xp, g, p.stride, pad, p.dilation, p.groups, k[0], k[1]).reshape(w.sizes());
  }
  if (need_b) out[2] = g.sum(DimList{0, 2, 3});
  return out;
}

// conv_transpose's: it is the x-gradient of the conv2d (same parameters, weight w) from y-shaped to
// x-shaped tensors, so grad_x is that conv of g, grad_weight that conv's weight gradient with g as
// its input and x as its output gradient.
std::vector<Tensor> conv_transpose_backward_recorded(int spatial, const Tensor& grad, const Tensor& x, const Tensor& w,
                                                     const native::ConvTransposeParams& tp, bool need_x, bool need_w,
                                                     bool need_b) {
  const native::ConvParams& p = tp.conv;
  const bool batched = x.dim() == spatial + 2;
  const Tensor g = as4d(grad.dtype() == x.dtype() ? grad : grad.to(x.dtype()), spatial, batched);
  const Tensor w4 = weight4d(w, spatial);
  const Tensor x4 = as4d(x, spatial, batched);
  std::vector<Tensor> out(3);
  if (need_x) {
    Tensor gx = functional::conv2d(g, w4, Tensor(),
                                   {.stride = {p.stride[0], p.stride[1]},
                                    .padding = {p.padding[0], p.padding[1]},
                                    .dilation = {p.dilation[0], p.dilation[1]},
                                    .groups = p.groups});
    // An output_padding >= stride (allowed below the dilation) leaves rows past x's.
    if (gx.size(2) != x4.size(2)) gx = gx.narrow(2, 0, x4.size(2));
    if (gx.size(3) != x4.size(3)) gx = gx.narrow(3, 0, x4.size(3));
    out[0] = gx.reshape(x.sizes());
  }
  if (need_w)
    out[1] =
        conv_weight_grad(g, x4, p.stride, p.padding, p.dilation, p.groups, w4.size(2), w4.size(3)).reshape(w.sizes());
  if (need_b) out[2] = g.sum(DimList{0, 2, 3});
  return out;
}

// The forward, and a node whose backward is one backend call (grad_x, grad_weight, grad_bias), or
// the recorded formulas above under create_graph.
// relu: relu(conv) with the ReLU in the forward kernel; backward first masks the gradient by the
// saved output > 0 (ReLU's own rule, recorded under create_graph).
template <size_t D>
Tensor conv_op(const char* op, const Tensor& x, const Tensor& w, const Tensor& b, const ConvFuncOptions<D>& o,
               bool relu = false) {
  const native::ConvParams p = params<D>(o);
  Tensor out = native::conv(op, D, x, w, b, p, relu);
  if (!autograd::should_record(x, w, b)) return out;
  autograd::SavedTensor sx(x, op), sw(w, op);
  autograd::SavedTensor sy = relu ? autograd::SavedTensor(out, op, autograd::Saved::kOutput) : autograd::SavedTensor();
  return autograd::record(
      op, {x, w, b}, std::move(out),
      [sx, sw, sy, relu, p, op](const Tensor& g0, const autograd::FunctionNode& n) {
        const Tensor g =
            relu ? autograd::bw::elementwise_backward("relu_backward", backend::ElemOp::ReluBackward, g0, sy.unpack())
                 : g0;
        if (autograd::creating_graph())
          return conv_backward_recorded(D, g, sx.unpack(), sw.unpack(), p, n.needs_input_grad(0), n.needs_input_grad(1),
                                        n.needs_input_grad(2));
        return native::conv_backward(op, D, g, sx.unpack(), sw.unpack(), p, n.needs_input_grad(0),
                                     n.needs_input_grad(1), n.needs_input_grad(2));
      },
      autograd::kDifferentiable);
}

template <size_t D>
std::vector<detail::TraceAttr> conv_attrs(const ConvFuncOptions<D>& o) {
  return {{"stride", ints(o.stride)},
          {"padding", ints(o.padding.values)},
          {"dilation", ints(o.dilation)},
          {"groups", o.groups},
          {"same", o.padding.same}};
}

// conv_transpose: forward and input gradient on the conv kernels (core/native/conv.cpp), or the
// recorded formulas under create_graph.
template <size_t D>
Tensor conv_transpose_op(const char* op, const Tensor& x, const Tensor& w, const Tensor& b,
                         const ConvTransposeFuncOptions<D>& o) {
  const native::ConvTransposeParams p = params<D>(o);
  Tensor out = native::conv_transpose(op, D, x, w, b, p);
  if (!autograd::should_record(x, w, b)) return out;
  autograd::SavedTensor sx(x, op), sw(w, op);
  return autograd::record(
      op, {x, w, b}, std::move(out),
      [sx, sw, p, op](const Tensor& g, const autograd::FunctionNode& n) {
        if (autograd::creating_graph())
          return conv_transpose_backward_recorded(D, g, sx.unpack(), sw.unpack(), p, n.needs_input_grad(0),
                                                  n.needs_input_grad(1), n.needs_input_grad(2));
        return native::conv_transpose_backward(op, D, g, sx.unpack(), sw.unpack(), p, n.needs_input_grad(0),
                                               n.needs_input_grad(1), n.needs_input_grad(2));
      },
      autograd::kDifferentiable);
}

template <size_t D>
std::vector<detail::TraceAttr> conv_transpose_attrs(const ConvTransposeFuncOptions<D>& o) {
  return {{"stride", ints(o.stride)},
          {"padding", ints(o.padding)},
          {"output_padding", ints(o.output_padding)},
          {"dilation", ints(o.dilation)},
          {"groups", o.groups}};
}

}  // namespace

namespace functional {

Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias, Conv1dFuncOptions o) {
  TG_AUTOCAST(Conv1d, conv1d(x, weight, bias, o), x, weight, bias);
  Tensor out = conv_op<1>("conv1d", x, weight, bias, o);
  TG_TRACE(Conv1d, out, operands(x, weight, bias), conv_attrs(o));
  return out;
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Conv2dFuncOptions o) {
  TG_AUTOCAST(Conv2d, conv2d(x, weight, bias, o), x, weight, bias);
  Tensor out = conv_op<2>("conv2d", x, weight, bias, o);
  TG_TRACE(Conv2d, out, operands(x, weight, bias), conv_attrs(o));
  return out;
}

Tensor conv2d_relu(const Tensor& x, const Tensor& weight, const Tensor& bias, Conv2dFuncOptions o) {
  TG_AUTOCAST(Conv2d, conv2d_relu(x, weight, bias, o), x, weight, bias);
  if (detail::tls_tracer != nullptr) return tg::relu(conv2d(x, weight, bias, o));  // traced as its two ops
  return conv_op<2>("conv2d_relu", x, weight, bias, o, /*relu=*/true);
}

Tensor conv_transpose1d(const Tensor& x, const Tensor& weight, const Tensor& bias, ConvTranspose1dFuncOptions o) {
  TG_AUTOCAST(ConvTranspose1d, conv_transpose1d(x, weight, bias, o), x, weight, bias);
  Tensor out = conv_transpose_op<1>("conv_transpose1d", x, weight, bias, o);
  TG_TRACE(ConvTranspose1d, out, operands(x, weight, bias), conv_transpose_attrs(o));
  return out;
}

Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias, ConvTranspose2dFuncOptions o) {
  TG_AUTOCAST(ConvTranspose2d, conv_transpose2d(x, weight, bias, o), x, weight, bias);
  Tensor out = conv_transpose_op<2>("conv_transpose2d", x, weight, bias, o);
  TG_TRACE(ConvTranspose2d, out, operands(x, weight, bias), conv_transpose_attrs(o));
  return out;
}

}  // namespace functional

namespace {

template <size_t D>
void check_module(const std::string& what, int64_t in, int64_t out, const ExpandingArray<D>& k, int64_t groups,
                  const ExpandingArray<D>& stride, const ExpandingArray<D>& dilation, const ExpandingArray<D>& padding,
                  const TensorOptions& to) {
  TG_CHECK(in >= 0 && out >= 0, what, ": in_channels and out_channels must be >= 0, got ", in, " and ", out);
  TG_CHECK(groups >= 1, what, ": groups must be >= 1, got ", groups);
  TG_CHECK(in % groups == 0, what, ": in_channels ", in, " must be divisible by groups ", groups);
  TG_CHECK(out % groups == 0, what, ": out_channels ", out, " must be divisible by groups ", groups);
  for (size_t i = 0; i < D; ++i) {
    TG_CHECK(k[i] >= 1, what, ": kernel_size must be >= 1, got ", k[i]);
    TG_CHECK(stride[i] >= 1, what, ": stride must be >= 1, got ", stride[i]);
    TG_CHECK(dilation[i] >= 1, what, ": dilation must be >= 1, got ", dilation[i]);
    TG_CHECK(padding[i] >= 0, what, ": padding must be >= 0, got ", padding[i]);
  }
  TG_CHECK(is_floating(to.dtype()), what, ": parameters must be floating point, got ", to.dtype());
}

// [d0, d1, k...]
template <size_t D>
Shape weight_shape(int64_t d0, int64_t d1, const ExpandingArray<D>& k) {
  Shape s{d0, d1};
  for (size_t i = 0; i < D; ++i) s.push_back(k[i]);
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

template <size_t D>
ConvNd<D>::ConvNd(int64_t in, int64_t out, ExpandingArray<D> k, ConvOptions<D> o, TensorOptions to)
    : in_channels(in), out_channels(out), kernel_size(k), options(o) {
  const std::string what = name();
  check_module<D>(what, in, out, k, o.groups, o.stride, o.dilation, o.padding.values, to);
  for (size_t i = 0; i < D; ++i)
    TG_CHECK(!o.padding.same || o.stride[i] == 1, what,
             ": padding='same' is not supported for strided convolutions (stride ", o.stride[i], ")");
  weight = register_parameter("weight", empty(weight_shape<D>(out, o.groups ? in / o.groups : 0, k), param_options(to)));
  if (o.bias) bias = register_parameter("bias", empty({out}, param_options(to)));
  reset_parameters();
}

template <size_t D>
void ConvNd<D>::reset_parameters() {
  reset_conv(weight, bias);
}

template <size_t D>
Tensor ConvNd<D>::forward(const Tensor& x) {
  const ConvFuncOptions<D> o{
      .stride = options.stride, .padding = options.padding, .dilation = options.dilation, .groups = options.groups};
  if constexpr (D == 1)
    return functional::conv1d(x, weight, bias, o);
  else
    return functional::conv2d(x, weight, bias, o);
}

template class ConvNd<1>;
template class ConvNd<2>;

Tensor ConvReLU2d::forward(const Tensor& x) {
  return functional::conv2d_relu(
      x, weight, bias,
      {.stride = options.stride, .padding = options.padding, .dilation = options.dilation, .groups = options.groups});
}

template <size_t D>
ConvTransposeNd<D>::ConvTransposeNd(int64_t in, int64_t out, ExpandingArray<D> k, ConvTransposeOptions<D> o,
                                    TensorOptions to)
    : in_channels(in), out_channels(out), kernel_size(k), options(o) {
  const std::string what = name();
  check_module<D>(what, in, out, k, o.groups, o.stride, o.dilation, o.padding, to);
  for (size_t i = 0; i < D; ++i)
    TG_CHECK(o.output_padding[i] >= 0 && (o.output_padding[i] < o.stride[i] || o.output_padding[i] < o.dilation[i]),
             what, ": output padding must be smaller than either stride or dilation, got output_padding ",
             o.output_padding[i], ", stride ", o.stride[i], ", dilation ", o.dilation[i]);
  weight = register_parameter("weight", empty(weight_shape<D>(in, o.groups ? out / o.groups : 0, k), param_options(to)));
  if (o.bias) bias = register_parameter("bias", empty({out}, param_options(to)));
  reset_parameters();
}

template <size_t D>
void ConvTransposeNd<D>::reset_parameters() {
  reset_conv(weight, bias);
}

template <size_t D>
Tensor ConvTransposeNd<D>::forward(const Tensor& x) {
  return forward(x, {});
}

template <size_t D>
Tensor ConvTransposeNd<D>::forward(const Tensor& x, const std::vector<int64_t>& output_size) {
  ConvTransposeFuncOptions<D> o{.stride = options.stride,
                                .padding = options.padding,
                                .output_padding = options.output_padding,
                                .groups = options.groups,
                                .dilation = options.dilation};
  if (!output_size.empty()) {  // PyTorch's _ConvTransposeNd._output_padding
    const std::string what = name();
    TG_CHECK(x.defined() && x.dim() >= static_cast<int64_t>(D) + 1, what, ": input of shape ",
             x.defined() ? x.sizes() : Shape{}, " has too few dims");
    TG_CHECK(output_size.size() == D || output_size.size() == D + 2, what, ": output_size must have ", D, " or ",
             D + 2, " elements, got ", Shape(output_size));
    const size_t off = output_size.size() - D;
    for (size_t i = 0; i < D; ++i) {
      const int64_t in = x.sizes()[static_cast<size_t>(x.dim()) - D + i];
      const int64_t lo = (in - 1) * options.stride[i] - 2 * options.padding[i] +
                         options.dilation[i] * (kernel_size[i] - 1) + 1;
      const int64_t hi = lo + options.stride[i] - 1;
      const int64_t want = output_size[off + i];
      TG_CHECK(want >= lo && want <= hi, what, ": requested an output size of ", Shape(output_size),
               ", but valid sizes range from ", lo, " to ", hi, " (for an input of shape ", x.sizes(), ")");
      o.output_padding.values[i] = want - lo;
    }
  }
  if constexpr (D == 1)
    return functional::conv_transpose1d(x, weight, bias, o);
  else
    return functional::conv_transpose2d(x, weight, bias, o);
}

template class ConvTransposeNd<1>;
template class ConvTransposeNd<2>;

}  // namespace tg::nn
