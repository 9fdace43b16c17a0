// tg::cuda::Graph: a captured training step replayed N times leaves the parameters
// bit for bit where N eager steps do (float32 SGD, and float16 autocast with a
// GradScaler that skips a step and backs off); replays allocate nothing; a host
// synchronisation inside the capture is a tg::Error that leaves the allocator and
// streams usable; a destroyed graph's memory goes back to the cache; launches finished by
// their last block (mse_loss) take zeroed counters from the graph's
// arena, so the graph holds no memset node for them.
#include <gtest/gtest.h>

#include <cstdlib>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.h>


namespace tg::testing {
namespace {

#define TG_SKIP_WITHOUT_CUDA() \
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device"

std::vector<float> host(const Tensor& t) { return t.detach().to(kFloat32).cpu().to_vector<float>(); }

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A small regression step: Linear(32, 16) -> tanh -> Linear(16, 1), MSE, SGD with
// momentum, or (amp) float16 autocast with a GradScaler around backward and step.
struct Trainer {
  Trainer(bool amp, uint64_t seed) : amp_on(amp) {
    manual_seed(seed);
    const TensorOptions o = TensorOptions().device(Device(kCUDA, 0));
    l1 = std::make_shared<nn::Linear>(32, 16, true, o);
    l2 = std::make_shared<nn::Linear>(16, 1, true, o);
    std::vector<Tensor> params = l1->parameters();
    for (const Tensor& p : l2->parameters()) params.push_back(p);
    opt = std::make_unique<optim::SGD>(params, optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
    scaler = std::make_unique<amp::GradScaler>(
        amp::GradScalerOptions{.init_scale = 1024, .growth_interval = 2, .enabled = amp});
    x = zeros({64, 32}, o);
    y = zeros({64, 1}, o);
  }
  void step() {
    opt->zero_grad();
    {
      amp::autocast guard(kCUDA, kFloat16, amp_on);
      loss = nn::functional::mse_loss((*l2)((*l1)(x).tanh()), y);
    }
    scaler->scale(loss).backward();
    scaler->step(*opt);
    scaler->update();
  }
  std::vector<float> params() const {
    std::vector<float> out;
    for (const auto* m : {l1.get(), l2.get()})
      for (const Tensor& p : m->parameters()) {
        std::vector<float> v = host(p);
        out.insert(out.end(), v.begin(), v.end());
      }
    return out;
  }
  bool amp_on;
  std::shared_ptr<nn::Linear> l1, l2;
  std::unique_ptr<optim::SGD> opt;
  std::unique_ptr<amp::GradScaler> scaler;
  Tensor x, y, loss;  // x, y: the static inputs every step reads
};

// Inputs for `n` steps, made on the CPU so both runs see the same values. With
// `poison`, step `poison` gets a value that overflows float16 (the scaler skips it).
std::vector<std::pair<Tensor, Tensor>> batches(int n, int poison = -1) {
  manual_seed(123);
  std::vector<std::pair<Tensor, Tensor>> out;
  for (int i = 0; i < n; ++i) {
    Tensor x = randn({64, 32});
    if (i == poison) x = x + full({64, 32}, 1e6);
    out.emplace_back(x.cuda(), (randn({64, 1}) * 0.5).cuda());
  }
  return out;
}

constexpr int kWarmup = 3;

// Eager: warm-up then one step per batch. Graph: the same warm-up, one capture, one
// replay per batch. Returns the parameters, the scale and the per-step losses.
struct RunResult {
  std::vector<float> params;
  double scale = 0;
  std::vector<float> losses;
};

RunResult run(bool amp, bool graphed, const std::vector<std::pair<Tensor, Tensor>>& data) {
  cuda::Stream side;
  cuda::StreamGuard guard(side);
  Trainer t(amp, 7);
  auto feed = [&](size_t i) {
    t.x.copy_(data[i].first);
    t.y.copy_(data[i].second);
  };
  for (int i = 0; i < kWarmup; ++i) {
    feed(0);
    t.step();
  }
  RunResult r;
  cuda::Graph graph;
  if (graphed) graph.capture([&] { t.step(); });
  for (size_t i = 0; i < data.size(); ++i) {
    feed(i);
    if (graphed)
      graph.replay();
    else
      t.step();
    r.losses.push_back(host(t.loss)[0]);  // a graphed step's loss lives in graph memory, refreshed per replay
  }
  side.synchronize();
  r.params = t.params();
  r.scale = t.scaler->get_scale();
  return r;
}

TEST(CudaGraph, ReplayEqualsEagerSgdBitForBit) {
  TG_SKIP_WITHOUT_CUDA();
  const auto data = batches(8);
  const RunResult eager = run(false, false, data);
  const RunResult graphed = run(false, true, data);
  EXPECT_TRUE(bitwise_equal(eager.params, graphed.params));
  EXPECT_TRUE(bitwise_equal(eager.losses, graphed.losses));
  EXPECT_NE(eager.losses.front(), eager.losses.back());  // the replays really trained
}

TEST(CudaGraph, ReplayEqualsEagerAmpGradScalerBitForBit) {
  TG_SKIP_WITHOUT_CUDA();
  const auto data = batches(9, /*poison=*/4);  // growth every 2 clean steps, one backoff
  const RunResult eager = run(true, false, data);
  const RunResult graphed = run(true, true, data);
  EXPECT_TRUE(bitwise_equal(eager.params, graphed.params));
  EXPECT_EQ(eager.scale, graphed.scale);
  EXPECT_NE(eager.scale, 1024.0);  // the device-side scale changed across replays
  for (float p : graphed.params) ASSERT_TRUE(std::isfinite(p));
}

TEST(CudaGraph, MemoryStaysFlatAcrossReplays) {
  TG_SKIP_WITHOUT_CUDA();
  const auto data = batches(1);
  cuda::Stream side;
  cuda::StreamGuard guard(side);
  Trainer t(true, 3);
  t.x.copy_(data[0].first);
  t.y.copy_(data[0].second);
  for (int i = 0; i < kWarmup; ++i) t.step();
  cuda::Graph graph;
  graph.capture([&] { t.step(); });
  EXPECT_TRUE(graph.is_captured());
  EXPECT_GT(graph.num_nodes(), 5u);
  graph.replay();
  side.synchronize();
  const size_t allocated = cuda::memory_allocated(), reserved = cuda::memory_reserved();
  for (int i = 0; i < 20; ++i) graph.replay();
  side.synchronize();
  EXPECT_EQ(cuda::memory_allocated(), allocated);
  EXPECT_EQ(cuda::memory_reserved(), reserved);
}

TEST(CudaGraph, HostSyncInCaptureThrowsAndEverythingKeepsWorking) {
  TG_SKIP_WITHOUT_CUDA();
  cuda::Stream side;
  cuda::StreamGuard guard(side);
  Tensor x = rand({1000}, Device(kCUDA, 0));
  (void)(x * 2).sum().item<float>();  // warm-up
  cuda::Graph graph;
  try {
    graph.capture([&] { (void)(x * 2).sum().item<float>(); });
    FAIL() << "a capture containing item() did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tg::cuda::Graph::capture"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(graph.is_capturing());
  EXPECT_FALSE(graph.is_captured());
  EXPECT_EQ(cuda::current_stream().handle(), side.handle());
  EXPECT_THROW(graph.replay(), Error);

  // Eager work, the allocator and a new capture on the same Graph all work.
  std::vector<float> xs = host(x);
  Tensor y = x * 3 + 1;
  std::vector<float> ys = host(y);
  for (size_t i = 0; i < xs.size(); ++i) ASSERT_FLOAT_EQ(ys[i], xs[i] * 3 + 1);
  Tensor out = zeros({1000}, Device(kCUDA, 0));
  graph.capture([&] { out.copy_(x * 2); });
  graph.replay();
  std::vector<float> outs = host(out);
  for (size_t i = 0; i < xs.size(); ++i) ASSERT_EQ(outs[i], xs[i] * 2);
}

TEST(CudaGraph, CaptureFromTheDefaultStreamUsesASideStream) {
  TG_SKIP_WITHOUT_CUDA();
  ASSERT_EQ(cuda::current_stream().handle(), nullptr);  // the legacy default stream
  Tensor x = rand({4096}, Device(kCUDA, 0));
  Tensor out = zeros({4096}, Device(kCUDA, 0));
  out.copy_(x.exp() + 1);  // warm-up: kernels load before capture
  cuda::Graph graph;
  graph.capture([&] { out.copy_(x.exp() + 1); });
  EXPECT_EQ(cuda::current_stream().handle(), nullptr);  // restored
  std::vector<float> xs = host(x);
  for (int round = 0; round < 2; ++round) {
    out.zero_();
    graph.replay();
    const std::vector<float> outs = host(out);
    for (size_t i = 0; i < xs.size(); ++i) ASSERT_NEAR(outs[i], std::exp(double(xs[i])) + 1, 1e-5) << i;
    x.mul_(0.5);  // a replay reads x's memory as it is now
    for (float& v : xs) v *= 0.5f;
  }
}

TEST(CudaGraph, DestroyedGraphReturnsItsPoolToTheCache) {
  if (std::getenv("TG_NO_CUDA_MEMORY_CACHING")) GTEST_SKIP() << "needs the caching allocator (TG_NO_CUDA_MEMORY_CACHING is set)";
  TG_SKIP_WITHOUT_CUDA();
  cuda::Stream side;
  cuda::StreamGuard guard(side);
  const int64_t n = 16 << 20;  // 64 MiB of float32: its own segment
  Tensor x = rand({n}, Device(kCUDA, 0));
  (void)(x.slice(0, 0, 16) * 2 + 1);  // warm-up
  {
    // The first capture on this stream creates its cuBLAS workspace (32 MiB, kept for the
    // stream's lifetime by design): let that happen before the baseline is taken.
    cuda::Graph warm;
    warm.capture([&] { (void)(x.slice(0, 0, 16) * 2); });
  }
  side.synchronize();
  const size_t allocated0 = cuda::memory_allocated();
  std::vector<size_t> reserved;
  Tensor kept;
  for (int cycle = 0; cycle < 4; ++cycle) {
    cuda::Graph graph;
    Tensor out;
    graph.capture([&] { out = x * 2 + 1; });  // out (and the temporary x * 2) live in graph memory
    graph.replay();
    side.synchronize();
    EXPECT_GT(cuda::memory_allocated(), allocated0);
    if (cycle == 0) kept = out;  // outlives its graph: stays valid, joins the cache when it dies
    out = Tensor();
    reserved.push_back(cuda::memory_reserved());
  }
  // Every graph after the first reused the memory the previous one handed back.
  for (size_t i = 1; i < reserved.size(); ++i) EXPECT_EQ(reserved[i], reserved[1]) << "cycle " << i;
  std::vector<float> ks = host(kept), xs = host(x.slice(0, 0, 16));
  for (size_t i = 0; i < 16; ++i) EXPECT_EQ(ks[i], xs[i] * 2 + 1);
  kept = Tensor();
  EXPECT_EQ(cuda::memory_allocated(), allocated0);
  // The pools' blocks are cached general memory now: empty_cache can release them.
  const size_t before = cuda::memory_reserved();
  cuda::empty_cache();
  EXPECT_LT(cuda::memory_reserved(), before);
}

TEST(CudaGraph, MisuseIsAnError) {
  TG_SKIP_WITHOUT_CUDA();
  cuda::Stream side;
  cuda::StreamGuard guard(side);
  cuda::Graph graph;
  EXPECT_THROW(graph.replay(), Error);
  EXPECT_THROW(graph.capture_end(), Error);
  Tensor x = zeros({8}, Device(kCUDA, 0));
  x.add_(1);  // warm-up
  graph.capture_begin();
  EXPECT_THROW(graph.capture_begin(), Error);
  x.add_(1);
  graph.capture_end();
  EXPECT_THROW(graph.capture_begin(), Error);  // already holds a graph
  graph.replay();
  graph.replay();
  EXPECT_EQ(host(x)[0], 3.0f);
  cuda::Graph moved = std::move(graph);
  moved.replay();
  EXPECT_EQ(host(x)[0], 4.0f);
  moved.reset();
  EXPECT_FALSE(moved.is_captured());
  EXPECT_THROW(moved.replay(), Error);
}

bool same_bits(const Tensor& a, const Tensor& b) { return bitwise_equal(host(a), host(b)); }

// Launches finished by their last block (mse_loss over many blocks) take zeroed counters
// from the graph's arena: one kernel node each, no memset node, and replays with new inputs
// equal eager calls bit for bit.
TEST(CudaGraph, LastBlockLaunchesNeedNoCounterMemsets) {
  TG_SKIP_WITHOUT_CUDA();
  cuda::Stream side;
  cuda::StreamGuard guard(side);
  const Device dev(kCUDA, 0);
  const Shape ls{1 << 18};
  Tensor a = zeros(ls, dev), b = zeros(ls, dev), c = zeros(ls, dev);
  auto step = [&] {
    return std::vector<Tensor>{nn::functional::mse_loss(a, b), nn::functional::mse_loss(c, a),
                               nn::functional::mse_loss(b, c, "sum")};
  };
  auto feed = [&](uint64_t seed) {
    manual_seed(seed);
    a.normal_();
    b.uniform_();
    c.normal_(0.5, 2.0);
  };
  feed(1);
  (void)step();  // warm-up
  cuda::Graph graph;
  std::vector<Tensor> outs;
  graph.capture([&] { outs = step(); });
  EXPECT_EQ(graph.num_nodes(), 3u);  // three kernels, no memsets
  std::vector<float> previous;
  for (uint64_t round = 0; round < 3; ++round) {
    feed(100 + round);
    graph.replay();
    const std::vector<float> replayed = host(outs[0]);
    const std::vector<Tensor> eager = step();
    for (size_t i = 0; i < outs.size(); ++i)
      EXPECT_TRUE(same_bits(outs[i], eager[i])) << "round " << round << " output " << i;
    EXPECT_FALSE(bitwise_equal(replayed, previous)) << "round " << round << ": the replay did not run";
    previous = replayed;
  }
}

// A destroyed stream gives back its 32 MB cuBLAS workspace (and its done counters); a graph
// captured on the stream keeps the workspace it replays with until the graph goes.
TEST(CudaGraph, DestroyedStreamsGiveBackTheirWorkspaces) {
  TG_SKIP_WITHOUT_CUDA();
  manual_seed(5);
  const TensorOptions o = TensorOptions().device(Device(kCUDA, 0));
  // 768 x 768 float32: past small_gemm.cu's limit, so the matmul takes cuBLAS and its workspace.
  auto a = randn({768, 768}, o), b = randn({768, 768}, o);
  auto target = randn({768, 768}, o);
  const std::vector<float> expect = host(matmul(a, b));
  cuda::synchronize();
  const size_t base = cuda::memory_allocated();
  {
    std::vector<cuda::Stream> streams(4);  // alive together: four distinct handles
    for (cuda::Stream& s : streams) {
      cuda::StreamGuard g(s);
      EXPECT_TRUE(bitwise_equal(host(matmul(a, b)), expect));
      (void)nn::functional::mse_loss(a, target).item<float>();  // done counters
    }
    EXPECT_GE(cuda::memory_allocated(), base + 4 * (size_t{32} << 20));
  }
  EXPECT_EQ(cuda::memory_allocated(), base);

  auto out = zeros({768, 768}, o);
  cuda::Graph graph;
  {
    cuda::Stream s;
    cuda::StreamGuard g(s);
    graph.capture([&] { out.copy_(matmul(a, b)); });
  }  // the capture stream is gone; the graph still holds its workspace
  EXPECT_GE(cuda::memory_allocated(), base + (size_t{32} << 20));
  graph.replay();
  EXPECT_TRUE(bitwise_equal(host(out), expect));
  graph.reset();
  out = Tensor();
  cuda::synchronize();
  EXPECT_EQ(cuda::memory_allocated(), base);
}

TEST(CudaGraph, WithoutCudaCaptureThrows) {
  if (cuda::is_available()) GTEST_SKIP() << "checks the no-GPU path";
  cuda::Graph graph;
  EXPECT_THROW(graph.capture([] {}), Error);
  EXPECT_FALSE(graph.is_captured());
  EXPECT_THROW(graph.replay(), Error);
}

}  // namespace
}  // namespace tg::testing
