// Native front-end of conv1d / conv2d (issue 17): validation, padding resolution, 4-d contiguous
// operands, then one backend call each way. The public ops with their backward are in nn/conv.cpp.
#include <vector>

#include <tapegrad/core/native.h>

namespace tg {

namespace backend {
void Backend::conv2d(const ConvArgs& a) { TG_ERROR("conv2d: no kernel on ", a.x.device()); }
void Backend::conv2d_backward(const ConvBackwardArgs& a) {
  TG_ERROR("conv2d backward: no kernel on ", a.conv.x.device());
}
}  // namespace backend

namespace native {

namespace {

// The validated problem in 4-d terms.
struct ConvProblem {
  Shape x4, w4, out4;  // [N, C, H, W], [Co, C / g, KH, KW], [N, Co, OH, OW]
  int64_t pad[2] = {0, 0};
  int64_t extra[2] = {0, 0};  // padding='same' with an odd total: the one more at the end than at the start
  bool batched = true;
};

// What a convolution and its transpose check alike: operands, ranks, dtype, device, groups, stride,
// dilation and padding. weight_dims: the weight's first two dimensions, as the message names them.
void check_conv_operands(const char* op, int spatial, const Tensor& x, const Tensor& w, const ConvParams& p,
                         const char* weight_dims) {
  TG_CHECK(x.defined() && w.defined(), op, ": input and weight must be defined");
  const int64_t sd = spatial;
  TG_CHECK(x.dim() == sd + 1 || x.dim() == sd + 2, op, ": expected a ", sd + 1, "-d (unbatched) or ", sd + 2,
           "-d (batched) input, got shape ", x.sizes());
  TG_CHECK(w.dim() == sd + 2, op, ": expected a ", sd + 2, "-d weight [", weight_dims, sd == 1 ? ", k" : ", kh, kw",
           "], got shape ", w.sizes());
  TG_CHECK(is_floating(x.dtype()), op, ": expected a floating input, got ", x.dtype());
  TG_CHECK(w.dtype() == x.dtype(), op, ": input of dtype ", x.dtype(), " but weight of dtype ", w.dtype(),
           " (expected one dtype)");
  TG_CHECK(w.device() == x.device(), op, ": input on ", x.device(), " but weight on ", w.device());
  TG_CHECK(p.groups >= 1, op, ": groups must be >= 1, got ", p.groups);
  for (int d = 0; d < 2; ++d) {
    TG_CHECK(p.stride[d] >= 1, op, ": stride must be >= 1, got ", p.stride[d]);
    TG_CHECK(p.dilation[d] >= 1, op, ": dilation must be >= 1, got ", p.dilation[d]);
    TG_CHECK(p.padding[d] >= 0, op, ": padding must be >= 0, got ", p.padding[d]);
  }
}

ConvProblem check_conv(const char* op, int spatial, const Tensor& x, const Tensor& w, const Tensor& b,
                       const ConvParams& p) {
  check_conv_operands(op, spatial, x, w, p, "out_channels, in_channels / groups");
  const int64_t sd = spatial, g = p.groups;
  for (int d = 0; d < 2; ++d)
    TG_CHECK(!p.same || p.stride[d] == 1, op, ": padding='same' is not supported for strided convolutions (stride ",
             p.stride[d], ")");
  ConvProblem r;
  r.batched = x.dim() == sd + 2;
  const Shape& xs = x.sizes();
  const Shape& ws = w.sizes();
  const int64_t c = xs[r.batched ? 1 : 0];
  const int64_t co = ws[0];
  TG_CHECK(c % g == 0, op, ": groups ", g, " must divide in_channels ", c, " (input of shape ", xs, ")");
  TG_CHECK(co % g == 0, op, ": groups ", g, " must divide out_channels ", co, " (weight of shape ", ws, ")");
  TG_CHECK(ws[1] * g == c, op, ": input of shape ", xs, " has ", c, " channels, but weight of shape ", ws,
           " with groups ", g, " expects ", ws[1] * g);
  if (b.defined()) {
    TG_CHECK(b.dim() == 1 && b.size(0) == co, op, ": bias of shape ", b.sizes(), " for weight of shape ", ws,
             " (expected [", co, "])");
    TG_CHECK(b.dtype() == x.dtype(), op, ": input of dtype ", x.dtype(), " but bias of dtype ", b.dtype());
    TG_CHECK(b.device() == x.device(), op, ": input on ", x.device(), " but bias on ", b.device());
  }
  const int64_t n = r.batched ? xs[0] : 1;
  const int64_t h = sd == 2 ? xs[xs.size() - 2] : 1, wd = xs[xs.size() - 1];
  const int64_t kh = sd == 2 ? ws[2] : 1, kw = ws[ws.size() - 1];
  r.x4 = {n, c, h, wd};
  r.w4 = {co, ws[1], kh, kw};
  const int64_t in[2] = {h, wd}, k[2] = {kh, kw};
  int64_t o[2];
  for (int d = 0; d < 2; ++d) {
    const int64_t span = p.dilation[d] * (k[d] - 1) + 1;
    int64_t before = p.padding[d], after = p.padding[d];
    if (p.same) {
      before = (span - 1) / 2;
      after = span - 1 - before;
    }
    TG_CHECK(in[d] + before + after >= span, op, ": kernel of shape ", ws, " (dilation ", p.dilation[d],
             ") is larger than the padded input (input of shape ", xs, ", padding ", before + after, " in all)");
    r.pad[d] = before;
    r.extra[d] = after - before;
    o[d] = (in[d] + before + after - span) / p.stride[d] + 1;
  }
  r.out4 = {n, co, o[0], o[1]};
  return r;
}

// The 4-d result as the caller's shape: [N, Co, L] for 1-d, without N when unbatched.
Shape user_out_shape(int spatial, const ConvProblem& r) {
  Shape s;
  if (r.batched) s.push_back(r.out4[0]);
  s.push_back(r.out4[1]);
  if (spatial == 2) s.push_back(r.out4[2]);
  s.push_back(r.out4[3]);
  return s;
}

Tensor channels_last(const Tensor& t) { return contiguous_channels_last(t); }
Tensor empty_channels_last(const Shape& s, DType dtype, Device device) {
  return empty_strided(s, {s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]}, dtype, device);
}

// Channels-last convolution: a batched 2-d input laid out NHWC (and not also row-major, as
// [N, 1, 1, 1] or [N, C, 1, 1] images are) keeps that layout: the backend gets NHWC operands
// where it takes them, else the row-major result is converted back.
bool nhwc(const Tensor& x) { return is_nhwc(x); }
bool wants_channels_last(int spatial, const ConvProblem& r, const Tensor& x) {
  return spatial == 2 && r.batched && nhwc(x);
}

backend::ConvArgs conv_args(const ConvProblem& r, const ConvParams& p, const Tensor& x, const Tensor& w, bool cl) {
  backend::ConvArgs a;
  a.x = cl ? x : native::reshape(native::contiguous(x), r.x4);
  a.weight = cl ? channels_last(w) : native::reshape(native::contiguous(w), r.w4);
  for (int d = 0; d < 2; ++d) {
    a.stride[d] = p.stride[d];
    a.pad[d] = r.pad[d];
    a.dilation[d] = p.dilation[d];
  }
  a.groups = p.groups;
  return a;
}

// padding='same' with an odd total (an even kernel span) pads the end by one more than the start.
// As PyTorch, x is then zero-padded at the end by that one and the conv runs with symmetric
// padding, so the backends only ever see symmetric padding (cuDNN's dgrad refuses, and its wgrad
// mishandled, asymmetric padding expressed through the output size).
bool asymmetric(const ConvProblem& r) { return r.extra[0] != 0 || r.extra[1] != 0; }
Tensor pad_end(int spatial, const Tensor& x, const ConvProblem& r) {
  Shape s = x.sizes();
  const size_t last = s.size() - 1;
  s[last] += r.extra[1];
  if (spatial == 2) s[last - 1] += r.extra[0];
  // A channels-last x stays channels-last (the conv then keeps its layout).
  const bool cl = spatial == 2 && nhwc(x);
  Tensor xp = cl ? empty_channels_last(s, x.dtype(), x.device()) : empty(s, x.dtype(), x.device());
  fill_(xp, 0);
  Tensor region = slice(xp, static_cast<int64_t>(last), 0, x.sizes()[last], 1);
  if (spatial == 2) region = slice(region, static_cast<int64_t>(last - 1), 0, x.sizes()[last - 1], 1);
  copy_(region, x);
  return xp;
}
ConvParams symmetric(const ConvParams& p, const ConvProblem& r) {
  ConvParams q = p;
  q.same = false;
  q.padding = {r.pad[0], r.pad[1]};
  return q;
}

}  // namespace

Tensor conv(const char* op, int spatial, const Tensor& x, const Tensor& weight, const Tensor& bias,
            const ConvParams& p, bool relu) {
  const ConvProblem r = check_conv(op, spatial, x, weight, bias, p);
  if (asymmetric(r)) return conv(op, spatial, pad_end(spatial, x, r), weight, bias, symmetric(p, r), relu);
  backend::Backend& be = backend::get(x.device().type());
  const bool keep_cl = wants_channels_last(spatial, r, x);
  const bool cl = keep_cl && be.conv_takes_channels_last();
  Tensor out = cl ? empty_channels_last(r.out4, x.dtype(), x.device()) : empty(r.out4, x.dtype(), x.device());
  if (out.numel() > 0) {
    backend::ConvArgs a = conv_args(r, p, x, weight, cl);
    a.bias = bias.defined() ? native::contiguous(bias) : Tensor();
    a.out = out;
    a.relu = relu;
    be.conv2d(a);
  }
  if (keep_cl) return cl ? out : channels_last(out);
  return native::view(out, user_out_shape(spatial, r));
}

std::vector<Tensor> conv_backward(const char* op, int spatial, const Tensor& grad, const Tensor& x,
                                  const Tensor& weight, const ConvParams& p, bool need_x, bool need_weight,
                                  bool need_bias) {
  const ConvProblem r = check_conv(op, spatial, x, weight, Tensor(), p);
  TG_CHECK(grad.numel() == r.out4.numel(), op, " backward: grad of shape ", grad.sizes(), " for output of shape ",
           user_out_shape(spatial, r));
  if (asymmetric(r)) {  // as conv(): the gradient of the zero-padded x, cut back to x's extent
    std::vector<Tensor> out = conv_backward(op, spatial, grad, pad_end(spatial, x, r), weight, symmetric(p, r), need_x,
                                            need_weight, need_bias);
    if (out[0].defined()) {
      const size_t last = x.sizes().size() - 1;
      Tensor gx = slice(out[0], static_cast<int64_t>(last), 0, x.sizes()[last], 1);
      if (spatial == 2) gx = slice(gx, static_cast<int64_t>(last - 1), 0, x.sizes()[last - 1], 1);
      out[0] = nhwc(x) ? channels_last(gx) : contiguous(gx);
    }
    return out;
  }
  std::vector<Tensor> out(3);
  backend::Backend& be = backend::get(x.device().type());
  const bool keep_cl = wants_channels_last(spatial, r, x);
  const bool cl = keep_cl && be.conv_takes_channels_last();
  auto alloc = [&](const Shape& s) {
    return cl ? empty_channels_last(s, x.dtype(), x.device()) : empty(s, x.dtype(), x.device());
  };
  if (need_x) out[0] = alloc(r.x4);
  if (need_weight) out[1] = alloc(r.w4);
  if (r.out4.numel() == 0) {
    if (need_bias) out[2] = empty({r.out4[1]}, x.dtype(), x.device());
    for (Tensor& t : out)
      if (t.defined()) native::fill_(t, 0);
  } else if (need_x || need_weight || need_bias) {
    backend::ConvBackwardArgs a;
    a.conv = conv_args(r, p, x, weight, cl);
    Tensor g = grad.dtype() == x.dtype() ? grad : to(grad, x.device(), x.dtype());
    a.grad_out = cl ? channels_last(native::reshape(g, r.out4)) : native::reshape(native::contiguous(g), r.out4);
    // The bias gradient is a reduction of grad_out over N, OH, OW: the reduce kernels' job.
    if (need_bias) out[2] = native::reduce(backend::ReduceOp::Sum, a.grad_out, {0, 2, 3}, false);
    a.grad_x = out[0];
    a.grad_weight = out[1];
    if (need_x || need_weight) be.conv2d_backward(a);
  }
  if (keep_cl && !cl && out[0].defined()) out[0] = channels_last(out[0]);
  if (!keep_cl && out[0].defined()) out[0] = native::view(out[0], x.sizes());
  if (!cl && out[1].defined()) out[1] = native::view(out[1], weight.sizes());
  return out;
}

// ---- issue 17: conv_transpose
namespace {

// conv_transpose's problem in the terms of the conv2d it is the input gradient of: that conv's
// input is y [N, C_out, OH, OW], its output is x [N, C_in, H, W], its weight w [C_in, C_out / g, KH, KW].
struct ConvTProblem {
  Shape x4, w4, y4;
  bool batched = true;
};

ConvTProblem check_conv_transpose(const char* op, int spatial, const Tensor& x, const Tensor& w, const Tensor& b,
                                  const ConvTransposeParams& tp) {
  const ConvParams& p = tp.conv;
  check_conv_operands(op, spatial, x, w, p, "in_channels, out_channels / groups");
  const int64_t sd = spatial, g = p.groups;
  for (int d = 0; d < 2; ++d) {
    TG_CHECK(tp.output_padding[d] >= 0, op, ": output_padding must be >= 0, got ", tp.output_padding[d]);
    TG_CHECK(tp.output_padding[d] < p.stride[d] || tp.output_padding[d] < p.dilation[d], op,
             ": output padding must be smaller than either stride or dilation, got output_padding ",
             tp.output_padding[d], ", stride ", p.stride[d], ", dilation ", p.dilation[d]);
  }
  ConvTProblem r;
  r.batched = x.dim() == sd + 2;
  const Shape& xs = x.sizes();
  const Shape& ws = w.sizes();
  const int64_t c = xs[r.batched ? 1 : 0];
  TG_CHECK(ws[0] == c, op, ": input of shape ", xs, " has ", c, " channels, but weight of shape ", ws, " expects ",
           ws[0], " (weight [in_channels, out_channels / groups, ...])");
  TG_CHECK(c % g == 0, op, ": groups ", g, " must divide in_channels ", c, " (input of shape ", xs, ")");
  const int64_t co = ws[1] * g;
  if (b.defined()) {
    TG_CHECK(b.dim() == 1 && b.size(0) == co, op, ": bias of shape ", b.sizes(), " for weight of shape ", ws,
             " and groups ", g, " (expected [", co, "])");
    TG_CHECK(b.dtype() == x.dtype(), op, ": input of dtype ", x.dtype(), " but bias of dtype ", b.dtype());
    TG_CHECK(b.device() == x.device(), op, ": input on ", x.device(), " but bias on ", b.device());
  }
  const int64_t n = r.batched ? xs[0] : 1;
  const int64_t h = sd == 2 ? xs[xs.size() - 2] : 1, wd = xs[xs.size() - 1];
  const int64_t kh = sd == 2 ? ws[2] : 1, kw = ws[ws.size() - 1];
  const int64_t in[2] = {h, wd}, k[2] = {kh, kw};
  int64_t o[2];
  for (int d = 0; d < 2; ++d) {
    o[d] = (in[d] - 1) * p.stride[d] - 2 * p.padding[d] + p.dilation[d] * (k[d] - 1) + tp.output_padding[d] + 1;
    TG_CHECK(o[d] > 0, op, ": input of shape ", xs, " and weight of shape ", ws, " (stride ", p.stride[d], ", padding ",
             p.padding[d], ", dilation ", p.dilation[d], ", output_padding ", tp.output_padding[d],
             ") give output size ", o[d], ": output size is too small");
  }
  r.x4 = {n, c, h, wd};
  r.w4 = {c, ws[1], kh, kw};
  r.y4 = {n, co, o[0], o[1]};
  return r;
}

Shape user_shape(int spatial, bool batched, const Shape& s4) {
  Shape s;
  if (batched) s.push_back(s4[0]);
  s.push_back(s4[1]);
  if (spatial == 2) s.push_back(s4[2]);
  s.push_back(s4[3]);
  return s;
}

// The conv2d whose input is y-shaped (`conv_in`) and whose output is x-shaped.
backend::ConvArgs transposed_conv(const ConvParams& p, const Tensor& conv_in, const Tensor& w4) {
  backend::ConvArgs a;
  a.x = conv_in;
  a.weight = w4;
  for (int d = 0; d < 2; ++d) {
    a.stride[d] = p.stride[d];
    a.pad[d] = p.padding[d];
    a.dilation[d] = p.dilation[d];
  }
  a.groups = p.groups;
  return a;
}

}  // namespace

Tensor conv_transpose(const char* op, int spatial, const Tensor& x, const Tensor& weight, const Tensor& bias,
                      const ConvTransposeParams& p) {
  const ConvTProblem r = check_conv_transpose(op, spatial, x, weight, bias, p);
  Tensor y = empty(r.y4, x.dtype(), x.device());
  if (y.numel() > 0) {
    if (r.x4.numel() == 0) {
      native::fill_(y, 0);
    } else {
      backend::ConvBackwardArgs a;
      // y is only written: its sizes give the geometry (the backend reads conv.x for grad_weight only).
      a.conv = transposed_conv(p.conv, y, native::reshape(native::contiguous(weight), r.w4));
      a.grad_out = native::reshape(native::contiguous(x), r.x4);
      a.grad_x = y;
      backend::get(x.device().type()).conv2d_backward(a);
    }
    if (bias.defined())
      native::binary_out(backend::ElemOp::Add, y, y, native::view(native::contiguous(bias), {1, r.y4[1], 1, 1}));
  }
  return native::view(y, user_shape(spatial, r.batched, r.y4));
}

std::vector<Tensor> conv_transpose_backward(const char* op, int spatial, const Tensor& grad, const Tensor& x,
                                            const Tensor& weight, const ConvTransposeParams& p, bool need_x,
                                            bool need_weight, bool need_bias) {
  const ConvTProblem r = check_conv_transpose(op, spatial, x, weight, Tensor(), p);
  TG_CHECK(grad.numel() == r.y4.numel(), op, " backward: grad of shape ", grad.sizes(), " for output of shape ",
           user_shape(spatial, r.batched, r.y4));
  Tensor g = grad.dtype() == x.dtype() ? grad : to(grad, x.device(), x.dtype());
  g = native::reshape(native::contiguous(g), r.y4);
  std::vector<Tensor> out(3);
  const bool empty_problem = r.x4.numel() == 0 || r.y4.numel() == 0;
  const Tensor w4 = native::reshape(native::contiguous(weight), r.w4);
  if (need_x) {
    out[0] = empty(r.x4, x.dtype(), x.device());
    if (empty_problem) {
      if (out[0].numel() > 0) native::fill_(out[0], 0);
    } else {
      backend::ConvArgs a = transposed_conv(p.conv, g, w4);
      a.out = out[0];
      backend::get(x.device().type()).conv2d(a);
    }
    out[0] = native::view(out[0], x.sizes());
  }
  if (need_weight) {
    out[1] = empty(r.w4, x.dtype(), x.device());
    if (empty_problem) {
      if (out[1].numel() > 0) native::fill_(out[1], 0);
    } else {
      backend::ConvBackwardArgs a;
      a.conv = transposed_conv(p.conv, g, w4);
      a.grad_out = native::reshape(native::contiguous(x), r.x4);
      a.grad_weight = out[1];
      backend::get(x.device().type()).conv2d_backward(a);
    }
    out[1] = native::view(out[1], weight.sizes());
  }
  if (need_bias) out[2] = native::reduce(backend::ReduceOp::Sum, g, DimList({0, 2, 3}), false);
  return out;
}

}  // namespace native
}  // namespace tg
