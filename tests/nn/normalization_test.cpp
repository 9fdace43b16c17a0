// layer_norm / rms_norm, embedding, dropout, their modules and ModuleList (issue 15), on the CPU
// and on CUDA when present, against float64 references computed here on the host.
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include <tapegrad/core/backend/backend.h>

#include "tests/autograd/common.h"

namespace tg::testing {
namespace {

namespace F = tg::nn::functional;

class Norm : public ::testing::TestWithParam<Dev> {};
INSTANTIATE_TEST_SUITE_P(Devices, Norm, ::testing::Values(Dev::CPU, Dev::CUDA), dev_name);

// Reference layer_norm / rms_norm forward and backward in float64, rows of n.
struct RefNorm {
  std::vector<double> y, gx, gw, gb;
};
RefNorm ref_norm(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                 const std::vector<double>& g, int64_t rows, int64_t n, double eps, bool rms) {
  RefNorm r;
  r.y.resize(x.size());
  r.gx.resize(x.size());
  r.gw.assign(n, 0);
  r.gb.assign(n, 0);
  for (int64_t i = 0; i < rows; ++i) {
    double mean = 0, var = 0;
    if (!rms) {
      for (int64_t j = 0; j < n; ++j) mean += x[i * n + j];
      mean /= n;
    }
    for (int64_t j = 0; j < n; ++j) var += (x[i * n + j] - mean) * (x[i * n + j] - mean);
    var /= n;
    const double rstd = 1 / std::sqrt(var + eps);
    std::vector<double> xh(n), gy(n);
    double s1 = 0, s2 = 0;
    for (int64_t j = 0; j < n; ++j) {
      xh[j] = (x[i * n + j] - mean) * rstd;
      r.y[i * n + j] = xh[j] * (w.empty() ? 1 : w[j]) + (b.empty() ? 0 : b[j]);
      gy[j] = g[i * n + j] * (w.empty() ? 1 : w[j]);
      s1 += gy[j];
      s2 += gy[j] * xh[j];
      r.gw[j] += g[i * n + j] * xh[j];
      r.gb[j] += g[i * n + j];
    }
    for (int64_t j = 0; j < n; ++j) r.gx[i * n + j] = rstd * (gy[j] - (rms ? 0 : s1 / n) - xh[j] * s2 / n);
  }
  return r;
}

void check_norm(Dev dev, DType dt, int64_t rows, int64_t n, bool rms, double tol) {
  const Device d = to_device(dev);
  tg::manual_seed(3);
  Tensor x64 = tg::randn({rows, n}, kFloat64) * 2 + 0.5, w64 = tg::randn({n}, kFloat64), b64 = tg::randn({n}, kFloat64),
         g64 = tg::randn({rows, n}, kFloat64);
  Tensor x = x64.to(d, dt).detach().requires_grad_(true), w = w64.to(d, dt).detach().requires_grad_(true),
         b = b64.to(d, dt).detach().requires_grad_(true);
  // Reference from the rounded inputs.
  auto xr = host(x), wr = host(w), br = host(b), gr = host(g64.to(dt));
  const double eps = 1e-5;
  Tensor y = rms ? F::rms_norm(x, {n}, w, eps) : F::layer_norm(x, {n}, w, b, eps);
  ASSERT_EQ(y.dtype(), dt);
  y.backward(g64.to(d, dt));
  RefNorm ref = ref_norm(xr, wr, rms ? std::vector<double>{} : br, gr, rows, n, eps, rms);
  const std::string what = std::string(rms ? "rms_norm " : "layer_norm ") + dtype_name(dt);
  expect_near_vec(host(y), ref.y, tol, tol, what + " y");
  expect_near_vec(host(x.grad()), ref.gx, tol * 4, tol * 4, what + " grad x");
  const double sum_tol = tol * std::sqrt(static_cast<double>(rows)) * 4;
  expect_near_vec(host(w.grad()), ref.gw, sum_tol, tol, what + " grad weight");
  if (!rms)
    expect_near_vec(host(b.grad()), ref.gb, sum_tol, tol, what + " grad bias");
  else
    EXPECT_FALSE(b.grad().defined());
}

TEST_P(Norm, LayerNormMatchesReference) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  check_norm(GetParam(), kFloat64, 7, 33, false, 1e-10);
  check_norm(GetParam(), kFloat32, 9, 100, false, 2e-5);
  check_norm(GetParam(), kFloat16, 5, 64, false, 1e-2);
  check_norm(GetParam(), kBFloat16, 5, 64, false, 6e-2);
}

TEST_P(Norm, RmsNormMatchesReference) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  check_norm(GetParam(), kFloat64, 7, 33, true, 1e-10);
  check_norm(GetParam(), kFloat32, 9, 100, true, 2e-5);
  check_norm(GetParam(), kFloat16, 5, 64, true, 1e-2);
  check_norm(GetParam(), kBFloat16, 5, 64, true, 6e-2);
}

// Row lengths around the CUDA kernels' vector widths and block sizes, and many rows (the
// partial sums of the weight / bias gradient).
TEST_P(Norm, ShapesAroundKernelBoundaries) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  for (int64_t n : {1, 3, 4, 8, 31, 129, 768, 1025, 4096, 5000}) {
    SCOPED_TRACE(n);
    check_norm(GetParam(), kFloat32, 3, n, false, 5e-5);
    check_norm(GetParam(), kFloat32, 3, n, true, 5e-5);
  }
  // Longer than the CUDA kernels keep in registers (8192 vectors): the re-reading kernels.
  check_norm(GetParam(), kFloat32, 3, 40000, false, 1e-4);
  check_norm(GetParam(), kFloat32, 3, 9001, true, 1e-4);
  check_norm(GetParam(), kBFloat16, 2, 70000, false, 6e-2);
  check_norm(GetParam(), kFloat32, 1500, 40, false, 5e-5);
  check_norm(GetParam(), kBFloat16, 700, 256, false, 6e-2);
  // 1024-thread blocks with 2-8 vectors per thread (kernels over 64 registers without the launch
  // bound could not launch: <bf16, 8, 2> backward had 90, <float, 4, 4> 94), and more rows than
  // blocks with one vector per thread (the next row's packs prefetched).
  check_norm(GetParam(), kFloat32, 3, 8200, false, 1e-4);
  check_norm(GetParam(), kFloat32, 3, 12288, true, 1e-4);
  check_norm(GetParam(), kBFloat16, 3, 12288, false, 6e-2);
  check_norm(GetParam(), kFloat16, 3, 16384, true, 1e-2);
  check_norm(GetParam(), kBFloat16, 2, 32768, false, 6e-2);
  check_norm(GetParam(), kBFloat16, 1000, 4096, false, 6e-2);
  check_norm(GetParam(), kFloat16, 1000, 4096, true, 1e-2);
}

// y = x + norm(x): the residual's gradient waits when the norm's backward runs, which adds it
// into grad x as it writes it (autograd::take_pending_grad); x's gradient is g + the norm's.
void check_residual_norm(Dev dev, DType dt, int64_t rows, int64_t n, bool rms, double tol) {
  const Device d = to_device(dev);
  tg::manual_seed(5);
  Tensor x = (tg::randn({rows, n}, kFloat64) * 2 - 0.25).to(d, dt).detach().requires_grad_(true);
  Tensor w = tg::randn({n}, kFloat64).to(d, dt).detach().requires_grad_(true);
  Tensor b = tg::randn({n}, kFloat64).to(d, dt).detach();
  Tensor g = tg::randn({rows, n}, kFloat64).to(d, dt);
  const double eps = 1e-5;
  Tensor y = tg::add(x, rms ? F::rms_norm(x, {n}, w, eps) : F::layer_norm(x, {n}, w, b, eps));
  y.backward(g);
  const auto gr = host(g);
  RefNorm ref = ref_norm(host(x), host(w), rms ? std::vector<double>{} : host(b), gr, rows, n, eps, rms);
  for (size_t i = 0; i < gr.size(); ++i) ref.gx[i] += gr[i];
  expect_near_vec(host(x.grad()), ref.gx, tol, tol, std::string("residual ") + (rms ? "rms_norm " : "layer_norm ") +
                                                        dtype_name(dt) + " grad x");
}

TEST_P(Norm, ResidualGradientIsAddedByTheBackward) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  for (auto [rows, n] : std::vector<std::pair<int64_t, int64_t>>{{1500, 40}, {3, 768}, {3, 12288}, {3, 40000}}) {
    SCOPED_TRACE(n);
    check_residual_norm(GetParam(), kFloat32, rows, n, false, 2e-4);
    check_residual_norm(GetParam(), kFloat32, rows, n, true, 2e-4);
  }
  check_residual_norm(GetParam(), kFloat64, 7, 33, false, 1e-10);
  check_residual_norm(GetParam(), kBFloat16, 700, 256, false, 6e-2);
}

// The residual's gradient goes into layer_norm's backward kernel: no separate sum. Counted in
// backend dispatches against the same graph whose second gradient arrives only after the norm
// ran (through x * 1, a node the engine reaches after the norm's: it runs the add's last input's
// branch first), where the engine must add the two itself.
TEST_P(Norm, ResidualGradientCostsNoExtraPass) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device d = to_device(GetParam());
  Tensor x = tg::randn({64, 96}, TensorOptions(kFloat32).device(d)).requires_grad_(true);
  Tensor g = tg::randn({64, 96}, TensorOptions(kFloat32).device(d));
  auto backward_dispatches = [&](const Tensor& y) {
    const uint64_t c0 = backend::dispatch_count();
    y.backward(g);
    return backend::dispatch_count() - c0;
  };
  Tensor y = tg::add(x, F::layer_norm(x, {96}, Tensor(), Tensor(), 1e-5));
  const uint64_t folded = backward_dispatches(y);
  const auto g1 = host(x.grad());
  x.mutable_grad() = Tensor();
  Tensor y2 = tg::add(x * 1.0, F::layer_norm(x, {96}, Tensor(), Tensor(), 1e-5));
  const uint64_t summed = backward_dispatches(y2);
  expect_near_vec(host(x.grad()), g1, 1e-6, 1e-6, "same gradient both ways");
  EXPECT_LT(folded, summed) << "the residual's gradient added by the norm's kernel, not by a sum";
  std::printf("[ info ] x + layer_norm(x) backward: %llu dispatches (%llu when summed by the engine)\n",
              static_cast<unsigned long long>(folded), static_cast<unsigned long long>(summed));
}

TEST_P(Norm, NonContiguousAndMultiDimShape) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device d = to_device(GetParam());
  Tensor base = tg::randn({4, 3, 5}, TensorOptions(kFloat64).device(d));
  Tensor x = base.transpose(0, 2);  // [5, 3, 4], not contiguous
  Tensor w = tg::randn({3, 4}, TensorOptions(kFloat64).device(d));
  Tensor y = F::layer_norm(x, {3, 4}, w, Tensor(), 1e-5);
  RefNorm ref = ref_norm(host(x), host(w), {}, std::vector<double>(60, 0.0), 5, 12, 1e-5, false);
  expect_near_vec(host(y), ref.y, 1e-10, 1e-10, "layer_norm over [3, 4] of a transposed input");
}

TEST_P(Norm, RmsNormDefaultEpsIsMachineEpsilon) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device d = to_device(GetParam());
  // A zero row: y = 0 / sqrt(0 + eps) = 0 either way; a tiny row shows eps: x = 1e-4 each.
  Tensor x = tg::full({1, 4}, 1e-4, TensorOptions(kFloat32).device(d));
  const double eps = 1.1920928955078125e-07;
  const double want = 1e-4 / std::sqrt(1e-8 + eps);
  expect_near_vec(host(F::rms_norm(x, {4})), std::vector<double>(4, want), 1e-6, 1e-5, "rms_norm default eps");
}

TEST(NormErrors, BadInputsNameTheOp) {
  Tensor x = tg::randn({2, 3});
  EXPECT_THROW(F::layer_norm(x, {4}), Error);
  try {
    F::layer_norm(x, {4});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer_norm"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(F::layer_norm(x, {3}, tg::ones({4})), Error);                           // weight shape
  EXPECT_THROW(F::layer_norm(x, {3}, tg::ones({3}, TensorOptions(kFloat64))), Error);  // weight dtype
  EXPECT_THROW(F::rms_norm(x, {2, 3, 4}), Error);
  EXPECT_THROW(F::rms_norm(tg::ones({2, 3}, TensorOptions(kInt64)), {3}), Error);
  EXPECT_THROW(F::layer_norm(x, {3}, {}, {}, -1.0), Error);
}

TEST(NormModules, StateDictNamesAndDefaults) {
  tg::nn::LayerNorm ln(8);
  auto sd = ln.state_dict();
  ASSERT_EQ(sd.keys(), (std::vector<std::string>{"weight", "bias"}));
  expect_near_vec(host(ln.weight), std::vector<double>(8, 1), 0, 0, "LayerNorm weight ones");
  expect_near_vec(host(ln.bias), std::vector<double>(8, 0), 0, 0, "LayerNorm bias zeros");
  tg::nn::LayerNorm no_bias({2, 4}, {.bias = false});
  EXPECT_EQ(no_bias.state_dict().keys(), std::vector<std::string>{"weight"});
  EXPECT_EQ(no_bias.weight.sizes(), (Shape{2, 4}));
  tg::nn::LayerNorm plain(8, {.eps = 1e-6, .elementwise_affine = false});
  EXPECT_TRUE(plain.state_dict().empty());
  tg::nn::RMSNorm rms(6);
  EXPECT_EQ(rms.state_dict().keys(), std::vector<std::string>{"weight"});
  tg::nn::RMSNorm rms_plain(6, {.eps = 1e-6, .elementwise_affine = false});
  EXPECT_TRUE(rms_plain.state_dict().empty());
  Tensor x = tg::randn({3, 8});
  auto ref = ref_norm(host(x), {}, {}, std::vector<double>(24, 0.0), 3, 8, 1e-5, false);
  expect_near_vec(host(ln(x)), ref.y, 1e-5, 1e-5, "LayerNorm forward");
}

TEST(NormAutocast, LayerNormRunsInFloat32) {
  Tensor x = tg::randn({4, 8}).to(kBFloat16);
  Tensor w = tg::ones({8}, TensorOptions(kBFloat16));
  tg::amp::autocast guard(kCPU);
  EXPECT_EQ(F::layer_norm(x, {8}, w).dtype(), kFloat32);
  EXPECT_EQ(F::rms_norm(x, {8}, w).dtype(), kFloat32);
}

// ---- embedding
class Emb : public ::testing::TestWithParam<Dev> {};
INSTANTIATE_TEST_SUITE_P(Devices, Emb, ::testing::Values(Dev::CPU, Dev::CUDA), dev_name);

void check_embedding(Dev dev, DType dt, int64_t num, int64_t dim, Shape index_shape, std::optional<int64_t> pad,
                     double tol, DType index_dtype = kInt64) {
  const Device d = to_device(dev);
  tg::manual_seed(11);
  const int64_t n = index_shape.numel();
  std::vector<int64_t> idx(n);
  for (int64_t i = 0; i < n; ++i) idx[i] = (i * 7 + i / 3) % num;  // repeats
  if (n > 2) idx[1] = idx[2] = 0;
  Tensor index = tg::tensor<int64_t>(idx, index_shape, TensorOptions(kInt64).device(d)).to(index_dtype);
  Tensor w = tg::randn({num, dim}, TensorOptions(kFloat64)).to(d, dt).detach().requires_grad_(true);
  Tensor out = F::embedding(index, w, {.padding_idx = pad});
  Shape want_shape = index_shape;
  want_shape.push_back(dim);
  ASSERT_EQ(out.sizes(), want_shape);
  Tensor g = tg::randn(want_shape, TensorOptions(kFloat64)).to(dt);
  out.backward(g.to(d));
  auto wh = host(w), gh = host(g), oh = host(out);
  std::vector<double> want_out(n * dim), want_gw(num * dim, 0.0);
  const int64_t p = pad ? (*pad < 0 ? *pad + num : *pad) : -1;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < dim; ++j) {
      want_out[i * dim + j] = wh[idx[i] * dim + j];
      if (idx[i] != p) want_gw[idx[i] * dim + j] += gh[i * dim + j];
    }
  expect_near_vec(oh, want_out, 0, 0, "embedding forward");
  expect_near_vec(host(w.grad()), want_gw, tol, tol, "embedding grad");
}

TEST_P(Emb, ForwardBackwardMatchReference) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  check_embedding(GetParam(), kFloat64, 10, 5, {4, 6}, std::nullopt, 1e-12);
  check_embedding(GetParam(), kFloat32, 10, 5, {4, 6}, 0, 1e-5);
  check_embedding(GetParam(), kFloat32, 50, 768, {300}, -1, 1e-4);
  check_embedding(GetParam(), kFloat16, 9, 33, {2, 3, 7}, 3, 2e-2);
  check_embedding(GetParam(), kBFloat16, 9, 130, {40}, std::nullopt, 1e-1);
  check_embedding(GetParam(), kFloat32, 4, 3, {}, std::nullopt, 1e-6);  // 0-d index
  check_embedding(GetParam(), kFloat32, 70, 20, {5, 50}, 3, 1e-5, kInt32);
  // Few distinct indices: runs of ~1000 positions across many of CUDA's 32-position blocks.
  check_embedding(GetParam(), kFloat32, 2, 40, {3000}, 1, 1e-4);
  check_embedding(GetParam(), kFloat32, 3, 130, {3001}, std::nullopt, 1e-4);
  check_embedding(GetParam(), kFloat16, 70, 24, {500}, std::nullopt, 5e-2, kInt32);
}

TEST_P(Emb, BackwardIsBitReproducibleByDefault) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device d = to_device(GetParam());
  EXPECT_TRUE(tg::are_deterministic_algorithms_enabled());
  std::vector<int64_t> idx(20000);
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int64_t>((i * 2654435761u) % 37);
  Tensor ix = tg::tensor<int64_t>(idx, TensorOptions(kInt64).device(d));
  Tensor g = tg::randn({20000, 64}, TensorOptions(kFloat32).device(d));
  std::vector<float> first;
  for (int rep = 0; rep < 3; ++rep) {
    Tensor w = tg::zeros({37, 64}, TensorOptions(kFloat32).device(d)).requires_grad_(true);
    F::embedding(ix, w).backward(g);
    auto v = w.grad().to(kCPU).to_vector<float>();
    if (rep == 0)
      first = v;
    else
      EXPECT_EQ(v, first) << "run " << rep;
  }
  // With the switch off the result is still right (atomics on CUDA), up to rounding.
  tg::use_deterministic_algorithms(false);
  Tensor w = tg::zeros({37, 64}, TensorOptions(kFloat32).device(d)).requires_grad_(true);
  F::embedding(ix, w).backward(g);
  tg::use_deterministic_algorithms(true);
  std::vector<double> fd(first.begin(), first.end());
  expect_near_vec(host(w.grad()), fd, 1e-3, 1e-5, "non-deterministic embedding backward");
}

TEST_P(Emb, OutOfRangeIndexIsAnError) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device d = to_device(GetParam());
  Tensor w = tg::randn({5, 3}, TensorOptions().device(d));
  for (int64_t bad : {5, -1, 100}) {
    Tensor ix = tg::tensor<int64_t>({0, bad, 2}, TensorOptions(kInt64).device(d));
    try {
      F::embedding(ix, w);
      ADD_FAILURE() << "no error for index " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("embedding"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("[5, 3]"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(F::embedding(tg::ones({3}), w), Error);  // float index
  EXPECT_THROW(F::embedding(tg::tensor<int64_t>({0}, TensorOptions(kInt64).device(d)), w, {.padding_idx = 5}), Error);
}

TEST(EmbeddingModule, InitAndStateDict) {
  tg::manual_seed(5);
  tg::nn::Embedding emb(1000, 16, {.padding_idx = 2});
  EXPECT_EQ(emb.state_dict().keys(), std::vector<std::string>{"weight"});
  auto w = host(emb.weight);
  double s = 0, ss = 0;
  for (double v : w) {
    s += v;
    ss += v * v;
  }
  const double mean = s / w.size(), var = ss / w.size() - mean * mean;
  EXPECT_NEAR(mean, 0, 0.02);
  EXPECT_NEAR(var, 1, 0.05);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(w[2 * 16 + j], 0.0);
  tg::nn::Embedding neg(10, 4, {.padding_idx = -1});
  EXPECT_EQ(*neg.options.padding_idx, 9);
  EXPECT_THROW(tg::nn::Embedding(10, 4, {.padding_idx = 10}), Error);
}

// ---- dropout
class Drop : public ::testing::TestWithParam<Dev> {};
INSTANTIATE_TEST_SUITE_P(Devices, Drop, ::testing::Values(Dev::CPU, Dev::CUDA), dev_name);

TEST_P(Drop, ScalingMaskAndStatistics) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device d = to_device(GetParam());
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    Tensor x = tg::full({200, 500}, 2.0, TensorOptions(dt).device(d)).requires_grad_(true);
    const double p = 0.3;
    Tensor y = F::dropout(x, p);
    auto yh = host(y);
    int64_t kept = 0;
    for (double v : yh) {
      if (v != 0) {
        ++kept;
        ASSERT_NEAR(v, 2.0 / (1 - p), dt == kFloat32 || dt == kFloat64 ? 1e-6 : 2e-2) << dtype_name(dt);
      }
    }
    const double frac = static_cast<double>(kept) / yh.size();
    EXPECT_NEAR(frac, 1 - p, 0.01) << dtype_name(dt);  // 100000 draws: sd 0.0015
    // Backward regenerates the same mask: grad = mask / (1 - p).
    y.backward(tg::ones_like(y));
    auto gh = host(x.grad());
    for (size_t i = 0; i < yh.size(); ++i) ASSERT_EQ(gh[i] != 0, yh[i] != 0) << i;
  }
}

TEST_P(Drop, EdgeProbabilitiesAndEval) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device d = to_device(GetParam());
  Tensor x = tg::randn({10, 10}, TensorOptions().device(d));
  EXPECT_TRUE(F::dropout(x, 0.0).is_same(x));
  EXPECT_TRUE(F::dropout(x, 0.7, false).is_same(x));
  expect_near_vec(host(F::dropout(x, 1.0)), std::vector<double>(100, 0.0), 0, 0, "p = 1");
  EXPECT_THROW(F::dropout(x, 1.5), Error);
  EXPECT_THROW(F::dropout(x, -0.1), Error);
  tg::nn::Dropout drop(0.5);
  EXPECT_FALSE(drop(x).is_same(x));
  drop.eval();
  EXPECT_TRUE(drop(x).is_same(x));
  drop.train();
  EXPECT_FALSE(drop(x).is_same(x));
  EXPECT_THROW(tg::nn::Dropout(2.0), Error);
}

TEST_P(Drop, NonContiguousInput) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device d = to_device(GetParam());
  Tensor x = tg::randn({30, 40}, TensorOptions().device(d)).t();
  tg::manual_seed(9);
  auto y = host(F::dropout(x, 0.5));
  tg::manual_seed(9);
  auto y2 = host(F::dropout(x.contiguous(), 0.5));
  EXPECT_EQ(y, y2);  // the mask follows the logical (row-major) order
  auto xh = host(x);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_TRUE(y[i] == 0 || std::abs(y[i] - 2 * xh[i]) < 1e-5);
}

// The mask is a function of (seed, offset): CPU and CUDA agree for the same seed.
TEST(DropoutDevices, CpuAndCudaGiveTheSameMask) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : {kFloat32, kFloat64, kBFloat16}) {
    Tensor x = tg::ones({1001, 37}, TensorOptions(dt));
    tg::manual_seed(1234);
    auto cpu = host(F::dropout(x, 0.4));
    tg::manual_seed(1234);
    auto gpu = host(F::dropout(x.to(kCUDA), 0.4));
    EXPECT_EQ(cpu, gpu) << dtype_name(dt);
  }
}

TEST(DropoutSeeds, ReproducibleFromSeed) {
  Tensor x = tg::ones({1000});
  tg::manual_seed(42);
  auto a = host(F::dropout(x, 0.5));
  auto b = host(F::dropout(x, 0.5));
  tg::manual_seed(42);
  auto c = host(F::dropout(x, 0.5));
  EXPECT_EQ(a, c);
  EXPECT_NE(a, b);  // the generator's offset advanced
}

// ---- ModuleList
struct Block : tg::nn::Module {
  Block() { fc = register_module("fc", std::make_shared<tg::nn::Linear>(4, 4)); }
  Tensor forward(const Tensor& x) override { return fc->forward(x); }
  std::shared_ptr<tg::nn::Linear> fc;
};
struct Net : tg::nn::Module {
  Net() {
    blocks = register_module("blocks", std::make_shared<tg::nn::ModuleList>());
    blocks->push_back(tg::nn::LayerNorm(4));
    blocks->push_back(std::make_shared<Block>());
    blocks->push_back(tg::nn::Dropout(0.1));
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = x;
    for (const auto& m : *blocks) y = m->forward(y);
    return y;
  }
  std::shared_ptr<tg::nn::ModuleList> blocks;
};

TEST(ModuleList, NamesIndexingIterationAndTrainFlag) {
  Net net;
  EXPECT_EQ(net.state_dict().keys(),
            (std::vector<std::string>{"blocks.0.weight", "blocks.0.bias", "blocks.1.fc.weight", "blocks.1.fc.bias"}));
  EXPECT_EQ(net.blocks->size(), 3u);
  EXPECT_EQ((*net.blocks)[0]->name(), "LayerNorm");
  EXPECT_EQ(net.blocks->get<tg::nn::Dropout>(2)->p, 0.1);
  EXPECT_THROW((*net.blocks)[3], Error);
  EXPECT_THROW(net.blocks->get<tg::nn::LayerNorm>(1), Error);
  EXPECT_THROW(net.blocks->forward(tg::ones({4})), Error);
  int count = 0;
  for (const auto& m : *net.blocks) count += m != nullptr;
  EXPECT_EQ(count, 3);
  net.eval();
  EXPECT_FALSE((*net.blocks)[2]->is_training());
  Tensor x = tg::randn({2, 4});
  EXPECT_EQ(host(net(x)), host(net(x)));  // eval: dropout is the identity
  tg::nn::ModuleList direct(tg::nn::Linear(2, 2), tg::nn::ReLU());
  EXPECT_EQ(direct.state_dict().keys(), (std::vector<std::string>{"0.weight", "0.bias"}));
}

}  // namespace
}  // namespace tg::testing
