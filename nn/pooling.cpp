// max_pool2d / avg_pool2d / adaptive_avg_pool2d with their backward right below (differentiable again:
// see pool_backward), and the modules.
#include <tapegrad/nn/pooling.h>

#include <vector>

#include <tapegrad/autograd/function.h>
#include <tapegrad/core/native.h>
#include <tapegrad/core/trace.h>

namespace tg::nn {

namespace {
std::tuple<Tensor, Tensor> pool(const char* op, const Tensor& x, backend::Pool2dArgs a, bool ceil_mode);

// The input gradient: one backend call. It is linear in g, so under create_graph it is recorded
// (bw::linear_map) with its adjoint as backward: for max, g2 gathered at the saved indices; for
// the averages, the pool itself (its backward spreads g / divisor over each window, the transpose
// of summing a window and dividing), so every order of derivative exists.
Tensor pool_backward(const char* op, const backend::Pool2dArgs& a, bool ceil_mode, const Tensor& g,
                     const Tensor& indices, const Shape& in_shape, bool channels_last) {
  auto f = [&](const Tensor& gy) { return native::pool2d_backward(a, gy, indices, in_shape, channels_last); };
  if (!autograd::creating_graph()) return f(g);
  const Shape out_shape = g.sizes();
  const char* name = a.kind == backend::PoolKind::Max   ? "max_pool2d_backward"
                     : a.kind == backend::PoolKind::Avg ? "avg_pool2d_backward"
                                                        : "adaptive_avg_pool2d_backward";
  return autograd::bw::linear_map(name, g, f, [op, a, ceil_mode, indices, out_shape](const Tensor& gg) {
    if (a.kind == backend::PoolKind::Max)
      return gg.flatten(-2).gather(-1, indices.flatten(-2)).reshape(out_shape);
    return std::get<0>(pool(op, gg, a, ceil_mode));
  });
}

// Runs the pool and records its backward (the input gradient only; indices saved for Max).
std::tuple<Tensor, Tensor> pool(const char* op, const Tensor& x, backend::Pool2dArgs a, bool ceil_mode) {
  auto [out, indices] = native::pool2d(op, x, a, ceil_mode);
  if (!autograd::should_record(x)) return {out, indices};
  autograd::SavedTensor si = indices.defined() ? autograd::SavedTensor(indices, op) : autograd::SavedTensor();
  const Shape in_shape = x.sizes();
  const bool cl = native::is_nhwc(x);  // the input gradient in x's layout, as the output
  out = autograd::record(
      op, {x}, std::move(out),
      [op, a, ceil_mode, si, in_shape, cl](const Tensor& g, const autograd::FunctionNode&) -> std::vector<Tensor> {
        return {pool_backward(op, a, ceil_mode, g, si.unpack(), in_shape, cl)};
      },
      autograd::kDifferentiable);
  return {out, indices};
}

backend::Pool2dArgs window(PoolSize k, const std::optional<PoolSize>& s, PoolSize p) {
  backend::Pool2dArgs a;
  a.kh = k.h;
  a.kw = k.w;
  const PoolSize st = s.value_or(k);
  a.sh = st.h;
  a.sw = st.w;
  a.ph = p.h;
  a.pw = p.w;
  return a;
}
}  // namespace

namespace {
// max_pool2d traced as the values (and, with_indices, the indices as a second node).
std::tuple<Tensor, Tensor> max_pool(const Tensor& x, const MaxPool2dOptions& o, bool trace_indices) {
  backend::Pool2dArgs a = window(o.kernel_size, o.stride, o.padding);
  a.kind = backend::PoolKind::Max;
  a.dh = o.dilation.h;
  a.dw = o.dilation.w;
  auto res = pool("max_pool2d", x, a, o.ceil_mode);
  auto attrs = [&] {
    return std::vector<detail::TraceAttr>{{"kernel_size", std::vector<int64_t>{a.kh, a.kw}},
                                          {"stride", std::vector<int64_t>{a.sh, a.sw}},
                                          {"padding", std::vector<int64_t>{a.ph, a.pw}},
                                          {"dilation", std::vector<int64_t>{a.dh, a.dw}},
                                          {"ceil_mode", o.ceil_mode}};
  };
  TG_TRACE(MaxPool2d, std::get<0>(res), {x}, attrs());
  if (trace_indices) TG_TRACE(MaxPool2dIndices, std::get<1>(res), {x}, attrs());
  return res;
}
}  // namespace

namespace functional {
std::tuple<Tensor, Tensor> max_pool2d_with_indices(const Tensor& x, const MaxPool2dOptions& o) {
  return max_pool(x, o, true);
}

Tensor max_pool2d(const Tensor& x, const MaxPool2dOptions& o) { return std::get<0>(max_pool(x, o, false)); }

Tensor avg_pool2d(const Tensor& x, const AvgPool2dOptions& o) {
  backend::Pool2dArgs a = window(o.kernel_size, o.stride, o.padding);
  a.kind = backend::PoolKind::Avg;
  a.count_include_pad = o.count_include_pad;
  if (o.divisor_override) {
    TG_CHECK(*o.divisor_override > 0, "avg_pool2d: divisor_override must be positive, got ", *o.divisor_override);
    a.divisor = *o.divisor_override;
  }
  Tensor out = std::get<0>(pool("avg_pool2d", x, a, o.ceil_mode));
  TG_TRACE(AvgPool2d, out, {x},
           {{"kernel_size", std::vector<int64_t>{a.kh, a.kw}},
            {"stride", std::vector<int64_t>{a.sh, a.sw}},
            {"padding", std::vector<int64_t>{a.ph, a.pw}},
            {"ceil_mode", o.ceil_mode},
            {"count_include_pad", o.count_include_pad},
            {"divisor_override", a.divisor}});
  return out;
}

Tensor adaptive_avg_pool2d(const Tensor& x, PoolSize output_size) {
  backend::Pool2dArgs a;
  a.kind = backend::PoolKind::AdaptiveAvg;
  a.OH = output_size.h;
  a.OW = output_size.w;
  Tensor out = std::get<0>(pool("adaptive_avg_pool2d", x, a, false));
  TG_TRACE(AdaptiveAvgPool2d, out, {x}, {{"output_size", std::vector<int64_t>{a.OH, a.OW}}});
  return out;
}
}  // namespace functional

MaxPool2d::MaxPool2d(PoolSize kernel_size, std::optional<PoolSize> stride, PoolSize padding, PoolSize dilation,
                     bool ceil_mode)
    : options{kernel_size, stride, padding, dilation, ceil_mode} {}
MaxPool2d::MaxPool2d(const MaxPool2dOptions& o) : options(o) {}
Tensor MaxPool2d::forward(const Tensor& x) { return functional::max_pool2d(x, options); }

AvgPool2d::AvgPool2d(PoolSize kernel_size, std::optional<PoolSize> stride, PoolSize padding, bool ceil_mode,
                     bool count_include_pad, std::optional<int64_t> divisor_override)
    : options{kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override} {}
AvgPool2d::AvgPool2d(const AvgPool2dOptions& o) : options(o) {}
Tensor AvgPool2d::forward(const Tensor& x) { return functional::avg_pool2d(x, options); }

AdaptiveAvgPool2d::AdaptiveAvgPool2d(PoolSize size) : output_size(size) {}
Tensor AdaptiveAvgPool2d::forward(const Tensor& x) { return functional::adaptive_avg_pool2d(x, output_size); }

Flatten::Flatten(int64_t start, int64_t end) : start_dim(start), end_dim(end) {}
Tensor Flatten::forward(const Tensor& x) {
  TG_CHECK(x.defined(), "Flatten: input is undefined");
  return x.flatten(start_dim, end_dim);  // errors name flatten, start_dim, end_dim and the shape
}

}  // namespace tg::nn
