// interpolate (nearest, linear, bilinear) and nn::Upsample (issue 17), on the CPU and on CUDA when
// present, against float64 references written here as plain loops (forward; the backward as a
// scatter of each output's gradient onto the inputs it reads, independent of the library's
// gather), closed forms, gradcheck, scale_factor vs size, non-contiguous inputs, errors.
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "tests/autograd/common.h"

namespace tg::testing {
namespace {

namespace F = tg::nn::functional;

class Interp : public ::testing::TestWithParam<Dev> {};
INSTANTIATE_TEST_SUITE_P(Devices, Interp, ::testing::Values(Dev::CPU, Dev::CUDA), dev_name);

struct Tap {
  int64_t i0, i1;
  double l0, l1;
};

// PyTorch's source index along one axis (UpSample.h, CPU). The nearest index is computed in float
// as PyTorch does; scale: the user's scale_factor, 0 when the output size was given.
Tap ref_tap(bool nearest, bool align, int64_t in, int64_t out, double scale, int64_t o) {
  if (in == out) return {o, o, 1, 0};
  if (nearest) {
    int64_t i;
    if (out == 2 * in) {
      i = o / 2;
    } else {
      const float s = scale > 0 ? static_cast<float>(1.0 / scale) : static_cast<float>(in) / static_cast<float>(out);
      i = static_cast<int64_t>(std::floor(static_cast<float>(o) * s));
    }
    i = std::min(i, in - 1);
    return {i, i, 1, 0};
  }
  double src;
  if (align) {
    src = out > 1 ? static_cast<double>(in - 1) / static_cast<double>(out - 1) * static_cast<double>(o) : 0.0;
  } else {
    const double r = scale > 0 ? 1.0 / scale : static_cast<double>(in) / static_cast<double>(out);
    src = std::max(r * (static_cast<double>(o) + 0.5) - 0.5, 0.0);
  }
  const int64_t i0 = std::min(static_cast<int64_t>(std::floor(src)), in - 1);
  const double l1 = std::min(std::max(src - static_cast<double>(i0), 0.0), 1.0);
  return {i0, i0 + (i0 < in - 1 ? 1 : 0), 1 - l1, l1};
}

struct Cfg {
  bool nearest = true, align = false;
  int64_t oh = 1, ow = 1;
  double sh = 0, sw = 0;
};

struct Ref {
  std::vector<double> y, gx;
};

// planes of H x W into OH x OW; g (may be empty): the upstream gradient, scattered back.
Ref reference(const Cfg& c, const std::vector<double>& x, int64_t planes, int64_t H, int64_t W,
              const std::vector<double>& g) {
  Ref r;
  r.y.assign(static_cast<size_t>(planes * c.oh * c.ow), 0);
  r.gx.assign(x.size(), 0);
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t oh = 0; oh < c.oh; ++oh)
      for (int64_t ow = 0; ow < c.ow; ++ow) {
        const Tap th = ref_tap(c.nearest, c.align, H, c.oh, c.sh, oh), tw = ref_tap(c.nearest, c.align, W, c.ow, c.sw, ow);
        const size_t o = static_cast<size_t>((p * c.oh + oh) * c.ow + ow);
        const int64_t hs[2] = {th.i0, th.i1}, ws[2] = {tw.i0, tw.i1};
        const double lh[2] = {th.l0, th.l1}, lw[2] = {tw.l0, tw.l1};
        for (int a = 0; a < 2; ++a)
          for (int b = 0; b < 2; ++b) {
            const size_t xi = static_cast<size_t>((p * H + hs[a]) * W + ws[b]);
            r.y[o] += lh[a] * lw[b] * x[xi];
            if (!g.empty()) r.gx[xi] += lh[a] * lw[b] * g[o];
          }
      }
  return r;
}

std::vector<double> randv(size_t n, uint64_t seed) {
  tg::manual_seed(seed);
  return host(tg::randn({static_cast<int64_t>(n)}, kFloat64));
}

// One 4-d case on the device in dtype dt through the options o, against the reference for c.
void check4(Dev dev, DType dt, const Shape& xs, const nn::InterpolateFuncOptions& o, const Cfg& c, double tol) {
  SCOPED_TRACE(::testing::Message() << "x " << xs << " mode " << o.mode << " out " << c.oh << "x" << c.ow
                                    << " scales " << c.sh << "," << c.sw << " align " << c.align << " "
                                    << dtype_name(dt));
  const int64_t planes = xs[0] * xs[1], H = xs[2], W = xs[3];
  const auto xv = randv(static_cast<size_t>(xs.numel()), 41);
  const auto gv = randv(static_cast<size_t>(planes * c.oh * c.ow), 42);
  const Ref r = reference(c, xv, planes, H, W, gv);
  auto x = tg::tensor(xv, xs).to(dt).to(to_device(dev)).requires_grad_();
  auto y = F::interpolate(x, o);
  ASSERT_EQ(y.sizes(), (Shape{xs[0], xs[1], c.oh, c.ow}));
  ASSERT_EQ(y.dtype(), dt);
  expect_near_vec(host(y), r.y, tol, tol, "y");
  y.backward(tg::tensor(gv, y.sizes()).to(dt).to(to_device(dev)));
  expect_near_vec(host(x.grad()), r.gx, tol, tol, "grad x");
}

TEST_P(Interp, NearestMatchesReference) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Shape xs{2, 3, 5, 7};
  // sizes up, down, equal, exactly twice; and scale factors (indices from 1 / scale_factor)
  for (auto [oh, ow] : std::vector<std::pair<int64_t, int64_t>>{{9, 11}, {3, 4}, {5, 14}, {10, 3}, {1, 1}})
    check4(GetParam(), kFloat64, xs, {.size = {oh, ow}}, {.nearest = true, .oh = oh, .ow = ow}, 1e-12);
  check4(GetParam(), kFloat64, xs, {.scale_factor = {1.7, 0.6}},
         {.nearest = true, .oh = 8, .ow = 4, .sh = 1.7, .sw = 0.6}, 1e-12);
  check4(GetParam(), kFloat32, xs, {.scale_factor = 2.5}, {.nearest = true, .oh = 12, .ow = 17, .sh = 2.5, .sw = 2.5},
         1e-6);
}

TEST_P(Interp, BilinearMatchesReference) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Shape xs{2, 2, 4, 6};
  for (bool align : {false, true}) {
    for (auto [oh, ow] : std::vector<std::pair<int64_t, int64_t>>{{7, 13}, {3, 2}, {4, 12}, {1, 5}, {9, 6}}) {
      nn::InterpolateFuncOptions o{.size = {oh, ow}, .mode = "bilinear", .align_corners = align};
      check4(GetParam(), kFloat64, xs, o, {.nearest = false, .align = align, .oh = oh, .ow = ow}, 1e-12);
      check4(GetParam(), kFloat32, xs, o, {.nearest = false, .align = align, .oh = oh, .ow = ow}, 2e-6);
    }
    nn::InterpolateFuncOptions o{.scale_factor = {1.7, 0.6}, .mode = "bilinear", .align_corners = align};
    // align_corners ignores the scale factor for the index (in - 1) / (out - 1), as PyTorch
    check4(GetParam(), kFloat64, xs, o, {.nearest = false, .align = align, .oh = 6, .ow = 3, .sh = 1.7, .sw = 0.6},
           1e-12);
  }
}

TEST_P(Interp, HalfPrecision) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  // Reads converted to float, weights and sums in float, one rounding on the store: errors of the
  // order of one bfloat16 / float16 ulp of values ~3 (0.016 / 0.002), plus the input's own rounding.
  nn::InterpolateFuncOptions o{.size = {7, 9}, .mode = "bilinear"};
  check4(GetParam(), kBFloat16, {1, 3, 4, 5}, o, {.nearest = false, .oh = 7, .ow = 9}, 0.05);
  check4(GetParam(), kFloat16, {1, 3, 4, 5}, o, {.nearest = false, .oh = 7, .ow = 9}, 0.006);
  check4(GetParam(), kFloat16, {1, 3, 4, 5}, {.size = {7, 9}}, {.nearest = true, .oh = 7, .ow = 9}, 0.006);
}

TEST_P(Interp, ThreeDNearestAndLinear) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device d = to_device(GetParam());
  // PyTorch: linear, size 4 from [1, 2] gives [1, 1.25, 1.75, 2]; align_corners [1, 4/3, 5/3, 2].
  auto x = tg::tensor(std::vector<double>{1, 2}, {1, 1, 2}).to(d);
  expect_near_vec(host(F::interpolate(x, {.size = 4, .mode = "linear"})), {1, 1.25, 1.75, 2}, 1e-15, 0, "linear");
  expect_near_vec(host(F::interpolate(x, {.size = 4, .mode = "linear", .align_corners = true})),
                  {1, 4.0 / 3, 5.0 / 3, 2}, 1e-15, 0, "linear align");
  expect_near_vec(host(F::interpolate(x, {.scale_factor = 2})), {1, 1, 2, 2}, 0, 0, "nearest");
  // against the reference (an H of 1) with gradients
  const auto xv = randv(2 * 3 * 6, 43);
  const auto gv = randv(2 * 3 * 10, 44);
  for (bool nearest : {true, false}) {
    const Ref r = reference({.nearest = nearest, .oh = 1, .ow = 10}, xv, 6, 1, 6, gv);
    auto x3 = tg::tensor(xv, {2, 3, 6}).to(d).requires_grad_();
    auto y = F::interpolate(x3, {.size = 10, .mode = nearest ? "nearest" : "linear"});
    ASSERT_EQ(y.sizes(), (Shape{2, 3, 10}));
    expect_near_vec(host(y), r.y, 1e-12, 1e-12, "y");
    y.backward(tg::tensor(gv, y.sizes()).to(d));
    expect_near_vec(host(x3.grad()), r.gx, 1e-12, 1e-12, "grad");
  }
}

TEST_P(Interp, ClosedForms) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device d = to_device(GetParam());
  auto x = tg::tensor(std::vector<double>{1, 2, 3, 4}, {1, 1, 2, 2}).to(d);
  expect_near_vec(host(F::interpolate(x, {.scale_factor = 2})),
                  {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}, 0, 0, "nearest x2");
  // bilinear 2x2 -> 3x3 with align_corners: the corners kept, midpoints averaged
  expect_near_vec(host(F::interpolate(x, {.size = 3, .mode = "bilinear", .align_corners = true})),
                  {1, 1.5, 2, 2, 2.5, 3, 3, 3.5, 4}, 1e-15, 0, "bilinear align");
  // bilinear 2x2 -> 4x4 without: rows/cols at weights 0, 1/4, 3/4, 1 (src = o / 2 - 1/4, clamped)
  auto y = host(F::interpolate(x, {.size = 4, .mode = "bilinear"}));
  const double row0[4] = {1, 1.25, 1.75, 2};
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(y[static_cast<size_t>(j)], row0[j], 1e-15);
  EXPECT_NEAR(y[4 * 1 + 0], 1.5, 1e-15);  // row weight 1/4 between rows [1, 2] and [3, 4], column 0
  // the gradient of sum(nearest x2) is 4 everywhere
  auto xg = x.detach().requires_grad_();
  F::interpolate(xg, {.scale_factor = 2}).sum().backward();
  expect_near_vec(host(xg.grad()), {4, 4, 4, 4}, 0, 0, "grad");
}

TEST_P(Interp, ScaleFactorVsSize) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device d = to_device(GetParam());
  // W = 5, scale_factor 1.7: 8 outputs; indices floor(o / 1.7) differ from floor(o * 5 / 8) at o = 5.
  auto x = tg::arange(5).to(kFloat64).view({1, 1, 1, 5}).to(d);
  const auto by_scale = host(F::interpolate(x, {.scale_factor = {1.0, 1.7}}));
  const auto by_size = host(F::interpolate(x, {.size = {1, 8}}));
  EXPECT_EQ(by_scale, (std::vector<double>{0, 0, 1, 1, 2, 2, 3, 4}));
  EXPECT_EQ(by_size, (std::vector<double>{0, 0, 1, 1, 2, 3, 3, 4}));
  // recompute_scale_factor: the scale is dropped, as with the size
  EXPECT_EQ(host(F::interpolate(x, {.scale_factor = {1.0, 1.7}, .recompute_scale_factor = true})), by_size);
  // bilinear: the ratio 1 / 1.7 vs 5 / 8
  auto b1 = host(F::interpolate(x, {.scale_factor = {1.0, 1.7}, .mode = "bilinear"}));
  auto b2 = host(F::interpolate(x, {.size = {1, 8}, .mode = "bilinear"}));
  EXPECT_NEAR(b1[3], 3.5 / 1.7 - 0.5, 1e-12);
  EXPECT_NEAR(b2[3], 3.5 * 5 / 8 - 0.5, 1e-12);
}

TEST_P(Interp, NonContiguousInput) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  tg::manual_seed(45);
  auto base = tg::randn({2, 6, 5, 3}, TensorOptions().dtype(kFloat64).device(to_device(GetParam())));
  auto xv = base.permute({0, 3, 2, 1}).requires_grad_();  // [2, 3, 5, 6]
  ASSERT_FALSE(xv.is_contiguous());
  auto xc = xv.detach().contiguous().requires_grad_();
  for (const char* mode : {"nearest", "bilinear"}) {
    auto yv = F::interpolate(xv, {.size = {7, 4}, .mode = mode});
    auto yc = F::interpolate(xc, {.size = {7, 4}, .mode = mode});
    expect_near_vec(host(yv), host(yc), 0, 0, mode);
    (yv * yv).sum().backward();
    (yc * yc).sum().backward();
    expect_near_vec(host(xv.grad()), host(xc.grad()), 1e-12, 1e-12, mode);
  }
}

TEST_P(Interp, Gradcheck) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  tg::manual_seed(46);
  const auto opts = TensorOptions().dtype(kFloat64).device(to_device(GetParam()));
  for (const nn::InterpolateFuncOptions& o :
       {nn::InterpolateFuncOptions{.size = {5, 3}}, nn::InterpolateFuncOptions{.size = {5, 7}, .mode = "bilinear"},
        nn::InterpolateFuncOptions{.scale_factor = 1.5, .mode = "bilinear", .align_corners = true}}) {
    auto rep = tg::autograd::gradcheck([&](const std::vector<Tensor>& in) { return F::interpolate(in[0], o); },
                                       {tg::randn({2, 2, 3, 4}, opts).requires_grad_()});
    EXPECT_TRUE(rep.ok) << o.mode << " " << rep;
  }
}

TEST(Interp, CudaMatchesCpu) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  tg::manual_seed(47);
  auto x = tg::randn({3, 4, 17, 23});
  for (const nn::InterpolateFuncOptions& o :
       {nn::InterpolateFuncOptions{.size = {40, 9}}, nn::InterpolateFuncOptions{.scale_factor = {2.3, 0.7}},
        nn::InterpolateFuncOptions{.size = {33, 50}, .mode = "bilinear"},
        nn::InterpolateFuncOptions{.scale_factor = 1.9, .mode = "bilinear", .align_corners = true}}) {
    auto xc = x.detach().requires_grad_();
    auto xg = x.to(kCUDA).requires_grad_();
    auto yc = F::interpolate(xc, o);
    auto yg = F::interpolate(xg, o);
    ASSERT_EQ(yc.sizes(), yg.sizes());
    // the same per-element formula on both; only fused multiply-adds may differ (a few float ulps)
    expect_near_vec(host(yg), host(yc), 1e-6, 1e-6, o.mode + " y");
    auto g = tg::randn(yc.sizes());
    yc.backward(g);
    yg.backward(g.to(kCUDA));
    expect_near_vec(host(xg.grad()), host(xc.grad()), 1e-5, 1e-5, o.mode + " grad");
  }
}

template <typename Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const tg::Error& e) {
    const std::string m = e.what();
    for (const auto& p : parts) EXPECT_NE(m.find(p), std::string::npos) << "'" << p << "' not in: " << m;
  }
}

TEST(Interp, BadInput) {
  auto x = tg::randn({1, 2, 3, 4});
  expect_error([&] { F::interpolate(x, {}); }, {"interpolate", "either size or scale_factor"});
  expect_error([&] { F::interpolate(x, {.size = 4, .scale_factor = 2}); }, {"interpolate", "only one of size"});
  expect_error([&] { F::interpolate(x, {.size = {1, 2, 3}}); }, {"interpolate", "[1, 2, 3, 4]", "[1, 2, 3]"});
  expect_error([&] { F::interpolate(x, {.size = 4, .mode = "bicubic"}); }, {"interpolate", "bicubic"});
  expect_error([&] { F::interpolate(x, {.size = 4, .mode = "linear"}); }, {"interpolate", "linear mode needs 3D"});
  expect_error([&] { F::interpolate(tg::randn({1, 2, 3}), {.size = 4, .mode = "bilinear"}); },
               {"interpolate", "bilinear mode needs 4D"});
  expect_error([&] { F::interpolate(x, {.size = 4, .align_corners = true}); }, {"interpolate", "align_corners"});
  expect_error([&] { F::interpolate(x, {.size = {0, 4}}); }, {"interpolate", "greater than 0", "[1, 2, 3, 4]"});
  expect_error([&] { F::interpolate(x, {.scale_factor = 0.2}); }, {"interpolate", "greater than 0"});
  expect_error([&] { F::interpolate(x, {.scale_factor = -1.0}); }, {"interpolate", "scale_factor", "-1"});
  expect_error([&] { F::interpolate(x, {.size = 5, .recompute_scale_factor = true}); },
               {"interpolate", "recompute_scale_factor"});
  expect_error([&] { F::interpolate(tg::randn({2, 3}), {.size = 4}); }, {"interpolate", "[2, 3]"});
  expect_error([&] { F::interpolate(tg::ones({1, 1, 2, 2}, kInt64), {.size = 4}); }, {"interpolate", "floating"});
}

TEST(Interp, UpsampleModuleAndExport) {
  tg::manual_seed(48);
  nn::Upsample up({.scale_factor = 2, .mode = "bilinear", .align_corners = false});
  EXPECT_EQ(up.name(), "Upsample");
  EXPECT_TRUE(up.parameters().empty());
  auto x = tg::randn({2, 3, 4, 5});
  auto y = up(x);
  EXPECT_EQ(y.sizes(), (Shape{2, 3, 8, 10}));
  expect_near_vec(host(y), host(F::interpolate(x, {.scale_factor = 2, .mode = "bilinear"})), 0, 0, "module");
  auto ep = tg::export_module(up, {x});
  EXPECT_NE(ep.graph().find("interpolate("), std::string::npos) << ep.graph();
  expect_near_vec(host(ep.run({x})[0]), host(y), 0, 0, "export");
}

}  // namespace
}  // namespace tg::testing
