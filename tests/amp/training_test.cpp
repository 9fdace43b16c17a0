// Mixed-precision training end to end: the AMP loop (autocast + GradScaler) tracks
// the float32 loop's loss curve (CPU bfloat16 always; CUDA float16 with a GPU),
// and the CUDA training step never synchronises with the host, proven by
// capturing it into a CUDA graph.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <vector>

#include <tapegrad/tapegrad.h>
#if defined(TG_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace tg::testing {
namespace {

struct Net : nn::Module {
  explicit Net(Device dev) {
    l1 = register_module("l1", std::make_shared<nn::Linear>(32, 64, true, TensorOptions().device(dev)));
    l2 = register_module("l2", std::make_shared<nn::Linear>(64, 1, true, TensorOptions().device(dev)));
  }
  Tensor forward(const Tensor& x) override { return (*l2)((*l1)(x).tanh()); }
  std::shared_ptr<nn::Linear> l1, l2;
};

// Loss per step of a small regression, trained with SGD, in float32 (amp_dtype
// unset) or under autocast with a GradScaler. Same seed: same data and init.
std::vector<double> train(Device dev, std::optional<DType> amp_dtype, int steps) {
  manual_seed(5);
  Net net(dev);
  Tensor x = randn({256, 32}, TensorOptions().device(dev));
  Tensor w_true = randn({32, 1}, TensorOptions().device(dev));
  Tensor y = (matmul(x, w_true) * 0.3).tanh();
  optim::SGD opt(net.parameters(), {.lr = 0.1, .momentum = 0.9});
  amp::GradScaler scaler({.enabled = amp_dtype.has_value()});
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    Tensor loss;
    {
      amp::autocast guard(dev.type(), amp_dtype, amp_dtype.has_value());
      loss = nn::functional::mse_loss(net(x), y);
    }
    EXPECT_EQ(loss.dtype(), kFloat32);
    losses.push_back(loss.item<double>());
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
  }
  for (const Tensor& p : net.parameters()) EXPECT_EQ(p.dtype(), kFloat32);
  return losses;
}

// Tolerance: each AMP loss within 5% (relative) + 2e-3 of the float32 loss at the same
// step. bfloat16 keeps 8 mantissa bits (0.4% per rounding); the products of a
// 32- and a 64-wide layer accumulate in float32, so the curves stay well inside that.
void check_tracks(Device dev, DType low) {
  const int steps = 60;
  std::vector<double> ref = train(dev, std::nullopt, steps);
  std::vector<double> amp = train(dev, low, steps);
  ASSERT_EQ(ref.size(), amp.size());
  for (int i = 0; i < steps; ++i)
    EXPECT_NEAR(amp[i], ref[i], 0.05 * ref[i] + 2e-3) << "step " << i << " on " << dev << " in " << low;
  EXPECT_NE(amp, ref);  // autocast really computed in the lower precision
  EXPECT_LT(ref.back(), 0.5 * ref.front());  // it did learn
  EXPECT_LT(amp.back(), 0.5 * amp.front());
}

TEST(AmpTraining, TracksFloat32CpuBFloat16) { check_tracks(Device(kCPU), kBFloat16); }

TEST(AmpTraining, TracksFloat32CudaFloat16) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  check_tracks(Device(kCUDA, 0), kFloat16);
}

// No host synchronisation in the CUDA training step. The whole step (forward under
// autocast, backward, scaler.step, scaler.update) is captured into a CUDA graph on a
// non-default stream in cudaStreamCaptureModeGlobal. During such a capture any call
// that would wait for the device (cudaStreamSynchronize, cudaDeviceSynchronize, a
// blocking cudaMemcpy to or from the host, cudaMalloc, reading a device value on the
// host such as found_inf.item()) is illegal and fails (and invalidates) the capture,
// so a capture that ends with cudaSuccess proves the step never waits for the GPU.
// The graph is then replayed once to check that the captured step really trains.
TEST(AmpTraining, CudaStepHasNoHostSync) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  // A raw capture cannot cudaMalloc: the step runs on memory the warm-up left in the cache.
  if (std::getenv("TG_NO_CUDA_MEMORY_CACHING")) GTEST_SKIP() << "needs the caching allocator (TG_NO_CUDA_MEMORY_CACHING is set)";
#if defined(TG_WITH_CUDA)
  manual_seed(9);
  cuda::Stream stream;
  cuda::StreamGuard stream_guard(stream);
  nn::Linear model(256, 256, true, TensorOptions().device(Device(kCUDA, 0)));
  optim::SGD opt(model.parameters(), {.lr = 1e-3});  // the seed loop's optimizer
  amp::GradScaler scaler({.init_scale = 1024, .growth_interval = 1000});
  Tensor inp = randn({64, 256}, TensorOptions().device(Device(kCUDA, 0)));
  auto train_step = [&] {
    opt.zero_grad();
    Tensor loss;
    {
      amp::autocast guard(kCUDA);
      loss = model(inp).pow(2).mean();
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
  };
  // Warm up on this stream: the allocator caches blocks for it, cuBLAS its handle and
  // workspace, the optimizer its state, the scaler its scale tensor.
  for (int i = 0; i < 3; ++i) train_step();
  stream.synchronize();
  const int64_t tracker_before = scaler.get_growth_tracker();
  const std::vector<float> w_before = model.weight.detach().cpu().to_vector<float>();

  auto s = static_cast<cudaStream_t>(stream.handle());
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  std::string error;
  try {
    train_step();
  } catch (const std::exception& e) {
    error = e.what();
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(s, &graph);
  cudaGetLastError();  // clear a sticky capture error, if any, before the asserts
  ASSERT_TRUE(error.empty()) << "the training step failed under capture (a host sync?): " << error;
  ASSERT_EQ(end, cudaSuccess) << "capture invalidated: " << cudaGetErrorString(end);
  ASSERT_NE(graph, nullptr);
  size_t num_nodes = 0;
  ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &num_nodes), cudaSuccess);
  EXPECT_GT(num_nodes, 5u);

  // Nothing ran during capture; replaying the graph runs one real step.
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(scaler.get_growth_tracker(), tracker_before + 1);
  EXPECT_NE(model.weight.detach().cpu().to_vector<float>(), w_before);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
#endif
}

}  // namespace
}  // namespace tg::testing
