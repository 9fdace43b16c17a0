// The CPU thread pool under concurrent use: several external threads running parallel_for
// at once (each chunk exactly once, results published to the caller), exceptions from chunks,
// nested calls, resizing between calls, and tensor ops from many threads at once. The CI runs
// this file under ThreadSanitizer (scripts/test).
#include <gtest/gtest.h>

#include <tapegrad/tapegrad.h>

#include <tapegrad/core/backend/cpu/thread_pool.h>

#include <atomic>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/num_threads_guard.h"

namespace {

using PoolSize = tg_test::NumThreadsGuard;

// Fills out[i] = f(i) through parallel_for with plain (non-atomic) writes: the caller must
// see every write once parallel_for returns.
void fill_squares(std::vector<int64_t>& out, int64_t grain) {
  tg::parallel_for(0, static_cast<int64_t>(out.size()), grain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) out[i] = i * i;
  });
}

TEST(ThreadPool, ManyCallersAtOnce) {
  PoolSize pool(4);
  constexpr int kCallers = 6, kRounds = 30;
  std::vector<std::thread> ts;
  std::atomic<int> bad{0};
  for (int c = 0; c < kCallers; ++c) {
    ts.emplace_back([&, c] {
      std::vector<int64_t> out(4000 + 97 * c);
      for (int r = 0; r < kRounds; ++r) {
        std::fill(out.begin(), out.end(), -1);
        fill_squares(out, 100);
        for (size_t i = 0; i < out.size(); ++i)
          if (out[i] != static_cast<int64_t>(i * i)) ++bad;
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(ThreadPool, EveryChunkRunsOnce) {
  PoolSize pool(4);
  std::vector<std::atomic<int>> hits(10007);
  tg::parallel_for(0, static_cast<int64_t>(hits.size()), 64, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
  });
  for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i].load(), 1) << i;
}

TEST(ThreadPool, ExceptionFromAChunkReachesTheCaller) {
  PoolSize pool(4);
  for (int round = 0; round < 20; ++round) {
    std::vector<int64_t> out(8000, 0);
    EXPECT_THROW(tg::parallel_for(0, 8000, 100,
                                  [&](int64_t lo, int64_t hi) {
                                    for (int64_t i = lo; i < hi; ++i) out[i] = 1;
                                    if (lo == 0) throw std::runtime_error("chunk failed");
                                  }),
                 std::runtime_error);
    // Every chunk still finished before the rethrow: nothing writes `out` after this point.
    EXPECT_EQ(std::accumulate(out.begin(), out.end(), int64_t{0}), 8000);
  }
}

TEST(ThreadPool, NestedCallsRunInline) {
  PoolSize pool(4);
  std::vector<int64_t> out(64 * 64, 0);
  tg::parallel_for(0, 64, 1, [&](int64_t lo, int64_t hi) {
    EXPECT_TRUE(tg::cpu::in_parallel_region());
    for (int64_t r = lo; r < hi; ++r)
      tg::parallel_for(0, 64, 1, [&](int64_t a, int64_t b) {
        for (int64_t c = a; c < b; ++c) out[r * 64 + c] = r + c;
      });
  });
  for (int64_t r = 0; r < 64; ++r)
    for (int64_t c = 0; c < 64; ++c) ASSERT_EQ(out[r * 64 + c], r + c);
  EXPECT_FALSE(tg::cpu::in_parallel_region());
}

TEST(ThreadPool, ResizeBetweenCalls) {
  PoolSize pool(1);
  for (int n : {2, 5, 1, 3, 4}) {
    tg::set_num_threads(n);
    EXPECT_EQ(tg::get_num_threads(), n);
    std::vector<int64_t> out(5000, -1);
    fill_squares(out, 50);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], static_cast<int64_t>(i * i));
  }
}

// Resizing while other threads are inside parallel_for: their calls still complete correctly.
TEST(ThreadPool, ResizeWhileOtherThreadsRun) {
  PoolSize pool(3);
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int c = 0; c < 3; ++c) {
    ts.emplace_back([&] {
      std::vector<int64_t> out(3000);
      while (!stop.load()) {
        std::fill(out.begin(), out.end(), -1);
        fill_squares(out, 64);
        for (size_t i = 0; i < out.size(); ++i)
          if (out[i] != static_cast<int64_t>(i * i)) ++bad;
      }
    });
  }
  for (int i = 0; i < 20; ++i) tg::set_num_threads(1 + i % 4);
  stop = true;
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
}

// Tensor ops (elementwise, reductions, matmul) from several threads at once, each compared
// with the single-threaded answer computed first.
TEST(ThreadPool, TensorOpsFromManyThreads) {
  PoolSize pool(4);
  tg::manual_seed(5);
  std::vector<tg::Tensor> xs;
  for (int c = 0; c < 4; ++c) xs.push_back(tg::randn({256, 300}));
  auto work = [](const tg::Tensor& x) {
    auto y = (x.exp() * 0.5 + x.pow(2)).sum(1);
    return (tg::matmul(x.t(), x).sum() + y.sum()).item<double>();
  };
  std::vector<double> expected;
  for (const auto& x : xs) expected.push_back(work(x));
  std::vector<double> got(xs.size());
  std::vector<std::thread> ts;
  for (size_t c = 0; c < xs.size(); ++c)
    ts.emplace_back([&, c] {
      for (int r = 0; r < 3; ++r) got[c] = work(xs[c]);
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(got, expected);
}

}  // namespace
