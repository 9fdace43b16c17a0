// Two threads train two separate models at once on the CPU (Linear regression, a seeded
// shuffling DataLoader each, SGD with momentum in one and Adam in the other) and must get
// bit for bit what each gets alone: the thread pool, the host allocator, the generators and
// the autograd engine are shared, and sharing them must change nothing. The CI runs this
// file under ThreadSanitizer (scripts/test), where a data race between the two is a failure.
#include <gtest/gtest.h>

#include <tapegrad/tapegrad.h>

#include <tapegrad/optim/adam.h>
#include <tapegrad/optim/sgd.h>

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "common/num_threads_guard.h"

namespace {

using tg::Tensor;

std::vector<uint8_t> bytes_of(const Tensor& t) {
  Tensor c = t.contiguous();
  std::vector<uint8_t> b(c.nbytes());
  c.copy_to_host(b.data());
  return b;
}

// Inputs prepared once on the calling thread: the training threads draw no random numbers
// from the global generator (its counters would interleave), so each run is reproducible.
struct Problem {
  Tensor x, y;
  tg::nn::StateDict init;
};

Problem make_problem(uint64_t seed, int64_t rows, int64_t features) {
  tg::manual_seed(seed);
  Problem p;
  p.x = tg::randn({rows, features}).contiguous();
  auto w = tg::randn({features, 1}) / 8.0;
  p.y = (tg::matmul(p.x, w) + 0.25 + tg::randn({rows, 1}) * 0.1).contiguous();
  tg::nn::Linear init(features, 1);
  for (const auto& [name, t] : init.state_dict()) p.init.insert(name, t.detach().clone());
  return p;
}

struct Result {
  std::vector<std::vector<uint8_t>> params;  // weight, bias
  std::vector<std::vector<uint8_t>> state;   // every optimizer state tensor, by name
  std::vector<float> losses;                 // every step's loss
};

enum class Opt { kSGD, kAdam };

Result train(const Problem& p, Opt which, int epochs) {
  tg::nn::Linear net(p.x.size(1), 1);
  net.load_state_dict(p.init);
  tg::data::TensorDataset ds(p.x, p.y);
  tg::data::DataLoader loader(ds, {.batch_size = 512, .shuffle = true, .seed = 7});
  std::unique_ptr<tg::optim::Optimizer> opt;
  if (which == Opt::kSGD)
    opt = std::make_unique<tg::optim::SGD>(net.parameters(), tg::optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  else
    opt = std::make_unique<tg::optim::Adam>(net.parameters(), tg::optim::AdamOptions{.lr = 1e-2});
  Result r;
  for (int e = 0; e < epochs; ++e) {
    for (auto [xb, yb] : loader) {
      opt->zero_grad();
      auto loss = tg::nn::functional::mse_loss(net(xb), yb);
      loss.backward();
      opt->step();
      r.losses.push_back(loss.item<float>());
    }
  }
  r.params = {bytes_of(net.weight), bytes_of(net.bias)};
  for (const auto& [name, t] : opt->state_dict()) r.state.push_back(bytes_of(t));
  return r;
}

// Runs with a given pool size and restores the old one.
using PoolSize = tg_test::NumThreadsGuard;

TEST(ConcurrentTraining, TwoModelsInTwoThreadsMatchEachAlone) {
  PoolSize pool(4);  // more workers than cores: chunks of both threads' jobs interleave
  // Large enough that elementwise ops, reductions and the batch gather go through the pool
  // (kGrain = 32768 elements): a batch is 512 x 128.
  const Problem a = make_problem(1, 2048, 128), b = make_problem(2, 2048, 128);
  const int epochs = 2;
  const Result alone_a = train(a, Opt::kSGD, epochs);
  const Result alone_b = train(b, Opt::kAdam, epochs);
  ASSERT_EQ(alone_a.losses.size(), 8u);
  // Training did something: the last loss is below the first.
  EXPECT_LT(alone_a.losses.back(), alone_a.losses.front());
  EXPECT_LT(alone_b.losses.back(), alone_b.losses.front());

  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round);
    Result together_a, together_b;
    std::thread ta([&] { together_a = train(a, Opt::kSGD, epochs); });
    std::thread tb([&] { together_b = train(b, Opt::kAdam, epochs); });
    ta.join();
    tb.join();
    EXPECT_EQ(together_a.losses, alone_a.losses);
    EXPECT_EQ(together_b.losses, alone_b.losses);
    EXPECT_EQ(together_a.params, alone_a.params);
    EXPECT_EQ(together_b.params, alone_b.params);
    EXPECT_EQ(together_a.state, alone_a.state);
    EXPECT_EQ(together_b.state, alone_b.state);
    ASSERT_FALSE(together_b.state.empty());
  }
}

// The same model trained twice at once from one Problem (read-only shared inputs): both
// threads read the same dataset tensors and must agree with each other and with a lone run.
TEST(ConcurrentTraining, SharedReadOnlyDatasetAcrossThreads) {
  PoolSize pool(3);
  const Problem p = make_problem(3, 1024, 128);
  const Result alone = train(p, Opt::kAdam, 1);
  std::vector<Result> out(3);
  std::vector<std::thread> ts;
  for (auto& r : out) ts.emplace_back([&p, &r] { r = train(p, Opt::kAdam, 1); });
  for (auto& t : ts) t.join();
  for (const auto& r : out) {
    EXPECT_EQ(r.losses, alone.losses);
    EXPECT_EQ(r.params, alone.params);
    EXPECT_EQ(r.state, alone.state);
  }
}

}  // namespace
