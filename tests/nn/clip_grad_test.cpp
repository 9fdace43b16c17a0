// Gradient clipping (nn/clip_grad.h) against float64 references computed here: total norms of
// order 1, 2, 3, inf and 0.5 over many tensors of different sizes (some larger than a multi-tensor
// range, more tensors than one CUDA launch holds), float16 / bfloat16 / float64 gradients, PyTorch's
// non-finite behaviour, the clamped coefficient, clip_grad_value_, bad input, the GradScaler
// sequence, and on CUDA a capture in a tg::cuda::Graph replayed with new gradients (a capture fails
// on any host synchronisation, so it also shows there is none) and total norms called in a row and
// several times in one replayed graph (the norm kernel's "blocks done" counter is re-armed). Each
// runs on the CPU and, when a GPU is present, on CUDA.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.h>

namespace tg::testing {
namespace {

using nn::utils::clip_grad_norm_;
using nn::utils::clip_grad_value_;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<Device> devices() {
  std::vector<Device> d{Device(kCPU)};
  if (cuda::is_available()) d.emplace_back(kCUDA, 0);
  return d;
}

std::vector<double> host(const Tensor& t) {
  const std::vector<double> v = t.detach().to(kFloat64).cpu().contiguous().to_vector<double>();
  return v;
}

// A parameter of `shape` on dev whose .grad is `g` (moved to dev).
Tensor param_with_grad(const Tensor& g, Device dev) {
  Tensor p = zeros(g.sizes(), TensorOptions().dtype(g.dtype()).device(dev)).requires_grad_();
  p.mutable_grad() = g.to(dev);
  return p;
}

// Parameters with randn * scale gradients of these sizes and dtype (made on the CPU, same values on
// every device).
std::vector<Tensor> make_params(const std::vector<int64_t>& sizes, DType dtype, Device dev, uint64_t seed,
                                double scale = 1.0) {
  manual_seed(seed);
  std::vector<Tensor> ps;
  for (int64_t n : sizes) ps.push_back(param_with_grad((randn({n}) * scale).to(dtype), dev));
  return ps;
}

std::vector<std::vector<double>> grads_of(const std::vector<Tensor>& ps) {
  std::vector<std::vector<double>> out;
  for (const Tensor& p : ps) out.push_back(host(p.grad()));
  return out;
}

// The float64 reference: (sum |x|^p)^(1/p), max |x| for inf; NaN anywhere gives NaN.
double ref_norm(const std::vector<std::vector<double>>& gs, double p) {
  double acc = 0;
  bool nan = false;
  for (const auto& g : gs)
    for (double v : g) {
      nan |= std::isnan(v);
      const double a = std::abs(v);
      acc = std::isinf(p) ? std::max(acc, a) : acc + std::pow(a, p);
    }
  if (nan) return kNaN;
  return std::isinf(p) ? acc : std::pow(acc, 1.0 / p);
}

// The coefficient clip_grad_norm_ applies for a returned total (PyTorch's float32 arithmetic;
// float64 for a float64 total).
double coef_for(double max_norm, const Tensor& total) {
  const double t = total.item<double>();
  if (total.dtype() == kFloat64) return std::min(max_norm / (t + 1e-6), 1.0);  // NaN: min returns the first
  const float c = static_cast<float>(max_norm) / (static_cast<float>(t) + 1e-6f);
  return c > 1.f ? 1.0 : static_cast<double>(c);
}

bool same(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

// g * coef rounded as the kernels do: in float32 (float64 for float64), stored in the grad's dtype.
std::vector<double> scaled(const std::vector<double>& g, double coef, DType dt) {
  if (dt == kFloat64) {
    std::vector<double> out(g.size());
    for (size_t i = 0; i < g.size(); ++i) out[i] = g[i] * coef;
    return out;
  }
  std::vector<float> v(g.size());
  for (size_t i = 0; i < g.size(); ++i) v[i] = static_cast<float>(g[i]) * static_cast<float>(coef);
  return tensor(v, {static_cast<int64_t>(v.size())}).to(dt).to(kFloat64).to_vector<double>();
}

// Every gradient equals its value before, scaled by coef as the kernels round it.
void expect_scaled(const std::vector<std::vector<double>>& before, const std::vector<std::vector<double>>& after,
                   double coef, const std::vector<DType>& dtypes) {
  ASSERT_EQ(before.size(), after.size());
  for (size_t t = 0; t < after.size(); ++t) {
    const std::vector<double> want = scaled(before[t], coef, dtypes[t]);
    ASSERT_EQ(after[t].size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_TRUE(same(after[t][i], want[i])) << "tensor " << t << " element " << i << ": " << after[t][i] << " vs " << want[i];
  }
}

std::vector<DType> dtypes_of(const std::vector<Tensor>& ps) {
  std::vector<DType> out;
  for (const Tensor& p : ps) out.push_back(p.grad().dtype());
  return out;
}

// Sizes from 1 element to more than a CUDA block's range (8192 elements at least) and a
// multi-tensor chunk (65536), an empty one, odd ones (vector tails).
const std::vector<int64_t> kSizes = {1, 7, 768, 0, 2304, 4099, 65536 + 3, 200003, 31, 16, 8193};

void check_clip(Device dev, DType dt, double p, double max_norm_factor, double rel_tol, double scale = 1.0) {
  SCOPED_TRACE(dev.str() + " " + dtype_name(dt) + " p=" + std::to_string(p));
  std::vector<Tensor> ps = make_params(kSizes, dt, dev, 5, scale);
  const auto before = grads_of(ps);
  const double ref = ref_norm(before, p);
  const double max_norm = ref * max_norm_factor;
  Tensor total = clip_grad_norm_(ps, max_norm, p);
  EXPECT_EQ(total.dim(), 0);
  EXPECT_EQ(total.device(), dev);
  EXPECT_EQ(total.dtype(), dt);  // PyTorch: the gradients' dtype
  EXPECT_NEAR(total.item<double>(), ref, rel_tol * ref);
  const double coef = coef_for(max_norm, total);
  if (max_norm_factor < 1) EXPECT_LT(coef, 1.0);
  expect_scaled(before, grads_of(ps), coef, dtypes_of(ps));
}

TEST(ClipGradNorm, NormsOfManyTensorsFloat32) {
  for (Device dev : devices())
    for (double p : {1.0, 2.0, 3.0, kInf, 0.5}) check_clip(dev, kFloat32, p, 0.25, 2e-5);
}

// Accumulated in float32 from the exact stored values; the total is rounded once to the dtype.
TEST(ClipGradNorm, HalfAndBFloat16Gradients) {
  for (Device dev : devices()) {
    for (double p : {2.0, 1.0, kInf}) {
      // scale 0.01: the 1-norm of these 280k elements stays inside float16's range
      check_clip(dev, kFloat16, p, 0.3, 1e-3, 0.01);  // 2^-11 rounding of the total, plus float32 sums
      check_clip(dev, kBFloat16, p, 0.3, 8e-3);   // 2^-8
    }
  }
}

TEST(ClipGradNorm, Float64Gradients) {
  for (Device dev : devices())
    for (double p : {2.0, 3.0, kInf}) check_clip(dev, kFloat64, p, 0.5, 1e-12);
}

TEST(ClipGradNorm, MixedDtypesPromoteTheTotal) {
  for (Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    manual_seed(3);
    std::vector<Tensor> ps = {param_with_grad(randn({1000}).to(kFloat16), dev),
                              param_with_grad(randn({3000}), dev),
                              param_with_grad(randn({500}).to(kBFloat16), dev)};
    const auto before = grads_of(ps);
    Tensor total = clip_grad_norm_(ps, 1.0);
    EXPECT_EQ(total.dtype(), kFloat32);
    EXPECT_NEAR(total.item<double>(), ref_norm(before, 2), 2e-5 * ref_norm(before, 2));
    const double coef = coef_for(1.0, total);
    expect_scaled(before, grads_of(ps), coef, dtypes_of(ps));
  }
}

// More tensors than one CUDA launch holds (224), of sizes 1 .. 3000.
TEST(ClipGradNorm, HundredsOfTensors) {
  std::vector<int64_t> sizes;
  for (int i = 0; i < 500; ++i) sizes.push_back(1 + (i * 7919) % 3000);
  for (Device dev : devices()) {
    for (double p : {2.0, kInf}) {
      SCOPED_TRACE(dev.str() + " p=" + std::to_string(p));
      std::vector<Tensor> ps = make_params(sizes, kFloat32, dev, 9);
      const auto before = grads_of(ps);
      const double ref = ref_norm(before, p);
      Tensor total = clip_grad_norm_(ps, 0.1, p);
      EXPECT_NEAR(total.item<double>(), ref, 2e-5 * ref);
      const double coef = coef_for(0.1, total);
      expect_scaled(before, grads_of(ps), coef, dtypes_of(ps));
    }
  }
}

// Several launches per dtype and several dtypes: every block's partial lands in one buffer.
TEST(ClipGradNorm, HundredsOfTensorsOfThreeDtypes) {
  for (Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    manual_seed(10);
    std::vector<Tensor> ps;
    const DType dts[] = {kFloat32, kFloat16, kBFloat16};
    for (int i = 0; i < 700; ++i) ps.push_back(param_with_grad(randn({1 + (i * 104729) % 5000}).to(dts[i % 3]), dev));
    const auto before = grads_of(ps);
    const double ref = ref_norm(before, 2);
    Tensor total = clip_grad_norm_(ps, 1.0);
    EXPECT_EQ(total.dtype(), kFloat32);
    EXPECT_NEAR(total.item<double>(), ref, 2e-5 * ref);
    expect_scaled(before, grads_of(ps), coef_for(1.0, total), dtypes_of(ps));
  }
}

// Millions of elements on CUDA, in tensors larger than a block's range, with one gradient that
// starts 4 bytes past a 16-byte boundary (a view at offset 1; its pieces take the scalar path).
// Every dtype and norm against float64, the scale bit for bit, and the norm after clipping is
// coef times the norm before (the scale reached every element).
TEST(ClipGradNormCuda, MillionsOfElementsInLargeTensors) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const Device dev(kCUDA, 0);
  const std::vector<int64_t> sizes = {3'000'001, 17, 5'000'000, 777'777};
  for (DType dt : {kFloat32, kBFloat16, kFloat64}) {
    for (double p : {2.0, 1.0, kInf}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " p=" + std::to_string(p));
      std::vector<Tensor> ps = make_params(sizes, dt, dev, 41);
      Tensor base = (randn({1'234'568}) * 3).to(dt).to(dev);
      Tensor odd = zeros({1'234'567}, TensorOptions().dtype(dt).device(dev)).requires_grad_();
      odd.mutable_grad() = base.slice(0, 1, 1'234'568);
      ASSERT_TRUE(odd.grad().is_contiguous());
      ps.insert(ps.begin() + 2, odd);
      const auto before = grads_of(ps);
      const double ref = ref_norm(before, p);
      const double tol = dt == kFloat64 ? 1e-12 : dt == kFloat32 ? 2e-5 : 8e-3;
      const double max_norm = ref * 0.3;
      Tensor total = clip_grad_norm_(ps, max_norm, p);
      EXPECT_EQ(total.dtype(), dt);
      EXPECT_NEAR(total.item<double>(), ref, tol * ref);
      const auto after = grads_of(ps);
      const double coef = coef_for(max_norm, total);
      EXPECT_LT(coef, 0.31);
      expect_scaled(before, after, coef, dtypes_of(ps));
      EXPECT_NEAR(ref_norm(after, p), coef * ref, 2 * tol * coef * ref);
    }
  }
}

TEST(ClipGradNorm, MaxNormAboveTheNormLeavesGradientsBitForBit) {
  for (Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    std::vector<Tensor> ps = make_params(kSizes, kFloat32, dev, 6);
    const auto before = grads_of(ps);
    const double ref = ref_norm(before, 2);
    Tensor total = clip_grad_norm_(ps, 2 * ref);
    EXPECT_NEAR(total.item<double>(), ref, 2e-5 * ref);
    EXPECT_EQ(grads_of(ps), before);
  }
}

// max_norm is not checked (PyTorch): a negative one gives a negative coefficient.
TEST(ClipGradNorm, NegativeMaxNormFollowsTheFormula) {
  for (Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    std::vector<Tensor> ps = make_params({100, 37}, kFloat32, dev, 8);
    const auto before = grads_of(ps);
    Tensor total = clip_grad_norm_(ps, -1.0);
    const double coef = coef_for(-1.0, total);
    EXPECT_LT(coef, 0);
    expect_scaled(before, grads_of(ps), coef, dtypes_of(ps));
  }
}

// As PyTorch: an inf gradient makes the norm inf and the coefficient 0 (finite gradients become 0,
// the inf one NaN); a NaN makes the norm and every gradient NaN; the inf-norm keeps a NaN too.
TEST(ClipGradNorm, NonFiniteGradients) {
  for (Device dev : devices()) {
    for (double p : {2.0, kInf, 1.0}) {
      SCOPED_TRACE(dev.str() + " p=" + std::to_string(p));
      std::vector<Tensor> ps = make_params({5000, 100000, 3}, kFloat32, dev, 1);
      ps[1].grad().slice(0, 77777, 77778).fill_(kInf);
      Tensor total = clip_grad_norm_(ps, 1.0, p);
      EXPECT_TRUE(std::isinf(total.item<double>())) << total.item<double>();
      auto g = grads_of(ps);
      EXPECT_TRUE(std::isnan(g[1][77777]));
      for (size_t t = 0; t < g.size(); ++t)
        for (size_t i = 0; i < g[t].size(); ++i)
          if (!(t == 1 && i == 77777)) ASSERT_EQ(g[t][i], 0.0) << t << " " << i;

      ps = make_params({5000, 100000, 3}, kFloat32, dev, 1);
      ps[1].grad().slice(0, 4242, 4243).fill_(kNaN);
      ps[2].grad().slice(0, 1, 2).fill_(kInf);
      total = clip_grad_norm_(ps, 1.0, p);
      EXPECT_TRUE(std::isnan(total.item<double>())) << total.item<double>();
      g = grads_of(ps);
      for (size_t t = 0; t < g.size(); ++t)
        for (size_t i = 0; i < g[t].size(); ++i) ASSERT_TRUE(std::isnan(g[t][i])) << t << " " << i;
    }
  }
}

TEST(ClipGradNorm, ErrorIfNonfiniteThrowsBeforeClipping) {
  for (Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    std::vector<Tensor> ps = make_params({100, 20}, kFloat32, dev, 2);
    ps[0].grad().slice(0, 3, 4).fill_(kNaN);
    const auto before = grads_of(ps);
    try {
      (void)clip_grad_norm_(ps, 1.0, 2.0, /*error_if_nonfinite=*/true);
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("non-finite"), std::string::npos) << e.what();
    }
    const auto after = grads_of(ps);
    for (size_t t = 0; t < after.size(); ++t)
      for (size_t i = 0; i < after[t].size(); ++i) ASSERT_TRUE(same(after[t][i], before[t][i]));
    // A finite norm passes the check and clips.
    std::vector<Tensor> ok = make_params({100, 20}, kFloat32, dev, 2);
    const double ref = ref_norm(grads_of(ok), 2);
    EXPECT_NEAR(clip_grad_norm_(ok, 1.0, 2.0, true).item<double>(), ref, 2e-5 * ref);
  }
}

TEST(ClipGradNorm, ParametersWithoutGradientsAreSkipped) {
  for (Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    std::vector<Tensor> ps = make_params({300, 40}, kFloat32, dev, 4);
    Tensor bare = zeros({1000}, TensorOptions().device(dev)).requires_grad_();
    ps.insert(ps.begin() + 1, bare);
    const double ref = ref_norm({host(ps[0].grad()), host(ps[2].grad())}, 2);
    EXPECT_NEAR(clip_grad_norm_(ps, 1e9).item<double>(), ref, 2e-5 * ref);
    EXPECT_FALSE(bare.grad().defined());
  }
}

// PyTorch returns torch.tensor(0.0) (float32, CPU) when no parameter has a gradient.
TEST(ClipGradNorm, NoGradientsGiveAZeroOnTheCpu) {
  for (const std::vector<Tensor>& ps :
       {std::vector<Tensor>{}, std::vector<Tensor>{zeros({3}).requires_grad_()}}) {
    Tensor total = clip_grad_norm_(ps, 1.0);
    EXPECT_EQ(total.dim(), 0);
    EXPECT_EQ(total.dtype(), kFloat32);
    EXPECT_TRUE(total.is_cpu());
    EXPECT_EQ(total.item<float>(), 0.f);
  }
  // Only empty gradients: a norm of 0 on their device, the gradients untouched.
  for (Device dev : devices()) {
    std::vector<Tensor> ps = make_params({0, 0}, kFloat32, dev, 1);
    Tensor total = clip_grad_norm_(ps, 1.0);
    EXPECT_EQ(total.device(), dev);
    EXPECT_EQ(total.item<float>(), 0.f);
  }
}

TEST(ClipGradNorm, BadInputIsAnError) {
  std::vector<Tensor> ps = make_params({10}, kFloat32, Device(kCPU), 1);
  for (double p : {0.0, -1.0, -kInf, kNaN}) {
    try {
      (void)clip_grad_norm_(ps, 1.0, p);
      FAIL() << "norm_type " << p << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("norm_type"), std::string::npos) << e.what();
    }
  }
  Tensor ip = zeros({4}).requires_grad_();
  ip.mutable_grad() = zeros({4}, kInt64);
  EXPECT_THROW((void)clip_grad_norm_({ip}, 1.0), Error);
  EXPECT_THROW(clip_grad_value_({ip}, 1.0), Error);
  EXPECT_THROW((void)clip_grad_norm_({Tensor()}, 1.0), Error);
  if (cuda::is_available()) {
    std::vector<Tensor> mixed = {make_params({10}, kFloat32, Device(kCPU), 1)[0],
                                 make_params({20}, kFloat32, Device(kCUDA, 0), 1)[0]};
    try {
      (void)clip_grad_norm_(mixed, 1.0);
      FAIL() << "mixed devices accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("more than one device"), std::string::npos) << e.what();
    }
    EXPECT_THROW(clip_grad_value_(mixed, 1.0), Error);
  }
}

TEST(ClipGradNorm, NonContiguousGradientIsWrittenBack) {
  for (Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    manual_seed(12);
    Tensor p = zeros({6, 40}, TensorOptions().device(dev)).requires_grad_();
    p.mutable_grad() = randn({40, 6}).to(dev).t();
    ASSERT_FALSE(p.grad().is_contiguous());
    const auto before = grads_of({p});
    Tensor total = clip_grad_norm_({p}, 0.5);
    EXPECT_NEAR(total.item<double>(), ref_norm(before, 2), 2e-5 * ref_norm(before, 2));
    const double coef = coef_for(0.5, total);
    expect_scaled(before, grads_of({p}), coef, {kFloat32});
  }
}

// The two halves PyTorch exposes give what clip_grad_norm_ gives.
TEST(ClipGradNorm, TotalNormAndClipWithNormMatchTheFusedCall) {
  for (Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    std::vector<Tensor> a = make_params(kSizes, kFloat32, dev, 21), b = make_params(kSizes, kFloat32, dev, 21);
    std::vector<Tensor> grads;
    for (const Tensor& p : b) grads.push_back(p.grad());
    Tensor fused = clip_grad_norm_(a, 3.0, 3.0);
    Tensor total = nn::utils::get_total_norm(grads, 3.0);
    EXPECT_EQ(total.item<float>(), fused.item<float>());
    nn::utils::clip_grads_with_norm_(b, 3.0, total);
    EXPECT_EQ(grads_of(a), grads_of(b));
  }
}

TEST(ClipGradNorm, BitReproducible) {
  for (Device dev : devices()) {
    std::vector<float> totals;
    for (int r = 0; r < 2; ++r) totals.push_back(clip_grad_norm_(make_params(kSizes, kFloat32, dev, 30), 1.0).item<float>());
    EXPECT_EQ(totals[0], totals[1]) << dev.str();
  }
}

// The AMP recipe: unscale_, then clip the true gradients, then step.
TEST(ClipGradNorm, AfterGradScalerUnscale) {
  for (Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    manual_seed(17);
    Tensor w = randn({64, 32}, TensorOptions().device(dev)).requires_grad_();
    Tensor x = randn({16, 64}, TensorOptions().device(dev));
    optim::SGD opt({w}, {.lr = 0.1});
    amp::GradScaler scaler({.init_scale = 4096});
    scaler.scale(matmul(x, w).pow(2).sum()).backward();
    scaler.unscale_(opt);
    const auto unscaled = grads_of({w});
    const double ref = ref_norm(unscaled, 2);
    Tensor total = clip_grad_norm_({w}, 1.0);
    EXPECT_NEAR(total.item<double>(), ref, 2e-5 * ref);
    const double coef = coef_for(1.0, total);
    expect_scaled(unscaled, grads_of({w}), coef, {kFloat32});
    const auto after = grads_of({w});
    const std::vector<double> w0 = host(w);
    scaler.step(opt);
    scaler.update();
    const std::vector<double> w1 = host(w);
    for (size_t i = 0; i < w0.size(); ++i) ASSERT_NEAR(w1[i], w0[i] - 0.1 * after[0][i], 1e-6);
  }
}

TEST(ClipGradValue, ClampsEveryGradient) {
  for (Device dev : devices()) {
    for (DType dt : {kFloat32, kFloat16, kBFloat16, kFloat64}) {
      SCOPED_TRACE(dev.str() + " " + dtype_name(dt));
      std::vector<Tensor> ps = make_params(kSizes, dt, dev, 40, 2.0);
      ps[6].grad().slice(0, 5, 6).fill_(kNaN);
      const auto before = grads_of(ps);
      const double c = 1.5;
      const double c_stored = tensor(std::vector<double>{c}, {1}).to(dt).item<double>();
      clip_grad_value_(ps, c);
      const auto after = grads_of(ps);
      for (size_t t = 0; t < after.size(); ++t)
        for (size_t i = 0; i < after[t].size(); ++i) {
          const double v = before[t][i];
          const double want = std::isnan(v) ? v : v < -c ? -c_stored : v > c ? c_stored : v;
          ASSERT_TRUE(same(after[t][i], want)) << t << " " << i << ": " << after[t][i] << " vs " << want;
        }
    }
  }
}

// clamp_min(-c) then clamp_max(c): a negative c sets everything to c (NaN stays).
TEST(ClipGradValue, NegativeClipValueSetsEverythingToIt) {
  for (Device dev : devices()) {
    std::vector<Tensor> ps = make_params({1000, 3}, kFloat32, dev, 41);
    clip_grad_value_(ps, -0.25);
    for (const auto& g : grads_of(ps))
      for (double v : g) ASSERT_EQ(v, -0.25);
  }
}

// Captured once, replayed with new gradients written into the same tensors: the replays compute
// each new norm and clip (nothing of the first values is frozen). The capture would fail on any
// host synchronisation (tg::cuda::Graph throws), so this also shows clip_grad_norm_ has none.
TEST(ClipGradNormCuda, CapturedInAGraphAndReplayed) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const Device dev(kCUDA, 0);
  cuda::Stream side;
  cuda::StreamGuard guard(side);
  std::vector<Tensor> ps = make_params(kSizes, kFloat32, dev, 50);
  std::vector<Tensor> ps16 = make_params({3000, 70000}, kFloat16, dev, 51);
  ps.insert(ps.end(), ps16.begin(), ps16.end());
  (void)clip_grad_norm_(ps, 1.0);  // warm-up
  clip_grad_value_(ps, 10.0);
  Tensor total;
  cuda::Graph graph;
  graph.capture([&] {
    clip_grad_value_(ps, 3.0);
    total = clip_grad_norm_(ps, 2.0);
  });
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    // New gradients in place (the captured kernels read these addresses).
    manual_seed(100 + round);
    for (const Tensor& p : ps) p.grad().copy_(randn(p.grad().sizes()).mul_(1.0 + round));
    std::vector<std::vector<double>> before = grads_of(ps);
    for (auto& g : before)
      for (double& v : g) v = std::min(std::max(v, -3.0), 3.0);  // clip_grad_value_ first (exact in fp16)
    graph.replay();
    side.synchronize();
    const double ref = ref_norm(before, 2);
    EXPECT_NEAR(total.item<double>(), ref, 2e-5 * ref);
    const double coef = coef_for(2.0, total);
    expect_scaled(before, grads_of(ps), coef, dtypes_of(ps));
  }
}

// The norm's last block to finish re-arms the call's "blocks done" counter: calls in a row, several
// calls in one captured graph (each with its own counter) and every replay of it find their counter
// at 0. `a` holds more tensors than one launch (224) of two dtypes, so one call is several launches
// counting on one counter; the results match the float64 CPU reference and each other bit for bit.
TEST(ClipGradNormCuda, RepeatedTotalNormsAndGraphReplays) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const Device dev(kCUDA, 0);
  cuda::Stream side;
  cuda::StreamGuard guard(side);
  std::vector<int64_t> many;
  for (int i = 0; i < 300; ++i) many.push_back(1 + (i * 37) % 3000);
  std::vector<Tensor> a = make_params(many, kFloat32, dev, 60);
  std::vector<Tensor> a16 = make_params({5000, 70001}, kBFloat16, dev, 61);
  a.insert(a.end(), a16.begin(), a16.end());
  std::vector<Tensor> b = make_params(kSizes, kFloat32, dev, 62);
  auto grads = [](const std::vector<Tensor>& ps) {
    std::vector<Tensor> g;
    for (const Tensor& p : ps) g.push_back(p.grad());
    return g;
  };
  const std::vector<Tensor> ga = grads(a), gb = grads(b);
  for (double p : {2.0, kInf, 3.0}) {  // eagerly, twice in a row
    SCOPED_TRACE("p=" + std::to_string(p));
    const double ref = ref_norm(grads_of(a), p);
    const Tensor t1 = nn::utils::get_total_norm(ga, p), t2 = nn::utils::get_total_norm(ga, p);
    EXPECT_EQ(t1.dtype(), kFloat32);  // float32 and bfloat16 promote to float32
    if (std::isinf(p))
      EXPECT_EQ(t1.item<double>(), ref);  // a max is exact
    else
      EXPECT_NEAR(t1.item<double>(), ref, 1e-4 * ref);
    EXPECT_EQ(t1.item<float>(), t2.item<float>());
  }
  Tensor ta, tb, ta2;
  cuda::Graph graph;
  graph.capture([&] {
    ta = nn::utils::get_total_norm(ga, 2.0);
    tb = nn::utils::get_total_norm(gb, kInf);
    ta2 = nn::utils::get_total_norm(ga, 2.0);
  });
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    manual_seed(200 + round);
    for (const Tensor& g : ga) g.copy_(randn(g.sizes()).mul_(1.0 + round));
    for (const Tensor& g : gb) g.copy_(randn(g.sizes()).mul_(0.5 + round));
    const auto before_a = grads_of(a), before_b = grads_of(b);
    graph.replay();
    side.synchronize();
    const double ref_a = ref_norm(before_a, 2.0);
    EXPECT_NEAR(ta.item<double>(), ref_a, 2e-5 * ref_a);
    EXPECT_EQ(tb.item<double>(), ref_norm(before_b, kInf));
    EXPECT_EQ(ta.item<float>(), ta2.item<float>());
    EXPECT_EQ(nn::utils::get_total_norm(ga, 2.0).item<float>(), ta.item<float>());  // eager after replays
  }
}

// error_if_nonfinite reads the norm on the host: inside a capture that is the documented error.
TEST(ClipGradNormCuda, ErrorIfNonfiniteCannotBeCaptured) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  cuda::Stream side;
  cuda::StreamGuard guard(side);
  std::vector<Tensor> ps = make_params({1000}, kFloat32, Device(kCUDA, 0), 52);
  (void)clip_grad_norm_(ps, 1.0, 2.0, true);
  cuda::Graph graph;
  EXPECT_THROW(graph.capture([&] { (void)clip_grad_norm_(ps, 1.0, 2.0, true); }), Error);
}

}  // namespace
}  // namespace tg::testing
