// scaled_dot_product_attention and MultiheadAttention (issue 18) against float64 references written
// here with loops: forward, gradients, masks, causal, GQA, dropout, bad input; CPU always, CUDA (the
// math path; the fused cuDNN path for float16 / bfloat16) when a device is present.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "tests/autograd/common.h"

namespace tg::testing {
namespace {

namespace F = tg::nn::functional;
constexpr double kInf = std::numeric_limits<double>::infinity();

class Sdpa : public ::testing::TestWithParam<Dev> {};
INSTANTIATE_TEST_SUITE_P(Devices, Sdpa, ::testing::Values(Dev::CPU, Dev::CUDA), dev_name);

struct Dims {
  int64_t B, Hq, Hk, Tq, Tk, E, Ev;
};
// Additive mask value for (b, h, i, j): 0, -inf or any float.
using MaskFn = std::function<double(int64_t, int64_t, int64_t, int64_t)>;

struct Ref {
  std::vector<double> o, dq, dk, dv;
};

// Attention in float64 with loops; key / value head of query head h is h / (Hq / Hk). A row whose
// scores are all -inf gives zeros (PyTorch's math path) and no gradient.
Ref ref_sdpa(const Dims& d, const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
             const std::vector<double>& g, const MaskFn& mask, double scale) {
  Ref r;
  r.o.assign(d.B * d.Hq * d.Tq * d.Ev, 0);
  r.dq.assign(q.size(), 0);
  r.dk.assign(k.size(), 0);
  r.dv.assign(v.size(), 0);
  const int64_t grp = d.Hq / d.Hk;
  std::vector<double> s(d.Tk), p(d.Tk), dp(d.Tk);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.Hq; ++h) {
      const int64_t hk = h / grp;
      auto Q = [&](int64_t i, int64_t e) -> int64_t { return ((b * d.Hq + h) * d.Tq + i) * d.E + e; };
      auto K = [&](int64_t j, int64_t e) -> int64_t { return ((b * d.Hk + hk) * d.Tk + j) * d.E + e; };
      auto V = [&](int64_t j, int64_t e) -> int64_t { return ((b * d.Hk + hk) * d.Tk + j) * d.Ev + e; };
      auto O = [&](int64_t i, int64_t e) -> int64_t { return ((b * d.Hq + h) * d.Tq + i) * d.Ev + e; };
      for (int64_t i = 0; i < d.Tq; ++i) {
        double mx = -kInf;
        for (int64_t j = 0; j < d.Tk; ++j) {
          double acc = 0;
          for (int64_t e = 0; e < d.E; ++e) acc += q[Q(i, e)] * k[K(j, e)];
          s[j] = scale * acc + (mask ? mask(b, h, i, j) : 0.0);
          mx = std::max(mx, s[j]);
        }
        if (mx == -kInf) continue;  // all masked: zeros
        double z = 0;
        for (int64_t j = 0; j < d.Tk; ++j) z += (p[j] = std::exp(s[j] - mx));
        for (int64_t j = 0; j < d.Tk; ++j) p[j] /= z;
        for (int64_t e = 0; e < d.Ev; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < d.Tk; ++j) acc += p[j] * v[V(j, e)];
          r.o[O(i, e)] = acc;
        }
        if (g.empty()) continue;
        double dot = 0;
        for (int64_t j = 0; j < d.Tk; ++j) {
          double acc = 0;
          for (int64_t e = 0; e < d.Ev; ++e) acc += g[O(i, e)] * v[V(j, e)];
          dp[j] = acc;
          dot += p[j] * acc;
        }
        for (int64_t j = 0; j < d.Tk; ++j) {
          const double ds = p[j] * (dp[j] - dot);
          for (int64_t e = 0; e < d.E; ++e) {
            r.dq[Q(i, e)] += scale * ds * k[K(j, e)];
            r.dk[K(j, e)] += scale * ds * q[Q(i, e)];
          }
          for (int64_t e = 0; e < d.Ev; ++e) r.dv[V(j, e)] += p[j] * g[O(i, e)];
        }
      }
    }
  return r;
}

struct Inputs {
  Tensor q, k, v, g;  // float64 on the CPU
};
Inputs make_inputs(const Dims& d, uint64_t seed) {
  tg::manual_seed(seed);
  return {tg::randn({d.B, d.Hq, d.Tq, d.E}, kFloat64), tg::randn({d.B, d.Hk, d.Tk, d.E}, kFloat64),
          tg::randn({d.B, d.Hk, d.Tk, d.Ev}, kFloat64), tg::randn({d.B, d.Hq, d.Tq, d.Ev}, kFloat64)};
}

// Runs SDPA on (dev, dt) with the options, compares output and gradients with the reference.
void check_against_ref(Dev dev, DType dt, const Dims& d, nn::ScaledDotProductAttentionOptions o, const MaskFn& mask,
                       double tol, uint64_t seed = 1) {
  const Device dv = to_device(dev);
  Inputs in = make_inputs(d, seed);
  const double scale = o.scale ? *o.scale : 1 / std::sqrt(static_cast<double>(d.E));
  Ref r = ref_sdpa(d, host(in.q), host(in.k), host(in.v), host(in.g), mask, scale);
  Tensor q = in.q.to(dv, dt).requires_grad_(true), k = in.k.to(dv, dt).requires_grad_(true),
         v = in.v.to(dv, dt).requires_grad_(true);
  if (o.attn_mask.defined()) o.attn_mask = o.attn_mask.to(dv);
  Tensor out = F::scaled_dot_product_attention(q, k, v, o);
  ASSERT_EQ(out.sizes(), Shape({d.B, d.Hq, d.Tq, d.Ev}));
  ASSERT_EQ(out.dtype(), dt);
  ASSERT_EQ(out.device().type(), dv.type());
  expect_near_vec(host(out), r.o, tol, tol, "output");
  out.backward(in.g.to(dv, dt));
  expect_near_vec(host(q.grad()), r.dq, tol, tol, "dq");
  expect_near_vec(host(k.grad()), r.dk, tol, tol, "dk");
  expect_near_vec(host(v.grad()), r.dv, tol, tol, "dv");
}

double tol_for(DType dt) { return dt == kFloat64 ? 1e-10 : 2e-5; }

TEST_P(Sdpa, PlainMatchesReference) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  for (DType dt : {kFloat64, kFloat32}) check_against_ref(GetParam(), dt, {2, 3, 3, 5, 7, 4, 6}, {}, nullptr, tol_for(dt));
}

TEST_P(Sdpa, CausalTopLeftWithTqNotTk) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const MaskFn causal = [](int64_t, int64_t, int64_t i, int64_t j) { return j > i ? -kInf : 0.0; };
  for (DType dt : {kFloat64, kFloat32}) {
    check_against_ref(GetParam(), dt, {2, 2, 2, 6, 4, 8, 8}, {.is_causal = true}, causal, tol_for(dt));
    check_against_ref(GetParam(), dt, {2, 2, 2, 4, 6, 8, 8}, {.is_causal = true}, causal, tol_for(dt));
    check_against_ref(GetParam(), dt, {1, 3, 3, 9, 9, 16, 16}, {.is_causal = true}, causal, tol_for(dt));
  }
}

TEST_P(Sdpa, BoolMaskBroadcastWithAFullyMaskedRow) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Dims d{2, 2, 2, 4, 5, 3, 3};
  // [Tq, Tk]: true = attend; row 2 sees nothing (zeros out, no gradient), as PyTorch's math path.
  std::vector<uint8_t> keep(d.Tq * d.Tk);
  for (int64_t i = 0; i < d.Tq; ++i)
    for (int64_t j = 0; j < d.Tk; ++j) keep[i * d.Tk + j] = i != 2 && (i + j) % 3 != 0;
  std::vector<float> keepf(keep.begin(), keep.end());
  Tensor mask = tg::tensor(keepf, {d.Tq, d.Tk}).gt(0.5);
  ASSERT_EQ(mask.dtype(), kBool);
  const MaskFn fn = [&](int64_t, int64_t, int64_t i, int64_t j) { return keep[i * d.Tk + j] ? 0.0 : -kInf; };
  for (DType dt : {kFloat64, kFloat32}) check_against_ref(GetParam(), dt, d, {.attn_mask = mask}, fn, tol_for(dt));
  // The masked row is exactly zero, not NaN.
  Inputs in = make_inputs(d, 1);
  Tensor out = F::scaled_dot_product_attention(in.q, in.k, in.v, {.attn_mask = mask});
  std::vector<double> o = host(out.select(2, 2));
  for (double x : o) EXPECT_EQ(x, 0.0);
}

TEST_P(Sdpa, FloatMaskPerBatchAndHead) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Dims d{2, 3, 3, 4, 6, 5, 2};
  tg::manual_seed(11);
  Tensor mask = tg::randn({d.B, 1, d.Tq, d.Tk}, kFloat32) * 2;  // float32 with any query dtype
  std::vector<double> mh = host(mask);
  const MaskFn fn = [&](int64_t b, int64_t, int64_t i, int64_t j) { return mh[(b * d.Tq + i) * d.Tk + j]; };
  for (DType dt : {kFloat64, kFloat32}) check_against_ref(GetParam(), dt, d, {.attn_mask = mask}, fn, tol_for(dt));
  // A mask in the query's dtype (float64 here), with a -inf that masks one key everywhere.
  Tensor m64 = mask.to(kFloat64).masked_fill(tg::arange(d.Tk).eq(1), -kInf);
  std::vector<double> mh64 = host(m64.expand({d.B, 1, d.Tq, d.Tk}));
  const MaskFn fn64 = [&](int64_t b, int64_t, int64_t i, int64_t j) { return mh64[(b * d.Tq + i) * d.Tk + j]; };
  check_against_ref(GetParam(), kFloat64, d, {.attn_mask = m64}, fn64, 1e-10);
}

TEST_P(Sdpa, ExplicitAndNegativeScale) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  for (double s : {0.7, -0.3})
    check_against_ref(GetParam(), kFloat64, {1, 2, 2, 3, 4, 5, 3}, {.scale = s}, nullptr, 1e-10);
}

TEST_P(Sdpa, GroupedQueryAttentionEqualsExplicitRepeat) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Dims d{2, 6, 2, 5, 7, 4, 3};
  const MaskFn causal = [](int64_t, int64_t, int64_t i, int64_t j) { return j > i ? -kInf : 0.0; };
  for (DType dt : {kFloat64, kFloat32}) {
    check_against_ref(GetParam(), dt, d, {.enable_gqa = true}, nullptr, tol_for(dt));
    check_against_ref(GetParam(), dt, d, {.is_causal = true, .enable_gqa = true}, causal, tol_for(dt));
  }
  // Against explicit repeat_interleave of the key / value heads: the same result.
  const Device dv = to_device(GetParam());
  Inputs in = make_inputs(d, 4);
  Tensor q = in.q.to(dv), k = in.k.to(dv), v = in.v.to(dv);
  Tensor kr = k.index_select(1, tg::tensor(std::vector<int64_t>{0, 0, 0, 1, 1, 1}, {6}).to(dv));
  Tensor vr = v.index_select(1, tg::tensor(std::vector<int64_t>{0, 0, 0, 1, 1, 1}, {6}).to(dv));
  expect_near_vec(host(F::scaled_dot_product_attention(q, k, v, {.enable_gqa = true})),
                  host(F::scaled_dot_product_attention(q, kr, vr)), 1e-12, 1e-12, "gqa vs repeat");
}

TEST_P(Sdpa, NonContiguousTransposedViews) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Dims d{2, 3, 3, 5, 6, 4, 4};
  const Device dv = to_device(GetParam());
  Inputs in = make_inputs(d, 5);
  // [B, T, H, E] storage, viewed as [B, H, T, E].
  Tensor qs = in.q.transpose(1, 2).contiguous().to(dv).requires_grad_(true);
  Tensor ks = in.k.transpose(1, 2).contiguous().to(dv).requires_grad_(true);
  Tensor vs = in.v.transpose(1, 2).contiguous().to(dv).requires_grad_(true);
  Tensor q = qs.transpose(1, 2), k = ks.transpose(1, 2), v = vs.transpose(1, 2);
  ASSERT_FALSE(q.is_contiguous());
  Ref r = ref_sdpa(d, host(in.q), host(in.k), host(in.v), host(in.g),
                   [](int64_t, int64_t, int64_t i, int64_t j) { return j > i ? -kInf : 0.0; }, 0.5);
  Tensor out = F::scaled_dot_product_attention(q, k, v, {.is_causal = true});
  expect_near_vec(host(out), r.o, 1e-10, 1e-10, "output");
  out.backward(in.g.to(dv));
  expect_near_vec(host(qs.grad().transpose(1, 2)), r.dq, 1e-10, 1e-10, "dq");
  expect_near_vec(host(ks.grad().transpose(1, 2)), r.dk, 1e-10, 1e-10, "dk");
  expect_near_vec(host(vs.grad().transpose(1, 2)), r.dv, 1e-10, 1e-10, "dv");
}

TEST_P(Sdpa, ThreeAndTwoDimInputs) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Dims d{1, 3, 3, 4, 5, 6, 2};
  const Device dv = to_device(GetParam());
  Inputs in = make_inputs(d, 6);
  Ref r = ref_sdpa(d, host(in.q), host(in.k), host(in.v), {}, nullptr, 1 / std::sqrt(6.0));
  Tensor out3 = F::scaled_dot_product_attention(in.q.select(0, 0).to(dv), in.k.select(0, 0).to(dv),
                                                in.v.select(0, 0).to(dv));
  ASSERT_EQ(out3.sizes(), Shape({3, 4, 2}));
  expect_near_vec(host(out3), r.o, 1e-10, 1e-10, "[H, T, E]");
  Tensor out2 = F::scaled_dot_product_attention(in.q.select(0, 0).select(0, 1).to(dv),
                                                in.k.select(0, 0).select(0, 1).to(dv),
                                                in.v.select(0, 0).select(0, 1).to(dv));
  ASSERT_EQ(out2.sizes(), Shape({4, 2}));
  expect_near_vec(host(out2), std::vector<double>(r.o.begin() + 8, r.o.begin() + 16), 1e-10, 1e-10, "[T, E]");
}

TEST(SdpaGrad, GradcheckQkvFloat64) {
  tg::manual_seed(21);
  auto make = [](Shape s) { return tg::randn(s, kFloat64).requires_grad_(true); };
  Tensor q = make({1, 2, 3, 4}), k = make({1, 2, 5, 4}), v = make({1, 2, 5, 3});
  Tensor fmask = tg::randn({3, 5}, kFloat64);
  Tensor bmask = tg::tensor(std::vector<float>{1, 0, 1, 1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 1, 0}, {3, 5}).gt(0.5);
  for (int mode = 0; mode < 4; ++mode) {
    auto fn = [&](const std::vector<Tensor>& x) {
      nn::ScaledDotProductAttentionOptions o;
      if (mode == 1) o.is_causal = true;
      if (mode == 2) o.attn_mask = fmask;
      if (mode == 3) o.attn_mask = bmask;
      return F::scaled_dot_product_attention(x[0], x[1], x[2], o);
    };
    auto rep = autograd::gradcheck(fn, {q, k, v});
    EXPECT_TRUE(rep.ok) << "mode " << mode << ": " << rep.message;
  }
  // GQA.
  Tensor qg = make({2, 4, 3, 2}), kg = make({2, 2, 4, 2}), vg = make({2, 2, 4, 2});
  auto rep = autograd::gradcheck(
      [](const std::vector<Tensor>& x) {
        return F::scaled_dot_product_attention(x[0], x[1], x[2], {.is_causal = true, .enable_gqa = true});
      },
      {qg, kg, vg});
  EXPECT_TRUE(rep.ok) << rep.message;
}

TEST_P(Sdpa, DropoutZeroIsIdentityAndMaskStatistics) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dv = to_device(GetParam());
  // p = 0: bit-identical to no dropout.
  Inputs in = make_inputs({2, 2, 2, 4, 4, 8, 8}, 7);
  Tensor a = F::scaled_dot_product_attention(in.q.to(dv), in.k.to(dv), in.v.to(dv));
  Tensor b = F::scaled_dot_product_attention(in.q.to(dv), in.k.to(dv), in.v.to(dv), {.dropout_p = 0.0});
  EXPECT_EQ(host(a), host(b));
  // q = 0: uniform probabilities 1 / Tk; v = identity, so out = the dropped probabilities
  // keep / (Tk (1 - p)), and dv = out^T g.
  const int64_t Tq = 64, Tk = 32, H = 4;
  const double p = 0.25;
  Tensor q = tg::zeros({1, H, Tq, 8}, TensorOptions().dtype(kFloat64).device(dv));
  Tensor k = tg::randn({1, H, Tk, 8}, kFloat64).to(dv);
  Tensor eye = tg::arange(Tk).unsqueeze(1).eq(tg::arange(Tk).unsqueeze(0)).to(kFloat64);
  Tensor v = eye.expand({1, H, Tk, Tk}).contiguous().to(dv).requires_grad_(true);
  tg::manual_seed(99);
  Tensor out = F::scaled_dot_product_attention(q, k, v, {.dropout_p = p});
  std::vector<double> o = host(out);
  int64_t zeros = 0;
  const double kept = 1.0 / (Tk * (1 - p));
  for (double x : o) {
    if (x == 0) ++zeros;
    else ASSERT_NEAR(x, kept, 1e-12);
  }
  const double n = static_cast<double>(o.size()), frac = zeros / n;
  EXPECT_NEAR(frac, p, 4 * std::sqrt(p * (1 - p) / n)) << zeros << " of " << n;
  // Same seed, same mask.
  tg::manual_seed(99);
  EXPECT_EQ(host(F::scaled_dot_product_attention(q, k, v, {.dropout_p = p})), o);
  // Backward regenerates the same mask: dv = out^T g.
  Tensor g = tg::randn({1, H, Tq, Tk}, kFloat64).to(dv);
  out.backward(g);
  expect_near_vec(host(v.grad()), host(tg::matmul(out.detach().transpose(-2, -1), g)), 1e-12, 1e-12, "dv");
}

TEST(SdpaAutocast, CpuBFloat16) {
  Inputs in = make_inputs({1, 2, 2, 4, 6, 8, 8}, 8);
  Tensor q = in.q.to(kFloat32), k = in.k.to(kFloat32), v = in.v.to(kFloat32);
  Tensor want = F::scaled_dot_product_attention(q, k, v, {.is_causal = true});
  Tensor got;
  {
    amp::autocast guard(kCPU);
    got = F::scaled_dot_product_attention(q, k, v, {.is_causal = true});
  }
  EXPECT_EQ(got.dtype(), kBFloat16);
  expect_near_vec(host(got), host(want), 3e-2, 3e-2, "autocast bf16");
}

// Traced as its parts (the math path's public ops): the exported program computes the same.
TEST(SdpaExport, TracedAsItsParts) {
  struct Attn : nn::Module {
    Tensor forward(const Tensor& x) override {
      return F::scaled_dot_product_attention(x, x * 2, x + 1, {.is_causal = true});
    }
  };
  Attn m;
  tg::manual_seed(9);
  auto ep = tg::export_module(m, {tg::randn({1, 2, 4, 8})});
  Tensor y = tg::randn({1, 2, 4, 8});
  expect_near_vec(host(ep.run({y})[0]), host(m(y)), 1e-6, 1e-6, "exported program");
}

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one with " << parts[0];
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const auto& p : parts) EXPECT_NE(m.find(p), std::string::npos) << "message: " << m << "\nmissing: " << p;
  }
}

TEST(SdpaErrors, BadInputsNameTheOpAndShapes) {
  Tensor q = tg::randn({2, 4, 5, 8}), k = tg::randn({2, 4, 6, 8}), v = tg::randn({2, 4, 6, 8});
  auto sdpa = [](const Tensor& a, const Tensor& b, const Tensor& c, nn::ScaledDotProductAttentionOptions o = {}) {
    return F::scaled_dot_product_attention(a, b, c, o);
  };
  const std::string op = "scaled_dot_product_attention";
  expect_error([&] { sdpa(tg::randn({8}), k, v); }, {op, "[8]"});
  expect_error([&] { sdpa(q, tg::randn({2, 4, 6, 7}), v); }, {op, "[2, 4, 6, 7]", "embedding"});
  expect_error([&] { sdpa(q, k, tg::randn({2, 4, 7, 8})); }, {op, "[2, 4, 7, 8]"});
  expect_error([&] { sdpa(q, tg::randn({3, 4, 6, 8}), tg::randn({3, 4, 6, 8})); }, {op, "[3, 4, 6, 8]"});
  expect_error([&] { sdpa(q, tg::randn({2, 2, 6, 8}), tg::randn({2, 2, 6, 8})); }, {op, "enable_gqa"});
  expect_error([&] { sdpa(q, tg::randn({2, 3, 6, 8}), tg::randn({2, 3, 6, 8}), {.enable_gqa = true}); },
               {op, "divide", "[2, 3, 6, 8]"});
  expect_error([&] { sdpa(q, k, v.to(kFloat64)); }, {op, "dtype"});
  expect_error([&] { sdpa(q.to(kInt64), k.to(kInt64), v.to(kInt64)); }, {op, "floating"});
  expect_error([&] { sdpa(q, k, v, {.attn_mask = tg::zeros({5, 7})}); }, {op, "[5, 7]", "[2, 4, 5, 6]"});
  expect_error([&] { sdpa(q, k, v, {.attn_mask = tg::zeros({3, 5, 6})}); }, {op, "[3, 5, 6]"});
  expect_error([&] { sdpa(q, k, v, {.attn_mask = tg::zeros({5, 6}, kInt64)}); }, {op, "attn_mask", "int64"});
  expect_error([&] { sdpa(q, k, v, {.attn_mask = tg::zeros({5, 6}, kFloat64)}); }, {op, "attn_mask"});
  expect_error([&] { sdpa(q, k, v, {.attn_mask = tg::zeros({5, 6}), .is_causal = true}); }, {op, "is_causal"});
  expect_error([&] { sdpa(q, k, v, {.dropout_p = 1.5}); }, {op, "dropout_p"});
  if (tg::cuda::is_available())
    expect_error([&] { sdpa(q, k.cuda(), v); }, {op, "device"});
}

// ---- the fused cuDNN path (CUDA, float16 / bfloat16) against the float32 math path on the same
// values. Tolerances: max |error| over max |reference|: output 4e-3 (float16) / 2e-2 (bfloat16),
// gradients 1e-2 / 5e-2 (flash attention's tiled float32 softmax against the exact one).
struct FusedCase {
  int64_t B, Hq, Hk, Tq, Tk, D;
  bool causal;
  int mask;         // 0 none, 1 bool [Tq, Tk] (with one fully masked row), 2 float32 [B, 1, Tq, Tk]
  bool bshd = false;  // q, k, v as transposed views of [B, T, H, D]
};

double rel_err(const Tensor& got, const Tensor& want) {
  std::vector<double> a = host(got), b = host(want);
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(a[i] - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return den > 0 ? num / den : num;
}

void check_fused(DType dt, const FusedCase& c) {
  const double tol_out = dt == kFloat16 ? 4e-3 : 2e-2, tol_grad = dt == kFloat16 ? 1e-2 : 5e-2;
  tg::manual_seed(40);
  auto make = [&](int64_t H, int64_t T) {
    Tensor t = c.bshd ? tg::randn({c.B, T, H, c.D}, kCUDA).to(dt).transpose(1, 2) : tg::randn({c.B, H, T, c.D}, kCUDA).to(dt);
    return t.detach().requires_grad_(true);
  };
  Tensor q = make(c.Hq, c.Tq), k = make(c.Hk, c.Tk), v = make(c.Hk, c.Tk);
  Tensor g = tg::randn({c.B, c.Hq, c.Tq, c.D}, kCUDA).to(dt);
  Tensor mask;
  if (c.mask == 1) {
    mask = tg::rand({c.Tq, c.Tk}, kCUDA).gt(0.3);
    NoGradGuard ng;
    mask.select(0, 1).fill_(false);
  } else if (c.mask == 2) {
    mask = tg::randn({c.B, 1, c.Tq, c.Tk}, kCUDA);
  }
  const nn::ScaledDotProductAttentionOptions o{.attn_mask = mask, .is_causal = c.causal, .enable_gqa = c.Hq != c.Hk};
  Tensor out = F::scaled_dot_product_attention(q, k, v, o);
  ASSERT_EQ(out.dtype(), dt);
  if (tg::backends::cudnn::is_available())  // the fused node ran (the math path ends with a cast)
    EXPECT_STREQ(out.grad_fn()->name(), c.mask ? "masked_fill" : "scaled_dot_product_attention");
  out.backward(g);
  Tensor q32 = q.detach().to(kFloat32).requires_grad_(true), k32 = k.detach().to(kFloat32).requires_grad_(true),
         v32 = v.detach().to(kFloat32).requires_grad_(true);
  Tensor ref = F::scaled_dot_product_attention(q32, k32, v32, o);
  ref.backward(g.to(kFloat32));
  EXPECT_LE(rel_err(out, ref), tol_out) << "output";
  EXPECT_LE(rel_err(q.grad(), q32.grad()), tol_grad) << "dq";
  EXPECT_LE(rel_err(k.grad(), k32.grad()), tol_grad) << "dk";
  EXPECT_LE(rel_err(v.grad(), v32.grad()), tol_grad) << "dv";
  if (c.mask == 1) {  // the fully masked row: zeros and no gradient, as the math path
    for (double x : host(out.select(2, 1))) EXPECT_EQ(x, 0.0);
    for (double x : host(q.grad().select(2, 1))) EXPECT_EQ(x, 0.0);
  }
}

class SdpaFused : public ::testing::TestWithParam<DType> {};
INSTANTIATE_TEST_SUITE_P(Dtypes, SdpaFused, ::testing::Values(kFloat16, kBFloat16),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(i.param == kFloat16 ? "fp16" : "bf16"); });

TEST_P(SdpaFused, MatchesFloat32Math) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const FusedCase cases[] = {
      {2, 4, 4, 128, 128, 64, true, 0},         // causal
      {2, 4, 4, 96, 160, 64, true, 0},          // causal, Tq != Tk (top-left)
      {2, 4, 4, 160, 96, 64, true, 0},          // causal, Tq > Tk
      {1, 8, 2, 128, 128, 128, true, 0},        // GQA, D = 128
      {2, 4, 4, 64, 64, 64, false, 0, true},    // [B, T, H, D] views
      {2, 4, 4, 64, 80, 64, false, 1},          // bool mask with a fully masked row
      {2, 4, 4, 64, 80, 64, false, 2},          // float mask
  };
  for (const FusedCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "B" << c.B << " Hq" << c.Hq << " Hk" << c.Hk << " Tq" << c.Tq << " Tk" << c.Tk
                                      << " D" << c.D << (c.causal ? " causal" : "") << " mask" << c.mask);
    check_fused(GetParam(), c);
  }
}

// GPT's packed projection: q, k, v split from one [B, T, 3C] tensor and viewed as heads. The fused
// backward writes dq, dk, dv into one buffer laid out as the packed tensor, and split's backward
// joins them without a copy: the packed gradient must equal the float32 math path's.
TEST_P(SdpaFused, PackedQkvGradientIsTheMathPaths) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const DType dt = GetParam();
  const int64_t B = 2, T = 96, H = 4, D = 64, C = H * D;
  tg::manual_seed(42);
  auto attend = [&](const Tensor& qkv) {
    const std::vector<Tensor> p = qkv.split(C, 2);
    auto heads = [&](const Tensor& t) { return t.reshape({B, T, H, D}).transpose(1, 2); };
    return F::scaled_dot_product_attention(heads(p[0]), heads(p[1]), heads(p[2]), {.is_causal = true});
  };
  Tensor qkv = tg::randn({B, T, 3 * C}, kCUDA).to(dt).requires_grad_(true);
  Tensor g = tg::randn({B, H, T, D}, kCUDA).to(dt);
  Tensor out = attend(qkv);
  if (tg::backends::cudnn::is_available()) EXPECT_STREQ(out.grad_fn()->name(), "scaled_dot_product_attention");
  out.backward(g);
  Tensor ref32 = qkv.detach().to(kFloat32).requires_grad_(true);
  attend(ref32).backward(g.to(kFloat32));
  const double tol = dt == kFloat16 ? 1e-2 : 5e-2;
  for (int64_t i = 0; i < 3; ++i)
    EXPECT_LE(rel_err(qkv.grad().slice(2, i * C, (i + 1) * C), ref32.grad().slice(2, i * C, (i + 1) * C)), tol)
        << "piece " << i;
  EXPECT_TRUE(qkv.grad().is_contiguous());
}

TEST_P(SdpaFused, ThreeDimInputs) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const DType dt = GetParam();
  tg::manual_seed(41);
  Tensor q = tg::randn({4, 64, 64}, kCUDA).to(dt), k = tg::randn({4, 64, 64}, kCUDA).to(dt),
         v = tg::randn({4, 64, 64}, kCUDA).to(dt);
  Tensor out = F::scaled_dot_product_attention(q, k, v, {.is_causal = true});
  ASSERT_EQ(out.sizes(), Shape({4, 64, 64}));
  Tensor ref = F::scaled_dot_product_attention(q.to(kFloat32), k.to(kFloat32), v.to(kFloat32), {.is_causal = true});
  EXPECT_LE(rel_err(out, ref), dt == kFloat16 ? 4e-3 : 2e-2);
}

TEST_P(SdpaFused, DropoutMaskStatisticsAndBackward) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const DType dt = GetParam();
  // q = 0: uniform probabilities 1 / Tk; v = identity, so out is the dropped probabilities.
  const int64_t B = 2, H = 4, T = 128, Tk = 64;
  const double p = 0.2;
  Tensor q = tg::zeros({B, H, T, 64}, TensorOptions().dtype(dt).device(kCUDA));
  Tensor k = tg::randn({B, H, Tk, 64}, kCUDA).to(dt);
  Tensor eye = tg::arange(Tk).unsqueeze(1).eq(tg::arange(Tk).unsqueeze(0)).to(dt).to(kCUDA);
  Tensor v = eye.expand({B, H, Tk, Tk}).contiguous().requires_grad_(true);
  tg::manual_seed(5);
  Tensor out = F::scaled_dot_product_attention(q, k, v, {.dropout_p = p});
  std::vector<double> o = host(out);
  const double kept = 1.0 / (Tk * (1 - p));
  int64_t zeros = 0;
  for (double x : o) {
    if (x == 0) ++zeros;
    else ASSERT_NEAR(x, kept, 1e-2 * kept);
  }
  const double n = static_cast<double>(o.size());
  EXPECT_NEAR(zeros / n, p, 5 * std::sqrt(p * (1 - p) / n));
  tg::manual_seed(5);
  EXPECT_EQ(host(F::scaled_dot_product_attention(q, k, v, {.dropout_p = p})), o) << "same seed, same mask";
  // The backward sees the same mask: dv = out^T g.
  Tensor g = tg::randn({B, H, T, Tk}, kCUDA).to(dt);
  out.backward(g);
  Tensor want = tg::matmul(out.detach().to(kFloat32).transpose(-2, -1), g.to(kFloat32));
  EXPECT_LE(rel_err(v.grad(), want), dt == kFloat16 ? 1e-2 : 4e-2);
}

// ---- MultiheadAttention

// The module's computation from its parameters, in float64 with loops: x [L, N, E] layouts.
struct MhaRef {
  std::vector<double> out, w;  // out [L, N, E]; w [N, H, L, S] (before averaging)
};
MhaRef ref_mha(nn::MultiheadAttention& m, const std::vector<double>& x, const std::vector<double>& kx,
               const std::vector<double>& vx, int64_t L, int64_t S, int64_t N,
               const std::function<double(int64_t, int64_t, int64_t, int64_t)>& add) {
  const int64_t E = m.embed_dim, H = m.num_heads, hd = m.head_dim, Kd = m.kdim, Vd = m.vdim;
  std::vector<double> W, Wq, Wk, Wv, bias, Wo = host(m.out_proj->weight), bo;
  if (m.in_proj_weight.defined()) {
    W = host(m.in_proj_weight);
    Wq.assign(W.begin(), W.begin() + E * E);
    Wk.assign(W.begin() + E * E, W.begin() + 2 * E * E);
    Wv.assign(W.begin() + 2 * E * E, W.end());
  } else {
    Wq = host(m.q_proj_weight);
    Wk = host(m.k_proj_weight);
    Wv = host(m.v_proj_weight);
  }
  bias = m.in_proj_bias.defined() ? host(m.in_proj_bias) : std::vector<double>(3 * E, 0);
  bo = m.out_proj->bias.defined() ? host(m.out_proj->bias) : std::vector<double>(E, 0);
  auto proj = [&](const std::vector<double>& in, int64_t T, int64_t D, const std::vector<double>& w, int64_t boff) {
    std::vector<double> r(T * N * E);
    for (int64_t t = 0; t < T * N; ++t)
      for (int64_t o = 0; o < E; ++o) {
        double a = bias[boff + o];
        for (int64_t i = 0; i < D; ++i) a += in[t * D + i] * w[o * D + i];
        r[t * E + o] = a;
      }
    return r;
  };
  std::vector<double> qp = proj(x, L, E, Wq, 0), kp = proj(kx, S, Kd, Wk, E), vp = proj(vx, S, Vd, Wv, 2 * E);
  MhaRef r;
  r.w.assign(N * H * L * S, 0);
  std::vector<double> ctx(L * N * E, 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t l = 0; l < L; ++l) {
        std::vector<double> s(S);
        double mx = -kInf;
        for (int64_t j = 0; j < S; ++j) {
          double a = 0;
          for (int64_t e = 0; e < hd; ++e) a += qp[(l * N + n) * E + h * hd + e] * kp[(j * N + n) * E + h * hd + e];
          s[j] = a / std::sqrt(static_cast<double>(hd)) + (add ? add(n, h, l, j) : 0.0);
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (int64_t j = 0; j < S; ++j) z += (s[j] = std::exp(s[j] - mx));
        for (int64_t j = 0; j < S; ++j) {
          const double pj = s[j] / z;
          r.w[((n * H + h) * L + l) * S + j] = pj;
          for (int64_t e = 0; e < hd; ++e) ctx[(l * N + n) * E + h * hd + e] += pj * vp[(j * N + n) * E + h * hd + e];
        }
      }
  r.out.assign(L * N * E, 0);
  for (int64_t t = 0; t < L * N; ++t)
    for (int64_t o = 0; o < E; ++o) {
      double a = bo[o];
      for (int64_t i = 0; i < E; ++i) a += ctx[t * E + i] * Wo[o * E + i];
      r.out[t * E + o] = a;
    }
  return r;
}

class Mha : public ::testing::TestWithParam<Dev> {};
INSTANTIATE_TEST_SUITE_P(Devices, Mha, ::testing::Values(Dev::CPU, Dev::CUDA), dev_name);

TEST(MhaModule, ParameterNamesShapesAndInit) {
  tg::manual_seed(0);
  nn::MultiheadAttention m(16, 4);
  auto named = m.named_parameters();
  ASSERT_EQ(named.size(), 4u);
  EXPECT_EQ(named[0].first, "in_proj_weight");
  EXPECT_EQ(named[1].first, "in_proj_bias");
  EXPECT_EQ(named[2].first, "out_proj.weight");
  EXPECT_EQ(named[3].first, "out_proj.bias");
  EXPECT_EQ(named[0].second.sizes(), Shape({48, 16}));
  EXPECT_EQ(named[1].second.sizes(), Shape({48}));
  EXPECT_EQ(named[2].second.sizes(), Shape({16, 16}));
  for (double b : host(m.in_proj_bias)) EXPECT_EQ(b, 0.0);
  for (double b : host(m.out_proj->bias)) EXPECT_EQ(b, 0.0);
  // xavier_uniform_: U(±sqrt(6 / (fan_in + fan_out))), fan_in 16, fan_out 48.
  const double bound = std::sqrt(6.0 / 64.0);
  std::vector<double> w = host(m.in_proj_weight);
  double mx = 0;
  for (double x : w) mx = std::max(mx, std::abs(x));
  EXPECT_LE(mx, bound);
  EXPECT_GT(mx, 0.95 * bound);
  nn::MultiheadAttention kv(8, 2, {.bias = false, .kdim = 5, .vdim = 3});
  auto n2 = kv.named_parameters();
  ASSERT_EQ(n2.size(), 4u);
  EXPECT_EQ(n2[0].first, "q_proj_weight");
  EXPECT_EQ(n2[1].first, "k_proj_weight");
  EXPECT_EQ(n2[2].first, "v_proj_weight");
  EXPECT_EQ(n2[3].first, "out_proj.weight");
  EXPECT_EQ(n2[1].second.sizes(), Shape({8, 5}));
  EXPECT_EQ(n2[2].second.sizes(), Shape({8, 3}));
  auto sd = m.state_dict();
  EXPECT_TRUE(sd.contains("out_proj.bias"));
}

// Random (non-zero) biases so that the reference checks them.
void randomize(nn::MultiheadAttention& m) {
  NoGradGuard ng;
  for (auto& p : m.parameters()) p.copy_(tg::randn(p.sizes(), kFloat64).to(p.device(), p.dtype()) * 0.5);
}

TEST_P(Mha, MatchesReferenceFromParameters) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dv = to_device(GetParam());
  const int64_t E = 8, H = 2, L = 3, S = 4, N = 2;
  tg::manual_seed(30);
  for (bool batch_first : {false, true}) {
    nn::MultiheadAttention m(E, H, {.batch_first = batch_first}, TensorOptions().dtype(kFloat64));
    randomize(m);
    Tensor x = tg::randn({L, N, E}, kFloat64), kx = tg::randn({S, N, E}, kFloat64), vx = tg::randn({S, N, E}, kFloat64);
    // key_padding_mask: batch 1 ignores key 3; attn_mask (bool, true = not allowed): (l=0, j=1).
    Tensor kpm = tg::tensor(std::vector<float>{0, 0, 0, 0, 0, 0, 0, 1}, {N, S}).gt(0.5);
    Tensor am = tg::tensor(std::vector<float>{0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {L, S}).gt(0.5);
    auto add = [](int64_t n, int64_t, int64_t l, int64_t j) {
      return (n == 1 && j == 3) || (l == 0 && j == 1) ? -kInf : 0.0;
    };
    MhaRef r = ref_mha(m, host(x), host(kx), host(vx), L, S, N, add);
    m.to(dv);
    auto in = [&](const Tensor& t) { return batch_first ? t.transpose(0, 1).contiguous().to(dv) : t.to(dv); };
    auto back = [&](const Tensor& t) { return host(batch_first ? t.transpose(0, 1) : t); };
    for (bool need : {true, false}) {
      for (bool avg : {true, false}) {
        auto [out, w] = m.forward(in(x), in(kx), in(vx),
                                  {.key_padding_mask = kpm.to(dv), .need_weights = need, .attn_mask = am.to(dv),
                                   .average_attn_weights = avg});
        expect_near_vec(back(out), r.out, 1e-10, 1e-10, "output");
        if (!need) {
          EXPECT_FALSE(w.defined());
          continue;
        }
        if (!avg) {
          ASSERT_EQ(w.sizes(), Shape({N, H, L, S}));
          expect_near_vec(host(w), r.w, 1e-12, 1e-10, "weights per head");
        } else {
          ASSERT_EQ(w.sizes(), Shape({N, L, S}));
          std::vector<double> avgw(N * L * S, 0);
          for (int64_t n = 0; n < N; ++n)
            for (int64_t h = 0; h < H; ++h)
              for (int64_t i = 0; i < L * S; ++i) avgw[n * L * S + i] += r.w[(n * H + h) * L * S + i] / H;
          expect_near_vec(host(w), avgw, 1e-12, 1e-10, "averaged weights");
        }
      }
    }
  }
}

TEST_P(Mha, KdimVdimUnbatchedAndSelfAttention) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dv = to_device(GetParam());
  tg::manual_seed(31);
  nn::MultiheadAttention m(6, 3, {.kdim = 4, .vdim = 5}, TensorOptions().dtype(kFloat64));
  randomize(m);
  Tensor x = tg::randn({3, 1, 6}, kFloat64), kx = tg::randn({5, 1, 4}, kFloat64), vx = tg::randn({5, 1, 5}, kFloat64);
  MhaRef r = ref_mha(m, host(x), host(kx), host(vx), 3, 5, 1, nullptr);
  m.to(dv);
  auto [out, w] = m.forward(x.select(1, 0).to(dv), kx.select(1, 0).to(dv), vx.select(1, 0).to(dv));
  ASSERT_EQ(out.sizes(), Shape({3, 6}));
  ASSERT_EQ(w.sizes(), Shape({3, 5}));
  expect_near_vec(host(out), r.out, 1e-10, 1e-10, "unbatched output");
  // Self-attention through forward(x) (the SDPA path), causal hint with the causal mask.
  nn::MultiheadAttention s(8, 2, {}, TensorOptions().dtype(kFloat64));
  randomize(s);
  Tensor xs = tg::randn({5, 2, 8}, kFloat64);
  auto causal = [](int64_t, int64_t, int64_t l, int64_t j) { return j > l ? -kInf : 0.0; };
  MhaRef rs = ref_mha(s, host(xs), host(xs), host(xs), 5, 5, 2, nullptr);
  MhaRef rc = ref_mha(s, host(xs), host(xs), host(xs), 5, 5, 2, causal);
  s.to(dv);
  expect_near_vec(host(s(xs.to(dv))), rs.out, 1e-10, 1e-10, "forward(x)");
  Tensor cm = tg::ones({5, 5}, kBool).triu(1).to(dv);
  auto [oc, wc] = s.forward(xs.to(dv), xs.to(dv), xs.to(dv), {.need_weights = false, .attn_mask = cm, .is_causal = true});
  expect_near_vec(host(oc), rc.out, 1e-10, 1e-10, "is_causal hint");
  EXPECT_FALSE(wc.defined());
}

TEST_P(Mha, GradientsReachEveryParameter) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dv = to_device(GetParam());
  tg::manual_seed(32);
  nn::MultiheadAttention m(4, 2, {}, TensorOptions().dtype(kFloat64));
  randomize(m);
  m.to(dv);
  Tensor x = tg::randn({3, 2, 4}, kFloat64).to(dv);
  auto params = m.parameters();
  // d(sum(out * g)) / d(param) by central differences against backward, per parameter element.
  Tensor g = tg::randn({3, 2, 4}, kFloat64).to(dv);
  for (bool need : {true, false}) {
    m.zero_grad();
    (std::get<0>(m.forward(x, x, x, {.need_weights = need})) * g).sum().backward();
    for (auto& p : params) {
      ASSERT_TRUE(p.grad().defined());
      std::vector<double> an = host(p.grad());
      for (int64_t i = 0; i < p.numel(); i += 3) {
        auto f = [&](double delta) {
          NoGradGuard ng;
          Tensor flat = p.view({-1});
          Tensor orig = flat.slice(0, i, i + 1).clone();
          flat.slice(0, i, i + 1).add_(delta);
          double val = host((std::get<0>(m.forward(x, x, x, {.need_weights = need})) * g).sum())[0];
          flat.slice(0, i, i + 1).copy_(orig);
          return val;
        };
        const double num = (f(1e-6) - f(-1e-6)) / 2e-6;
        EXPECT_NEAR(an[i], num, 1e-6 + 1e-5 * std::abs(num)) << "param element " << i;
      }
    }
  }
}

TEST(MhaModule, DropoutOnlyInTraining) {
  tg::manual_seed(33);
  nn::MultiheadAttention m(8, 2, {.dropout = 0.5}, TensorOptions().dtype(kFloat64));
  nn::MultiheadAttention ref(8, 2, {}, TensorOptions().dtype(kFloat64));
  ref.load_state_dict(m.state_dict());
  Tensor x = tg::randn({6, 3, 8}, kFloat64);
  m.eval();
  EXPECT_EQ(host(m(x)), host(ref(x)));
  EXPECT_EQ(host(std::get<1>(m.forward(x, x, x))), host(std::get<1>(ref.forward(x, x, x))));
  m.train();
  EXPECT_NE(host(m(x)), host(ref(x)));
  // Training, need_weights: the returned weights are the dropped ones (zeros or 2x the clean ones).
  auto [o, w] = m.forward(x, x, x, {.average_attn_weights = false});
  auto [o2, wc] = ref.forward(x, x, x, {.average_attn_weights = false});
  std::vector<double> wd = host(w), wr = host(wc);
  int zeros = 0;
  for (size_t i = 0; i < wd.size(); ++i) {
    if (wd[i] == 0) ++zeros;
    else ASSERT_NEAR(wd[i], 2 * wr[i], 1e-12);
  }
  EXPECT_GT(zeros, 0);
  EXPECT_LT(zeros, static_cast<int>(wd.size()));
}

TEST(MhaModule, BadInput) {
  expect_error([] { nn::MultiheadAttention(10, 3); }, {"MultiheadAttention", "divisible"});
  expect_error([] { nn::MultiheadAttention(8, 2, {.dropout = 2}); }, {"MultiheadAttention", "dropout"});
  nn::MultiheadAttention m(8, 2);
  Tensor x = tg::randn({3, 2, 8});
  expect_error([&] { m.forward(tg::randn({3, 2, 7}), x, x); }, {"MultiheadAttention", "[3, 2, 7]"});
  expect_error([&] { m.forward(x, tg::randn({4, 2, 8}), tg::randn({5, 2, 8})); }, {"MultiheadAttention", "[4, 2, 8]"});
  expect_error([&] { m.forward(x, x, x, {.key_padding_mask = tg::zeros({2, 4}, kBool)}); },
               {"MultiheadAttention", "key_padding_mask", "[2, 4]"});
  expect_error([&] { m.forward(x, x, x, {.attn_mask = tg::zeros({3, 4}, kBool)}); },
               {"MultiheadAttention", "attn_mask", "[3, 4]"});
  expect_error([&] { m.forward(x, x, x, {.attn_mask = tg::zeros({3, 3}, kInt64)}); },
               {"MultiheadAttention", "attn_mask"});
  expect_error([&] { m.forward(x, x, x, {.need_weights = false, .is_causal = true}); },
               {"MultiheadAttention", "is_causal"});
}

}  // namespace
}  // namespace tg::testing
