// max_pool2d / avg_pool2d / adaptive_avg_pool2d and the pooling modules (issue 17), on the CPU and
// on CUDA when present, against float64 references written here as plain loops (forward, and the
// backward as a scatter over the windows: independent of the library's gather), plus gradcheck.
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "tests/autograd/common.h"

namespace tg::testing {
namespace {

namespace F = tg::nn::functional;

class Pool : public ::testing::TestWithParam<Dev> {};
INSTANTIATE_TEST_SUITE_P(Devices, Pool, ::testing::Values(Dev::CPU, Dev::CUDA), dev_name);

enum class Kind { Max, Avg, Adaptive };
struct Cfg {
  Kind kind = Kind::Max;
  int64_t kh = 2, kw = 2, sh = 2, sw = 2, ph = 0, pw = 0, dh = 1, dw = 1;
  bool ceil = false, include_pad = true;
  int64_t divisor = 0;
  int64_t oh = 0, ow = 0;  // adaptive
};

// PyTorch's pooling_output_shape.
int64_t out_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil) {
  const double num = static_cast<double>(in + 2 * p - d * (k - 1) - 1 + (ceil ? s - 1 : 0));
  int64_t o = static_cast<int64_t>(std::floor(num / static_cast<double>(s))) + 1;
  if (ceil && (o - 1) * s >= in + p) --o;
  return o;
}

struct Ref {
  int64_t OH = 0, OW = 0;
  std::vector<double> out, grad_in;
  std::vector<int64_t> idx;
};

// planes of H x W; g: an upstream gradient of out's size (may be empty: no backward).
Ref reference(const Cfg& c, const std::vector<double>& x, int64_t planes, int64_t H, int64_t W,
              const std::vector<double>& g) {
  Ref r;
  if (c.kind == Kind::Adaptive) {
    r.OH = c.oh;
    r.OW = c.ow;
  } else {
    r.OH = out_size(H, c.kh, c.sh, c.ph, c.dh, c.ceil);
    r.OW = out_size(W, c.kw, c.sw, c.pw, c.dw, c.ceil);
  }
  r.out.assign(static_cast<size_t>(planes * r.OH * r.OW), 0);
  r.idx.assign(r.out.size(), -1);
  r.grad_in.assign(x.size(), 0);
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i = 0; i < r.OH; ++i)
      for (int64_t j = 0; j < r.OW; ++j) {
        const size_t o = static_cast<size_t>((p * r.OH + i) * r.OW + j);
        const double go = g.empty() ? 0.0 : g[o];
        std::vector<std::pair<int64_t, int64_t>> cells;  // in-range cells of the window, window order
        double div = 0;
        if (c.kind == Kind::Adaptive) {
          const int64_t h0 = static_cast<int64_t>(std::floor(static_cast<double>(i * H) / static_cast<double>(c.oh)));
          const int64_t h1 = static_cast<int64_t>(std::ceil(static_cast<double>((i + 1) * H) / static_cast<double>(c.oh)));
          const int64_t w0 = static_cast<int64_t>(std::floor(static_cast<double>(j * W) / static_cast<double>(c.ow)));
          const int64_t w1 = static_cast<int64_t>(std::ceil(static_cast<double>((j + 1) * W) / static_cast<double>(c.ow)));
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) cells.emplace_back(h, w);
          div = static_cast<double>(cells.size());
        } else {
          int64_t padded = 0;
          for (int64_t a = 0; a < c.kh; ++a)
            for (int64_t b = 0; b < c.kw; ++b) {
              const int64_t h = i * c.sh - c.ph + a * c.dh, w = j * c.sw - c.pw + b * c.dw;
              if (h < H + c.ph && w < W + c.pw) ++padded;  // avg: the window cut at the padded edge
              if (h >= 0 && h < H && w >= 0 && w < W) cells.emplace_back(h, w);
            }
          div = c.divisor ? static_cast<double>(c.divisor)
                          : c.include_pad ? static_cast<double>(padded) : static_cast<double>(cells.size());
        }
        if (c.kind == Kind::Max) {
          double best = -std::numeric_limits<double>::infinity();
          int64_t bi = -1;
          for (auto [h, w] : cells) {
            const double v = x[static_cast<size_t>((p * H + h) * W + w)];
            if (bi < 0 || v > best || std::isnan(v)) {
              best = v;
              bi = h * W + w;
            }
          }
          r.out[o] = best;
          r.idx[o] = bi;
          r.grad_in[static_cast<size_t>(p * H * W + bi)] += go;
        } else {
          double s = 0;
          for (auto [h, w] : cells) s += x[static_cast<size_t>((p * H + h) * W + w)];
          r.out[o] = cells.empty() ? 0.0 : s / div;
          for (auto [h, w] : cells) r.grad_in[static_cast<size_t>((p * H + h) * W + w)] += go / div;
        }
      }
  return r;
}

Tensor run(const Cfg& c, const Tensor& x) {
  switch (c.kind) {
    case Kind::Max:
      return F::max_pool2d(x, {.kernel_size = {c.kh, c.kw},
                               .stride = nn::PoolSize{c.sh, c.sw},
                               .padding = {c.ph, c.pw},
                               .dilation = {c.dh, c.dw},
                               .ceil_mode = c.ceil});
    case Kind::Avg:
      return F::avg_pool2d(x, {.kernel_size = {c.kh, c.kw},
                               .stride = nn::PoolSize{c.sh, c.sw},
                               .padding = {c.ph, c.pw},
                               .ceil_mode = c.ceil,
                               .count_include_pad = c.include_pad,
                               .divisor_override = c.divisor ? std::optional<int64_t>(c.divisor) : std::nullopt});
    case Kind::Adaptive: return F::adaptive_avg_pool2d(x, {c.oh, c.ow});
  }
  return Tensor();
}

std::vector<Cfg> configs() {
  std::vector<Cfg> v;
  v.push_back({.kind = Kind::Max});
  v.push_back({.kind = Kind::Max, .kh = 3, .kw = 3, .sh = 2, .sw = 2, .ph = 1, .pw = 1});
  v.push_back({.kind = Kind::Max, .kh = 3, .kw = 2, .sh = 2, .sw = 1, .ph = 1, .pw = 0, .dh = 2, .dw = 2});
  v.push_back({.kind = Kind::Max, .kh = 2, .kw = 3, .sh = 3, .sw = 2, .ph = 1, .pw = 1, .ceil = true});
  v.push_back({.kind = Kind::Avg});
  v.push_back({.kind = Kind::Avg, .kh = 3, .kw = 3, .sh = 2, .sw = 2, .ph = 1, .pw = 1});
  v.push_back({.kind = Kind::Avg, .kh = 3, .kw = 3, .sh = 2, .sw = 2, .ph = 1, .pw = 1, .include_pad = false});
  v.push_back({.kind = Kind::Avg, .kh = 2, .kw = 3, .sh = 3, .sw = 2, .ph = 1, .pw = 1, .ceil = true});
  v.push_back({.kind = Kind::Avg, .kh = 2, .kw = 3, .sh = 3, .sw = 2, .ph = 1, .pw = 1, .ceil = true,
               .include_pad = false});
  v.push_back({.kind = Kind::Avg, .kh = 3, .kw = 2, .sh = 1, .sw = 2, .ph = 1, .pw = 1, .divisor = 5});
  v.push_back({.kind = Kind::Adaptive, .oh = 3, .ow = 4});
  v.push_back({.kind = Kind::Adaptive, .oh = 1, .ow = 1});
  v.push_back({.kind = Kind::Adaptive, .oh = 7, .ow = 2});  // more outputs than rows: overlapping windows
  return v;
}

TEST_P(Pool, ForwardAndBackwardMatchReference) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  manual_seed(3);
  const int64_t N = 2, C = 3, H = 5, W = 7;
  int n = 0;
  for (const Cfg& c : configs()) {
    Tensor x = randn({N, C, H, W}, TensorOptions().dtype(kFloat64)).to(dev).requires_grad_(true);
    Tensor out = run(c, x);
    Tensor g = randn(out.sizes(), TensorOptions().dtype(kFloat64)).to(dev);
    out.backward(g);
    const Ref r = reference(c, host(x), N * C, H, W, host(g));
    const std::string what = "config " + std::to_string(n++);
    ASSERT_EQ(out.sizes(), Shape({N, C, r.OH, r.OW})) << what;
    expect_near_vec(host(out), r.out, 1e-12, 1e-12, what + " forward");
    expect_near_vec(host(x.grad()), r.grad_in, 1e-12, 1e-12, what + " backward");
  }
}

TEST_P(Pool, MaxIndicesAndThreeDimInput) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  const Cfg c{.kind = Kind::Max, .kh = 3, .kw = 3, .sh = 2, .sw = 2, .ph = 1, .pw = 1};
  Tensor x = randn({4, 6, 5}, TensorOptions().dtype(kFloat64)).to(dev);
  auto [out, idx] = F::max_pool2d_with_indices(x, {.kernel_size = 3, .stride = 2, .padding = 1});
  const Ref r = reference(c, host(x), 4, 6, 5, {});
  ASSERT_EQ(out.sizes(), Shape({4, 3, 3}));
  EXPECT_EQ(idx.dtype(), kInt64);
  expect_near_vec(host(out), r.out, 0, 0, "out");
  const std::vector<int64_t> got = idx.to(Device(kCPU)).contiguous().to_vector<int64_t>();
  EXPECT_EQ(got, r.idx);
}

TEST_P(Pool, TiesGoToTheFirstMaximumInWindowOrder) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  Tensor x = ones({1, 1, 4, 4}, TensorOptions().dtype(kFloat64)).to(dev).requires_grad_(true);
  // Overlapping 3x3 windows, stride 1: every window's first cell is its top-left one.
  auto [out, idx] = F::max_pool2d_with_indices(x, {.kernel_size = 3, .stride = 1});
  EXPECT_EQ(idx.to(Device(kCPU)).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 4, 5}));
  out.sum().backward();
  std::vector<double> want(16, 0.0);
  want[0] = want[1] = want[4] = want[5] = 1;
  expect_near_vec(host(x.grad()), want, 0, 0, "grad");
}

TEST_P(Pool, MaxPropagatesNaN) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  Tensor x = tensor(std::vector<double>{1, std::nan(""), 3, 4}).reshape({1, 1, 2, 2}).to(dev);
  EXPECT_TRUE(std::isnan(host(F::max_pool2d(x, {.kernel_size = 2}))[0]));
}

TEST_P(Pool, NonContiguousInput) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  for (const Cfg& c : configs()) {
    Tensor base = randn({2, 3, 7, 5}, TensorOptions().dtype(kFloat64)).to(dev).requires_grad_(true);
    Tensor x = base.transpose(2, 3);  // [2, 3, 5, 7], strided
    ASSERT_FALSE(x.is_contiguous());
    Tensor out = run(c, x);
    const Ref r = reference(c, host(x), 6, 5, 7, std::vector<double>(static_cast<size_t>(out.numel()), 1.0));
    expect_near_vec(host(out), r.out, 1e-12, 1e-12, "forward");
    out.sum().backward();
    expect_near_vec(host(base.grad().transpose(2, 3)), r.grad_in, 1e-12, 1e-12, "backward");
  }
}

// A channels-last input keeps its layout through the pool, and so does its gradient; the values
// are the row-major ones (so the layers after a pool keep running NHWC).
TEST_P(Pool, ChannelsLastInKeepsChannelsLastOut) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  for (const Cfg& c : configs()) {
    Tensor base = randn({2, 3, 6, 5}, TensorOptions().dtype(kFloat64)).to(dev);
    Tensor x = base.contiguous(MemoryFormat::ChannelsLast).detach().requires_grad_(true);
    Tensor xr = base.detach().requires_grad_(true);
    Tensor out = run(c, x), ref = run(c, xr);
    EXPECT_TRUE(out.is_contiguous(MemoryFormat::ChannelsLast)) << out.strides();
    expect_near_vec(host(out), host(ref), 0, 0, "forward");
    Tensor g = randn(ref.sizes(), TensorOptions().dtype(kFloat64)).to(dev);
    std::vector<Tensor> gx = autograd::grad({out}, {x}, {g.contiguous(MemoryFormat::ChannelsLast)});
    std::vector<Tensor> gr = autograd::grad({ref}, {xr}, {g});
    EXPECT_TRUE(gx[0].is_contiguous(MemoryFormat::ChannelsLast)) << gx[0].strides();
    expect_near_vec(host(gx[0]), host(gr[0]), 0, 0, "backward");
  }
}

TEST_P(Pool, Gradcheck) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  for (const Cfg& c : configs()) {
    Tensor x = randn({2, 2, 6, 5}, TensorOptions().dtype(kFloat64)).to(dev);
    auto rep = autograd::gradcheck([&](const std::vector<Tensor>& in) { return run(c, in[0]); }, {x});
    EXPECT_TRUE(rep) << rep;
    // Through a strided view made inside fn.
    Tensor xt = randn({2, 2, 5, 6}, TensorOptions().dtype(kFloat64)).to(dev);
    auto rep2 = autograd::gradcheck([&](const std::vector<Tensor>& in) { return run(c, in[0].transpose(2, 3)); }, {xt});
    EXPECT_TRUE(rep2) << rep2;
  }
}

TEST_P(Pool, ReducedPrecision) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  for (DType dt : {kFloat32, kFloat16, kBFloat16}) {
    const double tol = dt == kFloat32 ? 1e-5 : dt == kFloat16 ? 2e-3 : 2e-2;
    for (const Cfg& c : configs()) {
      Tensor x = randn({2, 3, 6, 7}, TensorOptions().dtype(dt)).to(dev).requires_grad_(true);
      Tensor out = run(c, x);
      EXPECT_EQ(out.dtype(), dt);
      out.sum().backward();
      // The reference reads the same rounded inputs; the outputs differ by one rounding.
      const Ref r = reference(c, host(x), 6, 6, 7, std::vector<double>(static_cast<size_t>(out.numel()), 1.0));
      expect_near_vec(host(out), r.out, tol, tol, "forward");
      expect_near_vec(host(x.grad()), r.grad_in, tol, tol, "backward");
    }
  }
}

TEST_P(Pool, CeilModeAndPaddingShapes) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  Tensor x = randn({1, 1, 5, 4}).to(dev);
  // PyTorch's output size: floor gives 2, ceil 3 for 5 rows with k = s = 2.
  EXPECT_EQ(F::max_pool2d(x, {.kernel_size = 2}).sizes(), Shape({1, 1, 2, 2}));
  EXPECT_EQ(F::max_pool2d(x, {.kernel_size = 2, .ceil_mode = true}).sizes(), Shape({1, 1, 3, 2}));
  // k = 2, s = 3, p = 1, ceil: (7 + 2) / 3 = 3 windows per dim, but the third would start at 6 >=
  // 5 + 1 rows (5 >= 4 + 1 columns), in the bottom / right padding: dropped, as PyTorch.
  EXPECT_EQ(F::avg_pool2d(x, {.kernel_size = 2, .stride = 3, .padding = 1, .ceil_mode = true}).sizes(),
            Shape({1, 1, 2, 2}));
  EXPECT_EQ(F::avg_pool2d(x, {.kernel_size = 2, .stride = 3, .padding = 1}).sizes(), Shape({1, 1, 2, 2}));
  EXPECT_EQ(F::max_pool2d(randn({1, 1, 6, 6}).to(dev), {.kernel_size = 2, .stride = 3, .padding = 1, .ceil_mode = true})
                .sizes(),
            Shape({1, 1, 3, 3}));
  // avg with ceil_mode: the last row window [4, 6) is cut to [4, 5 + 0) for the padded count.
  Tensor y = arange(0, 5, 1, TensorOptions().dtype(kFloat64)).reshape({1, 1, 5, 1}).to(dev);
  EXPECT_EQ(host(F::avg_pool2d(y, {.kernel_size = {2, 1}, .ceil_mode = true})), (std::vector<double>{0.5, 2.5, 4}));
  EXPECT_EQ(host(F::avg_pool2d(y, {.kernel_size = {3, 1}, .stride = 1, .padding = {1, 0}})),
            (std::vector<double>{1.0 / 3, 1, 2, 3, 7.0 / 3}));
  EXPECT_EQ(host(F::avg_pool2d(y, {.kernel_size = {3, 1}, .stride = 1, .padding = {1, 0},
                                   .count_include_pad = false})),
            (std::vector<double>{0.5, 1, 2, 3, 3.5}));
}

TEST_P(Pool, AdaptiveWindows) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  // 5 -> 3: rows [0, 2), [1, 4), [3, 5).
  Tensor y = arange(0, 5, 1, TensorOptions().dtype(kFloat64)).reshape({1, 5, 1}).to(dev);
  EXPECT_EQ(host(F::adaptive_avg_pool2d(y, {3, 1})), (std::vector<double>{0.5, 2, 3.5}));
  Tensor x = randn({2, 3, 4, 6}, TensorOptions().dtype(kFloat64)).to(dev);
  Tensor g = F::adaptive_avg_pool2d(x, 1);
  expect_near_vec(host(g), host(x.mean({2, 3}, true)), 1e-12, 1e-12, "global");
}

TEST_P(Pool, Errors) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  Tensor x = randn({1, 2, 4, 4}).to(dev);
  EXPECT_THROW(F::max_pool2d(randn({4, 4}).to(dev), {.kernel_size = 2}), Error);
  EXPECT_THROW(F::max_pool2d(randn({1, 1, 1, 4, 4}).to(dev), {.kernel_size = 2}), Error);
  EXPECT_THROW(F::max_pool2d(x, {.kernel_size = 0}), Error);
  EXPECT_THROW(F::max_pool2d(x, {.kernel_size = 2, .stride = 0}), Error);
  EXPECT_THROW(F::max_pool2d(x, {.kernel_size = 2, .dilation = 0}), Error);
  EXPECT_THROW(F::max_pool2d(x, {.kernel_size = 3, .padding = 2}), Error);  // padding > kernel / 2
  EXPECT_THROW(F::avg_pool2d(x, {.kernel_size = 5}), Error);                // kernel larger than input
  EXPECT_THROW(F::avg_pool2d(x, {.kernel_size = 2, .divisor_override = 0}), Error);
  EXPECT_THROW(F::adaptive_avg_pool2d(x, {0, 2}), Error);
  EXPECT_THROW(F::adaptive_avg_pool2d(randn({1, 0, 4, 4}).to(dev), 2), Error);
  EXPECT_THROW(F::max_pool2d(ones({1, 1, 4, 4}, TensorOptions().dtype(kInt64)).to(dev), {.kernel_size = 2}), Error);
  try {
    F::max_pool2d(x, {.kernel_size = 3, .padding = 2});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_pool2d"), std::string::npos) << e.what();
  }
  try {
    F::avg_pool2d(x, {.kernel_size = 5});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[1, 2, 4, 4]"), std::string::npos) << e.what();
  }
}

TEST_P(Pool, EmptyBatch) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  Tensor x = randn({0, 2, 4, 4}).to(to_device(GetParam()));
  EXPECT_EQ(F::max_pool2d(x, {.kernel_size = 2}).sizes(), Shape({0, 2, 2, 2}));
}

TEST(PoolModules, OutputShapes) {
  Tensor x = randn({2, 3, 8, 8});
  EXPECT_EQ(nn::MaxPool2d(2).forward(x).sizes(), Shape({2, 3, 4, 4}));
  EXPECT_EQ(nn::MaxPool2d(3, 2, 1).forward(x).sizes(), Shape({2, 3, 4, 4}));
  EXPECT_EQ(nn::MaxPool2d(nn::MaxPool2dOptions{.kernel_size = {2, 4}}).forward(x).sizes(), Shape({2, 3, 4, 2}));
  EXPECT_EQ(nn::AvgPool2d(3, 1, 1).forward(x).sizes(), Shape({2, 3, 8, 8}));
  EXPECT_EQ(nn::AdaptiveAvgPool2d({1, 1}).forward(x).sizes(), Shape({2, 3, 1, 1}));
  EXPECT_EQ(nn::AdaptiveAvgPool2d(5).forward(x).sizes(), Shape({2, 3, 5, 5}));
  EXPECT_EQ(nn::Flatten().forward(x).sizes(), Shape({2, 192}));
  EXPECT_EQ(nn::Flatten(0, 1).forward(x).sizes(), Shape({6, 8, 8}));
  EXPECT_EQ(nn::Flatten(-2).forward(x).sizes(), Shape({2, 3, 64}));
  EXPECT_THROW(nn::Flatten(2, 1).forward(x), Error);
  EXPECT_THROW(nn::Flatten(4).forward(x), Error);
  EXPECT_TRUE(nn::MaxPool2d(2).parameters().empty());
  // Module values: the same as the functional call.
  EXPECT_EQ(host(nn::AvgPool2d(2).forward(x)), host(F::avg_pool2d(x, {.kernel_size = 2})));
}

}  // namespace
}  // namespace tg::testing
