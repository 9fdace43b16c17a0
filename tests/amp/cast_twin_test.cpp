// Twins (core/cast_copies.h): layer_norm / rms_norm under autocast write their output's lowered
// cast beside it and the Linear after them takes it instead of casting; layer_norm's backward
// writes its input gradient's cast when a mixed residual add will cast it. Each case checks that
// the twin was taken (counted), and that results are bit-identical to the same run with twins
// off (the reference: the plain cast kernel). A stale twin (the result changed in place) is not
// taken; rows too short for the block kernels and the CPU write none. CUDA cases skip without a
// GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.h>

#include <tapegrad/core/cast_copies.h>
#include <tapegrad/core/native.h>

namespace tg::testing {
namespace {

std::vector<unsigned char> bytes_of(const Tensor& t) {
  Tensor c = t.detach().cpu().contiguous();
  std::vector<unsigned char> out(c.nbytes());
  c.copy_to_host(out.data());
  return out;
}

// Restores twins on at the end of a test that turned them off.
struct TwinsOn {
  ~TwinsOn() { detail::set_cast_twins_enabled(true); }
};

TensorOptions on(Device d) { return TensorOptions().device(d); }

// x -> LayerNorm(C) -> Linear(C, 64) under bfloat16 autocast.
std::vector<unsigned char> norm_then_linear(int64_t C, bool rms, int64_t* twins_taken) {
  manual_seed(7);
  const Device dev(kCUDA);
  Tensor x = randn({384, C}, on(dev));
  std::shared_ptr<nn::Module> norm;
  if (rms) norm = std::make_shared<nn::RMSNorm>(Shape{C}, nn::RMSNormOptions(), on(dev));
  else norm = std::make_shared<nn::LayerNorm>(Shape{C}, nn::LayerNormOptions(), on(dev));
  for (auto& p : norm->parameters()) {
    NoGradGuard g;
    p.copy_(randn(p.sizes(), on(dev)));
  }
  nn::Linear lin(C, 64, true, on(dev));
  const int64_t before = detail::cast_twin_hits();
  Tensor z;
  {
    amp::Autocast ac(kCUDA, kBFloat16);
    z = lin.forward(norm->forward(x));
  }
  *twins_taken = detail::cast_twin_hits() - before;
  EXPECT_EQ(z.dtype(), kBFloat16);
  return bytes_of(z);
}

TEST(CastTwin, LayerNormHandsItsCastToTheLinearBitForBit) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  TwinsOn restore;
  for (bool rms : {false, true}) {
    int64_t taken = 0, taken_off = 0;
    const auto with = norm_then_linear(768, rms, &taken);
    detail::set_cast_twins_enabled(false);
    const auto without = norm_then_linear(768, rms, &taken_off);
    detail::set_cast_twins_enabled(true);
    EXPECT_EQ(taken, 1) << "rms " << rms;
    EXPECT_EQ(taken_off, 0) << "rms " << rms;
    EXPECT_EQ(with, without) << "rms " << rms;
  }
}

TEST(CastTwin, ShortRowsWriteNoneAndStayCorrect) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  TwinsOn restore;
  int64_t taken = 0, taken_off = 0;
  const auto with = norm_then_linear(256, false, &taken);  // 64 float4 packs a row: the warp kernel
  detail::set_cast_twins_enabled(false);
  const auto without = norm_then_linear(256, false, &taken_off);
  EXPECT_EQ(taken, 0);
  EXPECT_EQ(with, without);
}

TEST(CastTwin, TakenOnceAndNeverWhenStale) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const Device dev(kCUDA);
  Tensor x = randn({64, 1024}, on(dev));
  Tensor y;
  {
    amp::Autocast ac(kCUDA, kBFloat16);
    y = nn::functional::layer_norm(x, {1024});
  }
  int64_t h = detail::cast_twin_hits();
  Tensor a = y.to(kBFloat16);
  EXPECT_EQ(detail::cast_twin_hits(), h + 1);
  Tensor b = y.to(kBFloat16);  // the twin went with the first cast: a real cast now
  EXPECT_EQ(detail::cast_twin_hits(), h + 1);
  EXPECT_EQ(bytes_of(a), bytes_of(b));
  EXPECT_FALSE(a.impl().storage == b.impl().storage);

  {
    amp::Autocast ac(kCUDA, kBFloat16);
    y = nn::functional::layer_norm(x, {1024});
  }
  {
    NoGradGuard g;
    y.add_(0.5);  // in place: the twin no longer equals y's cast
  }
  h = detail::cast_twin_hits();
  Tensor c = y.to(kBFloat16);
  EXPECT_EQ(detail::cast_twin_hits(), h);
  EXPECT_EQ(bytes_of(c), bytes_of(y.cpu().to(kBFloat16)));
}

// A pre-norm residual step: h = x + a (float32 stream, bfloat16 block output), LayerNorm(h),
// loss = sum(ln(h) * r). The gradient of a is the bfloat16 cast of layer_norm's input gradient.
struct Grads {
  std::vector<unsigned char> gx, gu, gw, gb, gl;
  int64_t twins = 0;
};
Grads residual_step() {
  manual_seed(11);
  const Device dev(kCUDA);
  const int64_t C = 768;
  Tensor x = (randn({512, C}, on(dev))).requires_grad_();
  Tensor u = (randn({512, C}, on(dev))).requires_grad_();
  Tensor r = randn({512, C}, on(dev));
  nn::Linear lin(C, C, true, on(dev));
  nn::LayerNorm ln(Shape{C}, nn::LayerNormOptions(), on(dev));
  Tensor loss;
  {
    amp::Autocast ac(kCUDA, kBFloat16);
    Tensor a = lin.forward(u);
    EXPECT_EQ(a.dtype(), kBFloat16);
    Tensor h = x + a;
    EXPECT_EQ(h.dtype(), kFloat32);
    loss = (ln.forward(h) * r).sum();
  }
  const int64_t before = detail::cast_twin_hits();
  loss.backward();
  Grads g;
  g.twins = detail::cast_twin_hits() - before;
  g.gx = bytes_of(x.grad());
  g.gu = bytes_of(u.grad());
  g.gw = bytes_of(lin.weight.grad());
  g.gb = bytes_of(lin.bias.grad());
  g.gl = bytes_of(ln.weight.grad());
  return g;
}

TEST(CastTwin, LayerNormBackwardWritesTheResidualGradientsCast) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  TwinsOn restore;
  const Grads with = residual_step();
  detail::set_cast_twins_enabled(false);
  const Grads without = residual_step();
  EXPECT_EQ(with.twins, 1);
  EXPECT_EQ(without.twins, 0);
  EXPECT_EQ(with.gx, without.gx);
  EXPECT_EQ(with.gu, without.gu);
  EXPECT_EQ(with.gw, without.gw);
  EXPECT_EQ(with.gb, without.gb);
  EXPECT_EQ(with.gl, without.gl);
}

// The kernels that write a twin leave every float32 result with the plain kernel's bits: y, mean
// and rstd forward; dx (with and without an addend), the weight and bias gradients backward.
TEST(CastTwin, TwinKernelsKeepTheFloat32Bits) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const Device dev(kCUDA);
  for (int64_t C : {768, 1024, 3072}) {
    for (bool rms : {false, true}) {
      manual_seed(static_cast<uint64_t>(C));
      Tensor x = randn({300, C}, on(dev)) * 3 + 1, w = randn({C}, on(dev)), b = rms ? Tensor() : randn({C}, on(dev));
      Tensor g = randn({300, C}, on(dev)), add = randn({300, C}, on(dev));
      const char* op = rms ? "rms_norm" : "layer_norm";
      const native::NormResult plain = native::norm_forward(op, x, Shape{C}, w, b, 1e-5, rms);
      const native::NormResult twin = native::norm_forward(op, x, Shape{C}, w, b, 1e-5, rms, kBFloat16);
      const std::string what = std::string(op) + " C=" + std::to_string(C);
      EXPECT_EQ(bytes_of(plain.y), bytes_of(twin.y)) << what << " y";
      EXPECT_EQ(bytes_of(plain.rstd), bytes_of(twin.rstd)) << what << " rstd";
      if (!rms) EXPECT_EQ(bytes_of(plain.mean), bytes_of(twin.mean)) << what << " mean";
      for (bool with_add : {false, true}) {
        const Tensor addend = with_add ? add : Tensor();
        auto p = native::norm_backward(g, x, Shape{C}, w, plain.mean, plain.rstd, rms, true, true, !rms, addend);
        auto t = native::norm_backward(g, x, Shape{C}, w, plain.mean, plain.rstd, rms, true, true, !rms, addend,
                                       kBFloat16);
        const std::string bw = what + (with_add ? " with addend" : "");
        EXPECT_EQ(bytes_of(p[0]), bytes_of(t[0])) << bw << " dx";
        EXPECT_EQ(bytes_of(p[1]), bytes_of(t[1])) << bw << " dw";
        if (!rms) EXPECT_EQ(bytes_of(p[2]), bytes_of(t[2])) << bw << " db";
      }
    }
  }
}

TEST(CastTwin, CpuWritesNone) {
  Tensor x = randn({8, 64});
  const int64_t h = detail::cast_twin_hits();
  Tensor y;
  {
    amp::Autocast ac(kCPU, kBFloat16);
    y = nn::functional::layer_norm(x, {64});
  }
  Tensor low = y.to(kBFloat16);
  EXPECT_EQ(detail::cast_twin_hits(), h);
  EXPECT_EQ(low.dtype(), kBFloat16);
  // The cast rounds: within bfloat16's half-ulp of the float32 result.
  const auto a = y.to_vector<float>();
  const auto b = low.to(kFloat32).to_vector<float>();
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(b[i], a[i], std::abs(a[i]) * 0.00390625 + 1e-30) << i;
}

}  // namespace
}  // namespace tg::testing
