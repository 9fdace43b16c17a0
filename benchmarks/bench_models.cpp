// Whole training epochs of small models, the way a user writes them (issue #15's table):
// an MNIST-shaped MLP 784-512-512-10, batch 128, cross_entropy + Adam, 60000 rows resident on
// the GPU with a device-side shuffle. Eager (DataLoader over a TensorDataset) and the same epoch
// captured whole into a tg::cuda::Graph and replayed once per epoch (a fresh randperm copied into
// the order tensor the graph reads). Host wall clock around a synchronised epoch, median of repeats.
// --cublas-benchmark: the same with cuBLASLt's algorithms timed per GEMM problem.
// --no-small-gemm: float32 GEMMs to cuBLAS instead of small_gemm.cu (A/B).
// --no-gemm-relu: the ReLUs as their own kernels, not in the linears' gemm epilogues (A/B).
// TG_GEMM_GROUPING=0 in the environment: each linear's input and weight gradient gemms as two
// launches, not one (A/B).
// --host-phases: also prints the eager step's host time per part (loader, zero_grad, forward,
// loss, backward, step), mean us over the timed epochs: where an eager step that outruns the GPU
// spends its time.
#include <algorithm>
#include <cstdio>
#include <string>

#include <tapegrad/tapegrad.h>
#ifdef TG_WITH_CUDA
#include <tapegrad/core/backend/cuda/blas.h>
#endif
#include "benchmarks/bench_util.h"

namespace {
using tg::bench::emit;
namespace F = tg::nn::functional;

constexpr int64_t kRows = 60000, kBatch = 128, kSteps = (kRows + kBatch - 1) / kBatch;

tg::nn::Sequential make_mlp() {
  tg::nn::Sequential net(tg::nn::Linear(784, 512), tg::nn::ReLU(), tg::nn::Linear(512, 512), tg::nn::ReLU(),
                         tg::nn::Linear(512, 10));
  net.to(tg::kCUDA);
  return net;
}

struct Data {
  tg::Tensor x, y;
};

Data make_data() {
  tg::manual_seed(0);
  Data d;
  d.x = tg::rand({kRows, 784}, tg::kCUDA);
  d.y = (tg::rand({kRows}, tg::kCUDA) * 10).to(tg::kInt64);  // labels 0..9, truncated
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  // --cublas-benchmark: cuBLASLt algorithms timed per GEMM problem (tg::backends::cublas).
  // --no-small-gemm: float32 GEMMs of few tiles to cuBLAS instead of small_gemm.cu (A/B).
  bool cublas_benchmark = false, small_gemm = true, host_phases = false, gemm_relu = true;
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--cublas-benchmark")
      cublas_benchmark = true;
    else if (std::string(argv[i]) == "--no-small-gemm")
      small_gemm = false;
    else if (std::string(argv[i]) == "--no-gemm-relu")
      gemm_relu = false;
    else if (std::string(argv[i]) == "--host-phases")
      host_phases = true;
    else
      argv[out++] = argv[i];
  }
  argc = out;
  auto o = tg::bench::parse_options(argc, argv);
  if (cublas_benchmark && tg::cuda::is_available()) tg::backends::cublas::set_benchmark(true);
#ifdef TG_WITH_CUDA
  tg::cuda::detail::set_small_sgemm(small_gemm);
  tg::cuda::detail::set_gemm_activation_fusion(gemm_relu);
#endif
  if (!tg::cuda::is_available()) {
    std::fprintf(stderr, "tg_bench_models: no CUDA device\n");
    return 0;
  }
  const int epochs = std::max(5, o.reps / 2);
  if (o.wants("mlp_mnist_epoch") && o.only != "mlp_mnist_epoch_graph") {
    Data d = make_data();
    tg::data::TensorDataset ds(d.x, d.y);
    tg::data::DataLoader loader(ds, {.batch_size = kBatch, .shuffle = true});
    auto net = make_mlp();
    tg::optim::Adam opt(net.parameters());
    std::vector<double> t;
    constexpr int kParts = 6;
    const char* part_names[kParts] = {"loader", "zero_grad", "forward", "loss", "backward", "step"};
    double part_s[kParts] = {};
    for (int r = 0; r < o.warmup + epochs; ++r) {
      tg::cuda::synchronize();
      double t0 = tg::bench::now_s();
      const bool timed = r >= o.warmup && host_phases;
      double tp = tg::bench::now_s();
      auto mark = [&](int part) {
        if (!timed) return;
        const double now = tg::bench::now_s();
        part_s[part] += now - tp;
        tp = now;
      };
      for (auto [xb, yb] : loader) {
        mark(0);
        opt.zero_grad();
        mark(1);
        auto logits = net(xb);
        mark(2);
        auto loss = F::cross_entropy(logits, yb);
        mark(3);
        loss.backward();
        mark(4);
        opt.step();
        mark(5);
      }
      tg::cuda::synchronize();
      if (r >= o.warmup) t.push_back((tg::bench::now_s() - t0) * 1e3);
    }
    double ms = tg::bench::median(t);
    std::string extra = "\"steps\": " + std::to_string(kSteps) + ", \"epoch_ms\": " + std::to_string(ms);
    if (host_phases)
      for (int i = 0; i < kParts; ++i)
        extra += ", \"host_us_" + std::string(part_names[i]) + "\": " + std::to_string(part_s[i] * 1e6 / (epochs * kSteps));
    emit("mlp_mnist_epoch", ms * 1e3 / kSteps, "us/step", ms, extra);
  }
  if (o.wants("mlp_mnist_epoch_graph")) {
    Data d = make_data();
    tg::cuda::Stream side;
    tg::cuda::StreamGuard side_guard(side);
    auto net = make_mlp();
    tg::optim::Adam opt(net.parameters());
    const auto i64 = tg::TensorOptions().dtype(tg::kInt64).device(tg::kCUDA);
    tg::Tensor order = tg::randperm(kRows, i64);
    auto epoch = [&] {
      for (int64_t s = 0; s < kSteps; ++s) {
        tg::Tensor idx = order.slice(0, s * kBatch, std::min(kRows, (s + 1) * kBatch));
        auto [xb, yb] = tg::data::gather_rows<2>({d.x, d.y}, idx);
        opt.zero_grad();
        auto loss = F::cross_entropy(net(xb), yb);
        loss.backward();
        opt.step();
      }
    };
    epoch();  // eager warm-up epoch on the capture stream
    tg::cuda::Graph graph;
    double c0 = tg::bench::now_s();
    graph.capture(epoch);
    const double capture_ms = (tg::bench::now_s() - c0) * 1e3;
    std::vector<double> t;
    for (int r = 0; r < o.warmup + epochs; ++r) {
      side.synchronize();
      double t0 = tg::bench::now_s();
      order.copy_(tg::randperm(kRows, i64));
      graph.replay();
      side.synchronize();
      if (r >= o.warmup) t.push_back((tg::bench::now_s() - t0) * 1e3);
    }
    double ms = tg::bench::median(t);
    emit("mlp_mnist_epoch_graph", ms * 1e3 / kSteps, "us/step", ms,
         "\"steps\": " + std::to_string(kSteps) + ", \"epoch_ms\": " + std::to_string(ms) +
             ", \"graph_nodes\": " + std::to_string(graph.num_nodes()) +
             ", \"capture_ms\": " + std::to_string(capture_ms));
  }
  return 0;
}
