// An MLP classifier trained from standard files: features and labels from IDX (the MNIST
// format) or .npy, a train/test split, Linear-ReLU-Linear trained with cross_entropy and Adam,
// a progress bar, train loss and test accuracy per epoch, a safetensors checkpoint; CPU or CUDA.
// The logic is in classify.h (tests call it).
//
//   classify --x train-images-idx3-ubyte --y train-labels-idx1-ubyte
//            --test-x t10k-images-idx3-ubyte --test-y t10k-labels-idx1-ubyte --device cuda
//   classify --x X.npy --y y.npy --test-size 0.2 --hidden 128 --epochs 30 --batch 64 --lr 1e-2
//   classify --synthetic 12000 --epochs 8 --metrics run.jsonl   # no files: digits-like data
//
// --accum-steps K runs each batch as K micro-batches (gradient accumulation: the same step, a
// K-th of the activations); --metrics FILE logs one record per epoch (JSON lines or CSV, by name;
// scripts/plot_metrics.py draws it).
//
// Parity mode (tests/parity/classify_parity.py): --init FILE loads the initial weights, --order
// FILE (safetensors "order", int64 [steps, batch]) fixes the batches; one "step i loss L" line each.
#include "classify.h"

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "cli.h"

int main(int argc, char** argv) {
  classify::Options o;
  o.out = "classify.safetensors";
  examples::App app{"An MLP classifier trained from IDX or .npy files (or synthetic digits)", "classify"};
  double scale = 0;
  bool no_progress = false;
  auto* x_opt = app.add_option("--x", o.x, "features (.npy or IDX)");
  auto* y_opt = app.add_option("--y", o.y, "labels (.npy or IDX)");
  auto* syn_opt = app.add_option("--synthetic", o.synthetic, "no files: this many rows of synthetic 8x8 digits")
                      ->check(examples::kPositive)
                      ->default_str("")
                      ->excludes(x_opt)
                      ->excludes(y_opt);
  auto* tx_opt = app.add_option("--test-x", o.test_x, "test features")->excludes(syn_opt);
  app.add_option("--test-y", o.test_y, "test labels")->excludes(syn_opt);
  app.add_option("--test-size", o.test_size, "test rows: < 1 a fraction, >= 1 a count (the last rows)")
      ->check(examples::kNonNegative)
      ->excludes(tx_opt);
  auto* scale_opt =
      app.add_option("--scale", scale, "feature scale (default 1/255 for uint8, else 1)")->default_str("");
  app.add_option("--hidden", o.hidden, "hidden units")->check(examples::kPositive);
  app.add_option("--epochs", o.epochs, "epochs")->check(examples::kNonNegative);
  app.add_option("--batch", o.batch, "batch size (rows per optimizer step)")->check(examples::kPositive);
  app.add_option("--accum-steps", o.accum_steps, "micro-batches per batch (gradient accumulation; divides --batch)")
      ->check(examples::kPositive);
  app.add_option("--lr", o.lr, "Adam learning rate")->check(examples::kPositive);
  app.add_option("--seed", o.seed, "seed (weights, shuffle, synthetic data)");
  examples::add_device_option(app, o.device, "cpu or cuda (gpu: cuda)");
  app.add_option("--out", o.out, "checkpoint (safetensors; empty: none)");
  app.add_option("--metrics", o.metrics, "metrics log, one record per epoch (.jsonl or .csv; must not exist)");
  app.add_option("--init", o.init, "initial weights (safetensors)");
  app.add_option("--order", o.order, "batch order (safetensors 'order'): parity mode");
  app.add_flag("--no-progress", no_progress, "no progress bar");
  app.add_flag("--quiet", o.quiet, "no output but errors");
  app.footer("FILE: .npy by name, IDX otherwise. Either --x and --y, or --synthetic N.");
  if (int rc = examples::parse(app, argc, argv); rc >= 0) return rc;
  if (o.synthetic == 0 && (o.x.empty() || o.y.empty()))
    return examples::usage_error(app, "--x and --y are required (or --synthetic N)");
  if (o.test_x.empty() != o.test_y.empty()) return examples::usage_error(app, "--test-x and --test-y go together");
  if (o.batch % o.accum_steps != 0)
    return examples::usage_error(
        app, "--accum-steps " + std::to_string(o.accum_steps) + " does not divide --batch " + std::to_string(o.batch));
  if (!o.metrics.empty() && std::filesystem::exists(o.metrics))
    return examples::usage_error(app, "--metrics " + o.metrics + " exists (remove it or name another file)");
  if (scale_opt->count() > 0) o.scale = scale;
  o.progress = !no_progress;
  const auto dev = examples::pick_device(app, o.device);
  if (!dev) return 2;
  o.device = dev->is_cuda() ? "cuda" : "cpu";
  try {
    classify::train(o, [](const std::string& line) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    });
  } catch (const tg::Error& e) {
    std::fprintf(stderr, "classify: %s\n", e.what());
    return 1;
  }
  return 0;
}
