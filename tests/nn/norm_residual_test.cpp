// A large residual add (float32 plus float16 / bfloat16) waits in the CUDA launch queue, and a
// layer_norm / rms_norm of its result called next reads the two operands, writes the sum and
// normalizes it in one kernel (normalization.cu, DeferredAdd). Checked: the pair fuses (counted)
// where it should and nowhere else; the sum and the norm's outputs are the same bits as the add
// and the norm run apart, and the norm is within float32 error of float64; a pre-norm block under
// bfloat16 autocast gives the same outputs and gradients fused and not; an op reading the sum in
// between, a norm of another tensor or of a view, rms_norm, an in-place add (left alone) and a
// captured graph. CUDA only.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.h>

#include <tapegrad/core/cuda_graph.h>
#include "tests/autograd/common.h"

#ifdef TG_WITH_CUDA
#include <tapegrad/core/backend/cuda/kernels.cuh>

namespace tg::testing {
namespace {

namespace F = tg::nn::functional;
using tg::cuda::kern::norm_residual_fusions;
using tg::cuda::kern::set_norm_residual_fusion;

#define TG_SKIP_WITHOUT_GPU() \
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

struct FusionOn {
  ~FusionOn() { set_norm_residual_fusion(true); }
};

const TensorOptions kGpu = TensorOptions().device(Device(kCUDA));

void expect_same_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  const std::vector<double> g = host(got), w = host(want);
  int bad = 0;
  for (size_t i = 0; i < g.size(); ++i)
    if (!(g[i] == w[i] || (std::isnan(g[i]) && std::isnan(w[i]))) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "] = " << g[i] << ", apart " << w[i];
}

// layer_norm of each row of h (host float64), with weight and bias.
std::vector<double> layer_norm_ref(const std::vector<double>& h, const std::vector<double>& w,
                                   const std::vector<double>& b, int64_t cols) {
  std::vector<double> y(h.size());
  for (size_t r = 0; r < h.size() / cols; ++r) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < cols; ++c) mean += h[r * cols + c];
    mean /= static_cast<double>(cols);
    for (int64_t c = 0; c < cols; ++c) var += (h[r * cols + c] - mean) * (h[r * cols + c] - mean);
    const double rstd = 1.0 / std::sqrt(var / static_cast<double>(cols) + 1e-5);
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = (h[r * cols + c] - mean) * rstd * w[c] + b[c];
  }
  return y;
}

TEST(NormResidual, FusesAndMatchesTheAddAndNormApart) {
  TG_SKIP_WITHOUT_GPU();
  FusionOn restore;
  tg::manual_seed(3);
  const int64_t rows = 1024, cols = 768;  // 786k elements: above the launch queue's own launches
  for (DType half : {kBFloat16, kFloat16}) {
    for (bool half_first : {false, true}) {
      const std::string what = std::string(dtype_name(half)) + (half_first ? " + float32" : " float32 + half");
      Tensor x = tg::randn({rows, cols}, kGpu) * 3.0 + 1.0;
      Tensor r = tg::randn({rows, cols}, kGpu).to(half);
      Tensor w = tg::randn({cols}, kGpu), b = tg::randn({cols}, kGpu);
      auto run = [&] {
        Tensor h = half_first ? r + x : x + r;
        Tensor y = F::layer_norm(h, {cols}, w, b);
        return std::pair{h, y};
      };
      set_norm_residual_fusion(true);
      const int64_t before = norm_residual_fusions();
      auto [h, y] = run();
      EXPECT_EQ(norm_residual_fusions() - before, 1) << what;
      set_norm_residual_fusion(false);
      auto [h0, y0] = run();
      EXPECT_EQ(norm_residual_fusions() - before, 1) << what;
      expect_same_bits(h, h0, what + ": sum");
      expect_same_bits(y, y0, what + ": layer_norm");
      // The sum is the float32 sum of the operands; the norm within float32 error of float64.
      const std::vector<double> hx = host(x), hr = host(r), hh = host(h);
      for (size_t i = 0; i < hh.size(); ++i)
        ASSERT_EQ(hh[i], static_cast<double>(static_cast<float>(hx[i]) + static_cast<float>(hr[i]))) << what << i;
      expect_near_vec(host(y), layer_norm_ref(hh, host(w), host(b), cols), 1e-4, 1e-4, what);
    }
  }
}

// ln(x + f(x)) as GPT-2's blocks write it, under bfloat16 autocast: outputs and gradients fused
// are the bits of the unfused run (the norms' bfloat16 twins included).
TEST(NormResidual, PreNormBlockUnderAutocastSameOutputsAndGradients) {
  TG_SKIP_WITHOUT_GPU();
  FusionOn restore;
  const int64_t B = 4, T = 128, C = 768;
  tg::manual_seed(11);
  nn::LayerNorm ln1(C, {}, kGpu), ln2(C, {}, kGpu);
  nn::Linear fc(C, C, true, kGpu), proj(C, C, true, kGpu);
  Tensor x0 = tg::randn({B, T, C}, kGpu);
  auto step = [&](bool fuse) {
    set_norm_residual_fusion(fuse);
    for (nn::Module* m : std::vector<nn::Module*>{&ln1, &ln2, &fc, &proj}) m->zero_grad();
    Tensor x = x0.detach().requires_grad_(true);
    Tensor out;
    const int64_t before = norm_residual_fusions();
    {
      amp::Autocast ac(kCUDA, kBFloat16);
      Tensor h = x + fc.forward(ln1.forward(x));
      out = proj.forward(ln2.forward(h));
    }
    EXPECT_EQ(norm_residual_fusions() - before, fuse ? 1 : 0);
    const Tensor o = out.to(kFloat32);
    (o * o).mean().backward();
    return std::vector<Tensor>{out, x.grad(), ln1.weight.grad(), ln2.weight.grad(), ln2.bias.grad(), fc.weight.grad()};
  };
  const std::vector<Tensor> fused = step(true), apart = step(false);
  const char* names[] = {"out", "x.grad", "ln1.weight.grad", "ln2.weight.grad", "ln2.bias.grad", "fc.weight.grad"};
  for (size_t i = 0; i < fused.size(); ++i) expect_same_bits(fused[i], apart[i], names[i]);
}

// An op that reads the sum before the norm runs the add on its own; a norm of another tensor, or
// of a view of the sum, leaves the add alone; the results stay right.
TEST(NormResidual, AnythingInBetweenLeavesTheAddAlone) {
  TG_SKIP_WITHOUT_GPU();
  FusionOn restore;
  tg::manual_seed(4);
  const int64_t rows = 512, cols = 1024;
  Tensor x = tg::randn({rows, cols}, kGpu), other = tg::randn({rows, cols}, kGpu);
  Tensor r = tg::randn({rows, cols}, kGpu).to(kBFloat16);
  const int64_t before = norm_residual_fusions();
  Tensor h1 = x + r;
  const double s = h1.sum().item<double>();
  Tensor y1 = F::layer_norm(h1, {cols});
  Tensor h2 = x + r;
  Tensor y2 = F::layer_norm(other, {cols});
  Tensor h3 = x + r;
  Tensor y3 = F::layer_norm(h3.slice(0, 0, rows / 2), {cols});
  EXPECT_EQ(norm_residual_fusions() - before, 0);
  set_norm_residual_fusion(false);
  Tensor h0 = x + r;
  expect_same_bits(h1, h0, "sum read in between");
  expect_same_bits(h2, h0, "norm of another tensor: sum");
  expect_same_bits(h3, h0, "norm of a view: sum");
  expect_same_bits(y1, F::layer_norm(h0, {cols}), "norm after the read");
  expect_same_bits(y2, F::layer_norm(other, {cols}), "norm of another tensor");
  expect_same_bits(y3, F::layer_norm(h0.slice(0, 0, rows / 2), {cols}), "norm of a view");
  EXPECT_NEAR(s, h0.sum().item<double>(), 1e-6 * std::abs(s) + 1e-3);
}

// rms_norm absorbs the add too. An in-place x += r is left alone (add_ casts r to x's float32
// first: a float32 add, not the mixed residual form) and stays right.
TEST(NormResidual, RmsNormAndInPlaceAdd) {
  TG_SKIP_WITHOUT_GPU();
  FusionOn restore;
  tg::manual_seed(6);
  const int64_t rows = 2048, cols = 512;
  Tensor x = tg::randn({rows, cols}, kGpu), w = tg::randn({cols}, kGpu);
  Tensor r = tg::randn({rows, cols}, kGpu).to(kFloat16);
  Tensor xa = x.clone(), xb = x.clone();
  const int64_t before = norm_residual_fusions();
  Tensor h = x + r;
  Tensor y = F::rms_norm(h, {cols}, w);
  EXPECT_EQ(norm_residual_fusions() - before, 1);
  Tensor ya;
  {
    NoGradGuard ng;
    xa.add_(r);
    ya = F::rms_norm(xa, {cols}, w);
  }
  EXPECT_EQ(norm_residual_fusions() - before, 1);
  set_norm_residual_fusion(false);
  Tensor h0 = x + r;
  Tensor y0 = F::rms_norm(h0, {cols}, w);
  Tensor yb;
  {
    NoGradGuard ng;
    xb.add_(r);
    yb = F::rms_norm(xb, {cols}, w);
  }
  expect_same_bits(h, h0, "sum");
  expect_same_bits(y, y0, "rms_norm");
  expect_same_bits(xa, xb, "in-place sum");
  expect_same_bits(ya, yb, "rms_norm after the in-place add");
  expect_same_bits(xa, h0, "in-place sum against the mixed add");
}

// Captured: the pair fuses into the graph, and a replay after new operand values recomputes both.
TEST(NormResidual, CapturedPairFusesAndReplays) {
  TG_SKIP_WITHOUT_GPU();
  FusionOn restore;
  tg::manual_seed(8);
  const int64_t rows = 1024, cols = 768;
  Tensor x = tg::randn({rows, cols}, kGpu), w = tg::randn({cols}, kGpu), b = tg::randn({cols}, kGpu);
  Tensor r = tg::randn({rows, cols}, kGpu).to(kBFloat16);
  Tensor h, y;
  tg::cuda::Stream side;
  {
    tg::cuda::StreamGuard guard(side);
    tg::cuda::Graph graph;
    const int64_t before = norm_residual_fusions();
    graph.capture([&] {
      h = x + r;
      y = F::layer_norm(h, {cols}, w, b);
    });
    EXPECT_EQ(norm_residual_fusions() - before, 1);
    NoGradGuard ng;
    x.copy_(tg::randn({rows, cols}, kGpu));
    graph.replay();
    side.synchronize();
  }
  set_norm_residual_fusion(false);
  Tensor h0 = x + r;
  expect_same_bits(h, h0, "replayed sum");
  expect_same_bits(y, F::layer_norm(h0, {cols}, w, b), "replayed layer_norm");
}

}  // namespace
}  // namespace tg::testing
#endif  // TG_WITH_CUDA
