// Launch batching (core/backend/cuda/launch_queue.h): small elementwise launches wait in a
// queue and reach the GPU as replays of cached chain graphs. These tests check that every way
// work or data can leave tapegrad sees the deferred launches first: host reads, a raw
// pointer handed to the caller's own copy, a stream handle, events between streams, another
// thread, a graph capture (ours and a raw one), freeing memory; and that runs of every length
// around the chain sizes compute exactly what one launch at a time does.
#include <gtest/gtest.h>

#include <cstdlib>

#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include <tapegrad/tapegrad.h>

#ifdef TG_WITH_CUDA
#include <cuda_runtime_api.h>

#include <tapegrad/core/backend/cuda/launch_queue.h>
#include <tapegrad/core/backend/cuda/runtime.h>

#include "core/queue_unaware_op.h"
#endif

namespace tg::testing {
namespace {

#ifdef TG_WITH_CUDA
namespace cd = tg::cuda::detail;

#define TG_SKIP_WITHOUT_CUDA() \
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device"

bool pending() { return cd::g_launches_pending.load(); }

// The queue holds work right now (when batching is on for this process).
void expect_pending(bool want) {
  if (cd::launch_batching_enabled()) EXPECT_EQ(pending(), want);
}

std::vector<float> host(const Tensor& t) { return t.cpu().to_vector<float>(); }

TEST(LaunchBatching, DependentRunsOfEveryLengthAreExact) {
  TG_SKIP_WITHOUT_CUDA();
  auto one = ones({16}, kCUDA);
  // Lengths around each chain size (2..64), the batch limit and several batches.
  for (int n : {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127, 128, 129, 200, 1000}) {
    Tensor y = one;
    for (int i = 0; i < n; ++i) y = y + one;
    const std::vector<float> v = host(y);
    for (float e : v) ASSERT_EQ(e, static_cast<float>(n + 1)) << "run of " << n << " adds";
    EXPECT_FALSE(pending());
  }
}

// The queue's correctness is local: an op that knows nothing of it (it takes the stream handle,
// runs tiny elementwise steps, then launches its own kernel and a cuBLAS gemm on that handle)
// is exact with batching on, in a loop between deferred top-level work.
TEST(LaunchBatching, OpUnawareOfTheQueueIsExact) {
  TG_SKIP_WITHOUT_CUDA();
  if (!cd::launch_batching_enabled()) GTEST_SKIP() << "launch batching is off (TG_LAUNCH_BATCHING=0)";
  manual_seed(11);
  const int64_t m = 7, k = 5, n = 3;
  Tensor x_cpu = rand({m, k}), w_cpu = rand({k, n});
  // The reference in double: ((x * 2 + 1) + 1) @ w.
  const std::vector<float> xv = x_cpu.to_vector<float>(), wv = w_cpu.to_vector<float>();
  std::vector<double> want(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p)
        want[i * n + j] += (2.0 * xv[i * k + p] + 2.0) * wv[p * n + j];
  Tensor x = x_cpu.to(kCUDA), w = w_cpu.to(kCUDA);
  for (int rep = 0; rep < 20; ++rep) {
    Tensor before = x + 0.0;  // deferred top-level work ahead of the op
    for (int i = 0; i < 3; ++i) before = before * 1.0;
    // (With the caching allocator off every free synchronises, which empties the queue.)
    if (!std::getenv("TG_NO_CUDA_MEMORY_CACHING")) expect_pending(true);
    Tensor out = zeros({m, n}, kCUDA);
    queue_unaware_op(before, w, out);
    Tensor after = out * 1.0 + 0.0;  // and behind it
    const std::vector<float> got = host(after);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5 * (1.0 + std::abs(want[i]))) << "element " << i << ", repeat " << rep;
  }
}

TEST(LaunchBatching, MixedKernelsAndStridedViewsMatchTheCpu) {
  TG_SKIP_WITHOUT_CUDA();
  manual_seed(3);
  auto a = rand({8, 5});
  auto b = rand({5});
  auto ga = a.to(kCUDA);
  auto gb = b.to(kCUDA);
  // Vectorised and strided kernels, a broadcast, float16 and a comparison, all small.
  auto chain = [](const Tensor& x, const Tensor& y) {
    Tensor t = x.t();                  // strided
    Tensor u = (t * 2.0 + 1.0).exp();  // vec path on a fresh tensor
    Tensor v = (x + y).log() * 3.0;    // broadcast
    Tensor h = v.to(kFloat16).to(kFloat32);
    Tensor w = where(h > 0.0, h, -h);  // |h|
    return std::make_pair(u.t() - 1.0, w.sqrt() + x);
  };
  auto [cu, cw] = chain(a, b);
  auto [gu, gw] = chain(ga, gb);
  const std::vector<float> eu = cu.contiguous().to_vector<float>(), ew = cw.contiguous().to_vector<float>();
  const std::vector<float> ou = host(gu.contiguous()), ow = host(gw.contiguous());
  ASSERT_EQ(eu.size(), ou.size());
  for (size_t i = 0; i < eu.size(); ++i) EXPECT_NEAR(ou[i], eu[i], 1e-5f * std::fabs(eu[i]) + 1e-6f) << i;
  // w went through float16: a 1-ulp float32 difference may round to the neighbouring float16
  // (2^-10 relative), which sqrt halves.
  for (size_t i = 0; i < ew.size(); ++i) EXPECT_NEAR(ow[i], ew[i], 1e-3f * std::fabs(ew[i]) + 1e-6f) << i;
}

TEST(LaunchBatching, RawPointerCopySeesDeferredWork) {
  if (std::getenv("TG_NO_CUDA_MEMORY_CACHING")) GTEST_SKIP() << "needs the caching allocator (TG_NO_CUDA_MEMORY_CACHING is set)";
  TG_SKIP_WITHOUT_CUDA();
  cuda::synchronize();
  auto x = full({64}, 2.0, kCUDA);
  Tensor y = x;
  for (int i = 0; i < 5; ++i) y = y * x;  // 2^6
  expect_pending(true);
  std::vector<float> h(64, 0.f);
  // The caller's own synchronous copy on the legacy stream: data_ptr() flushed first.
  TG_CUDA_CHECK(cudaMemcpy(h.data(), y.data_ptr(), 64 * sizeof(float), cudaMemcpyDeviceToHost));
  expect_pending(false);
  for (float e : h) ASSERT_EQ(e, 64.f);
}

TEST(LaunchBatching, StreamHandleSeesDeferredWork) {
  TG_SKIP_WITHOUT_CUDA();
  cuda::Stream s;
  cuda::StreamGuard guard(s);
  auto x = full({32}, 1.0, kCUDA);
  auto y = empty({32}, kCUDA);
  void* p = y.data_ptr();  // taken before the work: the pointer alone does not flush later
  y.fill_(0.0);
  for (int i = 0; i < 9; ++i) y.add_(x);
  expect_pending(true);
  std::vector<float> h(32, 0.f);
  auto raw = static_cast<cudaStream_t>(cuda::current_stream().handle());
  TG_CUDA_CHECK(cudaMemcpyAsync(h.data(), p, 32 * sizeof(float), cudaMemcpyDeviceToHost, raw));
  TG_CUDA_CHECK(cudaStreamSynchronize(raw));
  for (float e : h) ASSERT_EQ(e, 9.f);
}

TEST(LaunchBatching, EventsOrderWorkAcrossStreams) {
  TG_SKIP_WITHOUT_CUDA();
  cuda::Stream a, b;
  auto x = full({128}, 1.0, kCUDA);
  cuda::synchronize();
  Tensor y;
  cuda::Event done;
  {
    cuda::StreamGuard g(a);
    // Big work first, so the small deferred adds would surely lose a race with stream b.
    auto big = rand({4096, 4096}, kCUDA);
    for (int i = 0; i < 4; ++i) big = big * 1.0001;
    y = x + big.sum() * 0.0;  // a reduction, then small adds waiting in the queue
    for (int i = 0; i < 20; ++i) y = y + x;
    done.record(a);
  }
  Tensor z;
  {
    cuda::StreamGuard g(b);
    done.wait(b);
    z = y * 2.0;
    b.synchronize();
  }
  for (float e : host(z)) ASSERT_EQ(e, 42.f);
}

TEST(LaunchBatching, AnotherThreadsWorkIsSeenAfterJoin) {
  TG_SKIP_WITHOUT_CUDA();
  auto x = full({16}, 3.0, kCUDA);
  Tensor y;
  std::thread t([&] {
    Tensor r = x;
    for (int i = 0; i < 10; ++i) r = r + x;
    y = r;
  });
  t.join();
  for (float e : host(y)) ASSERT_EQ(e, 33.f);
}

TEST(LaunchBatching, GraphCaptureAfterPendingWork) {
  TG_SKIP_WITHOUT_CUDA();
  auto x = full({16}, 1.0, kCUDA);
  auto y = zeros({16}, kCUDA);
  for (int i = 0; i < 3; ++i) y.add_(x);  // pending when the capture begins
  cuda::Graph g;
  g.capture([&] {
    for (int i = 0; i < 5; ++i) y.add_(x);
  });
  expect_pending(false);
  EXPECT_EQ(g.num_nodes(), 5u);
  for (float e : host(y)) ASSERT_EQ(e, 3.f);  // capturing ran nothing
  g.replay();
  g.replay();
  for (float e : host(y)) ASSERT_EQ(e, 13.f);
}

TEST(LaunchBatching, RawCaptureOfTheCurrentStreamTakesTheWork) {
  TG_SKIP_WITHOUT_CUDA();
  cuda::Stream s;
  cuda::StreamGuard guard(s);
  auto x = full({16}, 1.0, kCUDA);
  auto y = zeros({16}, kCUDA);
  auto raw = static_cast<cudaStream_t>(s.handle());
  TG_CUDA_CHECK(cudaStreamBeginCapture(raw, cudaStreamCaptureModeRelaxed));
  for (int i = 0; i < 4; ++i) y.add_(x);
  EXPECT_FALSE(pending());  // captured, not deferred
  cudaGraph_t graph = nullptr;
  TG_CUDA_CHECK(cudaStreamEndCapture(raw, &graph));
  size_t nodes = 0;
  TG_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  EXPECT_EQ(nodes, 4u);
  cudaGraphExec_t exec = nullptr;
  TG_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  TG_CUDA_CHECK(cudaGraphLaunch(exec, raw));
  TG_CUDA_CHECK(cudaStreamSynchronize(raw));
  TG_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TG_CUDA_CHECK(cudaGraphDestroy(graph));
  for (float e : host(y)) ASSERT_EQ(e, 4.f);
}

TEST(LaunchBatching, FreeingAndEmptyingTheCacheWaitForDeferredWork) {
  if (std::getenv("TG_NO_CUDA_MEMORY_CACHING")) GTEST_SKIP() << "needs the caching allocator (TG_NO_CUDA_MEMORY_CACHING is set)";
  TG_SKIP_WITHOUT_CUDA();
  auto x = full({1000}, 2.0, kCUDA);
  Tensor y;
  {
    Tensor tmp = x * 3.0;
    y = tmp + x;  // reads tmp, which dies below with the launch still queued
  }
  expect_pending(true);
  cuda::empty_cache();
  expect_pending(false);
  auto other = full({1000}, 7.0, kCUDA);  // may take tmp's block
  for (float e : host(y)) ASSERT_EQ(e, 8.f);
  for (float e : host(other)) ASSERT_EQ(e, 7.f);
}

TEST(LaunchBatching, LargeLaunchesAreNotDeferredAndKeepOrder) {
  TG_SKIP_WITHOUT_CUDA();
  cuda::synchronize();
  auto small = full({8}, 1.0, kCUDA);
  auto s2 = small + 1.0;  // deferred
  expect_pending(true);
  auto big = full({1 << 20}, 1.0, kCUDA);  // launched now, after the queue
  expect_pending(false);
  auto sum = big.sum() + s2.sum();
  EXPECT_EQ(sum.item<double>(), double(1 << 20) + 16.0);
}

TEST(LaunchBatching, SynchronizeAndStreamQueryFlush) {
  if (std::getenv("TG_NO_CUDA_MEMORY_CACHING")) GTEST_SKIP() << "needs the caching allocator (TG_NO_CUDA_MEMORY_CACHING is set)";
  TG_SKIP_WITHOUT_CUDA();
  auto x = full({8}, 1.0, kCUDA);
  auto y = x + x;
  expect_pending(true);
  cuda::synchronize();
  expect_pending(false);
  y = y + x;
  expect_pending(true);
  EXPECT_TRUE([&] {
    cuda::Stream cur = cuda::current_stream();  // flushes
    cur.synchronize();
    return cur.query();
  }());
  expect_pending(false);
  for (float e : host(y)) ASSERT_EQ(e, 3.f);
}

#endif  // TG_WITH_CUDA

}  // namespace
}  // namespace tg::testing
