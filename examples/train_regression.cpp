// The seed's "preprocess on the GPU, then train" program: 1M x 64 uniform
// features standardized on the device, a TensorDataset + shuffling DataLoader,
// Sequential(Linear(64, 1)) trained with Adam on the MSE, the loss printed per
// epoch, then a safetensors checkpoint.
//
//   train_regression [--device cpu|cuda | --cpu] [--rows N] [--epochs N] [--batch N] [--lr X]
//                    [--planted] [--out net.safetensors] [--cuda-graph]
//
// Without --device (or --cpu, its old spelling for cpu) it trains on CUDA when a device is usable
// and says so when it falls back to the CPU.
//
// --planted makes y a noisy linear function of the features (so the loss falls
// to ~0.01) instead of the seed's independent randn (loss stays near 1).
//
// --cuda-graph captures a whole epoch into one tg::cuda::Graph. Epoch 0 runs eagerly
// on a side stream (the warm-up: cached memory, cuBLAS, Adam's state), then the epoch
// is captured once and every later epoch is one replay. The shuffled order differs per
// epoch, so it lives in a device tensor `order` that the graph reads: before each
// replay, order.copy_(randperm(rows)) writes the new epoch's order, and the captured
// batches gather rows by slices of it. Capturing the epoch instead of one step takes
// the host out of the loop entirely (one launch per epoch instead of a gather, two
// copies and a launch per step), which is what a 245-step epoch of a 64 -> 1 model,
// a few microseconds of GPU work per step, needs.
//
// Parity mode (tests/parity/parity.py): --init FILE loads the initial weights
// ("0.weight", "0.bias"), --data FILE the features and targets ("x", "y"), and
// --order FILE the batch order ("order", int64 [steps, batch]); the program then
// trains one step per row of "order" and prints "step i loss L" for each.
#include <tapegrad/tapegrad.h>

#include <tapegrad/optim/adam.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "cli.h"

namespace {

struct Args {
  bool cpu = false;
  std::string device;
  int64_t rows = 1'000'000;
  int64_t epochs = 5;
  int64_t batch = 4096;
  double lr = 1e-3;
  bool planted = false;
  std::string out = "net.safetensors";
  std::string init, data, order;
  bool cuda_graph = false;
};

void sync(tg::Device d) {
  if (d.is_cuda()) tg::cuda::synchronize();
}

// Parity mode: fixed weights, data and batch order; one line per step.
int run_parity(const Args& a, tg::Device dev) {
  tg::nn::Sequential net(tg::nn::Linear(64, 1));
  net.load_state_dict(tg::load(a.init));
  net.to(dev);
  auto data = tg::load(a.data, dev);
  tg::Tensor x = data["x"], y = data["y"];
  tg::Tensor order = tg::load(a.order, dev)["order"];
  tg::optim::Adam opt(net.parameters(), {.lr = a.lr});
  for (int64_t s = 0; s < order.size(0); ++s) {
    tg::Tensor idx = order.select(0, s);
    tg::Tensor xb = x.index_select(0, idx), yb = y.index_select(0, idx);
    opt.zero_grad();
    auto loss = tg::nn::functional::mse_loss(net(xb), yb);
    loss.backward();
    opt.step();
    std::printf("step %lld loss %.9g\n", static_cast<long long>(s), loss.item<double>());
  }
  tg::save(net.state_dict(), a.out);
  return 0;
}

// --cuda-graph: epoch 0 eager, then one captured epoch replayed per epoch (see the top).
void train_graphed(const Args& a, tg::Device dev, const tg::Tensor& feat, const tg::Tensor& y, tg::nn::Sequential& net,
                   tg::optim::Adam& opt, int64_t steps) {
  tg::cuda::Stream side;  // capture needs a stream other than the legacy default
  tg::cuda::StreamGuard side_guard(side);
  tg::Tensor order = tg::empty({a.rows}, tg::TensorOptions().dtype(tg::kInt64).device(dev));
  tg::Tensor total = tg::zeros({}, dev);  // the epoch's summed loss, on the device
  auto epoch_body = [&] {
    total.zero_();
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t start = s * a.batch, end = std::min(a.rows, start + a.batch);
      tg::Tensor idx = order.slice(0, start, end);
      auto [xb, yb] = tg::data::gather_rows<2>({feat, y}, idx);
      opt.zero_grad();
      auto loss = tg::nn::functional::mse_loss(net(xb), yb);
      loss.backward();
      opt.step();
      total.add_(loss.detach());
    }
  };
  tg::cuda::Graph graph;
  for (int64_t epoch = 0; epoch < a.epochs; ++epoch) {
    if (epoch == 1) {
      auto c0 = std::chrono::steady_clock::now();
      graph.capture(epoch_body);  // records the epoch; nothing runs until replay()
      double cms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c0).count();
      std::printf("captured one epoch: %zu graph nodes in %.1f ms\n", graph.num_nodes(), cms);
    }
    side.synchronize();
    auto t0 = std::chrono::steady_clock::now();
    order.copy_(tg::randperm(a.rows, tg::TensorOptions().dtype(tg::kInt64).device(dev)));  // this epoch's shuffle
    if (graph.is_captured())
      graph.replay();
    else
      epoch_body();
    side.synchronize();
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    double mean = total.item<double>() / static_cast<double>(std::max<int64_t>(steps, 1));
    std::printf("epoch %lld  loss %.6f  %.1f ms%s\n", static_cast<long long>(epoch), mean, ms,
                graph.is_captured() ? " (graph replay)" : "");
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  examples::App app{"Standardize features, then train Linear(64, 1) on the MSE with Adam", "train_regression"};
  examples::add_device_option(app, a.device);
  app.add_flag("--cpu", a.cpu, "train on the CPU (the same as --device cpu)");
  app.add_option("--rows", a.rows, "rows of 64 features")->check(examples::kPositive);
  app.add_option("--epochs", a.epochs, "epochs")->check(examples::kNonNegative);
  app.add_option("--batch", a.batch, "batch size")->check(examples::kPositive);
  app.add_option("--lr", a.lr, "Adam learning rate")->check(examples::kPositive);
  app.add_flag("--planted", a.planted, "targets a noisy linear function of the features (else randn)");
  app.add_option("--out", a.out, "checkpoint (safetensors)");
  app.add_option("--init", a.init, "parity mode: initial weights (safetensors '0.weight', '0.bias')");
  app.add_option("--data", a.data, "parity mode: features and targets (safetensors 'x', 'y')");
  app.add_option("--order", a.order, "parity mode: batch order (safetensors 'order', int64 [steps, batch])");
  app.add_flag("--cuda-graph", a.cuda_graph, "capture an epoch into a CUDA graph and replay it");
  if (int rc = examples::parse(app, argc, argv); rc >= 0) return rc;
  if (a.cpu && !a.device.empty() && a.device != "cpu")
    return examples::usage_error(app, "--cpu and --device " + a.device);
  if (a.cpu) a.device = "cpu";
  if (a.cuda_graph && a.device == "cpu") return examples::usage_error(app, "--cuda-graph needs the GPU");
  if (a.cuda_graph && !a.init.empty()) return examples::usage_error(app, "--cuda-graph is not for parity mode");
  if (!a.init.empty() && (a.data.empty() || a.order.empty()))
    return examples::usage_error(app, "--init needs --data and --order too");
  const auto picked = examples::pick_device(app, a.device);
  if (!picked) return 2;
  const tg::Device dev = *picked;
  if (a.device.empty() && dev.is_cpu())
    std::fprintf(stderr, "no CUDA device; running on the CPU (pass --device cpu to say so)\n");
  try {
    if (!a.init.empty()) return run_parity(a, dev);

    tg::manual_seed(0);
    auto raw = tg::rand({a.rows, 64}, dev);
    auto feat = ((raw - raw.mean(0)) / raw.std(0)).contiguous();
    tg::Tensor y;
    if (a.planted) {
      auto w = tg::randn({64, 1}, dev) / 8.0;
      y = (tg::matmul(feat, w) + 0.5 + tg::randn({a.rows, 1}, dev) * 0.1).contiguous();
    } else {
      y = tg::randn({a.rows, 1}, dev);
    }

    tg::data::TensorDataset ds(feat, y);
    tg::data::DataLoader loader(ds, {.batch_size = a.batch, .shuffle = true});
    tg::nn::Sequential net(tg::nn::Linear(64, 1));
    net.to(dev);
    tg::optim::Adam opt(net.parameters(), {.lr = a.lr});
    std::printf("train_regression: %lld x 64 on %s, batch %lld, %zu steps/epoch\n", static_cast<long long>(a.rows),
                dev.str().c_str(), static_cast<long long>(a.batch), loader.size());

    if (a.cuda_graph && dev.is_cuda()) {
      train_graphed(a, dev, feat, y, net, opt, static_cast<int64_t>(loader.size()));
      tg::save(net.state_dict(), a.out, {{"producer", "tapegrad train_regression"}});
      std::printf("saved %s\n", a.out.c_str());
      return 0;
    }
    for (int64_t epoch = 0; epoch < a.epochs; ++epoch) {
      sync(dev);
      auto t0 = std::chrono::steady_clock::now();
      tg::Tensor total = tg::zeros({}, dev);  // summed on the device: no host sync per step
      for (auto [xb, yb] : loader) {
        opt.zero_grad();
        auto loss = tg::nn::functional::mse_loss(net(xb), yb);
        loss.backward();
        opt.step();
        total.add_(loss.detach());
      }
      sync(dev);
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      double mean = total.item<double>() / static_cast<double>(std::max<size_t>(loader.size(), 1));
      std::printf("epoch %lld  loss %.6f  %.1f ms\n", static_cast<long long>(epoch), mean, ms);
    }
    tg::save(net.state_dict(), a.out, {{"producer", "tapegrad train_regression"}});
    std::printf("saved %s\n", a.out.c_str());
  } catch (const tg::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
