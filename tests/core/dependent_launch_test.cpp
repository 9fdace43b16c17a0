// Programmatic dependent launch (core/backend/cuda/dependent_launch.cuh): kernels launched
// dependent may start while the kernel before them runs, and wait for it on the GPU. These tests
// make the hazards a missing wait would expose likely (a long producer, then a consumer that reads
// its output or overwrites its input), eagerly and in a captured graph, and compare the values
// with float64 references and bitwise with the same work launched plainly.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include <tapegrad/tapegrad.h>

#ifdef TG_WITH_CUDA
#include <tapegrad/core/backend/cuda/runtime.h>
#endif

namespace tg::testing {
namespace {

#ifdef TG_WITH_CUDA
namespace cd = tg::cuda::detail;
namespace F = tg::nn::functional;

#define TG_SKIP_WITHOUT_CUDA() \
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device"

struct DependentLaunchSetting {
  explicit DependentLaunchSetting(bool on) : prev_(cd::dependent_launch_setting()) { cd::set_dependent_launch(on); }
  ~DependentLaunchSetting() { cd::set_dependent_launch(prev_); }
  bool prev_;
};

std::vector<float> host(const Tensor& t) { return t.cpu().to_vector<float>(); }

// A chain of large elementwise kernels (past the launch queue's size, so each is launched
// dependent), read-after-write and write-after-read on the same buffers: x <- x * 1.5 + 1 and
// y <- x - y alternating, then a reduction. Float64 reference on the host.
TEST(DependentLaunch, ElementwiseChainsReadAndOverwriteInOrder) {
  TG_SKIP_WITHOUT_CUDA();
  DependentLaunchSetting on(true);
  const int64_t n = int64_t{1} << 22;
  auto x = arange(0.0, static_cast<double>(n), 1.0, TensorOptions().dtype(kFloat32).device(Device(kCUDA))) * (1.0 / n);
  auto y = zeros({n}, TensorOptions().device(Device(kCUDA)));
  std::vector<double> rx(static_cast<size_t>(n)), ry(static_cast<size_t>(n), 0.0);
  for (int64_t i = 0; i < n; ++i) rx[static_cast<size_t>(i)] = static_cast<float>(static_cast<float>(i) * (1.0 / n));
  for (int r = 0; r < 20; ++r) {
    x.mul_(1.5f).add_(1.0f);
    y.copy_(x - y);
    for (size_t i = 0; i < rx.size(); ++i) {
      rx[i] = static_cast<float>(static_cast<float>(rx[i] * 1.5f) + 1.0f);
      ry[i] = static_cast<float>(rx[i] - ry[i]);
    }
  }
  const std::vector<float> hx = host(x), hy = host(y);
  for (size_t i = 0; i < rx.size(); i += 4099) {
    ASSERT_EQ(hx[i], static_cast<float>(rx[i])) << i;
    ASSERT_EQ(hy[i], static_cast<float>(ry[i])) << i;
  }
}

// The MNIST-shaped training step (gather, small gemms with fused epilogues, cross_entropy, Adam:
// every kernel of it launched dependent) gives the same bits with dependent launch on and off,
// eagerly and replayed as a graph.
std::vector<std::vector<float>> train(bool dependent, bool graph) {
  DependentLaunchSetting setting(dependent);
  manual_seed(3);
  nn::Sequential net(nn::Linear(784, 512), nn::ReLU(), nn::Linear(512, 512), nn::ReLU(), nn::Linear(512, 10));
  net.to(kCUDA);
  optim::Adam opt(net.parameters());
  const auto opts = TensorOptions().device(Device(kCUDA));
  Tensor data = rand({1024, 784}, opts), labels = (rand({1024}, opts) * 10).to(kInt64);
  Tensor order = randperm(1024, TensorOptions().dtype(kInt64).device(Device(kCUDA)));
  Tensor losses = zeros({8}, opts);
  Tensor at = zeros({}, TensorOptions().dtype(kInt64).device(Device(kCUDA)));  // the batch, on the GPU
  auto step = [&] {
    Tensor idx = order.reshape({8, 128}).index_select(0, at.reshape({1})).reshape({128});
    opt.zero_grad();
    Tensor loss = F::cross_entropy(net(data.index_select(0, idx)), labels.index_select(0, idx));
    loss.backward();
    opt.step();
    losses.index_add_(0, at.reshape({1}), loss.detach().reshape({1}));
    at.add_(1);
  };
  if (graph) {
    step();  // warm-up, eager (Adam's state exists before capture)
    cuda::Stream side;
    cuda::StreamGuard guard(side);
    cuda::Graph g;
    g.capture(step);
    for (int i = 0; i < 7; ++i) g.replay();
    side.synchronize();
  } else {
    for (int i = 0; i < 8; ++i) step();
  }
  std::vector<std::vector<float>> out{host(losses)};
  for (const Tensor& p : net.parameters()) out.push_back(host(p));
  return out;
}

TEST(DependentLaunch, MlpTrainingStepIsBitwiseTheSame) {
  TG_SKIP_WITHOUT_CUDA();
  for (bool graph : {false, true}) {
    const auto on = train(true, graph), off = train(false, graph);
    ASSERT_EQ(on.size(), off.size());
    for (size_t t = 0; t < on.size(); ++t) {
      ASSERT_EQ(on[t].size(), off[t].size());
      for (size_t i = 0; i < on[t].size(); ++i)
        ASSERT_EQ(on[t][i], off[t][i]) << (graph ? "graph" : "eager") << " tensor " << t << " element " << i;
    }
    for (float l : on[0]) EXPECT_TRUE(std::isfinite(l) && l > 0.f && l < 10.f) << l;
  }
}

// A consumer launched dependent right behind a producer that runs for a while: the small gemm
// reads what a long elementwise kernel wrote, then the next elementwise kernel overwrites the
// gemm's input. Against a float64 product on the host.
TEST(DependentLaunch, GemmWaitsForItsProducerAndItsSuccessorForIt) {
  TG_SKIP_WITHOUT_CUDA();
  DependentLaunchSetting on(true);
  manual_seed(5);
  auto a0 = rand({128, 784});
  auto w = rand({512, 784}) - 0.5;
  auto a = a0.to(kCUDA), wc = w.to(kCUDA);
  auto big = zeros({int64_t{1} << 24}, TensorOptions().device(Device(kCUDA)));
  for (int r = 0; r < 3; ++r) {
    big.add_(1.0f);          // a long kernel ahead of the producer
    auto x = a * 2.0f;       // producer (below the queue's size: may be batched)
    auto x2 = (x + 1.0f).sqrt();  // two more kernels between the producer and the gemm
    auto y = F::linear(x2, wc);
    a.mul_(0.5f);            // overwrites the producer's input right behind the gemm
    a.mul_(2.0f);
    const std::vector<float> hy = host(y), hx = host(x2);
    const std::vector<float> hw = w.to_vector<float>();
    for (int i = 0; i < 128; i += 13)
      for (int j = 0; j < 512; j += 37) {
        double s = 0;
        for (int k = 0; k < 784; ++k)
          s += static_cast<double>(hx[static_cast<size_t>(i) * 784 + k]) * hw[static_cast<size_t>(j) * 784 + k];
        ASSERT_NEAR(hy[static_cast<size_t>(i) * 512 + j], s, 1e-3 * (1 + std::abs(s))) << i << ", " << j;
      }
  }
  EXPECT_EQ(host(big)[12345], 3.0f);
}
#endif

}  // namespace
}  // namespace tg::testing
