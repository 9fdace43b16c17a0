// The examples' command lines (examples/cli.h), run as programs: a bad value or an unknown option
// prints what was wrong and the usage on stderr and exits 2; --help prints the options and exits 0;
// --device cuda (or gpu) without a usable CUDA device exits 2 saying so; classify's --synthetic
// and --metrics run end to end and the log parses. Built by examples/CMakeLists.txt (it needs the
// example programs); TG_EXAMPLES_DIR is where they are.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.h>

namespace {

struct Proc {
  int code;
  std::string text;
};

// Runs examples/<args>; `text` is its stderr, or its stdout with `want_stdout`.
Proc run(const std::string& args, bool want_stdout = false) {
  const std::string cmd =
      std::string(TG_EXAMPLES_DIR) + "/" + args + (want_stdout ? " 2>/dev/null" : " 2>&1 >/dev/null");
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

const std::vector<std::string> kExamples = {"matmul", "matmul_grad", "standardize", "train_regression", "amp_train",
                                            "export_model", "custom_kernels", "classify",
                                            // ---- issue 17
                                            "resnet", "cnn_digits"};

bool has(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

TEST(ExampleCli, UnknownOptionIsUsageErrorExit2) {
  for (const auto& ex : kExamples) {
    const Proc r = run(ex + " --no-such-option");
    EXPECT_EQ(r.code, 2) << ex << ": " << r.text;
    EXPECT_TRUE(has(r.text, "Usage: " + ex)) << ex << ": " << r.text;
    EXPECT_TRUE(has(r.text, "--no-such-option")) << ex << ": " << r.text;
    EXPECT_TRUE(has(r.text, "--device")) << ex << ": the usage lists the options: " << r.text;
  }
}

TEST(ExampleCli, HelpExits0AndListsTheOptions) {
  for (const auto& ex : kExamples) {
    const Proc r = run(ex + " --help", true);
    EXPECT_EQ(r.code, 0) << ex;
    EXPECT_TRUE(has(r.text, "Usage: " + ex)) << ex << ": " << r.text;
    EXPECT_TRUE(has(r.text, "--device")) << ex << ": " << r.text;
  }
  // Each example keeps its flags.
  EXPECT_TRUE(has(run("train_regression --help", true).text, "--planted"));
  EXPECT_TRUE(has(run("train_regression --help", true).text, "--cuda-graph"));
  EXPECT_TRUE(has(run("amp_train --help", true).text, "--init-scale"));
  EXPECT_TRUE(has(run("matmul_grad --help", true).text, "--size"));
  EXPECT_TRUE(has(run("classify --help", true).text, "--accum-steps"));
  EXPECT_TRUE(has(run("classify --help", true).text, "--metrics"));
  EXPECT_TRUE(has(run("resnet --help", true).text, "--weight-decay"));
  EXPECT_TRUE(has(run("cnn_digits --help", true).text, "--min-acc"));
}

TEST(ExampleCli, BadValuesAreUsageErrorsExit2) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"train_regression --rows abc", "--rows"},
      {"train_regression --rows 0", "--rows"},
      {"train_regression --batch -4", "--batch"},
      {"train_regression --lr fast", "--lr"},
      {"train_regression --cpu --device cuda", "--cpu and --device cuda"},
      {"train_regression --init a.safetensors", "--init needs --data and --order"},
      {"train_regression --cpu --cuda-graph", "--cuda-graph needs the GPU"},
      {"amp_train --steps x", "--steps"},
      {"amp_train --dtype fp8 --cpu", "--dtype"},
      {"amp_train --cpu --init a", "--init, --data and --log go together"},
      {"matmul --n 12q", "--n"},
      {"matmul --reps -1", "--reps"},
      {"matmul --device tpu", "--device"},
      {"matmul_grad --size big", "--size"},
      {"standardize --rows 1e", "--rows"},
      {"custom_kernels --n 0", "--n"},
      {"export_model --device 3", "--device"},
      {"classify --synthetic 100 --accum-steps 3 --batch 64", "--accum-steps 3 does not divide --batch 64"},
      {"classify --synthetic 100 --accum-steps 0", "--accum-steps"},
      {"classify --epochs 2", "--x and --y are required"},
      {"classify --synthetic 100 --x a.npy", "--synthetic"},
      {"classify --synthetic 100 --test-size -1", "--test-size"},
      {"train_regression extra", "extra"},
      // ---- issue 17
      {"resnet --device cpu", "give --synthetic N or --input FILE"},
      {"resnet --synthetic 2 --batch 0", "--batch"},
      {"resnet --synthetic 2 --amp fp8", "--amp"},
      {"resnet --synthetic 2 --image-size 16", "--image-size"},
      {"resnet --synthetic 2 --input b.safetensors", "--synthetic"},
      {"resnet --synthetic 2 --steps 3", "--steps"},
      {"resnet --synthetic 2 --device cpu --amp fp16", "--amp fp16 needs --device cuda"},
      {"cnn_digits --epochs 2", "--x and --y are required"},
      {"cnn_digits --synthetic 100 --min-acc 2", "--min-acc"},
      {"cnn_digits --synthetic 100 --x a.npy", "--synthetic"},
  };
  for (const auto& [args, needle] : cases) {
    const Proc r = run(args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.text;
    EXPECT_TRUE(has(r.text, needle)) << args << ": wanted '" << needle << "' in: " << r.text;
    const std::string name = args.substr(0, args.find(' '));
    EXPECT_TRUE(has(r.text, "Usage: " + name)) << args << ": " << r.text;
  }
}

TEST(ExampleCli, CudaWithoutADeviceIsAnErrorNotACpuRun) {
  if (tg::cuda::is_available()) GTEST_SKIP() << "a CUDA device is usable here";
  for (const auto& ex : kExamples) {
    for (const char* name : {"cuda", "gpu"}) {
      const Proc r = run(ex + " --device " + name +
                         (ex == "classify" || ex == "cnn_digits" ? " --synthetic 100"
                          : ex == "resnet"                       ? " --synthetic 1"
                                                                 : ""));
      EXPECT_EQ(r.code, 2) << ex << " --device " << name << ": " << r.text;
      EXPECT_TRUE(has(r.text, std::string("--device ") + name + ": no usable CUDA device")) << ex << ": " << r.text;
    }
  }
  // amp_train's default device is cuda: the same error without --device.
  const Proc r = run("amp_train");
  EXPECT_EQ(r.code, 2) << r.text;
  EXPECT_TRUE(has(r.text, "no usable CUDA device")) << r.text;
}

TEST(ExampleCli, ClassifySyntheticWritesAParseableMetricsLog) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("tg_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string log = (dir / "m.jsonl").string(), ck = (dir / "ck.safetensors").string();
  const Proc r =
      run("classify --synthetic 2000 --epochs 3 --batch 32 --accum-steps 2 --hidden 32 --lr 1e-2 "
          "--device cpu --no-progress --metrics " +
              log + " --out " + ck,
          true);
  ASSERT_EQ(r.code, 0) << r.text;
  EXPECT_TRUE(has(r.text, "epoch 3/3 train_loss")) << r.text;
  std::ifstream in(log);
  std::vector<nlohmann::json> recs;
  for (std::string line; std::getline(in, line);) recs.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(recs.size(), 3u);
  for (int e = 0; e < 3; ++e) {
    EXPECT_EQ(recs[e]["epoch"].get<int>(), e);
    EXPECT_EQ(recs[e]["step"].get<int>(), 50 * (e + 1));  // 1600 training rows / 32
    EXPECT_DOUBLE_EQ(recs[e]["lr"].get<double>(), 1e-2);
    EXPECT_GT(recs[e]["samples_per_s"].get<double>(), 0.0);
    EXPECT_GE(recs[e]["test_accuracy"].get<double>(), 0.0);
  }
  EXPECT_LT(recs[2]["train_loss"].get<double>(), recs[0]["train_loss"].get<double>());
  EXPECT_GE(recs[2]["test_accuracy"].get<double>(), 0.5);  // 10 classes: chance is 0.1
  EXPECT_TRUE(fs::exists(ck));
  // The log exists now: a second run refuses to overwrite it.
  const Proc again = run("classify --synthetic 600 --epochs 1 --device cpu --metrics " + log);
  EXPECT_EQ(again.code, 2) << again.text;
  EXPECT_TRUE(has(again.text, "exists")) << again.text;
  fs::remove_all(dir);
}

// ---- issue 17: resnet's synthetic training and checkpoint; cnn_digits learning synthetic digits.
TEST(ExampleCli, ResnetSyntheticWritesMetricsAndATorchvisionCheckpoint) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("tg_cli_resnet_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string log = (dir / "m.jsonl").string(), ck = (dir / "r18.safetensors").string();
  const Proc r = run(
      "resnet --synthetic 2 --batch 4 --num-classes 7 --device cpu --no-progress --metrics " + log + " --save " + ck,
      true);
  ASSERT_EQ(r.code, 0) << r.text;
  EXPECT_TRUE(has(r.text, "11180103 parameters")) << r.text;  // 11,689,512 - 513 * (1000 - 7)
  EXPECT_TRUE(has(r.text, "resnet18: 2 steps of batch 4")) << r.text;
  std::ifstream in(log);
  std::vector<nlohmann::json> recs;
  for (std::string line; std::getline(in, line);) recs.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(recs.size(), 2u);
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(recs[s]["step"].get<int>(), s);
    EXPECT_TRUE(std::isfinite(recs[s]["train_loss"].get<double>()));
    EXPECT_DOUBLE_EQ(recs[s]["lr"].get<double>(), 0.1);
  }
  const tg::nn::StateDict sd = tg::load(ck);
  EXPECT_EQ(sd.size(), 122u);
  EXPECT_EQ(sd.at("fc.weight").sizes(), tg::Shape({7, 512}));
  EXPECT_EQ(sd.at("layer4.0.downsample.0.weight").sizes(), tg::Shape({512, 256, 1, 1}));
  EXPECT_EQ(sd.at("bn1.num_batches_tracked").item<int64_t>(), 2);  // two training steps
  // The checkpoint loads back (--load) and the training continues from it.
  const Proc again = run("resnet --synthetic 1 --batch 2 --num-classes 7 --device cpu --quiet --load " + ck);
  EXPECT_EQ(again.code, 0) << again.text;
  // A checkpoint of another class count is refused, naming the tensor.
  const Proc wrong = run("resnet --synthetic 1 --batch 2 --num-classes 10 --device cpu --quiet --load " + ck);
  EXPECT_EQ(wrong.code, 1) << wrong.text;
  EXPECT_TRUE(has(wrong.text, "fc.weight")) << wrong.text;
  fs::remove_all(dir);
}

TEST(ExampleCli, CnnDigitsLearnsSyntheticDigits) {
  const Proc r = run("cnn_digits --synthetic 2000 --epochs 3 --device cpu --no-progress --min-acc 0.9", true);
  ASSERT_EQ(r.code, 0) << r.text;
  EXPECT_TRUE(has(r.text, "1600 train / 400 test images 1x8x8")) << r.text;
  EXPECT_TRUE(has(r.text, "epoch 3/3 train_loss")) << r.text;
  // --min-acc above what 1 epoch reaches fails the run (exit 1).
  const Proc low = run("cnn_digits --synthetic 500 --epochs 1 --device cpu --no-progress --min-acc 0.999");
  EXPECT_EQ(low.code, 1) << low.text;
  EXPECT_TRUE(has(low.text, "< --min-acc")) << low.text;
}

// ---- issue 18: examples/gpt2's command line: usage errors exit 2, bad data exits 1 naming the
// file, a small run on a text file (byte tokenizer) logs metrics, validates and samples.
TEST(ExampleCli, Gpt2UsageErrorsBadDataAndASmallRun) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("tg_cli_gpt2_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string text = (dir / "t.txt").string(), bad = (dir / "bad.bin").string();
  {
    std::ofstream f(text);
    for (int i = 0; i < 300; ++i) f << "a quick brown fox jumps over the lazy dog " << i % 7 << "\n";
    std::ofstream b(bad, std::ios::binary);
    const uint16_t toks[4] = {1, 2, 60000, 3};
    b.write(reinterpret_cast<const char*>(toks), sizeof toks);
  }
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"gpt2 --data " + text + " --seq 2000", "--seq 2000 is longer than the context 1024"},
      {"gpt2 --data " + text + " --width 100", "--width 100 is not a multiple of --heads 12"},
      {"gpt2 --data " + text + " --vocab 0", "--vocab"},
      {"gpt2 --data " + text + " --precision fp8", "--precision"},
      {"gpt2 --steps 3", "--data FILE is required"},
      {"gpt2 --data " + text + " --batches b.safetensors", "--batches"},
      {"gpt2 --data " + text + " --logits-out l.safetensors", "--logits-out"},
  };
  for (const auto& [args, needle] : cases) {
    const Proc r = run(args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.text;
    EXPECT_TRUE(has(r.text, needle)) << args << ": wanted '" << needle << "' in: " << r.text;
    EXPECT_TRUE(has(r.text, "Usage: gpt2")) << args << ": " << r.text;
  }
  if (!tg::cuda::is_available()) {
    const Proc r = run("gpt2 --data " + text + " --device cuda");
    EXPECT_EQ(r.code, 2) << r.text;
    EXPECT_TRUE(has(r.text, "--device cuda: no usable CUDA device")) << r.text;
  }
  const Proc b = run("gpt2 --data " + bad + " --device cpu");
  EXPECT_EQ(b.code, 1) << b.text;
  EXPECT_TRUE(has(b.text, "bad.bin': token 60000 at byte offset 4 (token 2) is not below the vocab size 50257"))
      << b.text;
  const std::string log = (dir / "m.jsonl").string();
  const Proc r = run("gpt2 --data " + text + " --device cpu --layers 1 --heads 2 --width 32 --context 32 --seq 32 "
                     "--batch 4 --steps 8 --warmup 2 --lr 3e-3 --eval-interval 4 --eval-iters 2 --sample 40 "
                     "--no-progress --metrics " + log,
                     true);
  ASSERT_EQ(r.code, 0) << r.text;
  EXPECT_TRUE(has(r.text, "vocab 256")) << r.text;
  EXPECT_TRUE(has(r.text, "step 4 val_loss")) << r.text;
  EXPECT_TRUE(has(r.text, "step 8 val_loss")) << r.text;
  EXPECT_TRUE(has(r.text, "---- sample (40 tokens")) << r.text;
  std::ifstream in(log);
  int train = 0, val = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("train_loss")) {
      ++train;
      EXPECT_EQ(j["step"].get<int>(), train);
      EXPECT_GT(j["tokens_per_s"].get<double>(), 0.0);
      EXPECT_GT(j["grad_norm"].get<double>(), 0.0);
    }
    if (j.contains("val_loss")) ++val;
  }
  EXPECT_EQ(train, 8);
  EXPECT_EQ(val, 2);
  fs::remove_all(dir);
}

}  // namespace
