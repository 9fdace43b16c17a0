// Issue 16: a whole AMP training step with clip_grad_norm_ and AdamW, captured once into a
// tg::cuda::Graph, while a cosine schedule changes the lr between replays. The capture itself is
// the proof that the step never waits for the GPU (any host sync breaks it and capture() throws);
// the replayed run must equal the same steps run eagerly, bit for bit, including a step the
// GradScaler skips (an inf in the batch) and the lr values the scheduler set.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <vector>

#include <tapegrad/tapegrad.h>

namespace tg::testing {
namespace {

namespace ls = optim::lr_scheduler;

nn::Sequential make_model(uint64_t seed) {
  tg::manual_seed(seed);
  nn::Sequential m(nn::Linear(32, 64), nn::ReLU(), nn::Linear(64, 8));
  m.to(Device(kCUDA));
  return m;
}

struct Rig {
  explicit Rig(uint64_t seed) : model(make_model(seed)) {
    opt = std::make_unique<optim::AdamW>(model.parameters(), optim::AdamWOptions{.lr = 3e-3, .weight_decay = 0.01});
    sched = std::make_unique<ls::CosineAnnealingLR>(*opt, 6, 1e-4);
  }
  // One training step on the batch in (x, y): nothing here reads the device from the host.
  void step() {
    opt->zero_grad();
    Tensor loss;
    {
      amp::autocast ac(kCUDA, kFloat16);
      loss = nn::functional::mse_loss(model(x), y);
    }
    scaler.scale(loss).backward();
    scaler.unscale_(*opt);
    norm = nn::utils::clip_grad_norm_(model.parameters(), 0.5);
    scaler.step(*opt);
    scaler.update();
  }
  nn::Sequential model;
  std::unique_ptr<optim::AdamW> opt;
  std::unique_ptr<ls::CosineAnnealingLR> sched;
  amp::GradScaler scaler;
  Tensor x = tg::zeros({16, 32}, kCUDA), y = tg::zeros({16, 8}, kCUDA), norm;
};

std::vector<unsigned char> bytes_of(const std::vector<Tensor>& ts) {
  std::vector<unsigned char> out;
  for (const Tensor& t : ts) {
    const Tensor c = t.detach().cpu().contiguous();
    const auto* p = static_cast<const unsigned char*>(c.data_ptr());
    out.insert(out.end(), p, p + c.nbytes());
  }
  return out;
}

TEST(CapturedTrainStep, AmpClipAndCosineScheduleReplayLikeEagerSteps) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  cuda::Stream side;
  cuda::StreamGuard guard(side);
  Rig eager(7), graphed(7);
  ASSERT_EQ(bytes_of(eager.model.parameters()), bytes_of(graphed.model.parameters()));
  constexpr int kWarmup = 3, kSteps = 12, kInfStep = 7;
  cuda::Graph graph;
  std::vector<double> lrs, scales;
  for (int k = 0; k < kWarmup + kSteps; ++k) {
    tg::manual_seed(100 + k);
    Tensor xb = tg::randn({16, 32}), yb = tg::randn({16, 8});
    if (k == kInfStep) xb.select(1, 3).fill_(std::numeric_limits<double>::infinity());
    for (Rig* r : {&eager, &graphed}) {
      r->x.copy_(xb.to(Device(kCUDA)));
      r->y.copy_(yb.to(Device(kCUDA)));
    }
    eager.step();
    if (k < kWarmup) {
      graphed.step();
    } else {
      if (!graph.is_captured()) ASSERT_NO_THROW(graph.capture([&] { graphed.step(); })) << "the step synced";
      graph.replay();
    }
    lrs.push_back(eager.sched->get_last_lr()[0]);
    scales.push_back(eager.scaler.get_scale());
    eager.sched->step();
    graphed.sched->step();  // outside the graph: the fused AdamW reads the lr on the device
  }
  side.synchronize();
  EXPECT_NE(lrs[kWarmup], lrs[kWarmup + 4]) << "the schedule changes the lr between replays";
  EXPECT_EQ(scales[kInfStep], scales[kInfStep - 1] / 2) << "the inf step was skipped and the scale backed off";
  EXPECT_EQ(graphed.scaler.get_scale(), eager.scaler.get_scale());
  EXPECT_EQ(bytes_of(graphed.model.parameters()), bytes_of(eager.model.parameters()))
      << "the replayed steps differ from the eager steps";
  EXPECT_EQ(bytes_of({graphed.norm}), bytes_of({eager.norm}));
  for (const Tensor& p : graphed.model.parameters()) {
    const auto* st = graphed.opt->state(p);
    ASSERT_NE(st, nullptr);
    EXPECT_EQ(st->at("step").item<float>(), static_cast<float>(kWarmup + kSteps - 1)) << "one step skipped";
  }
}

}  // namespace
}  // namespace tg::testing
