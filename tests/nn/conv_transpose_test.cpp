// conv_transpose1d / conv_transpose2d and the modules ConvTranspose1d / ConvTranspose2d (issue 17):
// forward and gradients against a direct float64 scatter loop written here (each input element
// adds x * w into the output window it spreads to), gradcheck, non-contiguous inputs, half
// precision, errors, init, forward(x, output_size), autocast.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tests/autograd/common.h"

namespace tg::testing {
namespace {

namespace F = tg::nn::functional;

struct Case {
  int64_t n, c, h, w, co, kh, kw;  // c: in channels, co: out channels
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, oph = 0, opw = 0, dh = 1, dw = 1, groups = 1;
  bool bias = true;
};

struct Ref {
  int64_t oh = 0, ow = 0;
  std::vector<double> y, gx, gw, gb;
};

// The scatter formulation: y[n, co, i * s - p + k * d] += x[n, ci, i] * w[ci, co % cog, k];
// gradients of the same sum for the upstream gradient g (when given).
Ref ref_convt(const Case& k, const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
              const std::vector<double>& g = {}) {
  Ref r;
  r.oh = (k.h - 1) * k.sh - 2 * k.ph + k.dh * (k.kh - 1) + k.oph + 1;
  r.ow = (k.w - 1) * k.sw - 2 * k.pw + k.dw * (k.kw - 1) + k.opw + 1;
  const int64_t cg = k.c / k.groups, cog = k.co / k.groups;
  r.y.assign(static_cast<size_t>(k.n * k.co * r.oh * r.ow), 0);
  r.gx.assign(x.size(), 0);
  r.gw.assign(w.size(), 0);
  r.gb.assign(static_cast<size_t>(k.co), 0);
  auto yi = [&](int64_t n, int64_t o, int64_t oh, int64_t ow) {
    return static_cast<size_t>(((n * k.co + o) * r.oh + oh) * r.ow + ow);
  };
  for (int64_t n = 0; n < k.n; ++n)
    for (int64_t o = 0; o < k.co; ++o)
      for (int64_t oh = 0; oh < r.oh; ++oh)
        for (int64_t ow = 0; ow < r.ow; ++ow) {
          if (!b.empty()) r.y[yi(n, o, oh, ow)] = b[static_cast<size_t>(o)];
          if (!g.empty()) r.gb[static_cast<size_t>(o)] += g[yi(n, o, oh, ow)];
        }
  for (int64_t n = 0; n < k.n; ++n)
    for (int64_t ci = 0; ci < k.c; ++ci)
      for (int64_t ih = 0; ih < k.h; ++ih)
        for (int64_t iw = 0; iw < k.w; ++iw) {
          const size_t xi = static_cast<size_t>(((n * k.c + ci) * k.h + ih) * k.w + iw);
          const int64_t grp = ci / cg;
          for (int64_t ol = 0; ol < cog; ++ol) {
            const int64_t o = grp * cog + ol;
            for (int64_t i = 0; i < k.kh; ++i)
              for (int64_t j = 0; j < k.kw; ++j) {
                const int64_t oh = ih * k.sh - k.ph + i * k.dh, ow = iw * k.sw - k.pw + j * k.dw;
                if (oh < 0 || oh >= r.oh || ow < 0 || ow >= r.ow) continue;
                const size_t wi = static_cast<size_t>(((ci * cog + ol) * k.kh + i) * k.kw + j);
                r.y[yi(n, o, oh, ow)] += x[xi] * w[wi];
                if (!g.empty()) {
                  r.gx[xi] += g[yi(n, o, oh, ow)] * w[wi];
                  r.gw[wi] += g[yi(n, o, oh, ow)] * x[xi];
                }
              }
          }
        }
  return r;
}

nn::ConvTranspose2dFuncOptions opts2(const Case& k) {
  return {.stride = {k.sh, k.sw},
          .padding = {k.ph, k.pw},
          .output_padding = {k.oph, k.opw},
          .groups = k.groups,
          .dilation = {k.dh, k.dw}};
}

std::vector<double> randv(size_t n, uint64_t seed) {
  tg::manual_seed(seed);
  return host(tg::randn({static_cast<int64_t>(n)}, kFloat64));
}

void check_convt2d(const Case& k, DType dt, double tol) {
  SCOPED_TRACE(::testing::Message() << "n" << k.n << " c" << k.c << " " << k.h << "x" << k.w << " co" << k.co << " k"
                                    << k.kh << "x" << k.kw << " s" << k.sh << "," << k.sw << " p" << k.ph << "," << k.pw
                                    << " op" << k.oph << "," << k.opw << " d" << k.dh << "," << k.dw << " g" << k.groups
                                    << " " << dtype_name(dt));
  const auto xv = randv(static_cast<size_t>(k.n * k.c * k.h * k.w), 1);
  const auto wv = randv(static_cast<size_t>(k.c * (k.co / k.groups) * k.kh * k.kw), 2);
  const auto bv = k.bias ? randv(static_cast<size_t>(k.co), 3) : std::vector<double>{};
  const Ref r0 = ref_convt(k, xv, wv, bv);
  const auto gv = randv(r0.y.size(), 4);
  const Ref r = ref_convt(k, xv, wv, bv, gv);
  auto x = tg::tensor(xv, {k.n, k.c, k.h, k.w}).to(dt).requires_grad_();
  auto w = tg::tensor(wv, {k.c, k.co / k.groups, k.kh, k.kw}).to(dt).requires_grad_();
  Tensor b = k.bias ? tg::tensor(bv, {k.co}).to(dt).requires_grad_() : Tensor();
  auto y = F::conv_transpose2d(x, w, b, opts2(k));
  ASSERT_EQ(y.sizes(), (Shape{k.n, k.co, r.oh, r.ow}));
  ASSERT_EQ(y.dtype(), dt);
  expect_near_vec(host(y), r.y, tol, tol, "y");
  y.backward(tg::tensor(gv, y.sizes()).to(dt));
  expect_near_vec(host(x.grad()), r.gx, tol, tol, "grad x");
  expect_near_vec(host(w.grad()), r.gw, tol, tol, "grad weight");
  if (k.bias) expect_near_vec(host(b.grad()), r.gb, tol, tol, "grad bias");
}

std::vector<Case> cases() {
  std::vector<Case> v;
  v.push_back({.n = 2, .c = 3, .h = 4, .w = 5, .co = 4, .kh = 3, .kw = 3});
  v.push_back({.n = 2, .c = 3, .h = 4, .w = 5, .co = 2, .kh = 3, .kw = 3, .sh = 2, .sw = 2, .ph = 1, .pw = 1});
  // output_padding below the stride, unequal strides
  v.push_back({.n = 1,
               .c = 2,
               .h = 3,
               .w = 4,
               .co = 3,
               .kh = 3,
               .kw = 2,
               .sh = 2,
               .sw = 3,
               .ph = 1,
               .pw = 0,
               .oph = 1,
               .opw = 2});
  // output_padding not below the stride but below the dilation (PyTorch allows it)
  v.push_back(
      {.n = 2, .c = 2, .h = 4, .w = 3, .co = 2, .kh = 2, .kw = 3, .ph = 1, .oph = 1, .dh = 2, .dw = 2, .bias = false});
  // groups, and depthwise with a multiplier
  v.push_back({.n = 2, .c = 4, .h = 3, .w = 3, .co = 6, .kh = 3, .kw = 1, .sh = 2, .ph = 1, .oph = 1, .groups = 2});
  v.push_back({.n = 3,
               .c = 3,
               .h = 5,
               .w = 4,
               .co = 6,
               .kh = 3,
               .kw = 3,
               .sh = 1,
               .sw = 2,
               .ph = 1,
               .pw = 2,
               .opw = 1,
               .dh = 2,
               .groups = 3});
  // 1x1, and padding that crops most of the output
  v.push_back({.n = 4, .c = 5, .h = 3, .w = 2, .co = 7, .kh = 1, .kw = 1});
  v.push_back({.n = 1, .c = 2, .h = 2, .w = 2, .co = 2, .kh = 4, .kw = 4, .sh = 2, .sw = 2, .ph = 2, .pw = 2});
  return v;
}

TEST(ConvTranspose2d, Float64MatchesScatterLoop) {
  for (const Case& k : cases()) check_convt2d(k, kFloat64, 1e-12);
}

TEST(ConvTranspose2d, Float32MatchesScatterLoop) {
  for (const Case& k : cases()) check_convt2d(k, kFloat32, 2e-5);
}

TEST(ConvTranspose2d, BFloat16AndFloat16ComputeInFloat) {
  // Operands rounded once to the narrow type, sums in float, the result rounded once: bfloat16's
  // 8-bit mantissa gives ~0.4% per rounding on values of size ~3 (hence 0.08), float16's 11 bits 0.01.
  Case k{.n = 2,
         .c = 4,
         .h = 4,
         .w = 4,
         .co = 4,
         .kh = 3,
         .kw = 3,
         .sh = 2,
         .sw = 2,
         .ph = 1,
         .pw = 1,
         .oph = 1,
         .opw = 1,
         .groups = 2};
  check_convt2d(k, kBFloat16, 0.08);
  check_convt2d(k, kFloat16, 0.01);
}

TEST(ConvTranspose2d, SmallClosedForm) {
  // stride 2, a 2x2 kernel of ones: every input pixel becomes a 2x2 block of itself.
  auto x = tg::tensor(std::vector<double>{1, 2, 3, 4}, {1, 1, 2, 2});
  auto w = tg::ones({1, 1, 2, 2}, kFloat64);
  auto y = F::conv_transpose2d(x, w, Tensor(), {.stride = 2});
  EXPECT_EQ(host(y), (std::vector<double>{1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}));
  // 1-d, stride 2, kernel [1, 10], bias 0.5: y[2i] = x[i] + 0.5, y[2i + 1] = 10 x[i] + 0.5; output_padding adds
  // one element that only the bias reaches.
  auto y1 = F::conv_transpose1d(tg::tensor(std::vector<double>{1, 2, 3}, {1, 1, 3}),
                                tg::tensor(std::vector<double>{1, 10}, {1, 1, 2}),
                                tg::tensor(std::vector<double>{0.5}, {1}), {.stride = 2, .output_padding = 1});
  EXPECT_EQ(host(y1), (std::vector<double>{1.5, 10.5, 2.5, 20.5, 3.5, 30.5, 0.5}));
}

TEST(ConvTranspose2d, IsTheInputGradientOfConv2d) {
  // <conv_transpose2d(g, w), x> == <g, conv2d(x, w)> for the same stride / padding / dilation / groups.
  tg::manual_seed(21);
  auto x = tg::randn({2, 4, 9, 8}, kFloat64);
  auto w = tg::randn({6, 2, 3, 2}, kFloat64);
  auto y = F::conv2d(x, w, Tensor(), {.stride = {2, 3}, .padding = {1, 1}, .dilation = {2, 1}, .groups = 2});
  auto g = tg::randn(y.sizes(), kFloat64);
  // conv2d's output is 4 x 3; back to 9 x 8: (4 - 1) * 2 - 2 + 2 * 2 + 1 = 9, (3 - 1) * 3 - 2 + 1 + 1 + 2 = 8
  // with output_padding 2 in W.
  auto xt = F::conv_transpose2d(
      g, w, Tensor(), {.stride = {2, 3}, .padding = {1, 1}, .output_padding = {0, 2}, .groups = 2, .dilation = {2, 1}});
  ASSERT_EQ(xt.sizes(), x.sizes());
  EXPECT_NEAR((xt * x).sum().item<double>(), (g * y).sum().item<double>(), 1e-9);
}

TEST(ConvTranspose2d, UnbatchedAndConvTranspose1d) {
  tg::manual_seed(22);
  auto x = tg::randn({3, 4, 5}, kFloat64);
  auto w = tg::randn({3, 2, 2, 3}, kFloat64);
  auto b = tg::randn({2}, kFloat64);
  auto y = F::conv_transpose2d(x, w, b, {.stride = 2, .padding = 1});
  auto yb = F::conv_transpose2d(x.unsqueeze(0), w, b, {.stride = 2, .padding = 1});
  ASSERT_EQ(y.sizes(), (Shape{2, 6, 9}));  // (4 - 1) * 2 - 2 + 1 + 1, (5 - 1) * 2 - 2 + 2 + 1
  expect_near_vec(host(y), host(yb), 0, 0, "unbatched");
  // conv_transpose1d is conv_transpose2d with a unit H dim, checked against the scatter loop.
  Case k{.n = 2, .c = 4, .h = 1, .w = 7, .co = 6, .kh = 1, .kw = 3, .sw = 3, .pw = 1, .opw = 2, .dw = 2, .groups = 2};
  const auto xv = randv(2 * 4 * 7, 31), wv = randv(4 * 3 * 3, 32), bv = randv(6, 33);
  const Ref r0 = ref_convt(k, xv, wv, bv);
  const auto gv = randv(r0.y.size(), 34);
  const Ref r = ref_convt(k, xv, wv, bv, gv);
  auto x1 = tg::tensor(xv, {2, 4, 7}).requires_grad_();
  auto w1 = tg::tensor(wv, {4, 3, 3}).requires_grad_();
  auto b1 = tg::tensor(bv, {6}).requires_grad_();
  auto y1 =
      F::conv_transpose1d(x1, w1, b1, {.stride = 3, .padding = 1, .output_padding = 2, .groups = 2, .dilation = 2});
  ASSERT_EQ(y1.sizes(), (Shape{2, 6, r.ow}));
  expect_near_vec(host(y1), r.y, 1e-12, 1e-12, "y");
  y1.backward(tg::tensor(gv, y1.sizes()));
  expect_near_vec(host(x1.grad()), r.gx, 1e-12, 1e-12, "grad x");
  expect_near_vec(host(w1.grad()), r.gw, 1e-12, 1e-12, "grad weight");
  expect_near_vec(host(b1.grad()), r.gb, 1e-12, 1e-12, "grad bias");
}

TEST(ConvTranspose2d, NonContiguousInputs) {
  tg::manual_seed(23);
  auto base = tg::randn({2, 5, 4, 3}, kFloat64);  // [N, W, H, C] permuted to [N, C, H, W]
  auto xv = base.permute({0, 3, 2, 1}).requires_grad_();
  ASSERT_FALSE(xv.is_contiguous());
  auto xc = xv.detach().contiguous().requires_grad_();
  auto wt = tg::randn({4, 3, 3, 3}, kFloat64).transpose(0, 1);  // [3, 4, 3, 3], non-contiguous
  ASSERT_FALSE(wt.is_contiguous());
  const nn::ConvTranspose2dFuncOptions o{.stride = 2, .padding = 1, .output_padding = 1};
  auto yv = F::conv_transpose2d(xv, wt, Tensor(), o);
  auto yc = F::conv_transpose2d(xc, wt.contiguous(), Tensor(), o);
  expect_near_vec(host(yv), host(yc), 1e-12, 0, "y");
  (yv * yv).sum().backward();
  (yc * yc).sum().backward();
  expect_near_vec(host(xv.grad()), host(xc.grad()), 1e-10, 1e-12, "grad x");
}

TEST(ConvTranspose2d, Gradcheck) {
  tg::manual_seed(24);
  auto rep = tg::autograd::gradcheck(
      [](const std::vector<Tensor>& in) {
        return F::conv_transpose2d(
            in[0], in[1], in[2],
            {.stride = {2, 1}, .padding = {1, 0}, .output_padding = {1, 0}, .groups = 2, .dilation = {1, 2}});
      },
      {tg::randn({2, 4, 3, 4}, kFloat64).requires_grad_(), tg::randn({4, 3, 3, 2}, kFloat64).requires_grad_(),
       tg::randn({6}, kFloat64).requires_grad_()});
  EXPECT_TRUE(rep.ok) << rep;
  auto nc = tg::autograd::gradcheck(
      [](const std::vector<Tensor>& in) {
        return F::conv_transpose1d(in[0].transpose(1, 2), in[1], Tensor(), {.stride = 2, .output_padding = 1});
      },
      {tg::randn({2, 5, 3}, kFloat64).requires_grad_(), tg::randn({3, 2, 3}, kFloat64).requires_grad_()});
  EXPECT_TRUE(nc.ok) << nc;
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

TEST(ConvTranspose2d, BadInputNamesOpAndShapes) {
  auto x = tg::randn({2, 4, 5, 5});
  expect_error(
      [&] {
        F::conv_transpose2d(x, tg::randn({3, 2, 3, 3}));
      },
      {"conv_transpose2d", "[2, 4, 5, 5]", "[3, 2, 3, 3]"});
  expect_error(
      [&] {
        F::conv_transpose2d(x, tg::randn({4, 2, 3, 3}), Tensor(), {.stride = 2, .output_padding = 2});
      },
      {"conv_transpose2d", "output padding must be smaller than either stride or dilation", "output_padding 2"});
  expect_error(
      [&] {
        F::conv_transpose2d(x, tg::randn({4, 2, 3, 3}), Tensor(), {.groups = 3});
      },
      {"conv_transpose2d", "groups 3", "in_channels 4"});
  expect_error(
      [&] {
        F::conv_transpose2d(x, tg::randn({4, 2, 3, 3}), tg::randn({2}), {.groups = 2});
      },
      {"conv_transpose2d", "bias of shape [2]", "groups 2", "expected [4]"});  // C_out = 2 * groups
}

TEST(ConvTranspose2d, MoreBadInput) {
  auto x = tg::randn({2, 4, 5, 5});
  expect_error(
      [&] {
        F::conv_transpose2d(x, tg::randn({4, 2, 3, 3}), tg::randn({3}));
      },
      {"conv_transpose2d", "bias of shape [3]", "expected [2]"});
  expect_error(
      [&] {
        F::conv_transpose2d(tg::randn({1, 1, 1, 1}), tg::randn({1, 1, 1, 1}), Tensor(), {.padding = 1});
      },
      {"conv_transpose2d", "output size is too small"});
  expect_error(
      [&] {
        F::conv_transpose2d(x, tg::randn({4, 2, 3, 3}, kFloat64));
      },
      {"conv_transpose2d", "float64", "float32"});
  expect_error(
      [&] {
        F::conv_transpose2d(tg::randn({5, 5}), tg::randn({4, 2, 3, 3}));
      },
      {"conv_transpose2d", "[5, 5]"});
  expect_error(
      [&] {
        F::conv_transpose1d(tg::randn({2, 4, 5}), tg::randn({3, 2, 3}));
      },
      {"conv_transpose1d", "[2, 4, 5]", "[3, 2, 3]"});
  expect_error([&] { nn::ConvTranspose2d(4, 6, 3, {.groups = 4}); }, {"ConvTranspose2d", "out_channels 6", "groups 4"});
  expect_error([&] { nn::ConvTranspose2d(4, 6, 3, {.stride = 2, .output_padding = 2}); },
               {"ConvTranspose2d", "output padding"});
  nn::ConvTranspose2d m(2, 2, 3, {.stride = 2, .padding = 1});
  expect_error(
      [&] {
        m.forward(tg::randn({1, 2, 4, 4}), {9, 9});
      },
      {"ConvTranspose2d", "valid sizes range from 7 to 8"});
}

TEST(ConvTranspose2d, ModuleShapesNamesInitAndOutputSize) {
  nn::ConvTranspose2d m(8, 6, 3, {.stride = 2, .padding = 1, .output_padding = 1, .groups = 2});
  EXPECT_EQ(m.weight.sizes(), (Shape{8, 3, 3, 3}));
  EXPECT_EQ(m.bias.sizes(), (Shape{6}));
  EXPECT_EQ(m.state_dict().keys(), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(m.name(), "ConvTranspose2d");
  // PyTorch's fan_in of this layout: weight.size(1) * kh * kw = 27; bound 1 / sqrt(27) for both.
  const double bound = 1.0 / std::sqrt(27.0);
  for (const Tensor& t : {m.weight, m.bias})
    for (double e : host(t)) EXPECT_LE(std::abs(e), bound);
  nn::ConvTranspose2d big(16, 64, 4);  // fan_in 64 * 16 = 1024: bound 1/32, variance bound^2 / 3
  const auto wv = host(big.weight);
  double mx = 0, sq = 0;
  for (double e : wv) mx = std::max(mx, std::abs(e)), sq += e * e;
  EXPECT_LE(mx, 1.0 / 32);
  EXPECT_GT(mx, 0.99 / 32);
  EXPECT_NEAR(sq / static_cast<double>(wv.size()), 1.0 / (32.0 * 32.0 * 3.0), 0.05 / (32.0 * 32.0));
  auto x = tg::randn({2, 8, 4, 5});
  auto y = m(x);
  EXPECT_EQ(y.sizes(), (Shape{2, 6, 8, 10}));
  expect_near_vec(
      host(y),
      host(F::conv_transpose2d(x, m.weight, m.bias, {.stride = 2, .padding = 1, .output_padding = 1, .groups = 2})), 0,
      0, "module");
  nn::ConvTranspose2d m0(8, 6, 3, {.stride = 2, .padding = 1, .groups = 2, .bias = false});
  EXPECT_EQ(m0.state_dict().keys(), std::vector<std::string>{"weight"});
  EXPECT_EQ(m0(x).sizes(), (Shape{2, 6, 7, 9}));
  EXPECT_EQ(m0.forward(x, {8, 9}).sizes(), (Shape{2, 6, 8, 9}));  // output_size picks output_padding (1, 0)
  EXPECT_EQ(m0.forward(x, {2, 6, 7, 10}).sizes(), (Shape{2, 6, 7, 10}));
  nn::ConvTranspose1d m1(3, 5, 4, {.stride = 2});
  EXPECT_EQ(m1.weight.sizes(), (Shape{3, 5, 4}));
  EXPECT_EQ(m1.name(), "ConvTranspose1d");
  auto y1 = m1(tg::randn({2, 3, 6}));
  EXPECT_EQ(y1.sizes(), (Shape{2, 5, 14}));
  y1.sum().backward();
  EXPECT_EQ(m1.weight.grad().sizes(), m1.weight.sizes());
}

TEST(ConvTranspose2d, AutocastLowersOnCpu) {
  tg::manual_seed(25);
  auto x = tg::randn({2, 3, 4, 4}).requires_grad_();
  auto w = tg::randn({3, 2, 3, 3}).requires_grad_();
  Tensor y;
  {
    tg::amp::autocast guard(kCPU);
    y = F::conv_transpose2d(x, w, Tensor(), {.stride = 2});
  }
  EXPECT_EQ(y.dtype(), kBFloat16);
  const auto want = host(F::conv_transpose2d(x.to(kBFloat16), w.to(kBFloat16), Tensor(), {.stride = 2}));
  expect_near_vec(host(y), want, 0, 0, "bf16");
  y.sum().backward();
  EXPECT_EQ(x.grad().dtype(), kFloat32);
}

TEST(ConvTranspose2d, ExportRunMatches) {
  tg::manual_seed(26);
  nn::ConvTranspose2d m(3, 4, {2, 3}, {.stride = 2, .padding = {0, 1}, .output_padding = 1});
  auto x = tg::randn({2, 3, 4, 5});
  auto ep = tg::export_module(m, {x});
  EXPECT_NE(ep.graph().find("conv_transpose2d("), std::string::npos) << ep.graph();
  auto out = ep.run({x});
  ASSERT_EQ(out.size(), 1u);
  expect_near_vec(host(out[0]), host(m(x)), 0, 0, "export");
}

TEST(ConvTranspose2d, CudaMatchesCpu) {
  // Runs once conv2d has a CUDA path (cuDNN): conv_transpose has no kernels of its own.
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  try {
    F::conv2d(tg::randn({1, 1, 3, 3}, kCUDA), tg::randn({1, 1, 1, 1}, kCUDA));
  } catch (const tg::Error& e) {
    if (std::string(e.what()).find("not built yet") != std::string::npos) GTEST_SKIP() << "conv2d has no CUDA path yet";
    throw;
  }
  // float32 exactly (TF32 is on by default, as torch.backends.cudnn.allow_tf32); restored below.
  struct Tf32Off {
    Tf32Off() { tg::backends::cudnn::set_allow_tf32(false); }
    ~Tf32Off() { tg::backends::cudnn::set_allow_tf32(true); }
  } tf32_off;
  for (const Case& k : cases()) {
    SCOPED_TRACE(::testing::Message() << "s" << k.sh << "," << k.sw << " op" << k.oph << "," << k.opw << " d" << k.dh
                                      << "," << k.dw << " g" << k.groups);
    tg::manual_seed(27);
    auto x = tg::randn({k.n, k.c, k.h, k.w});
    auto w = tg::randn({k.c, k.co / k.groups, k.kh, k.kw});
    auto b = tg::randn({k.co});
    auto xc = x.detach().requires_grad_(), wc = w.detach().requires_grad_(), bc = b.detach().requires_grad_();
    auto xg = x.to(kCUDA).requires_grad_(), wg = w.to(kCUDA).requires_grad_(), bg = b.to(kCUDA).requires_grad_();
    auto yc = F::conv_transpose2d(xc, wc, bc, opts2(k));
    auto yg = F::conv_transpose2d(xg, wg, bg, opts2(k));
    ASSERT_EQ(yc.sizes(), yg.sizes());
    // float32 sums in another order (cuDNN's algorithms; TF32 off): a few ulps of sums of ~30 terms
    expect_near_vec(host(yg), host(yc), 1e-4, 1e-4, "y");
    auto g = tg::randn(yc.sizes());
    yc.backward(g);
    yg.backward(g.to(kCUDA));
    expect_near_vec(host(xg.grad()), host(xc.grad()), 1e-4, 1e-4, "grad x");
    expect_near_vec(host(wg.grad()), host(wc.grad()), 1e-4, 1e-4, "grad weight");
    expect_near_vec(host(bg.grad()), host(bc.grad()), 1e-4, 1e-4, "grad bias");
  }
}

}  // namespace
}  // namespace tg::testing
