// interpolate with its backward right below (core/native/interpolate.cpp; differentiable again, see
// upsample()), and the Upsample module.
#include <tapegrad/nn/upsample.h>

#include <cmath>
#include <vector>

#include <tapegrad/autograd/function.h>
#include <tapegrad/core/native.h>
#include <tapegrad/core/trace.h>

namespace tg::nn {

namespace {
// The resolved interpolation and its node. The input gradient is linear in g, so under
// create_graph it is recorded (bw::linear_map) with its adjoint, the interpolation itself, as
// backward: the backward kernel adds each output's weighted gradient into the inputs it read,
// the transpose of the forward's weighted reads. Every order of derivative exists.
Tensor upsample(const Tensor& x, backend::Upsample2dArgs a) {
  const char* op = "interpolate";
  Tensor y = native::upsample2d(op, x, a);
  if (!autograd::should_record(x)) return y;
  const Shape in_shape = x.sizes();
  return autograd::record(
      op, {x}, std::move(y),
      [a, in_shape](const Tensor& g, const autograd::FunctionNode&) -> std::vector<Tensor> {
        auto f = [&](const Tensor& gy) { return native::upsample2d_backward(a, gy, in_shape); };
        if (!autograd::creating_graph()) return {f(g)};
        return {autograd::bw::linear_map("interpolate_backward", g, f,
                                         [a](const Tensor& gg) { return upsample(gg, a); })};
      },
      autograd::kDifferentiable);
}
}  // namespace

namespace functional {

Tensor interpolate(const Tensor& x, const InterpolateFuncOptions& o) {
  const char* op = "interpolate";
  TG_CHECK(x.defined(), op, ": input is undefined");
  const std::string& mode = o.mode;
  TG_CHECK(mode == "nearest" || mode == "linear" || mode == "bilinear", op, ": mode '", mode,
           "' is not supported (nearest, linear, bilinear)");
  TG_CHECK(x.dim() == 3 || x.dim() == 4, op, ": expected a 3-d [N, C, W] or 4-d [N, C, H, W] input, got shape ",
           x.sizes());
  const int64_t sd = x.dim() - 2;
  TG_CHECK(mode != "linear" || sd == 1, op, ": got ", x.dim(), "D input, but linear mode needs 3D input");
  TG_CHECK(mode != "bilinear" || sd == 2, op, ": got ", x.dim(), "D input, but bilinear mode needs 4D input");
  const bool nearest = mode == "nearest";
  TG_CHECK(!nearest || !o.align_corners.has_value(), op,
           ": align_corners option can only be set with the interpolating modes: linear | bilinear");
  const bool has_size = !o.size.values.empty(), has_scale = !o.scale_factor.values.empty();
  TG_CHECK(has_size != has_scale, op,
           has_size ? ": only one of size or scale_factor should be defined"
                    : ": either size or scale_factor should be defined");
  TG_CHECK(!(has_size && o.recompute_scale_factor.value_or(false)), op,
           ": recompute_scale_factor is not meaningful with an explicit size");
  const Shape& xs = x.sizes();
  int64_t out[2] = {1, 1};
  double scales[2] = {0, 0};
  if (has_size) {
    const auto& v = o.size.values;
    TG_CHECK(v.size() == 1 || static_cast<int64_t>(v.size()) == sd, op,
             ": input and output must have the same number of spatial dimensions, got input of shape ", xs,
             " and output size ", Shape(v));
    for (int64_t d = 0; d < sd; ++d) out[2 - sd + d] = v.size() == 1 ? v[0] : v[static_cast<size_t>(d)];
  } else {
    const auto& v = o.scale_factor.values;
    TG_CHECK(v.size() == 1 || static_cast<int64_t>(v.size()) == sd, op,
             ": input and scale_factor must have the same number of spatial dimensions, got input of shape ", xs,
             " and ", v.size(), " scale factors");
    for (int64_t d = 0; d < sd; ++d) {
      const double s = v.size() == 1 ? v[0] : v[static_cast<size_t>(d)];
      TG_CHECK(std::isfinite(s) && s > 0, op, ": scale_factor must be finite and positive, got ", s);
      const double o_d = std::floor(static_cast<double>(xs[static_cast<size_t>(2 + d)]) * s);
      TG_CHECK(o_d < 9.2e18, op, ": scale_factor ", s, " gives an output too large for input of shape ", xs);
      out[2 - sd + d] = static_cast<int64_t>(o_d);
      if (!o.recompute_scale_factor.value_or(false)) scales[2 - sd + d] = s;
    }
  }
  backend::Upsample2dArgs a;
  a.mode = nearest ? backend::UpsampleMode::Nearest : backend::UpsampleMode::Linear;
  a.align_corners = o.align_corners.value_or(false);
  a.OH = out[0];
  a.OW = out[1];
  a.scale_h = scales[0];
  a.scale_w = scales[1];
  Tensor y = upsample(x, a);
  std::vector<int64_t> size_attr;
  for (int64_t d = 0; d < sd; ++d) size_attr.push_back(out[2 - sd + d]);
  TG_TRACE(Interpolate, y, {x},
           {{"size", size_attr},
            {"mode", static_cast<int64_t>(nearest ? 0 : 1)},
            {"align_corners", a.align_corners},
            {"scale_h", a.scale_h},
            {"scale_w", a.scale_w}});
  return y;
}

}  // namespace functional

Upsample::Upsample(UpsampleOptions o) : options(std::move(o)) {}
Upsample::Upsample(InterpolateSize size, InterpolateScale scale_factor, std::string mode,
                   std::optional<bool> align_corners, std::optional<bool> recompute_scale_factor)
    : options{std::move(size), std::move(scale_factor), std::move(mode), align_corners, recompute_scale_factor} {}
Tensor Upsample::forward(const Tensor& x) { return functional::interpolate(x, options); }

}  // namespace tg::nn
