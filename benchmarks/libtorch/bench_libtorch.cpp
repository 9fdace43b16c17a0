// libtorch C++ timings of the tiny-op workloads, same method as tapegrad's benchmarks:
// warm-up discarded, median of repeats, host clock around the loop plus a final synchronize.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

namespace {
double median_us_per_op(int ops, const std::function<void()>& body) {
  std::vector<double> t;
  for (int r = 0; r < 3 + 15; ++r) {
    torch::cuda::synchronize();
    auto t0 = std::chrono::steady_clock::now();
    body();
    torch::cuda::synchronize();
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (r >= 3) t.push_back(us / ops);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
}  // namespace

int main() {
  if (!torch::cuda::is_available()) return 0;
  auto opts = torch::TensorOptions().device(torch::kCUDA);
  auto x = torch::rand({16}, opts);
  double adds = median_us_per_op(1000, [&] {
    auto y = x;
    for (int i = 0; i < 1000; ++i) y = y + x;
  });
  std::printf("{\"workload\": \"libtorch_dependent_adds_16\", \"value\": %.3f, \"unit\": \"us/op\"}\n", adds);
  auto w = torch::rand({16}, opts.requires_grad(true));
  double chain = median_us_per_op(2000, [&] {
    auto y = w;
    for (int i = 0; i < 2000; ++i) y = y + w;
    y.sum().backward();
    w.mutable_grad() = torch::Tensor();
  });
  std::printf("{\"workload\": \"libtorch_autograd_chain_2000_fwd_bwd\", \"value\": %.3f, \"unit\": \"us/op\"}\n", chain);
  return 0;
}
