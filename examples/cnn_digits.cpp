// A small CNN on 8x8 digit images (scikit-learn's digits, written by tests/parity/digits.py as
// X.npy / y.npy or IDX; or classify's synthetic digits): the 64 features of a row as a 1x8x8
// image, two conv3x3-batchnorm-relu-maxpool2 stages (1 -> 32 -> 64 channels, 8x8 -> 4x4 -> 2x2),
// then Linear(256, 10). Adam with cross_entropy, a progress bar, train loss and test accuracy per
// epoch (and into --metrics), a safetensors checkpoint with torch.nn.Sequential's names.
//
//   python3 tests/parity/digits.py --out /tmp/digits
//   cnn_digits --x /tmp/digits/X.npy --y /tmp/digits/y.npy --test-size 297 --device cuda
//   cnn_digits --synthetic 3000 --epochs 3 --min-acc 0.9          # no files
//
// --min-acc A: exit 1 when the final test accuracy is below A (scripts/gpu-check uses 0.98).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>

#include "classify.h"
#include "cli.h"

namespace {

// Sequential names: 0 conv, 1 bn, 2 relu, 3 pool, 4 conv, 5 bn, 6 relu, 7 pool, 8 flatten, 9 fc.
tg::nn::Sequential make_cnn(int64_t classes) {
  using namespace tg::nn;
  return Sequential(Conv2d(1, 32, 3, Conv2dOptions{.padding = 1}), BatchNorm2d(32), ReLU(), MaxPool2d(2),
                    Conv2d(32, 64, 3, Conv2dOptions{.padding = 1}), BatchNorm2d(64), ReLU(), MaxPool2d(2), Flatten(),
                    Linear(64 * 2 * 2, classes));
}

// Rows of 64 features as [N, 1, 8, 8] images.
tg::Tensor as_images(const tg::Tensor& x) {
  TG_CHECK(x.dim() == 2 && x.size(1) == 64, "cnn_digits: expected 64 features per row (8x8 images), got ", x.sizes());
  return x.reshape({x.size(0), 1, 8, 8}).contiguous();
}

}  // namespace

int main(int argc, char** argv) {
  classify::Options o;
  o.epochs = 15;
  o.batch = 64;
  o.lr = 3e-3;
  double min_acc = 0;
  bool no_progress = false;
  examples::App app{"A small CNN on 8x8 digit images (.npy / IDX files, or synthetic digits)", "cnn_digits"};
  auto* x_opt = app.add_option("--x", o.x, "features (.npy or IDX; 64 per row)");
  auto* y_opt = app.add_option("--y", o.y, "labels (.npy or IDX)");
  app.add_option("--synthetic", o.synthetic, "no files: this many rows of synthetic 8x8 digits")
      ->check(examples::kPositive)
      ->default_str("")
      ->excludes(x_opt)
      ->excludes(y_opt);
  app.add_option("--test-size", o.test_size, "test rows: < 1 a fraction, >= 1 a count (the last rows)")
      ->check(examples::kNonNegative);
  double scale = 0;
  auto* scale_opt =
      app.add_option("--scale", scale, "feature scale (default 1/255 for uint8, else 1)")->default_str("");
  app.add_option("--epochs", o.epochs, "epochs")->check(examples::kNonNegative);
  app.add_option("--batch", o.batch, "batch size")->check(examples::kPositive);
  app.add_option("--lr", o.lr, "Adam learning rate")->check(examples::kPositive);
  app.add_option("--seed", o.seed, "seed (weights, shuffle, synthetic data)");
  examples::add_device_option(app, o.device);
  app.add_option("--out", o.out, "checkpoint (safetensors; empty: none)");
  app.add_option("--metrics", o.metrics, "metrics log, one record per epoch (.jsonl or .csv; must not exist)");
  app.add_option("--min-acc", min_acc, "exit 1 when the final test accuracy is below this")
      ->check(CLI::Range(0.0, 1.0));
  app.add_flag("--no-progress", no_progress, "no progress bar");
  app.add_flag("--quiet", o.quiet, "no output but errors");
  app.footer("FILE: .npy by name, IDX otherwise. Either --x and --y, or --synthetic N.");
  if (int rc = examples::parse(app, argc, argv); rc >= 0) return rc;
  if (o.synthetic == 0 && (o.x.empty() || o.y.empty()))
    return examples::usage_error(app, "--x and --y are required (or --synthetic N)");
  if (!o.metrics.empty() && std::filesystem::exists(o.metrics))
    return examples::usage_error(app, "--metrics " + o.metrics + " exists (remove it or name another file)");
  if (scale_opt->count() > 0) o.scale = scale;
  const auto dev = examples::pick_device(app, o.device);
  if (!dev) return 2;
  auto say = [&](const std::string& s) {
    if (o.quiet) return;
    std::printf("%s\n", s.c_str());
    std::fflush(stdout);
  };
  try {
    auto [train_set, test_set] = classify::load_split(o);
    const tg::Tensor xtr = as_images(train_set.x).to(*dev), ytr = train_set.y.to(*dev);
    const tg::Tensor xte = as_images(test_set.x).to(*dev), yte = test_set.y.to(*dev);
    TG_CHECK(xtr.size(0) > 0, "cnn_digits: no training rows");
    TG_CHECK(ytr.min().item<int64_t>() >= 0, "cnn_digits: labels must be >= 0");
    int64_t classes = ytr.max().item<int64_t>() + 1;
    if (yte.numel() > 0) classes = std::max(classes, yte.max().item<int64_t>() + 1);

    tg::manual_seed(o.seed);
    tg::nn::Sequential net = make_cnn(classes);
    net.to(*dev);
    tg::optim::Adam opt(net.parameters(), {.lr = o.lr});
    char buf[256];
    std::snprintf(buf, sizeof buf, "cnn_digits: %lld train / %lld test images 1x8x8, %lld classes, on %s",
                  static_cast<long long>(xtr.size(0)), static_cast<long long>(xte.size(0)),
                  static_cast<long long>(classes), dev->str().c_str());
    say(buf);

    // Test accuracy in eval mode (batch norm with its running statistics).
    auto accuracy = [&]() -> double {
      if (xte.size(0) == 0) return std::nan("");
      tg::NoGradGuard no_grad;
      net.eval();
      const double acc = static_cast<double>((tg::argmax(net(xte), 1) == yte).sum().item<int64_t>()) /
                         static_cast<double>(xte.size(0));
      net.train();
      return acc;
    };

    tg::data::TensorDataset ds(xtr, ytr);
    // drop_last: a last batch of one row would give batch norm a single value per channel.
    tg::data::DataLoader loader(ds, {.batch_size = o.batch, .shuffle = true, .drop_last = true, .seed = o.seed});
    std::optional<tg::data::MetricsLog> metrics;
    if (!o.metrics.empty()) metrics.emplace(o.metrics);
    const bool show = !no_progress && !o.quiet;
    std::ostringstream sink;
    tg::data::ProgressBar bar(static_cast<int64_t>(loader.size()),
                              {.num_epochs = o.epochs, .out = show ? nullptr : &sink, .batch_size = o.batch});
    double acc = accuracy();
    int64_t step = 0;
    for (int64_t e = 0; e < o.epochs; ++e) {
      bar.start_epoch(e);
      tg::Tensor total = tg::zeros({}, *dev);
      for (auto [xb, yb] : loader) {
        opt.zero_grad();
        tg::Tensor loss = tg::nn::functional::cross_entropy(net(xb), yb);
        loss.backward();
        opt.step();
        ++step;
        total.add_(loss.detach());
        if (show)
          bar.update(loss.item<double>(), 1, xb.size(0));
        else
          bar.update(std::nullopt, 1, xb.size(0));
      }
      const double train_loss = total.item<double>() / static_cast<double>(std::max<size_t>(loader.size(), 1));
      const double it_s = bar.rate(), samples_s = bar.samples_rate();
      if (show) bar.finish();
      acc = accuracy();
      if (metrics)
        metrics->log(step, e,
                     {{"train_loss", train_loss}, {"test_accuracy", acc}, {"lr", o.lr}, {"samples_per_s", samples_s}});
      std::snprintf(buf, sizeof buf, "epoch %lld/%lld train_loss %.6f test_acc %.4f (%.1f it/s, %.0f samples/s)",
                    static_cast<long long>(e + 1), static_cast<long long>(o.epochs), train_loss, acc, it_s, samples_s);
      say(buf);
    }
    if (!o.out.empty()) {
      tg::save(net.state_dict(), o.out);
      say("saved " + o.out);
    }
    if (min_acc > 0 && !(acc >= min_acc)) {
      std::fprintf(stderr, "cnn_digits: test accuracy %.4f < --min-acc %.4f\n", acc, min_acc);
      return 1;
    }
  } catch (const tg::Error& e) {
    std::fprintf(stderr, "cnn_digits: %s\n", e.what());
    return 1;
  }
  return 0;
}
