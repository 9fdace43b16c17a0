// Issue 14's autograd workloads on the GPU: the Hessian-vector product of sum((x @ y)^2) at 8000^2
// fp32 through create_graph (PyTorch's same call: g, = torch.autograd.grad(f, x, create_graph=True);
// torch.autograd.grad(g, x, v)), and the 2000-op chain's forward + backward with create_graph
// against without (the ratio the issue asks to report). One JSON line per workload.
//
//   tg_bench_autograd [--reps N] [--warmup N] [--only SUBSTRING]
#include <tapegrad/tapegrad.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "benchmarks/bench_util.h"

namespace {

using tg::bench::emit;
using tg::bench::Options;

double per_op_us(const Options& o, int ops, const std::function<void()>& body) {
  std::vector<double> t;
  for (int r = 0; r < o.warmup + o.reps; ++r) {
    tg::cuda::synchronize();
    const double t0 = tg::bench::now_s();
    body();
    tg::cuda::synchronize();
    if (r >= o.warmup) t.push_back(tg::bench::now_s() - t0);
  }
  return tg::bench::median(t) * 1e6 / ops;
}

void bench_hvp(const Options& o) {
  if (!o.wants("hvp_matmul_8000_fp32")) return;
  const int64_t n = 8000;
  auto x = tg::randn({n, n}, tg::TensorOptions().device(tg::kCUDA).requires_grad(true));
  auto y = tg::randn({n, n}, tg::kCUDA);
  auto v = tg::randn({n, n}, tg::kCUDA);
  std::vector<double> ms;
  for (int r = 0; r < o.warmup + o.reps; ++r) {
    tg::cuda::Event e0, e1;
    e0.record();
    auto f = tg::matmul(x, y).pow(2).sum();
    auto g = tg::autograd::grad({f}, {x}, tg::autograd::GradOptions{.create_graph = true});
    auto hv = tg::autograd::grad({g[0]}, {x}, tg::autograd::GradOptions{.grad_outputs = {v}});
    e1.record();
    e1.synchronize();
    if (r >= o.warmup) ms.push_back(e0.elapsed_ms(e1));
  }
  const double m = tg::bench::median(ms);
  emit("hvp_matmul_8000_fp32", m, "ms", m, "\"note\": \"forward + grad(create_graph) + grad(g, x, v)\"");
}

void bench_chain(const Options& o) {
  if (!o.wants("autograd_chain_2000")) return;
  const int kOps = 2000;
  auto w = tg::rand({16}, tg::TensorOptions().device(tg::kCUDA).requires_grad(true));
  auto chain = [&](bool create_graph) {
    return per_op_us(o, kOps, [&] {
      tg::Tensor h = w;
      for (int i = 0; i < kOps; ++i) h = h + w;
      h.sum().backward({}, {.create_graph = create_graph});
      w.mutable_grad() = tg::Tensor();
    });
  };
  const double plain = chain(false), cg = chain(true);
  emit("autograd_chain_2000_fwd_bwd", plain, "us/op", 0);
  emit("autograd_chain_2000_fwd_bwd_create_graph", cg, "us/op", 0,
       "\"ratio_to_plain\": " + std::to_string(cg / plain));
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = tg::bench::parse_options(argc, argv);
  if (!tg::cuda::is_available()) {
    std::fprintf(stderr, "tg_bench_autograd: no CUDA device\n");
    return 0;
  }
  bench_hvp(o);
  bench_chain(o);
  return 0;
}
