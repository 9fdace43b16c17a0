// Where the time of a tiny op goes: raw kernel launches against tapegrad's
// allocation, front-end and autograd layers (host wall clock per op, median of repeats).
#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <functional>
#include <string>

#include <tapegrad/tapegrad.h>
#include "benchmarks/bench_util.h"
#include <tapegrad/core/native.h>

int launch_add_one(float* p, int n, int count, void* stream);
void launch_report(float* p, int n, int count);
void runtime_call_report(float* p, int n, int count);
void batch_report(float* p, int n, int count);

namespace {
using tg::bench::emit;

double per_op_us(const tg::bench::Options& o, int ops, const std::function<void()>& body) {
  std::vector<double> t;
  for (int r = 0; r < o.warmup + o.reps; ++r) {
    tg::cuda::synchronize();
    double t0 = tg::bench::now_s();
    body();
    tg::cuda::synchronize();
    double dt = tg::bench::now_s() - t0;
    if (r >= o.warmup) t.push_back(dt);
  }
  return tg::bench::median(t) * 1e6 / ops;
}
}  // namespace

int main(int argc, char** argv) {
  auto o = tg::bench::parse_options(argc, argv);
  if (!tg::cuda::is_available()) return 0;
  const int kOps = 2000;
  auto x = tg::rand({16}, tg::kCUDA);
  auto buf = tg::zeros({16}, tg::kCUDA);
  launch_report(buf.data_ptr<float>(), 16, kOps);
  runtime_call_report(buf.data_ptr<float>(), 16, kOps);
  batch_report(buf.data_ptr<float>(), 16, 2048);
  if (std::getenv("TG_BATCH_ONLY")) return 0;  // only the raw launch and batching baselines above
  {  // the same front-end on CPU tensors: tapegrad's host cost on this machine without CUDA
    auto xc = tg::rand({16});
    emit("overhead_add_chain_cpu", per_op_us(o, kOps, [&] {
           tg::Tensor y = xc;
           for (int i = 0; i < kOps; ++i) y = y + xc;
         }), "us/op", 0);
    auto wc = tg::rand({16}, tg::TensorOptions().requires_grad(true));
    emit("autograd_chain_cpu_fwd_bwd", per_op_us(o, kOps, [&] {
           tg::Tensor y = wc;
           for (int i = 0; i < kOps; ++i) y = y + wc;
           y.sum().backward();
           wc.mutable_grad() = tg::Tensor();
         }), "us/op", 0);
  }
  {  // the same adds on a non-blocking stream made current
    tg::cuda::Stream s;
    tg::cuda::StreamGuard g(s);
    emit("overhead_add_chain_nonblocking_stream", per_op_us(o, kOps, [&] {
           tg::Tensor y = x;
           for (int i = 0; i < kOps; ++i) y = y + x;
         }), "us/op", 0);
  }
  emit("overhead_native_empty", per_op_us(o, kOps, [&] {
         for (int i = 0; i < kOps; ++i) (void)tg::native::empty({16}, tg::kFloat32, tg::Device(tg::kCUDA, 0));
       }), "us/op", 0);
  emit("overhead_native_add", per_op_us(o, kOps, [&] {
         tg::Tensor y = x;
         for (int i = 0; i < kOps; ++i) y = tg::native::add(y, x);
       }), "us/op", 0);
  emit("overhead_add_chain", per_op_us(o, kOps, [&] {
         tg::Tensor y = x;
         for (int i = 0; i < kOps; ++i) y = y + x;
       }), "us/op", 0);
  emit("overhead_add_inplace", per_op_us(o, kOps, [&] {
         for (int i = 0; i < kOps; ++i) buf.add_(x);
       }), "us/op", 0);
  emit("overhead_add_independent", per_op_us(o, kOps, [&] {
         for (int i = 0; i < kOps; ++i) (void)(x + x);
       }), "us/op", 0);
  auto w = tg::rand({16}, tg::TensorOptions().device(tg::kCUDA).requires_grad(true));
  emit("autograd_chain_2000_fwd_bwd", per_op_us(o, kOps, [&] {
         tg::Tensor y = w;
         for (int i = 0; i < kOps; ++i) y = y + w;
         y.sum().backward();
         w.mutable_grad() = tg::Tensor();
       }), "us/op", 0, "\"note\": \"2000 dependent adds with requires_grad, forward + backward, per op\"");
  {  // the same chain, forward and backward timed apart (host clock, synchronised)
    std::vector<double> tf, tb;
    for (int r = 0; r < o.warmup + o.reps; ++r) {
      tg::cuda::synchronize();
      double t0 = tg::bench::now_s();
      tg::Tensor y = w;
      for (int i = 0; i < kOps; ++i) y = y + w;
      auto s = y.sum();
      tg::cuda::synchronize();
      double t1 = tg::bench::now_s();
      s.backward();
      tg::cuda::synchronize();
      double t2 = tg::bench::now_s();
      w.mutable_grad() = tg::Tensor();
      if (r >= o.warmup) {
        tf.push_back((t1 - t0) * 1e6 / kOps);
        tb.push_back((t2 - t1) * 1e6 / kOps);
      }
    }
    emit("autograd_chain_2000_fwd_only", tg::bench::median(tf), "us/op", 0);
    emit("autograd_chain_2000_bwd_only", tg::bench::median(tb), "us/op", 0);
  }
  {  // forward + backward of sum(x @ y) at 8000 fp32 (event-timed)
    auto a = tg::randn({8000, 8000}, tg::TensorOptions().device(tg::kCUDA).requires_grad(true));
    auto b = tg::randn({8000, 8000}, tg::kCUDA);
    std::vector<double> t;
    for (int r = 0; r < o.warmup + o.reps; ++r) {
      a.mutable_grad() = tg::Tensor();
      tg::cuda::Event e0, e1;
      e0.record();
      tg::matmul(a, b).sum().backward();
      e1.record();
      e1.synchronize();
      if (r >= o.warmup) t.push_back(e0.elapsed_ms(e1));
    }
    double ms = tg::bench::median(t);
    emit("matmul_grad_8000", ms, "ms", ms);
  }
  {  // one epoch of the seed's regression program: 1M x 64 standardized, batches of 4096
    auto raw = tg::rand({1'000'000, 64}, tg::kCUDA);
    auto feat = ((raw - raw.mean(0)) / raw.std(0)).contiguous();
    auto y = tg::randn({1'000'000, 1}, tg::kCUDA);
    tg::data::TensorDataset ds(feat, y);
    tg::data::DataLoader loader(ds, {.batch_size = 4096, .shuffle = true});
    tg::nn::Sequential net(tg::nn::Linear(64, 1));
    net.to(tg::kCUDA);
    tg::optim::Adam opt(net.parameters());
    std::vector<double> t;
    for (int r = 0; r < o.warmup + 10; ++r) {
      tg::cuda::synchronize();
      double t0 = tg::bench::now_s();
      for (auto [xb, yb] : loader) {
        opt.zero_grad();
        auto loss = tg::nn::functional::mse_loss(net(xb), yb);
        loss.backward();
        opt.step();
      }
      tg::cuda::synchronize();
      if (r >= o.warmup) t.push_back((tg::bench::now_s() - t0) * 1e3);
    }
    double ms = tg::bench::median(t);
    emit("regression_epoch", ms, "ms", ms, "\"steps\": 245");
  }
  {  // the same epoch captured whole into a tg::cuda::Graph (examples/train_regression --cuda-graph):
     // per epoch, a new randperm is copied into the order tensor the graph reads, then one replay
    const int64_t rows = 1'000'000, batch = 4096, steps = (rows + batch - 1) / batch;
    tg::cuda::Stream side;
    tg::cuda::StreamGuard side_guard(side);
    auto raw = tg::rand({rows, 64}, tg::kCUDA);
    auto feat = ((raw - raw.mean(0)) / raw.std(0)).contiguous();
    auto y = tg::randn({rows, 1}, tg::kCUDA);
    tg::nn::Sequential net(tg::nn::Linear(64, 1));
    net.to(tg::kCUDA);
    tg::optim::Adam opt(net.parameters());
    const auto i64 = tg::TensorOptions().dtype(tg::kInt64).device(tg::kCUDA);
    tg::Tensor order = tg::randperm(rows, i64);
    auto epoch = [&] {
      for (int64_t s = 0; s < steps; ++s) {
        tg::Tensor idx = order.slice(0, s * batch, std::min(rows, (s + 1) * batch));
        auto [xb, yb] = tg::data::gather_rows<2>({feat, y}, idx);
        opt.zero_grad();
        auto loss = tg::nn::functional::mse_loss(net(xb), yb);
        loss.backward();
        opt.step();
      }
    };
    epoch();  // eager warm-up epoch on the capture stream
    tg::cuda::Graph graph;
    double c0 = tg::bench::now_s();
    graph.capture(epoch);
    const double capture_ms = (tg::bench::now_s() - c0) * 1e3;
    if (const char* dir = std::getenv("TG_GRAPH_DOT_DIR")) graph.debug_dot(std::string(dir) + "/regression_epoch.dot");
    std::vector<double> t;
    for (int r = 0; r < o.warmup + 10; ++r) {
      side.synchronize();
      double t0 = tg::bench::now_s();
      order.copy_(tg::randperm(rows, i64));
      graph.replay();
      side.synchronize();
      if (r >= o.warmup) t.push_back((tg::bench::now_s() - t0) * 1e3);
    }
    double ms = tg::bench::median(t);
    emit("regression_epoch_graph", ms, "ms", ms,
         "\"steps\": 245, \"graph_nodes\": " + std::to_string(graph.num_nodes()) +
             ", \"capture_ms\": " + std::to_string(capture_ms));
  }
  return 0;
}
