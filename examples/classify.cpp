// An MLP classifier trained from standard files: features and labels from IDX (the MNIST
// format) or .npy, a train/test split, Linear-ReLU-Linear trained with cross_entropy and Adam,
// a progress bar, train loss and test accuracy per epoch, a safetensors checkpoint; CPU or CUDA.
// The logic is in classify.h (tests call it).
//
//   classify --x train-images-idx3-ubyte --y train-labels-idx1-ubyte
//            --test-x t10k-images-idx3-ubyte --test-y t10k-labels-idx1-ubyte --device cuda
//   classify --x X.npy --y y.npy --test-size 0.2 --hidden 128 --epochs 30 --batch 64 --lr 1e-2
//
// Parity mode (tests/parity/classify_parity.py): --init FILE loads the initial weights, --order
// FILE (safetensors "order", int64 [steps, batch]) fixes the batches; one "step i loss L" line each.
//
// Options are parsed with CLI11 when its header is installed (Debian's libcli11-dev, in
// scripts/lib.sh); otherwise with the small parser below, which accepts the same options, so the
// example builds on a machine without it (the GPU machine).
#include "classify.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#if __has_include(<CLI/CLI.hpp>) && !defined(TG_CLASSIFY_NO_CLI11)  // the define forces the fallback
#include <CLI/CLI.hpp>
#define TG_CLASSIFY_CLI11 1
#endif

namespace {

constexpr const char* kUsage =
    "usage: classify --x FILE --y FILE [--test-x FILE --test-y FILE | --test-size F] [--scale S]\n"
    "                [--hidden N] [--epochs N] [--batch N] [--lr X] [--seed N] [--device cpu|cuda]\n"
    "                [--out FILE] [--init FILE] [--order FILE] [--no-progress] [--quiet]\n"
    "FILE: .npy by name, IDX otherwise. --test-size: < 1 a fraction, >= 1 a row count (the last rows).\n";

#ifdef TG_CLASSIFY_CLI11
int parse(int argc, char** argv, classify::Options& o) {
  CLI::App app{"An MLP classifier trained from IDX or .npy files"};
  double scale = 0;
  bool no_progress = false;
  app.add_option("--x", o.x, "features (.npy or IDX)")->required();
  app.add_option("--y", o.y, "labels (.npy or IDX)")->required();
  app.add_option("--test-x", o.test_x, "test features");
  app.add_option("--test-y", o.test_y, "test labels");
  app.add_option("--test-size", o.test_size, "test rows: < 1 a fraction, >= 1 a count (the last rows)");
  auto* scale_opt = app.add_option("--scale", scale, "feature scale (default 1/255 for uint8, else 1)");
  app.add_option("--hidden", o.hidden, "hidden units");
  app.add_option("--epochs", o.epochs, "epochs");
  app.add_option("--batch", o.batch, "batch size");
  app.add_option("--lr", o.lr, "Adam learning rate");
  app.add_option("--seed", o.seed, "seed (weights and shuffle)");
  app.add_option("--device", o.device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--out", o.out, "checkpoint (safetensors)");
  app.add_option("--init", o.init, "initial weights (safetensors)");
  app.add_option("--order", o.order, "batch order (safetensors 'order'): parity mode");
  app.add_flag("--no-progress", no_progress, "no progress bar");
  app.add_flag("--quiet", o.quiet, "no output but errors");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (scale_opt->count() > 0) o.scale = scale;
  o.progress = !no_progress;
  return -1;
}
#else
// The fallback: "--name value" and "--name=value", the same options as above.
int parse(int argc, char** argv, classify::Options& o) {
  auto fail = [](const std::string& msg) {
    std::fprintf(stderr, "classify: %s\n%s", msg.c_str(), kUsage);
    return 2;
  };
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i], v;
    if (k == "--help" || k == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
    if (k == "--no-progress") {
      o.progress = false;
      continue;
    }
    if (k == "--quiet") {
      o.quiet = true;
      continue;
    }
    const size_t eq = k.find('=');
    if (eq != std::string::npos) {
      v = k.substr(eq + 1);
      k = k.substr(0, eq);
    } else {
      if (i + 1 >= argc) return fail(k + " needs a value");
      v = argv[++i];
    }
    try {
      size_t used = 0;
      auto num = [&](auto conv) {
        auto r = conv(v, &used);
        if (used != v.size()) throw std::invalid_argument(v);
        return r;
      };
      auto to_d = [](const std::string& s, size_t* u) { return std::stod(s, u); };
      auto to_i = [](const std::string& s, size_t* u) { return static_cast<int64_t>(std::stoll(s, u)); };
      if (k == "--x") o.x = v;
      else if (k == "--y") o.y = v;
      else if (k == "--test-x") o.test_x = v;
      else if (k == "--test-y") o.test_y = v;
      else if (k == "--test-size") o.test_size = num(to_d);
      else if (k == "--scale") o.scale = num(to_d);
      else if (k == "--hidden") o.hidden = num(to_i);
      else if (k == "--epochs") o.epochs = num(to_i);
      else if (k == "--batch") o.batch = num(to_i);
      else if (k == "--lr") o.lr = num(to_d);
      else if (k == "--seed") o.seed = static_cast<uint64_t>(num(to_i));
      else if (k == "--device") o.device = v;
      else if (k == "--out") o.out = v;
      else if (k == "--init") o.init = v;
      else if (k == "--order") o.order = v;
      else return fail("unknown option " + k);
    } catch (const std::exception&) {
      return fail("bad value '" + v + "' for " + k);
    }
  }
  if (o.x.empty() || o.y.empty()) return fail("--x and --y are required");
  if (o.device != "cpu" && o.device != "cuda") return fail("--device must be cpu or cuda");
  return -1;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  classify::Options o;
  o.out = "classify.safetensors";
  if (int rc = parse(argc, argv, o); rc >= 0) return rc;
  if (o.test_x.empty() != o.test_y.empty()) {
    std::fprintf(stderr, "classify: --test-x and --test-y go together\n%s", kUsage);
    return 2;
  }
  try {
    classify::train(o, [](const std::string& line) { std::printf("%s\n", line.c_str()); std::fflush(stdout); });
  } catch (const tg::Error& e) {
    std::fprintf(stderr, "classify: %s\n", e.what());
    return 1;
  }
  return 0;
}
