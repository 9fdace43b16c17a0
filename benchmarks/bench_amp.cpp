// The seed's mixed-precision training loop (Linear(4096, 4096), SGD lr 1e-3, batch
// 256 randn, loss = model(inp).pow(2).mean(), GradScaler) timed in float16, bfloat16
// and float32 (autocast and scaler off): 100 steps between two CUDA events per
// repeat, warm-up repeats discarded, the median reported in us/step, plus the peak
// GPU memory of the float16 run. One JSON line per workload (bench_util.h's emit):
//   amp_train_fp16 / amp_train_bf16 / amp_train_fp32   us/step
//   amp_fp16_vs_fp32                                   us/step, baseline: our float32 loop
//   amp_train_fp16_peak_mib                            MiB (max_memory_allocated)
//   amp_train_fp16_graph                               us/step, the float16 step captured once into
//                                                      a tg::cuda::Graph and replayed (a fresh randn
//                                                      batch drawn into its input, normal_, before each
//                                                      replay)
//
//   tg_bench_amp [--reps N] [--warmup N] [--only SUBSTRING]
#include <cstdlib>
#include <tapegrad/tapegrad.h>

#include <cstdio>
#include <thread>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <tapegrad/amp/amp.h>
#include "benchmarks/bench_util.h"
#include <tapegrad/optim/optim.h>

namespace {

using tg::bench::emit;
using tg::bench::median;
using tg::bench::Options;

constexpr int kSteps = 100;
constexpr int64_t kFeatures = 4096;
constexpr int64_t kBatch = 256;

struct Result {
  double us_per_step;
  double peak_mib;
};

// low: nullopt = float32 (autocast and scaler disabled).
Result run_loop(const Options& o, std::optional<tg::DType> low) {
  tg::cuda::synchronize();
  tg::cuda::empty_cache();
  tg::cuda::reset_peak_memory_stats();
  tg::manual_seed(0);
  const tg::Device dev(tg::kCUDA);
  tg::nn::Linear model(kFeatures, kFeatures);
  model.to(dev);
  tg::optim::SGD opt(model.parameters(), {.lr = 1e-3});
  tg::amp::GradScaler scaler({.enabled = low.has_value()});
  auto step = [&] {
    auto inp = tg::randn({kBatch, kFeatures}, dev);
    opt.zero_grad();
    tg::Tensor loss;
    {
      tg::amp::autocast guard(tg::kCUDA, low, low.has_value());
      loss = model(inp).pow(2).mean();
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
  };
  for (int i = 0; i < o.warmup * 10; ++i) step();  // a warm-up repeat is 10 steps
  tg::cuda::synchronize();
  tg::cuda::Event start, end;
  std::vector<double> us;
  for (int r = 0; r < o.reps; ++r) {
    start.record();
    for (int i = 0; i < kSteps; ++i) step();
    end.record();
    end.synchronize();
    us.push_back(start.elapsed_ms(end) * 1e3 / kSteps);
  }
  return {median(us), static_cast<double>(tg::cuda::max_memory_allocated()) / (1024.0 * 1024.0)};
}

// The graphed float16 loop's state, on a side stream (capture needs a stream other than
// the legacy default). phases: the step up to and including phase 1 forward, 2 backward,
// 3 scaler.step (inf check + SGD), 4 scaler.update; eager calls (last = false) always update.
struct GraphedAmp {
  GraphedAmp() : guard(side) {}
  void step(int phases = 4, bool last = false) {
    opt.zero_grad();
    tg::Tensor loss;
    {
      tg::amp::autocast ac(tg::kCUDA, tg::kFloat16);
      loss = model(inp).pow(2).mean();
    }
    if (phases >= 2) scaler.scale(loss).backward();
    if (phases >= 3) scaler.step(opt);
    if (phases >= 4 || (phases == 3 && !last)) scaler.update();
  }
  tg::cuda::Stream side;
  tg::cuda::StreamGuard guard;
  tg::nn::Linear model{kFeatures, kFeatures, true, tg::TensorOptions().device(tg::kCUDA)};
  tg::optim::SGD opt{model.parameters(), {.lr = 1e-3}};
  tg::amp::GradScaler scaler;
  tg::Tensor inp = tg::randn({kBatch, kFeatures}, tg::kCUDA);
};

// The float16 loop with the step captured into a CUDA graph: warm-up steps eagerly on a
// side stream, one capture, then each timed step draws a fresh batch into the graph's input
// (normal_: the numbers randn would give, without a temporary and a copy) + replay().
double run_graph_loop(const Options& o) {
  tg::cuda::synchronize();
  tg::cuda::empty_cache();
  tg::manual_seed(0);
  GraphedAmp g;
  auto train_step = [&] { g.step(); };
  auto& inp = g.inp;
  auto& side = g.side;
  for (int i = 0; i < 3; ++i) train_step();
  tg::cuda::Graph graph;
  graph.capture(train_step);
  if (const char* dir = std::getenv("TG_GRAPH_DOT_DIR")) graph.debug_dot(std::string(dir) + "/amp_step.dot");
  auto step = [&] {
    inp.normal_();
    graph.replay();
  };
  for (int i = 0; i < o.warmup * 10; ++i) step();
  side.synchronize();
  tg::cuda::Event start, end;
  std::vector<double> us;
  std::vector<double> host_us;
  for (int r = 0; r < o.reps; ++r) {
    start.record();
    const double t0 = tg::bench::now_s();
    for (int i = 0; i < kSteps; ++i) step();
    host_us.push_back((tg::bench::now_s() - t0) * 1e6 / kSteps);
    end.record();
    end.synchronize();
    us.push_back(start.elapsed_ms(end) * 1e3 / kSteps);
  }
  if (std::getenv("TG_AMP_DIAG")) {
    std::fprintf(stderr, "graph loop: host enqueue %.1f us/step\n", median(host_us));
    auto addr = [](const char* what, const tg::Tensor& t) {
      const auto a = reinterpret_cast<uintptr_t>(t.data_ptr());
      std::fprintf(stderr, "  %s at %#lx (mod 2 MiB: %#lx)\n", what, static_cast<unsigned long>(a),
                   static_cast<unsigned long>(a % (2u << 20)));
    };
    addr("weight", g.model.weight);
    addr("weight grad", g.model.weight.grad());
    addr("input", inp);
    auto time_loop = [&](const std::function<void()>& f) {
      std::vector<double> t;
      for (int r = 0; r < 5; ++r) {
        start.record();
        for (int i = 0; i < kSteps; ++i) f();
        end.record();
        end.synchronize();
        t.push_back(start.elapsed_ms(end) * 1e3 / kSteps);
      }
      return median(t);
    };
    std::fprintf(stderr, "same graph: replay only %.1f us, normal_ only %.1f us, both %.1f us\n",
                 time_loop([&] { graph.replay(); }), time_loop([&] { inp.normal_(); }), time_loop(step));
  }
  return median(us);
}

// Where the graph step's GPU time goes: the step cut after each phase (forward; + backward;
// + scaler.step, i.e. inf check and SGD; + update), each captured alone and replayed
// back to back without the input copy. Differences between rows are the phases' costs.
void graph_phase_breakdown(const Options& o) {
  static const char* kNames[] = {"amp_graph_phase_forward", "amp_graph_phase_backward", "amp_graph_phase_step",
                                 "amp_graph_phase_update"};
  for (int phases = 1; phases <= 4; ++phases) {
    tg::cuda::synchronize();
    tg::manual_seed(0);
    GraphedAmp g;
    auto partial = [&](bool last) { g.step(phases, last); };
    auto& side = g.side;
    for (int i = 0; i < 3; ++i) partial(false);
    tg::cuda::Graph graph;
    graph.capture([&] { partial(true); });
    for (int i = 0; i < 20; ++i) graph.replay();
    side.synchronize();
    std::vector<double> us;
    for (int r = 0; r < o.reps; ++r) {
      tg::cuda::Event start, end;
      start.record();
      for (int i = 0; i < kSteps; ++i) graph.replay();
      end.record();
      end.synchronize();
      us.push_back(start.elapsed_ms(end) * 1e3 / kSteps);
    }
    emit(kNames[phases - 1], median(us), "us/step", median(us) * kSteps * 1e-3,
         "\"graph_nodes\": " + std::to_string(graph.num_nodes()));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = tg::bench::parse_options(argc, argv);
  if (!tg::cuda::is_available()) {
    std::fprintf(stderr, "tg_bench_amp: no CUDA device; nothing to time\n");
    return 0;
  }
  try {
    const bool want16 = o.wants("amp_train_fp16") || o.wants("amp_fp16_vs_fp32");
    const bool want32 = o.wants("amp_train_fp32") || o.wants("amp_fp16_vs_fp32");
    std::optional<Result> r16, r32;
    if (want16) {
      r16 = run_loop(o, tg::kFloat16);
      emit("amp_train_fp16", r16->us_per_step, "us/step", r16->us_per_step * kSteps * 1e-3);
      emit("amp_train_fp16_peak_mib", r16->peak_mib, "MiB", r16->us_per_step * kSteps * 1e-3);
    }
    if (o.wants("amp_train_bf16")) {
      Result r = run_loop(o, tg::kBFloat16);
      emit("amp_train_bf16", r.us_per_step, "us/step", r.us_per_step * kSteps * 1e-3,
           "\"peak_mib\": " + std::to_string(r.peak_mib));
    }
    if (want32) {
      r32 = run_loop(o, std::nullopt);
      emit("amp_train_fp32", r32->us_per_step, "us/step", r32->us_per_step * kSteps * 1e-3,
           "\"peak_mib\": " + std::to_string(r32->peak_mib));
    }
    if (o.wants("amp_train_fp16_graph")) {
      const double us = run_graph_loop(o);
      emit("amp_train_fp16_graph", us, "us/step", us * kSteps * 1e-3,
           "\"note\": \"one tg::cuda::Graph replay per step, input drawn in place first (normal_)\"");
    }
    if (o.wants("amp_graph_phase")) graph_phase_breakdown(o);
    if (std::getenv("TG_AMP_DIAG")) {
      if (const char* z = std::getenv("TG_AMP_DIAG_SLEEP")) {
        tg::cuda::synchronize();
        std::this_thread::sleep_for(std::chrono::seconds(std::atoi(z)));
      }
      std::fprintf(stderr, "graph loop again, last: %.1f us/step\n", run_graph_loop(o));
    }
    if (r16 && r32)
      emit("amp_fp16_vs_fp32", r16->us_per_step, "us/step", r16->us_per_step * kSteps * 1e-3,
           "\"baseline\": " + std::to_string(r32->us_per_step) + ", \"baseline_name\": \"tg float32\"");
  } catch (const tg::Error& e) {
    std::fprintf(stderr, "tg_bench_amp: %s\n", e.what());
    return 1;
  }
  return 0;
}
