// The fused mse_loss (one kernel forward, one backward): values and gradients
// against a float64 reference for every reduction and floating dtype on each
// device, gradcheck, the composite fallback (broadcast, strided, mixed dtypes,
// tracing), the multi-block CUDA reduction at 3M elements, bit-reproducible
// repeats, CUDA-graph replay, the saved-tensor version check, and the number of
// backend dispatches (launches on CUDA) each way.
#include <gtest/gtest.h>

#include <tapegrad/tapegrad.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <tapegrad/core/backend/backend.h>
#include <tapegrad/core/native.h>
#include "core/reference.h"
#include <tapegrad/core/trace.h>

namespace {

using tg::Tensor;
using tg::testing::Dims;
using tg::testing::RefTensor;
namespace F = tg::nn::functional;

struct Case {
  tg::DeviceType device;
  tg::DType dtype;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(info.param.device == tg::kCPU ? "cpu_" : "cuda_") + tg::dtype_name(info.param.dtype);
}

class MseFused : public ::testing::TestWithParam<Case> {
 protected:
  tg::Device dev() const { return tg::Device(GetParam().device); }
  tg::DType dtype() const { return GetParam().dtype; }
};

// Reductions round the float (double for float64) sum once more; 1e-5 covers float
// accumulation over these sizes, and the narrow dtypes' tolerance covers their rounding.
tg::testing::Tol reduce_tol(tg::DType t) {
  tg::testing::Tol tol = tg::testing::tol_for(t);
  if (t == tg::kFloat32) tol.rtol = 1e-5;
  return tol;
}

struct Ref {
  RefTensor none, grad_mean, grad_sum;
  double sum = 0;
};
Ref reference(const Tensor& a, const Tensor& b) {
  RefTensor A = RefTensor::from(a), B = RefTensor::from(b);
  Ref r{RefTensor(A.shape), RefTensor(A.shape), RefTensor(A.shape), 0};
  const double n = static_cast<double>(A.numel());
  for (int64_t i = 0; i < A.numel(); ++i) {
    const double d = A.v[i] - B.v[i];
    r.none.v[i] = d * d;
    r.sum += d * d;
    r.grad_mean.v[i] = 2 * d / n;
    r.grad_sum.v[i] = 2 * d;
  }
  return r;
}
RefTensor scalar(double v) { return RefTensor(Dims{}, std::vector<double>{v}); }
RefTensor negated(RefTensor t) {
  for (double& v : t.v) v = -v;
  return t;
}

TEST_P(MseFused, ValuesMatchFloat64Reference) {
  TG_SKIP_IF_NO_CUDA(dev());
  // Odd sizes exercise the vector loads' tails; the offset-1 slices are contiguous but not
  // 16-byte aligned (the scalar-load path); [4096, 1] is the regression example's batch.
  for (Dims shape : {Dims{37, 29}, Dims{4096, 1}, Dims{5}, Dims{}}) {
    Tensor a = tg::testing::make_values(shape, dtype(), dev(), {}, 1);
    Tensor b = tg::testing::make_values(shape, dtype(), dev(), {}, 2);
    ASSERT_TRUE(tg::native::mse_loss_fusable(a, b));
    const Ref r = reference(a, b);
    const double n = static_cast<double>(a.numel());
    SCOPED_TRACE(tg::testing::describe(a));
    Tensor mean = F::mse_loss(a, b), sum = F::mse_loss(a, b, "sum"), none = F::mse_loss(a, b, "none");
    EXPECT_EQ(mean.dtype(), dtype());
    EXPECT_EQ(mean.dim(), 0);
    EXPECT_EQ(mean.device().type(), dev().type());
    tg::testing::expect_close(mean, scalar(r.sum / n), reduce_tol(dtype()));
    tg::testing::expect_close(sum, scalar(r.sum), reduce_tol(dtype()));
    tg::testing::expect_close(none, r.none);
  }
  const int64_t n = 1001;
  Tensor a = tg::testing::make_values({n + 1}, dtype(), dev(), {}, 3).slice(0, 1, n + 1);
  Tensor b = tg::testing::make_values({n + 2}, dtype(), dev(), {}, 4).slice(0, 2, n + 2);
  ASSERT_TRUE(a.is_contiguous() && b.is_contiguous());
  const Ref r = reference(a, b);
  tg::testing::expect_close(F::mse_loss(a, b), scalar(r.sum / n), reduce_tol(dtype()));
  tg::testing::expect_close(F::mse_loss(a, b, "sum"), scalar(r.sum), reduce_tol(dtype()));
  tg::testing::expect_close(F::mse_loss(a, b, "none"), r.none);
}

TEST_P(MseFused, GradientsMatchFloat64Reference) {
  TG_SKIP_IF_NO_CUDA(dev());
  Tensor a0 = tg::testing::make_values({33, 7}, dtype(), dev(), {}, 5);
  Tensor b0 = tg::testing::make_values({33, 7}, dtype(), dev(), {}, 6);
  const Ref r = reference(a0, b0);
  for (const char* red : {"mean", "sum"}) {
    SCOPED_TRACE(red);
    Tensor a = a0.detach().requires_grad_(true), b = b0.detach().requires_grad_(true);
    F::mse_loss(a, b, red).backward();
    const RefTensor& want = std::string(red) == "mean" ? r.grad_mean : r.grad_sum;
    ASSERT_TRUE(a.grad().defined() && b.grad().defined());
    EXPECT_EQ(a.grad().dtype(), dtype());
    tg::testing::expect_close(a.grad(), want);
    tg::testing::expect_close(b.grad(), negated(want));
  }
  // Only the target requires grad.
  Tensor b = b0.detach().requires_grad_(true);
  F::mse_loss(a0, b).backward();
  tg::testing::expect_close(b.grad(), negated(r.grad_mean));
  // 'none' with a per-element upstream gradient (w) and with an expanded scalar (sum()).
  Tensor a = a0.detach().requires_grad_(true);
  Tensor w = tg::testing::make_values({33, 7}, dtype(), dev(), {}, 7);
  (F::mse_loss(a, b0, "none") * w).sum().backward();
  RefTensor W = RefTensor::from(w), want = r.grad_sum;
  for (int64_t i = 0; i < want.numel(); ++i) want.v[i] *= W.v[i];
  // w * g rounds once more in the narrow dtypes.
  tg::testing::Tol tol = tg::testing::tol_for(dtype());
  tol.rtol *= 2;
  tg::testing::expect_close(a.grad(), want, tol);
  Tensor a2 = a0.detach().requires_grad_(true);
  F::mse_loss(a2, b0, "none").sum().backward();
  tg::testing::expect_close(a2.grad(), r.grad_sum);
}

TEST_P(MseFused, RepeatsAreBitIdentical) {
  TG_SKIP_IF_NO_CUDA(dev());
  Tensor a = tg::testing::make_values({300, 70}, dtype(), dev(), {}, 8).requires_grad_(true);
  Tensor b = tg::testing::make_values({300, 70}, dtype(), dev(), {}, 9);
  auto bits = [](const Tensor& t) { return t.cpu().to(tg::kFloat64).contiguous().to_vector<double>(); };
  std::vector<double> first, first_grad;
  for (int rep = 0; rep < 4; ++rep) {
    a.mutable_grad() = Tensor();
    Tensor loss = F::mse_loss(a, b, "sum");
    loss.backward();
    auto v = bits(loss), g = bits(a.grad());
    if (rep == 0) {
      first = v;
      first_grad = g;
    }
    ASSERT_EQ(std::memcmp(v.data(), first.data(), sizeof(double)), 0) << "rep " << rep;
    ASSERT_EQ(std::memcmp(g.data(), first_grad.data(), g.size() * sizeof(double)), 0) << "rep " << rep;
  }
}

TEST_P(MseFused, EmptyInput) {
  TG_SKIP_IF_NO_CUDA(dev());
  Tensor a = tg::zeros({0, 3}, tg::TensorOptions().dtype(dtype()).device(dev()));
  EXPECT_TRUE(std::isnan(F::mse_loss(a, a).item<double>()));
  EXPECT_EQ(F::mse_loss(a, a, "sum").item<double>(), 0.0);
  EXPECT_EQ(F::mse_loss(a, a, "none").sizes(), a.sizes());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MseFused,
                         ::testing::Values(Case{tg::kCPU, tg::kFloat32}, Case{tg::kCPU, tg::kFloat64},
                                           Case{tg::kCPU, tg::kFloat16}, Case{tg::kCPU, tg::kBFloat16},
                                           Case{tg::kCUDA, tg::kFloat32}, Case{tg::kCUDA, tg::kFloat64},
                                           Case{tg::kCUDA, tg::kFloat16}, Case{tg::kCUDA, tg::kBFloat16}),
                         case_name);

class MseDevice : public ::testing::TestWithParam<tg::DeviceType> {
 protected:
  tg::Device dev() const { return tg::Device(GetParam()); }
};

TEST_P(MseDevice, Gradcheck) {
  TG_SKIP_IF_NO_CUDA(dev());
  auto o64 = tg::TensorOptions().dtype(tg::kFloat64).device(dev());
  for (const char* r : {"mean", "sum", "none"}) {
    auto fn = [&](const std::vector<Tensor>& in) { return F::mse_loss(in[0], in[1], r); };
    auto both = tg::autograd::gradcheck(fn, {tg::randn({3, 4}, o64), tg::randn({3, 4}, o64)});
    EXPECT_TRUE(both) << r << ": " << both;
    auto target_only =
        tg::autograd::gradcheck(fn, {tg::randn({3, 4}, o64), tg::randn({3, 4}, o64.requires_grad(true))});
    EXPECT_TRUE(target_only) << r << ": " << target_only;
    auto input_only = tg::autograd::gradcheck(fn, {tg::randn({5}, o64.requires_grad(true)), tg::randn({5}, o64)});
    EXPECT_TRUE(input_only) << r << ": " << input_only;
  }
}

// Broadcast, strided and mixed-dtype operands take the composite and still match.
TEST_P(MseDevice, FallbackMatchesReference) {
  TG_SKIP_IF_NO_CUDA(dev());
  using tg::testing::Layout;
  for (Layout l : {Layout::kTransposed, Layout::kStep2, Layout::kExpanded}) {
    SCOPED_TRACE(tg::testing::layout_name(l));
    Tensor a = tg::testing::make_input({6, 5}, l, tg::kFloat64, dev(), {}, 10).detach().requires_grad_(true);
    Tensor b = tg::testing::make_values({6, 5}, tg::kFloat64, dev(), {}, 11);
    EXPECT_FALSE(tg::native::mse_loss_fusable(a, b));
    const Ref r = reference(a, b);
    tg::testing::expect_close(F::mse_loss(a, b, "sum"), scalar(r.sum));
    tg::testing::expect_close(F::mse_loss(b, a, "none"), r.none);
    Tensor x = tg::testing::make_input({6, 5}, l, tg::kFloat64, dev(), {}, 10);
    auto rep = tg::autograd::gradcheck(
        [&](const std::vector<Tensor>& in) {
          Tensor v = in[0];
          if (l == Layout::kTransposed) v = v.t().contiguous().t();  // a strided view inside fn
          return F::mse_loss(v, in[1]);
        },
        {x.contiguous(), b});
    EXPECT_TRUE(rep) << rep;
  }
  // Broadcast target [5] against input [6, 5].
  Tensor a = tg::testing::make_values({6, 5}, tg::kFloat32, dev(), {}, 12);
  Tensor b = tg::testing::make_values({5}, tg::kFloat32, dev(), {}, 13);
  RefTensor d = tg::testing::ref_binary(RefTensor::from(a), RefTensor::from(b),
                                        [](double x, double y) { return (x - y) * (x - y); });
  tg::testing::expect_close(F::mse_loss(a, b), scalar(tg::testing::ref_mean_of(d.v)));
  tg::testing::expect_close(F::mse_loss(a, b, "none"), d);
  // Mixed dtypes promote as before: float32 input, float64 target -> float64.
  Tensor b64 = tg::testing::make_values({6, 5}, tg::kFloat64, dev(), {}, 14);
  Tensor m = F::mse_loss(a, b64, "sum");
  EXPECT_EQ(m.dtype(), tg::kFloat64);
  tg::testing::expect_close(m, scalar(reference(a.to(tg::kFloat64), b64).sum));
}

// The fast path is one backend dispatch (one kernel on CUDA) each way.
TEST_P(MseDevice, OneDispatchEachWay) {
  TG_SKIP_IF_NO_CUDA(dev());
  auto opts = tg::TensorOptions().device(dev());
  Tensor a = tg::randn({4096, 1}, opts).requires_grad_(true);
  Tensor b = tg::randn({4096, 1}, opts).requires_grad_(true);
  F::mse_loss(a, b).backward();  // the first CUDA backward makes the shared implicit 1 (one fill)
  for (const char* r : {"mean", "sum", "none"}) {
    SCOPED_TRACE(r);
    uint64_t c0 = tg::backend::dispatch_count();
    Tensor loss = F::mse_loss(a, b, r);
    EXPECT_EQ(tg::backend::dispatch_count() - c0, 1u);
    if (std::string(r) == "none") continue;
    a.mutable_grad() = Tensor();
    b.mutable_grad() = Tensor();
    c0 = tg::backend::dispatch_count();
    loss.backward();
    // The fused backward writing both gradients; on the CPU also the root gradient's fill of
    // ones (CUDA roots share a cached read-only 1, so there is no fill launch).
    EXPECT_EQ(tg::backend::dispatch_count() - c0, dev().is_cuda() ? 1u : 2u);
    EXPECT_TRUE(a.grad().defined() && b.grad().defined());
  }
  // A strided input takes the composite: sub, mul, mean.
  Tensor st = tg::randn({64, 32}, opts).t(), sb = tg::randn({32, 64}, opts);
  uint64_t c0 = tg::backend::dispatch_count();
  (void)F::mse_loss(st, sb);
  EXPECT_EQ(tg::backend::dispatch_count() - c0, 3u);
}

TEST_P(MseDevice, SavedTensorsAreVersionChecked) {
  TG_SKIP_IF_NO_CUDA(dev());
  auto opts = tg::TensorOptions().device(dev());
  Tensor w = tg::randn({8}, opts).requires_grad_(true);
  Tensor target = tg::randn({8}, opts);
  Tensor loss = F::mse_loss(w * 2.0, target);
  target.add_(1.0);
  try {
    loss.backward();
    FAIL() << "expected a tg::Error for a target modified in place";
  } catch (const tg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("mse_loss"), std::string::npos) << e.what();
  }
}

TEST_P(MseDevice, Errors) {
  TG_SKIP_IF_NO_CUDA(dev());
  auto opts = tg::TensorOptions().device(dev());
  Tensor a = tg::randn({4, 3}, opts);
  EXPECT_THROW(F::mse_loss(a, tg::randn({4, 2}, opts)), tg::Error);
  EXPECT_THROW(F::mse_loss(a, a, "avg"), tg::Error);
  EXPECT_THROW(F::mse_loss(a, Tensor()), tg::Error);
  Tensor i = tg::ones({4, 3}, opts.dtype(tg::kInt64));
  EXPECT_THROW(F::mse_loss(i, i), tg::Error);
  // The native op refuses what it cannot take as it is, naming itself.
  try {
    (void)tg::native::mse_loss(a, a.t().contiguous().t(), tg::backend::LossReduction::Mean);
    FAIL() << "expected a tg::Error";
  } catch (const tg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("mse_loss"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, MseDevice, ::testing::Values(tg::kCPU, tg::kCUDA),
                         [](const auto& info) { return info.param == tg::kCPU ? "cpu" : "cuda"; });

// 3M elements: several blocks on CUDA, partials added by the last block; repeated calls
// (the counter must be back at 0 after each) give the same bits.
TEST(MseLossLarge, MultiBlockMatchesReferenceAndRepeats) {
  for (tg::Device dev : tg::testing::devices()) {
    SCOPED_TRACE(dev.str());
    const int64_t n = 3'000'000;
    Tensor a = tg::randn({n}, tg::TensorOptions().device(dev));
    Tensor b = tg::randn({n}, tg::TensorOptions().device(dev));
    auto A = a.cpu().to_vector<float>(), B = b.cpu().to_vector<float>();
    double want = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double d = static_cast<double>(A[i]) - static_cast<double>(B[i]);
      want += d * d;
    }
    const float first = F::mse_loss(a, b, "sum").item<float>();
    EXPECT_NEAR(first, want, 1e-5 * want);
    EXPECT_NEAR(F::mse_loss(a, b).item<double>(), want / n, 1e-5 * want / n);
    Tensor big = tg::randn({5'000'001}, tg::TensorOptions().device(dev));
    Tensor big2 = tg::randn({5'000'001}, tg::TensorOptions().device(dev));
    for (int rep = 0; rep < 5; ++rep) {
      (void)F::mse_loss(big, big2, rep % 2 ? "mean" : "sum");  // another grid in between
      const float again = F::mse_loss(a, b, "sum").item<float>();
      ASSERT_EQ(std::memcmp(&again, &first, sizeof(float)), 0) << "rep " << rep;
    }
    // float64 and an unaligned (scalar-load) view at the same size.
    Tensor a64 = a.to(tg::kFloat64), b64 = b.to(tg::kFloat64);
    EXPECT_NEAR(F::mse_loss(a64, b64, "sum").item<double>(), want, 1e-9 * want);
    Tensor au = tg::cat({tg::zeros({1}, tg::TensorOptions().device(dev)), a}, 0).slice(0, 1, n + 1);
    EXPECT_NEAR(F::mse_loss(au, b, "sum").item<double>(), want, 1e-5 * want);
  }
}

// The trace records the public op, mse_loss with its reduction, whether it ran as the fused
// kernel (same shapes) or as a composite (broadcasting): never the ops it is made of.
TEST(MseLossTrace, TracerSeesMseLoss) {
  struct Recorder : tg::detail::Tracer {
    std::vector<tg::OpKind> ops;
    std::vector<int64_t> reductions;
    void record(tg::OpKind op, const Tensor&, std::vector<Tensor>, std::vector<tg::detail::TraceAttr> attrs) override {
      ops.push_back(op);
      for (const auto& a : attrs)
        if (std::string(a.name) == "reduction") reductions.push_back(std::get<int64_t>(a.value));
    }
  };
  Tensor a = tg::randn({4, 3});
  for (Tensor b : {tg::randn({4, 3}), tg::randn({3})}) {
    Recorder rec;
    {
      tg::detail::TracerGuard guard(&rec);
      (void)F::mse_loss(a, b);
      (void)F::mse_loss(a, b, "sum");
      (void)F::mse_loss(a, b, "none");
    }
    EXPECT_EQ(rec.ops, std::vector<tg::OpKind>(3, tg::OpKind::MseLoss)) << b.sizes();
    EXPECT_EQ(rec.reductions, (std::vector<int64_t>{1, 2, 0})) << b.sizes();
  }
}

// Captured into a CUDA graph (both reduction paths: one block, and partials with the
// capture's own counter), replays give the eager bits.
TEST(MseLossGraph, ReplayMatchesEager) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  tg::cuda::Stream side;
  tg::cuda::StreamGuard guard(side);
  for (int64_t n : {int64_t{4096}, int64_t{3'000'000}}) {
    SCOPED_TRACE(n);
    Tensor a = tg::randn({n, 1}, tg::kCUDA).requires_grad_(true);
    Tensor b = tg::randn({n, 1}, tg::kCUDA);
    Tensor loss;
    auto step = [&] {
      a.mutable_grad() = Tensor();
      loss = F::mse_loss(a, b);
      loss.backward();
    };
    step();
    const float eager = loss.item<float>();
    const std::vector<float> eager_grad = a.grad().cpu().to_vector<float>();
    tg::cuda::Graph graph;
    graph.capture(step);
    for (int rep = 0; rep < 3; ++rep) {
      graph.replay();
      const float replayed = loss.item<float>();
      ASSERT_EQ(std::memcmp(&replayed, &eager, sizeof(float)), 0) << "rep " << rep;
      ASSERT_EQ(a.grad().cpu().to_vector<float>(), eager_grad) << "rep " << rep;
    }
    // Eager calls on the capture stream still work after the replays.
    EXPECT_EQ(F::mse_loss(a, b).item<float>(), eager);
  }
}

}  // namespace
