// Optimizer step timings on CUDA: one fused Adam (and SGD) step over the parameters
// of Linear(64, 1) (launch/host bound) and of Linear(4096, 4096) (bandwidth bound).
// Device time with CUDA events around kStepsPerRep steps; host time is the enqueue
// cost of one step (no sync inside step()). One JSON line per workload on stdout.
//
//   tg_bench_optim [--reps N] [--warmup N] [--only SUBSTRING]
#include <tapegrad/tapegrad.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/bench_util.h"
#include <tapegrad/optim/optim.h>

namespace {

using tg::bench::emit;
using tg::bench::median;
using tg::bench::now_s;
using tg::bench::Options;

constexpr int kStepsPerRep = 20;

std::vector<tg::Tensor> linear_params(int64_t in, int64_t out) {
  std::vector<tg::Tensor> ps = {tg::randn({out, in}, tg::kCUDA).requires_grad_(),
                                tg::randn({out}, tg::kCUDA).requires_grad_()};
  for (auto& p : ps) p.mutable_grad() = tg::randn(p.sizes(), tg::kCUDA);
  return ps;
}

void bench(const Options& o, const std::string& name, int64_t in, int64_t out,
           const std::function<std::unique_ptr<tg::optim::Optimizer>(const std::vector<tg::Tensor>&)>& make) {
  if (!o.wants(name)) return;
  auto params = linear_params(in, out);
  auto opt = make(params);
  for (int i = 0; i < o.warmup * kStepsPerRep; ++i) opt->step();
  tg::cuda::synchronize();
  tg::cuda::Event start, end;
  std::vector<double> device_ms, host_us;
  for (int r = 0; r < o.reps; ++r) {
    start.record();
    const double t0 = now_s();
    for (int i = 0; i < kStepsPerRep; ++i) opt->step();
    host_us.push_back((now_s() - t0) * 1e6 / kStepsPerRep);
    end.record();
    end.synchronize();
    device_ms.push_back(start.elapsed_ms(end) / kStepsPerRep);
  }
  const double ms = median(device_ms);
  int64_t numel = 0;
  for (auto& p : params) numel += p.numel();
  // Adam reads param, grad, exp_avg, exp_avg_sq and writes three of them: 7 x 4 bytes per element.
  char extra[160];
  std::snprintf(extra, sizeof(extra), "\"host_us_per_step\": %.3g, \"numel\": %lld", median(host_us),
                static_cast<long long>(numel));
  emit(name, ms * 1e3, "us/step", ms, extra);
}

}  // namespace

int main(int argc, char** argv) {
  Options o = tg::bench::parse_options(argc, argv);
  if (!tg::cuda::is_available()) {
    std::fprintf(stderr, "tg_bench_optim: no CUDA device\n");
    return 0;
  }
  auto adam = [](const std::vector<tg::Tensor>& ps) { return std::make_unique<tg::optim::Adam>(ps); };
  auto sgd = [](const std::vector<tg::Tensor>& ps) {
    return std::make_unique<tg::optim::SGD>(ps, tg::optim::SGDOptions{.lr = 1e-3});
  };
  bench(o, "optim_adam_step_linear_64x1", 64, 1, adam);
  bench(o, "optim_adam_step_linear_4096x4096", 4096, 4096, adam);
  bench(o, "optim_sgd_step_linear_4096x4096", 4096, 4096, sgd);
  return 0;
}
