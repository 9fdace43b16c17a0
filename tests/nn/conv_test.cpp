// conv1d / conv2d and the modules Conv1d / Conv2d (issue 17): forward and gradients against a
// direct float64 convolution loop written here, gradcheck, non-contiguous inputs, errors, init.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tests/autograd/common.h"

namespace tg::testing {
namespace {

namespace F = tg::nn::functional;

struct Case {
  int64_t n, c, h, w, co, kh, kw;
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, groups = 1;
  bool same = false, bias = true;
};

struct Ref {
  int64_t oh = 0, ow = 0;
  std::vector<double> y, gx, gw, gb;
};

// Direct cross-correlation in float64, and its gradients for the upstream gradient g (when given).
Ref ref_conv(const Case& k, const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
             const std::vector<double>& g = {}) {
  int64_t pt = k.ph, pb = k.ph, pl = k.pw, pr = k.pw;
  if (k.same) {
    const int64_t th = k.dh * (k.kh - 1), tw = k.dw * (k.kw - 1);
    pt = th / 2, pb = th - pt, pl = tw / 2, pr = tw - pl;
  }
  Ref r;
  r.oh = (k.h + pt + pb - k.dh * (k.kh - 1) - 1) / k.sh + 1;
  r.ow = (k.w + pl + pr - k.dw * (k.kw - 1) - 1) / k.sw + 1;
  const int64_t cg = k.c / k.groups, cog = k.co / k.groups;
  r.y.assign(static_cast<size_t>(k.n * k.co * r.oh * r.ow), 0);
  r.gx.assign(x.size(), 0);
  r.gw.assign(w.size(), 0);
  r.gb.assign(static_cast<size_t>(k.co), 0);
  for (int64_t n = 0; n < k.n; ++n)
    for (int64_t o = 0; o < k.co; ++o)
      for (int64_t oh = 0; oh < r.oh; ++oh)
        for (int64_t ow = 0; ow < r.ow; ++ow) {
          const size_t yi = static_cast<size_t>(((n * k.co + o) * r.oh + oh) * r.ow + ow);
          const double gy = g.empty() ? 0 : g[yi];
          double acc = b.empty() ? 0 : b[static_cast<size_t>(o)];
          r.gb[static_cast<size_t>(o)] += gy;
          for (int64_t ci = 0; ci < cg; ++ci) {
            const int64_t c = (o / cog) * cg + ci;
            for (int64_t i = 0; i < k.kh; ++i)
              for (int64_t j = 0; j < k.kw; ++j) {
                const int64_t ih = oh * k.sh - pt + i * k.dh, iw = ow * k.sw - pl + j * k.dw;
                if (ih < 0 || ih >= k.h || iw < 0 || iw >= k.w) continue;
                const size_t xi = static_cast<size_t>(((n * k.c + c) * k.h + ih) * k.w + iw);
                const size_t wi = static_cast<size_t>(((o * cg + ci) * k.kh + i) * k.kw + j);
                acc += x[xi] * w[wi];
                r.gx[xi] += gy * w[wi];
                r.gw[wi] += gy * x[xi];
              }
          }
          r.y[yi] = acc;
        }
  return r;
}

nn::Conv2dFuncOptions opts2(const Case& k) {
  nn::Conv2dFuncOptions o{
      .stride = {k.sh, k.sw}, .padding = {k.ph, k.pw}, .dilation = {k.dh, k.dw}, .groups = k.groups};
  if (k.same) o.padding = "same";
  return o;
}

std::vector<double> randv(size_t n, uint64_t seed) {
  tg::manual_seed(seed);
  return host(tg::randn({static_cast<int64_t>(n)}, kFloat64));
}

// Forward and all three gradients of conv2d (relu: conv2d_relu) in `dt` against ref_conv (relu:
// max(y, 0), and the gradients of the upstream gradient masked where y <= 0).
void check_conv2d(const Case& k, DType dt, double tol, Device dev = kCPU, bool channels_last = false,
                  bool relu = false) {
  SCOPED_TRACE(::testing::Message() << "n" << k.n << " c" << k.c << " " << k.h << "x" << k.w << " co" << k.co << " k"
                                    << k.kh << "x" << k.kw << " s" << k.sh << "," << k.sw << " p" << k.ph << "," << k.pw
                                    << " d" << k.dh << "," << k.dw << " g" << k.groups << " same" << k.same << " "
                                    << dtype_name(dt) << " " << dev << (channels_last ? " channels_last" : "")
                                    << (relu ? " relu" : ""));
  const auto xv = randv(static_cast<size_t>(k.n * k.c * k.h * k.w), 1);
  const auto wv = randv(static_cast<size_t>(k.co * (k.c / k.groups) * k.kh * k.kw), 2);
  const auto bv = k.bias ? randv(static_cast<size_t>(k.co), 3) : std::vector<double>{};
  const Ref r0 = ref_conv(k, xv, wv, bv);
  auto gv = randv(r0.y.size(), 4);
  const auto g_in = gv;
  if (relu)
    for (size_t i = 0; i < gv.size(); ++i)
      if (r0.y[i] <= 0) gv[i] = 0;
  Ref r = ref_conv(k, xv, wv, bv, gv);
  if (relu)
    for (double& v : r.y) v = std::max(v, 0.0);
  auto x = tg::tensor(xv, {k.n, k.c, k.h, k.w}).to(dev, dt).requires_grad_();
  auto w = tg::tensor(wv, {k.co, k.c / k.groups, k.kh, k.kw}).to(dev, dt).requires_grad_();
  Tensor b = k.bias ? tg::tensor(bv, {k.co}).to(dev, dt).requires_grad_() : Tensor();
  auto xin = channels_last ? x.contiguous(MemoryFormat::ChannelsLast) : x;
  auto win = channels_last ? w.contiguous(MemoryFormat::ChannelsLast) : w;
  auto y = relu ? F::conv2d_relu(xin, win, b, opts2(k)) : F::conv2d(xin, win, b, opts2(k));
  ASSERT_EQ(y.sizes(), (Shape{k.n, k.co, r.oh, r.ow}));
  ASSERT_EQ(y.dtype(), dt);
  ASSERT_EQ(y.device(), x.device());
  if (channels_last) EXPECT_TRUE(y.is_contiguous(MemoryFormat::ChannelsLast)) << y.strides();
  expect_near_vec(host(y), r.y, tol, tol, "y");
  Tensor gy = tg::tensor(g_in, y.sizes()).to(dev, dt);
  y.backward(channels_last ? gy.contiguous(MemoryFormat::ChannelsLast) : gy);
  expect_near_vec(host(x.grad()), r.gx, tol, tol, "grad x");
  expect_near_vec(host(w.grad()), r.gw, tol, tol, "grad weight");
  if (k.bias) expect_near_vec(host(b.grad()), r.gb, tol, tol, "grad bias");
}

std::vector<Case> cases() {
  std::vector<Case> v;
  v.push_back({.n = 2, .c = 3, .h = 7, .w = 6, .co = 4, .kh = 3, .kw = 3, .ph = 1, .pw = 1});
  v.push_back({.n = 1, .c = 2, .h = 9, .w = 8, .co = 3, .kh = 3, .kw = 2, .sh = 2, .sw = 3, .ph = 2, .pw = 0});
  v.push_back({.n = 3, .c = 2, .h = 8, .w = 9, .co = 2, .kh = 3, .kw = 3, .dh = 2, .dw = 3, .bias = false});
  v.push_back({.n = 2, .c = 4, .h = 5, .w = 6, .co = 6, .kh = 3, .kw = 1, .ph = 1, .groups = 2});
  // depthwise with a channel multiplier of 2
  v.push_back(
      {.n = 5, .c = 3, .h = 6, .w = 5, .co = 6, .kh = 3, .kw = 3, .sh = 2, .sw = 1, .ph = 1, .pw = 1, .groups = 3});
  // "same" with even kernels (odd totals: the extra row / column at the end), and with dilation
  v.push_back({.n = 2, .c = 2, .h = 5, .w = 6, .co = 3, .kh = 4, .kw = 2, .same = true});
  v.push_back({.n = 1, .c = 2, .h = 7, .w = 6, .co = 2, .kh = 2, .kw = 3, .dh = 3, .dw = 2, .same = true});
  // 1x1, and a kernel exactly the padded input
  v.push_back({.n = 4, .c = 5, .h = 3, .w = 4, .co = 7, .kh = 1, .kw = 1});
  v.push_back({.n = 2, .c = 2, .h = 2, .w = 3, .co = 2, .kh = 4, .kw = 3, .ph = 1});
  return v;
}

TEST(Conv2d, Float64MatchesDirectLoop) {
  for (const Case& k : cases()) check_conv2d(k, kFloat64, 1e-12);
}

// ResNet-18's convolutions at CIFAR size (batch 16): big enough for the CPU's threaded paths.
TEST(Conv2d, ResNetSizedFloat64MatchesDirectLoop) {
  check_conv2d({.n = 16, .c = 3, .h = 32, .w = 32, .co = 64, .kh = 7, .kw = 7, .sh = 2, .sw = 2, .ph = 3, .pw = 3,
                .bias = false},
               kFloat64, 1e-10);
  check_conv2d({.n = 16, .c = 64, .h = 8, .w = 8, .co = 64, .kh = 3, .kw = 3, .ph = 1, .pw = 1, .bias = false},
               kFloat64, 1e-10);
  check_conv2d({.n = 16, .c = 64, .h = 8, .w = 8, .co = 128, .kh = 3, .kw = 3, .sh = 2, .sw = 2, .ph = 1, .pw = 1,
                .bias = false},
               kFloat64, 1e-10);
  check_conv2d({.n = 16, .c = 128, .h = 4, .w = 4, .co = 256, .kh = 1, .kw = 1, .sh = 2, .sw = 2, .bias = false},
               kFloat64, 1e-10);
  check_conv2d({.n = 16, .c = 64, .h = 8, .w = 8, .co = 128, .kh = 3, .kw = 3, .sh = 2, .sw = 2, .ph = 1, .pw = 1,
                .bias = false},
               kFloat32, 1e-3);
}

TEST(Conv2d, Float32MatchesDirectLoop) {
  for (const Case& k : cases()) check_conv2d(k, kFloat32, 2e-5);
}

TEST(Conv2d, BFloat16AndFloat16ComputeInFloat) {
  Case k{.n = 2, .c = 4, .h = 5, .w = 5, .co = 4, .kh = 3, .kw = 3, .ph = 1, .pw = 1, .groups = 2};
  check_conv2d(k, kBFloat16, 0.08);
  check_conv2d(k, kFloat16, 0.01);
}

TEST(Conv2d, SameEvenKernelPadsTheEnd) {
  // A kernel of 2 with "same": output[i] = x[i] * w0 + x[i + 1] * w1 (x[L] = 0), as PyTorch.
  auto x = tg::tensor(std::vector<double>{1, 2, 3}, {1, 1, 1, 3});
  auto w = tg::tensor(std::vector<double>{10, 1}, {1, 1, 1, 2});
  auto y = F::conv2d(x, w, Tensor(), {.padding = "same"});
  EXPECT_EQ(host(y), (std::vector<double>{12, 23, 30}));
  auto y1 = F::conv1d(x.view({1, 1, 3}), w.view({1, 1, 2}), Tensor(), {.padding = "same"});
  EXPECT_EQ(host(y1), (std::vector<double>{12, 23, 30}));
  auto v = F::conv2d(x, w, Tensor(), {.padding = "valid"});
  EXPECT_EQ(host(v), (std::vector<double>{12, 23}));
}

TEST(Conv2d, UnbatchedMatchesBatched) {
  tg::manual_seed(5);
  auto x = tg::randn({3, 6, 5}, kFloat64);
  auto w = tg::randn({4, 3, 2, 3}, kFloat64);
  auto b = tg::randn({4}, kFloat64);
  auto y = F::conv2d(x, w, b, {.stride = 2, .padding = 1});
  auto yb = F::conv2d(x.unsqueeze(0), w, b, {.stride = 2, .padding = 1});
  ASSERT_EQ(y.sizes(), (Shape{4, 4, 3}));  // (6 + 2 - 2) / 2 + 1, (5 + 2 - 3) / 2 + 1
  expect_near_vec(host(y), host(yb), 0, 0, "unbatched");
}

TEST(Conv2d, NonContiguousInput) {
  tg::manual_seed(6);
  auto base = tg::randn({2, 7, 6, 3}, kFloat64);  // [N, W, H, C] permuted to [N, C, H, W]
  auto xv = base.permute({0, 3, 2, 1}).requires_grad_();
  ASSERT_FALSE(xv.is_contiguous());
  auto xc = xv.detach().contiguous().requires_grad_();
  auto wt = tg::randn({3, 4, 3, 3}, kFloat64).transpose(0, 1);  // a non-contiguous weight too
  auto yv = F::conv2d(xv, wt, Tensor(), {.padding = 1});
  auto yc = F::conv2d(xc, wt.contiguous(), Tensor(), {.padding = 1});
  expect_near_vec(host(yv), host(yc), 1e-12, 0, "y");
  (yv * yv).sum().backward();
  (yc * yc).sum().backward();
  expect_near_vec(host(xv.grad()), host(xc.grad()), 1e-10, 1e-12, "grad x");
}

TEST(Conv2d, Gradcheck) {
  tg::manual_seed(7);
  auto x = tg::randn({2, 4, 5, 6}, kFloat64).requires_grad_();
  auto w = tg::randn({6, 2, 3, 2}, kFloat64).requires_grad_();
  auto b = tg::randn({6}, kFloat64).requires_grad_();
  auto rep = tg::autograd::gradcheck(
      [](const std::vector<Tensor>& in) {
        return F::conv2d(in[0], in[1], in[2], {.stride = {2, 1}, .padding = {1, 2}, .dilation = {1, 2}, .groups = 2});
      },
      {x, w, b});
  EXPECT_TRUE(rep.ok) << rep;
  auto same = tg::autograd::gradcheck(
      [](const std::vector<Tensor>& in) {
        return F::conv2d(in[0], in[1], Tensor(), {.padding = "same", .dilation = 2});
      },
      {tg::randn({1, 2, 6, 5}, kFloat64).requires_grad_(), tg::randn({3, 2, 2, 4}, kFloat64).requires_grad_()});
  EXPECT_TRUE(same.ok) << same;
  // a non-contiguous input made inside fn
  auto nc = tg::autograd::gradcheck(
      [](const std::vector<Tensor>& in) { return F::conv2d(in[0].transpose(2, 3), in[1], in[2], {.padding = 1}); },
      {tg::randn({2, 3, 5, 4}, kFloat64).requires_grad_(), tg::randn({2, 3, 3, 3}, kFloat64).requires_grad_(),
       tg::randn({2}, kFloat64).requires_grad_()});
  EXPECT_TRUE(nc.ok) << nc;
}

TEST(Conv1d, MatchesDirectLoop) {
  struct C1 {
    int64_t n, c, l, co, k, s, p, d, g;
    bool same;
  };
  for (const C1& c : std::vector<C1>{{2, 3, 10, 4, 3, 1, 1, 1, 1, false},
                                     {3, 4, 11, 2, 2, 3, 2, 2, 2, false},
                                     {2, 4, 9, 8, 3, 1, 0, 1, 4, false},
                                     {1, 2, 7, 3, 4, 1, 0, 1, 1, true},
                                     {2, 2, 8, 2, 3, 1, 0, 3, 2, true}}) {
    SCOPED_TRACE(::testing::Message() << "l" << c.l << " k" << c.k << " s" << c.s << " p" << c.p << " d" << c.d << " g"
                                      << c.g << " same" << c.same);
    Case k{.n = c.n,
           .c = c.c,
           .h = 1,
           .w = c.l,
           .co = c.co,
           .kh = 1,
           .kw = c.k,
           .sw = c.s,
           .pw = c.p,
           .dw = c.d,
           .groups = c.g,
           .same = c.same};
    const auto xv = randv(static_cast<size_t>(c.n * c.c * c.l), 11);
    const auto wv = randv(static_cast<size_t>(c.co * (c.c / c.g) * c.k), 12);
    const auto bv = randv(static_cast<size_t>(c.co), 13);
    const Ref r0 = ref_conv(k, xv, wv, bv);
    const auto gv = randv(r0.y.size(), 14);
    const Ref r = ref_conv(k, xv, wv, bv, gv);
    auto x = tg::tensor(xv, {c.n, c.c, c.l}).requires_grad_();
    auto w = tg::tensor(wv, {c.co, c.c / c.g, c.k}).requires_grad_();
    auto b = tg::tensor(bv, {c.co}).requires_grad_();
    nn::Conv1dFuncOptions o{.stride = c.s, .padding = c.p, .dilation = c.d, .groups = c.g};
    if (c.same) o.padding = "same";
    auto y = F::conv1d(x, w, b, o);
    ASSERT_EQ(y.sizes(), (Shape{c.n, c.co, r.ow}));
    expect_near_vec(host(y), r.y, 1e-12, 1e-12, "y");
    y.backward(tg::tensor(gv, y.sizes()));
    expect_near_vec(host(x.grad()), r.gx, 1e-12, 1e-12, "grad x");
    expect_near_vec(host(w.grad()), r.gw, 1e-12, 1e-12, "grad weight");
    expect_near_vec(host(b.grad()), r.gb, 1e-12, 1e-12, "grad bias");
  }
}

TEST(Conv1d, GradcheckAndUnbatched) {
  tg::manual_seed(8);
  auto rep = tg::autograd::gradcheck(
      [](const std::vector<Tensor>& in) {
        return F::conv1d(in[0], in[1], in[2], {.stride = 2, .padding = 1, .dilation = 2, .groups = 2});
      },
      {tg::randn({2, 4, 9}, kFloat64).requires_grad_(), tg::randn({2, 2, 3}, kFloat64).requires_grad_(),
       tg::randn({2}, kFloat64).requires_grad_()});
  EXPECT_TRUE(rep.ok) << rep;
  auto x = tg::randn({3, 8}, kFloat64);
  auto w = tg::randn({5, 3, 3}, kFloat64);
  auto y = F::conv1d(x, w);
  ASSERT_EQ(y.sizes(), (Shape{5, 6}));
  expect_near_vec(host(y), host(F::conv1d(x.unsqueeze(0), w)), 0, 0, "unbatched");
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

TEST(Conv2d, BadInputNamesOpAndShapes) {
  auto x = tg::randn({2, 4, 5, 5});
  expect_error([&] { F::conv2d(x, tg::randn({3, 3, 3, 3})); }, {"conv2d", "[2, 4, 5, 5]", "[3, 3, 3, 3]"});
  expect_error(
      [&] {
        F::conv2d(x, tg::randn({3, 2, 3, 3}), Tensor(), {.groups = 2});
      },
      {"conv2d", "groups 2", "out_channels 3"});
  expect_error(
      [&] {
        F::conv2d(tg::randn({1, 3, 5, 5}), tg::randn({4, 1, 3, 3}), Tensor(), {.groups = 2});
      },
      {"conv2d", "in_channels 3"});
  expect_error(
      [&] {
        F::conv2d(x, tg::randn({3, 4, 7, 3}));
      },
      {"conv2d", "larger than the padded input", "[3, 4, 7, 3]"});
  expect_error(
      [&] {
        F::conv2d(x, tg::randn({3, 4, 3, 3}), Tensor(), {.stride = 2, .padding = "same"});
      },
      {"conv2d", "'same'", "strided"});
  expect_error([&] { F::conv2d(x, tg::randn({3, 4, 3, 3}), tg::randn({4})); }, {"conv2d", "bias of shape [4]"});
  expect_error([&] { F::conv2d(x, tg::randn({3, 4, 3, 3}, kFloat64)); }, {"conv2d", "float64", "float32"});
  expect_error([&] { F::conv2d(tg::randn({5, 5}), tg::randn({3, 4, 3, 3})); }, {"conv2d", "[5, 5]"});
  expect_error([&] { F::conv2d(x, tg::randn({3, 4, 3, 3}), Tensor(), {.stride = 0}); }, {"conv2d", "stride"});
  expect_error([&] { F::conv1d(tg::randn({2, 4, 5}), tg::randn({3, 2, 3})); }, {"conv1d", "[2, 4, 5]", "[3, 2, 3]"});
  expect_error([&] { nn::Conv2dFuncOptions o{.padding = "full"}; }, {"padding", "full"});
  expect_error([&] { nn::Conv2dFuncOptions o{.stride = {1, 2, 3}}; }, {"expected 2"});
  expect_error([&] { nn::Conv2d(4, 6, 3, {.groups = 4}); }, {"Conv2d", "out_channels 6", "groups 4"});
  expect_error([&] { nn::Conv1d(4, 4, 3, {.stride = 2, .padding = "same"}); }, {"Conv1d", "'same'"});
}

TEST(Conv2d, ModuleShapesNamesAndInit) {
  nn::Conv2d conv(64, 32, 3, {.padding = 1});
  EXPECT_EQ(conv.weight.sizes(), (Shape{32, 64, 3, 3}));
  EXPECT_EQ(conv.bias.sizes(), (Shape{32}));
  EXPECT_EQ(conv.state_dict().keys(), (std::vector<std::string>{"weight", "bias"}));
  // kaiming_uniform(a = sqrt 5): bound = sqrt(6 / ((1 + 5) fan_in)) = 1 / sqrt(fan_in) = 1/24 here;
  // bias U(+-1/sqrt(fan_in)). Uniform: variance bound^2 / 3.
  const double bound = 1.0 / 24;
  for (const Tensor& t : {conv.weight, conv.bias}) {
    const auto v = host(t);
    double mx = 0, mean = 0, sq = 0;
    for (double e : v) mx = std::max(mx, std::abs(e)), mean += e, sq += e * e;
    mean /= static_cast<double>(v.size());
    sq /= static_cast<double>(v.size());
    EXPECT_LE(mx, bound);
    if (v.size() > 1000) {
      EXPECT_GT(mx, 0.99 * bound);
      EXPECT_NEAR(mean, 0, 0.05 * bound);
      EXPECT_NEAR(sq, bound * bound / 3, 0.05 * bound * bound);
    }
  }
  nn::Conv2d dw(8, 16, {3, 5}, {.stride = {2, 1}, .groups = 8, .bias = false});
  EXPECT_EQ(dw.weight.sizes(), (Shape{16, 1, 3, 5}));
  EXPECT_FALSE(dw.bias.defined());
  EXPECT_EQ(dw.state_dict().keys(), std::vector<std::string>{"weight"});
  const auto wv = host(dw.weight);
  EXPECT_LE(*std::max_element(wv.begin(), wv.end()), 1.0 / std::sqrt(15.0));
  auto x = tg::randn({2, 8, 9, 7});
  auto y = dw(x);
  EXPECT_EQ(y.sizes(), (Shape{2, 16, 4, 3}));
  expect_near_vec(host(y), host(F::conv2d(x, dw.weight, Tensor(), {.stride = {2, 1}, .groups = 8})), 0, 0, "module");
  EXPECT_EQ(conv.parameters().size(), 2u);
}

TEST(Conv1d, ModuleShapesNamesAndSame) {
  nn::Conv1d conv(3, 5, 4, {.padding = "same", .dilation = 2});
  EXPECT_EQ(conv.weight.sizes(), (Shape{5, 3, 4}));
  EXPECT_EQ(conv.state_dict().keys(), (std::vector<std::string>{"weight", "bias"}));
  const auto bv = host(conv.bias);
  for (double e : bv) EXPECT_LE(std::abs(e), 1.0 / std::sqrt(12.0));
  auto y = conv(tg::randn({2, 3, 11}));
  EXPECT_EQ(y.sizes(), (Shape{2, 5, 11}));
  y.sum().backward();
  EXPECT_EQ(conv.weight.grad().sizes(), conv.weight.sizes());
}

TEST(Conv2d, ExportRunMatches) {
  tg::manual_seed(9);
  nn::Conv2d conv(3, 4, {2, 3}, {.stride = 1, .padding = "same"});
  auto x = tg::randn({2, 3, 6, 5});
  auto ep = tg::export_module(conv, {x});
  auto out = ep.run({x});
  ASSERT_EQ(out.size(), 1u);
  expect_near_vec(host(out[0]), host(conv(x)), 0, 0, "export");
}

// The fused modules trace as the ops they fuse (conv2d / batch_norm, then relu): the exported
// program names a relu and gives the module's values, in training (batch statistics) and eval mode.
TEST(Conv2d, FusedReluModulesExportAsTheirTwoOps) {
  tg::manual_seed(12);
  nn::Sequential m(nn::ConvReLU2d(3, 4, 3, {.padding = 1}), nn::BatchNormReLU2d(4));
  auto x = tg::randn({2, 3, 6, 5});
  for (bool training : {true, false}) {
    m.train(training);
    auto ep = tg::export_module(m, {x});
    EXPECT_NE(ep.graph().find("relu"), std::string::npos) << ep.graph();
    auto out = ep.run({x});
    ASSERT_EQ(out.size(), 1u);
    expect_near_vec(host(out[0]), host(m.forward(x)), 1e-6, 1e-6, training ? "export train" : "export eval");
  }
}

TEST(Conv2d, AutocastLowersOnCpu) {
  // conv is matmul-like for autocast (PyTorch's lower-precision list): bfloat16 on the CPU.
  tg::manual_seed(10);
  auto x = tg::randn({2, 3, 5, 5}).requires_grad_();
  auto w = tg::randn({4, 3, 3, 3}).requires_grad_();
  Tensor y;
  {
    tg::amp::autocast guard(kCPU);
    y = F::conv2d(x, w, Tensor(), {.padding = 1});
  }
  EXPECT_EQ(y.dtype(), kBFloat16);
  const auto want = host(F::conv2d(x.to(kBFloat16), w.to(kBFloat16), Tensor(), {.padding = 1}));
  expect_near_vec(host(y), want, 0, 0, "bf16");
  y.sum().backward();
  EXPECT_EQ(x.grad().dtype(), kFloat32);
  EXPECT_EQ(w.grad().sizes(), w.sizes());
}

// Channels-last (NHWC strides) on the CPU: the same values and gradients, and the layout kept.
// conv2d_relu: conv + bias + ReLU fused (the CPU's epilogue), backward through the output's mask.
TEST(Conv2d, ReluFusedMatchesDirectLoop) {
  for (const Case& k : cases()) {
    check_conv2d(k, kFloat64, 1e-12, kCPU, false, true);
    check_conv2d(k, kFloat32, 2e-5, kCPU, false, true);
    if (!k.same || k.kh % 2) check_conv2d(k, kFloat64, 1e-12, kCPU, true, true);
  }
}

TEST(Conv2d, ReluFusedGradcheckAndGradgradcheck) {
  for (Device d : {kCPU, kCUDA}) {
    if (d == kCUDA && (!tg::cuda::is_available() || !tg::backends::cudnn::is_available())) continue;
    tg::manual_seed(8);
    std::vector<Tensor> in{tg::randn({2, 4, 5, 6}, TensorOptions(kFloat64).device(d)).requires_grad_(),
                           tg::randn({6, 2, 3, 2}, TensorOptions(kFloat64).device(d)).requires_grad_(),
                           tg::randn({6}, TensorOptions(kFloat64).device(d)).requires_grad_()};
    auto fn = [](const std::vector<Tensor>& v) {
      Tensor y = F::conv2d_relu(v[0], v[1], v[2], {.stride = {2, 1}, .padding = {1, 2}, .groups = 2});
      return y * y;
    };
    auto rep = tg::autograd::gradcheck(fn, in);
    EXPECT_TRUE(rep.ok) << d << ": " << rep;
    auto rep2 = tg::autograd::gradgradcheck(fn, in);
    EXPECT_TRUE(rep2.ok) << d << " gradgrad: " << rep2;
  }
}

TEST(Conv2d, ConvReLU2dModuleIsConv2dThenRelu) {
  tg::manual_seed(9);
  tg::nn::ConvReLU2d m(3, 4, 3, {.padding = 1}, TensorOptions(kFloat64));
  tg::nn::Conv2d c(3, 4, 3, {.padding = 1}, TensorOptions(kFloat64));
  EXPECT_EQ(m.state_dict().keys(), c.state_dict().keys());
  EXPECT_EQ(m.name(), "ConvReLU2d");
  Tensor x = tg::randn({2, 3, 5, 5}, kFloat64);
  Tensor y = m(x);
  EXPECT_EQ(host(y), host(tg::relu(F::conv2d(x, m.weight, m.bias, {.padding = 1}))));
  EXPECT_GT(host((y == 0).to(kFloat64).sum())[0], 0);  // the ReLU did clamp something
  expect_error([&] { m(tg::randn({2, 4, 5, 5}, kFloat64)); }, {"conv2d_relu", "[2, 4, 5, 5]"});
}

TEST(Conv2d, ChannelsLastOnCpuKeepsLayout) {
  for (const Case& k : cases())
    if (!k.same || k.kh % 2) check_conv2d(k, kFloat64, 1e-12, kCPU, true);
}

// cuDNN (issue 17): every case in float32 with TF32 off against the float64 loop, NCHW and NHWC;
// float16 / bfloat16 (float32 accumulation) within their rounding; TF32 within its 10-bit inputs.
TEST(Conv2d, CudnnMatchesDirectLoop) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!tg::backends::cudnn::is_available()) {
    expect_error([&] { F::conv2d(tg::randn({1, 2, 4, 4}, kCUDA), tg::randn({2, 2, 3, 3}, kCUDA)); },
                 {"conv2d", "without cuDNN"});
    return;
  }
  EXPECT_GE(tg::backends::cudnn::version(), 90000);
  tg::backends::cudnn::set_allow_tf32(false);
  for (const Case& k : cases()) {
    check_conv2d(k, kFloat32, 1e-4, kCUDA, false);
    check_conv2d(k, kFloat32, 1e-4, kCUDA, true);
  }
  tg::backends::cudnn::set_allow_tf32(true);
  Case h{.n = 4, .c = 8, .h = 9, .w = 7, .co = 16, .kh = 3, .kw = 3, .ph = 1, .pw = 1};
  check_conv2d(h, kFloat32, 2e-2, kCUDA, true);  // TF32
  for (bool cl : {false, true}) {
    check_conv2d(h, kFloat16, 2e-2, kCUDA, cl);
    check_conv2d(h, kBFloat16, 0.15, kCUDA, cl);
  }
  Case dw{.n = 3, .c = 8, .h = 10, .w = 10, .co = 8, .kh = 3, .kw = 3, .ph = 1, .pw = 1, .groups = 8};
  check_conv2d(dw, kFloat16, 2e-2, kCUDA, true);
}

// conv2d_relu on cuDNN: the conv + bias + ReLU graph (or, where no engine runs it, conv then a
// ReLU pass) against the float64 loop, float32 without TF32 in both layouts; float16 / bfloat16
// NHWC (the fused graph's home) against conv2d then relu within their rounding.
TEST(Conv2d, CudnnReluFusedMatchesDirectLoop) {
  if (!tg::cuda::is_available() || !tg::backends::cudnn::is_available()) GTEST_SKIP() << "no cuDNN on a GPU";
  tg::backends::cudnn::set_allow_tf32(false);
  for (const Case& k : cases()) {
    check_conv2d(k, kFloat32, 1e-4, kCUDA, false, true);
    check_conv2d(k, kFloat32, 1e-4, kCUDA, true, true);
  }
  tg::backends::cudnn::set_allow_tf32(true);
  tg::manual_seed(10);
  for (DType dt : {kFloat16, kBFloat16}) {
    Tensor x = tg::randn({8, 64, 14, 14}, kCUDA).to(dt).contiguous(MemoryFormat::ChannelsLast);
    Tensor w = (tg::randn({64, 64, 3, 3}, kCUDA) * 0.05).to(dt).contiguous(MemoryFormat::ChannelsLast);
    Tensor b = tg::randn({64}, kCUDA).to(dt);
    Tensor fused = F::conv2d_relu(x, w, b, {.padding = 1});
    EXPECT_TRUE(fused.is_contiguous(MemoryFormat::ChannelsLast));
    Tensor sep = tg::relu(F::conv2d(x, w, b, {.padding = 1}));
    expect_near_vec(host(fused.to(kFloat32)), host(sep.to(kFloat32)), dt == kFloat16 ? 1e-2 : 6e-2, 1e-2,
                    std::string("fused vs separate ") + dtype_name(dt));
  }
}

// Autotune (set_benchmark) picks among engines; the answer stays the same.
TEST(Conv2d, CudnnBenchmarkModeSameAnswer) {
  if (!tg::cuda::is_available() || !tg::backends::cudnn::is_available()) GTEST_SKIP() << "no cuDNN on a GPU";
  tg::manual_seed(3);
  auto x = tg::randn({8, 16, 12, 12}, kCUDA).to(kFloat16).contiguous(MemoryFormat::ChannelsLast);
  auto w = tg::randn({32, 16, 3, 3}, kCUDA).to(kFloat16);
  auto ref = host(F::conv2d(x, w, Tensor(), {.padding = 1}).to(kFloat32));
  tg::backends::cudnn::set_benchmark(true);
  auto tuned = host(F::conv2d(x, w, Tensor(), {.padding = 1}).to(kFloat32));
  auto again = host(F::conv2d(x, w, Tensor(), {.padding = 1}).to(kFloat32));
  tg::backends::cudnn::set_benchmark(false);
  expect_near_vec(tuned, ref, 2e-2, 2e-2, "tuned");
  expect_near_vec(again, tuned, 0, 0, "second run");
}

// conv1d on CUDA goes through the same 2-d cuDNN graphs.
TEST(Conv1d, CudnnMatchesCpu) {
  if (!tg::cuda::is_available() || !tg::backends::cudnn::is_available()) GTEST_SKIP() << "no cuDNN on a GPU";
  tg::backends::cudnn::set_allow_tf32(false);
  tg::manual_seed(5);
  auto x = tg::randn({3, 4, 20}, kFloat64);
  auto w = tg::randn({6, 2, 5}, kFloat64);
  auto b = tg::randn({6}, kFloat64);
  auto ref = F::conv1d(x, w, b, {.stride = 2, .padding = 3, .dilation = 2, .groups = 2});
  auto y = F::conv1d(x.to(kCUDA, kFloat32), w.to(kCUDA, kFloat32), b.to(kCUDA, kFloat32),
                     {.stride = 2, .padding = 3, .dilation = 2, .groups = 2});
  tg::backends::cudnn::set_allow_tf32(true);
  expect_near_vec(host(y.to(kFloat64)), host(ref), 1e-4, 1e-4, "conv1d");
}

}  // namespace
}  // namespace tg::testing
