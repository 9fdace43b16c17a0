// ResNet-18 (examples/resnet.h: torchvision's layout and state_dict names) on the CPU or CUDA.
//
// Training on synthetic data: N steps of SGD with momentum on random batches (randn images,
// random labels), optionally under autocast (fp16 with a GradScaler, or bf16), with a progress
// bar and a metrics log:
//   resnet --synthetic 200 --batch 256 --amp fp16 --metrics run.jsonl --save r18.safetensors
//
// Weights from torchvision (save `torchvision.models.resnet18(num_classes=10).state_dict()` with
// safetensors.torch.save_file) load with --load; --num-classes must match the file's fc.
//
// Parity mode (tests/parity/resnet_parity.py): --input FILE is one batch (safetensors "x" float32
// [N, 3, H, W] and "y" int64 [N]; or x as .npy with --labels y.npy). The program writes to
// --logits FILE the eval-mode logits ("eval"), the train-mode logits of the first step ("train")
// and each step's loss ("loss"), takes --steps SGD steps on the batch (lr, momentum,
// weight_decay as given) and writes the state_dict (parameters and running stats) to --save.
// Float32 with TF32 off.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli.h"
#include "resnet.h"

namespace {

namespace F = tg::nn::functional;

struct Options {
  std::string device;
  int64_t num_classes = 10;
  std::string load, save, metrics;
  int64_t synthetic = 0;  // steps of synthetic training
  int64_t batch = 128;
  int64_t image_size = 32;
  double lr = 0.1, momentum = 0.9, weight_decay = 5e-4;
  std::string amp = "none";  // none | fp16 | bf16
  uint64_t seed = 0;
  bool progress = true, quiet = false;
  // parity mode
  std::string input, labels, logits;
  int64_t steps = 1;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void say(const Options& o, const std::string& s) {
  if (o.quiet) return;
  std::printf("%s\n", s.c_str());
  std::fflush(stdout);
}

int64_t count_parameters(const tg::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

// The batch of parity mode: x float32 [N, 3, H, W], y int64 [N].
std::pair<tg::Tensor, tg::Tensor> load_batch(const Options& o, tg::Device dev) {
  tg::Tensor x, y;
  if (ends_with(o.input, ".npy")) {
    TG_CHECK(!o.labels.empty(), "resnet: --input ", o.input, " is .npy: give the labels with --labels y.npy");
    x = tg::load_npy(o.input);
    y = tg::load_npy(o.labels);
  } else {
    const tg::nn::StateDict d = tg::load(o.input);
    TG_CHECK(d.contains("x"), "resnet: --input ", o.input, " has no tensor 'x'");
    x = d.at("x");
    if (!o.labels.empty())
      y = tg::load_npy(o.labels);
    else {
      TG_CHECK(d.contains("y"), "resnet: --input ", o.input, " has no tensor 'y' (or give --labels y.npy)");
      y = d.at("y");
    }
  }
  TG_CHECK(x.dim() == 4 && x.size(1) == 3 && tg::is_floating(x.dtype()),
           "resnet: the input batch must be floating [N, 3, H, W], got ", x.dtype(), " ", x.sizes());
  TG_CHECK(y.dim() == 1 && tg::is_integral(y.dtype()) && y.size(0) == x.size(0),
           "resnet: the labels must be an integer [N] with N = ", x.size(0), ", got ", y.dtype(), " ", y.sizes());
  return {x.to(dev, tg::kFloat32).contiguous(), y.to(dev, tg::kInt64).contiguous()};
}

int parity(const Options& o, resnet::ResNet18& model, tg::Device dev) {
  tg::set_allow_tf32(false);
  // TODO(issue 17, cuDNN): also switch cuDNN's TF32 off here once the cuDNN conv path has its switch.
  auto [x, y] = load_batch(o, dev);
  tg::optim::SGD opt(model.parameters(), {.lr = o.lr, .momentum = o.momentum, .weight_decay = o.weight_decay});
  tg::nn::StateDict out;
  model.eval();
  {
    tg::NoGradGuard no_grad;
    out.insert("eval", model(x).contiguous());
  }
  model.train();
  std::vector<double> losses;
  for (int64_t s = 0; s < o.steps; ++s) {
    opt.zero_grad();
    tg::Tensor logits = model(x);
    tg::Tensor loss = F::cross_entropy(logits, y);
    loss.backward();
    opt.step();
    if (s == 0) out.insert("train", logits.detach().contiguous());
    losses.push_back(loss.item<double>());
    char buf[96];
    std::snprintf(buf, sizeof buf, "step %lld loss %.9g", static_cast<long long>(s), losses.back());
    say(o, buf);
  }
  out.insert("loss", tg::tensor(losses));
  if (!o.logits.empty()) tg::save(out, o.logits);
  if (!o.save.empty()) tg::save(model.state_dict(), o.save);
  return 0;
}

int train_synthetic(const Options& o, resnet::ResNet18& model, tg::Device dev) {
  std::optional<tg::DType> low;
  if (o.amp == "fp16") low = tg::kFloat16;
  if (o.amp == "bf16") low = tg::kBFloat16;
  tg::optim::SGD opt(model.parameters(), {.lr = o.lr, .momentum = o.momentum, .weight_decay = o.weight_decay});
  tg::amp::GradScaler scaler({.enabled = o.amp == "fp16"});
  // TODO(issue 17, channels_last): model.to(tg::MemoryFormat::ChannelsLast) and
  // x.contiguous(tg::MemoryFormat::ChannelsLast) behind a --channels-last flag once merged.
  std::optional<tg::data::MetricsLog> metrics;
  if (!o.metrics.empty()) metrics.emplace(o.metrics);
  const bool show = o.progress && !o.quiet;
  std::ostringstream sink;
  tg::data::ProgressBar bar(o.synthetic, {.num_epochs = 1, .out = show ? nullptr : &sink, .batch_size = o.batch});
  bar.start_epoch(0);
  double last = 0;
  tg::Tensor total = tg::zeros({}, dev);  // the losses summed on the device (no sync per step)
  for (int64_t s = 0; s < o.synthetic; ++s) {
    tg::Tensor x = tg::randn({o.batch, 3, o.image_size, o.image_size}, dev);
    tg::Tensor y =
        (tg::rand({o.batch}, dev) * static_cast<double>(o.num_classes)).to(tg::kInt64).clamp(0, o.num_classes - 1);
    opt.zero_grad();
    tg::Tensor loss;
    {
      tg::amp::autocast guard(dev.type(), low, low.has_value());
      loss = F::cross_entropy(model(x), y);
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    total.add_(loss.detach());
    if (show || metrics) {
      last = loss.item<double>();
      bar.update(last, 1, o.batch);
    } else {
      bar.update(std::nullopt, 1, o.batch);
    }
    if (metrics) metrics->log(s, 0, {{"train_loss", last}, {"lr", o.lr}, {"samples_per_s", bar.samples_rate()}});
  }
  const double mean_loss = total.item<double>() / static_cast<double>(std::max<int64_t>(o.synthetic, 1));
  const double samples_s = bar.samples_rate();
  if (show) bar.finish();
  char buf[192];
  std::snprintf(buf, sizeof buf, "resnet18: %lld steps of batch %lld (%s, amp %s): mean loss %.4f, %.0f samples/s",
                static_cast<long long>(o.synthetic), static_cast<long long>(o.batch), dev.str().c_str(), o.amp.c_str(),
                mean_loss, samples_s);
  say(o, buf);
  if (!o.save.empty()) {
    tg::save(model.state_dict(), o.save);
    say(o, "saved " + o.save);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  examples::App app{"ResNet-18 (torchvision's layout and names): synthetic training or a parity step", "resnet"};
  bool no_progress = false;
  examples::add_device_option(app, o.device);
  app.add_option("--num-classes", o.num_classes, "classes (fc outputs)")->check(examples::kPositive);
  app.add_option("--load", o.load, "initial weights (safetensors, torchvision's state_dict names)");
  app.add_option("--save", o.save, "write the state_dict here at the end (safetensors)");
  auto* syn = app.add_option("--synthetic", o.synthetic, "train this many steps on random batches")
                  ->check(examples::kNonNegative);
  app.add_option("--batch", o.batch, "batch size (synthetic training)")->check(examples::kPositive);
  app.add_option("--image-size", o.image_size, "image height and width (synthetic training; >= 32)")
      ->check(CLI::Range(int64_t{32}, int64_t{4096}));
  app.add_option("--lr", o.lr, "SGD learning rate")->check(examples::kPositive);
  app.add_option("--momentum", o.momentum, "SGD momentum")->check(examples::kNonNegative);
  app.add_option("--weight-decay", o.weight_decay, "SGD weight decay")->check(examples::kNonNegative);
  app.add_option("--amp", o.amp, "autocast: none, fp16 (with a GradScaler; CUDA) or bf16")
      ->check(CLI::IsMember({"none", "fp16", "bf16"}));
  app.add_option("--seed", o.seed, "seed (initial weights, synthetic batches)");
  app.add_option("--metrics", o.metrics, "metrics log, one record per step (.jsonl or .csv; must not exist)");
  auto* in = app.add_option("--input", o.input, "parity mode: one batch (safetensors x, y; or x .npy)")->excludes(syn);
  app.add_option("--labels", o.labels, "parity mode: labels .npy (int64 [N])")->needs(in);
  app.add_option("--logits", o.logits, "parity mode: write eval / train logits and losses here (safetensors)")
      ->needs(in);
  app.add_option("--steps", o.steps, "parity mode: SGD steps on the batch")->check(examples::kPositive)->needs(in);
  app.add_flag("--no-progress", no_progress, "no progress bar");
  app.add_flag("--quiet", o.quiet, "no output but errors");
  app.footer("Either --synthetic N (training) or --input FILE (parity mode).");
  if (int rc = examples::parse(app, argc, argv); rc >= 0) return rc;
  if (o.synthetic == 0 && o.input.empty()) return examples::usage_error(app, "give --synthetic N or --input FILE");
  if (!o.metrics.empty() && std::filesystem::exists(o.metrics))
    return examples::usage_error(app, "--metrics " + o.metrics + " exists (remove it or name another file)");
  o.progress = !no_progress;
  const auto dev = examples::pick_device(app, o.device);
  if (!dev) return 2;
  if (o.amp == "fp16" && !dev->is_cuda()) return examples::usage_error(app, "--amp fp16 needs --device cuda");
  try {
    tg::manual_seed(o.seed);
    resnet::ResNet18 model(o.num_classes);
    if (!o.load.empty()) model.load_state_dict(tg::load(o.load));
    model.to(*dev);
    char buf[160];
    std::snprintf(buf, sizeof buf, "resnet18: %lld classes, %lld parameters, on %s",
                  static_cast<long long>(o.num_classes), static_cast<long long>(count_parameters(model)),
                  dev->str().c_str());
    say(o, buf);
    return o.input.empty() ? train_synthetic(o, model, *dev) : parity(o, model, *dev);
  } catch (const tg::Error& e) {
    const std::string msg = e.what();
    std::fprintf(stderr, "%s%s\n", msg.rfind("resnet", 0) == 0 ? "" : "resnet: ", msg.c_str());
    return 1;
  }
}
