// A whole training state in one file (nn/checkpoint.h, core/rng.h): 100 steps straight equal
// 50 steps, save_checkpoint, load into fresh objects, 50 steps, bit for bit (parameters,
// optimizer state, GradScaler state), on the CPU with Adam and SGD-momentum and a Dropout
// model, on CUDA with autocast fp16 + GradScaler, and in a second process (this binary run
// again with a filter). Bad input: optimizer state for other parameters, corrupt or truncated
// files, failed saves (the old file stays).
#include <gtest/gtest.h>

#include <tapegrad/tapegrad.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/num_threads_guard.h"

extern char** environ;

namespace tg::testing {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;
using OptFactory = std::function<std::unique_ptr<optim::Optimizer>(const std::vector<Tensor>&, bool fresh)>;

bool has_cuda() { return cuda::is_available(); }

Bytes bytes_of(const Tensor& t) {
  Tensor c = t.contiguous();
  Bytes b(c.nbytes());
  if (!b.empty()) c.copy_to_host(b.data());
  return b;
}

Bytes file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), {});
}

void write_bytes(const std::string& path, const Bytes& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// Every tensor of a state, by name, as bytes (exact comparison).
std::map<std::string, Bytes> snapshot(const StateDict& sd, const std::string& prefix) {
  std::map<std::string, Bytes> out;
  for (const auto& [k, t] : sd) out[prefix + k] = bytes_of(t);
  return out;
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tg_checkpoint_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  std::string path_;
};

// ---- the training rig: Linear -> ReLU -> Dropout -> Linear, batches drawn with randperm, so
// both the dropout masks and the batch order come from the generators.
struct Rig {
  Rig(Device dev, const OptFactory& make_opt, bool fresh, bool amp, uint64_t init_seed) : device(dev), use_amp(amp) {
    tg::manual_seed(init_seed);  // fresh objects start from other weights than the run they resume
    model = nn::Sequential(nn::Linear(8, 32), nn::ReLU(), nn::Dropout(0.25), nn::Linear(32, 4));
    model.to(dev);
    opt = make_opt(model.parameters(), fresh);
    // A fresh scaler has other options: the checkpoint's win.
    scaler = std::make_unique<amp::GradScaler>(
        fresh ? amp::GradScalerOptions{.init_scale = 8.0, .growth_interval = 100}
              : amp::GradScalerOptions{.init_scale = 65536.0 * 256, .growth_interval = 7});
  }

  void train(const Tensor& x, const Tensor& y, int steps) {
    for (int s = 0; s < steps; ++s) {
      Tensor idx = tg::randperm(x.size(0), TensorOptions().dtype(kInt64).device(device)).slice(0, 0, 16);
      Tensor xb = x.index_select(0, idx), yb = y.index_select(0, idx);
      opt->zero_grad();
      if (!use_amp) {
        Tensor loss = nn::functional::mse_loss(model(xb), yb);
        loss.backward();
        opt->step();
        continue;
      }
      Tensor loss;
      {
        amp::autocast guard(kCUDA, kFloat16);
        loss = nn::functional::mse_loss(model(xb), yb);
      }
      scaler->scale(loss).backward();
      scaler->step(*opt);
      scaler->update();
    }
  }

  std::map<std::string, Bytes> state() const {
    auto out = snapshot(model.state_dict(), "model.");
    auto o = snapshot(opt->state_dict(), "optimizer.");
    out.insert(o.begin(), o.end());
    if (use_amp) {
      auto s = snapshot(scaler->state_dict(), "scaler.");
      out.insert(s.begin(), s.end());
    }
    return out;
  }

  void save(const std::string& path, int64_t step) const {
    save_checkpoint(
        path, {{"model", model}, {"optimizer", *opt}, {"scaler", *scaler}, {"rng", rng_state_dict()}, {"step", step}});
  }

  // Loads everything but (optionally) the generators; returns the saved step.
  int64_t load(const std::string& path, bool restore_rng = true) {
    Checkpoint ck = load_checkpoint(path);
    ck.load_into("model", model);
    ck.load_into("optimizer", *opt);
    ck.load_into("scaler", *scaler);
    if (restore_rng) load_rng_state_dict(ck.at("rng"));
    return ck.item<int64_t>("step");
  }

  Device device;
  bool use_amp;
  nn::Sequential model;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<amp::GradScaler> scaler;
};

struct Data {
  Tensor x, y;
};
Data make_data(Device dev) {
  tg::manual_seed(7);
  Tensor x = tg::randn({64, 8}).to(dev);
  Tensor y = tg::randn({64, 4}).to(dev);
  return {x, y};
}

std::unique_ptr<optim::Optimizer> make_adam(const std::vector<Tensor>& p, bool fresh) {
  return std::make_unique<optim::Adam>(p, optim::AdamOptions{.lr = fresh ? 0.5 : 1e-2, .betas = {0.8, 0.99}});
}
std::unique_ptr<optim::Optimizer> make_sgd(const std::vector<Tensor>& p, bool fresh) {
  return std::make_unique<optim::SGD>(p, optim::SGDOptions{.lr = fresh ? 1.0 : 0.05, .momentum = fresh ? 0.0 : 0.9});
}

// 100 steps straight; 50 + save + load into fresh objects + 50. Returns both final states.
struct Outcome {
  std::map<std::string, Bytes> straight, resumed, initial;
};
Outcome straight_and_resumed(Device dev, const OptFactory& make_opt, bool amp, const std::string& path) {
  Data d = make_data(dev);
  Outcome out;
  {
    Rig r(dev, make_opt, false, amp, 1);
    out.initial = r.state();
    r.train(d.x, d.y, 100);
    out.straight = r.state();
  }
  {
    Rig r(dev, make_opt, false, amp, 1);
    r.train(d.x, d.y, 50);
    r.save(path, 50);
  }
  tg::manual_seed(999);  // the generators move on, as in a new process
  (void)tg::rand({123});
  Rig fresh(dev, make_opt, true, amp, 12345);
  EXPECT_EQ(fresh.load(path), 50);
  fresh.train(d.x, d.y, 50);
  out.resumed = fresh.state();
  return out;
}

void expect_same(const std::map<std::string, Bytes>& a, const std::map<std::string, Bytes>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    ASSERT_NE(it, b.end()) << k;
    EXPECT_TRUE(v == it->second) << k << " differs";
  }
}

TEST(Checkpoint, AdamResumesBitForBitCpu) {
  TempDir dir;
  const std::string path = dir.path() + "/ck.safetensors";
  Outcome o = straight_and_resumed(Device(kCPU), make_adam, false, path);
  expect_same(o.straight, o.resumed);
  EXPECT_NE(o.straight, o.initial);  // training moved the weights
  EXPECT_TRUE(o.straight.count("optimizer.state.0.exp_avg_sq"));
  EXPECT_EQ(dir.files(), std::vector<std::string>{"ck.safetensors"});  // no temporary left

  // Controls: the same resume without the generators' state, or without the optimizer's,
  // ends elsewhere (the test would see a missing piece).
  Data d = make_data(Device(kCPU));
  Rig no_rng(Device(kCPU), make_adam, true, false, 12345);
  no_rng.load(path, false);
  no_rng.train(d.x, d.y, 50);
  EXPECT_NE(no_rng.state().at("model.0.weight"), o.straight.at("model.0.weight"));
  Rig no_opt(Device(kCPU), make_adam, false, false, 12345);
  {
    Checkpoint ck = load_checkpoint(path);
    ck.load_into("model", no_opt.model);
    load_rng_state_dict(ck.at("rng"));
  }
  no_opt.train(d.x, d.y, 50);
  EXPECT_NE(no_opt.state().at("model.0.weight"), o.straight.at("model.0.weight"));
}

TEST(Checkpoint, SgdMomentumResumesBitForBitCpu) {
  TempDir dir;
  Outcome o = straight_and_resumed(Device(kCPU), make_sgd, false, dir.path() + "/ck.safetensors");
  expect_same(o.straight, o.resumed);
  EXPECT_TRUE(o.straight.count("optimizer.state.3.momentum_buffer"));
}

TEST(Checkpoint, AmpAdamResumesBitForBitCuda) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  TempDir dir;
  const std::string path = dir.path() + "/ck.safetensors";
  Outcome o = straight_and_resumed(Device(kCUDA, 0), make_adam, true, path);
  expect_same(o.straight, o.resumed);
  // The run went through a backoff and growth: the scale left its initial value.
  Checkpoint ck = load_checkpoint(path);
  EXPECT_NE(ck.at("scaler").at("scale").item<double>(), 65536.0 * 256);
  EXPECT_TRUE(ck.at("rng").contains("cuda.0"));
}

TEST(Checkpoint, AmpSgdMomentumResumesBitForBitCuda) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  TempDir dir;
  Outcome o = straight_and_resumed(Device(kCUDA, 0), make_sgd, true, dir.path() + "/ck.safetensors");
  expect_same(o.straight, o.resumed);
}

// ---- a second process: this binary again, running only CheckpointChild.ResumeFromEnvironment,
// which loads the checkpoint named by TG_CHECKPOINT_RESUME into fresh objects, trains 50 steps
// and writes the model's state to TG_CHECKPOINT_OUT.
constexpr const char* kResumeEnv = "TG_CHECKPOINT_RESUME";
constexpr const char* kOutEnv = "TG_CHECKPOINT_OUT";

TEST(CheckpointChild, ResumeFromEnvironment) {
  const char* in = std::getenv(kResumeEnv);
  const char* out = std::getenv(kOutEnv);
  if (in == nullptr || out == nullptr) GTEST_SKIP() << "run by Checkpoint.ResumesInANewProcess";
  Data d = make_data(Device(kCPU));
  Rig fresh(Device(kCPU), make_adam, true, false, 4242);
  ASSERT_EQ(fresh.load(in), 50);
  fresh.train(d.x, d.y, 50);
  save_checkpoint(out, {{"model", fresh.model}, {"optimizer", *fresh.opt}});
}

int run_self(const std::vector<std::string>& args, const std::vector<std::string>& extra_env) {
  std::string self = fs::read_symlink("/proc/self/exe").string();
  std::vector<std::string> argv_s{self};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  // The parent's environment less gtest's (sharding or an XML output would apply to the child too).
  std::vector<std::string> env_s(extra_env);
  for (char** e = environ; *e != nullptr; ++e)
    if (std::strncmp(*e, "GTEST_", 6) != 0) env_s.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& s : env_s) envp.push_back(s.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  if (::posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), envp.data()) != 0) return -1;
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(Checkpoint, ResumesInANewProcess) {
  TempDir dir;
  const std::string ck = dir.path() + "/ck.safetensors", out = dir.path() + "/out.safetensors";
  Data d = make_data(Device(kCPU));
  std::map<std::string, Bytes> straight;
  {
    Rig r(Device(kCPU), make_adam, false, false, 1);
    r.train(d.x, d.y, 100);
    straight = snapshot(r.model.state_dict(), "model.");
    auto o = snapshot(r.opt->state_dict(), "optimizer.");
    straight.insert(o.begin(), o.end());
  }
  {
    Rig r(Device(kCPU), make_adam, false, false, 1);
    r.train(d.x, d.y, 50);
    r.save(ck, 50);
  }
  ASSERT_EQ(run_self({"--gtest_filter=CheckpointChild.ResumeFromEnvironment"},
                     {std::string(kResumeEnv) + "=" + ck, std::string(kOutEnv) + "=" + out}),
            0);
  ASSERT_TRUE(fs::exists(out)) << "the child wrote nothing";
  Checkpoint result = load_checkpoint(out);
  std::map<std::string, Bytes> resumed = snapshot(result.at("model"), "model.");
  auto o = snapshot(result.at("optimizer"), "optimizer.");
  resumed.insert(o.begin(), o.end());
  expect_same(straight, resumed);
}

// ---- for tests/parity/optim_state_to_torch.py: Linear(5, 3), Adam in two groups (amsgrad, weight
// decay), 3 steps, then one checkpoint with the model, the optimizer, the next step's data, and
// the model and optimizer after that step. Runs when TG_TORCH_PARITY_DIR names a folder.
TEST(Checkpoint, WritesAdamStateForTorch) {
  const char* dir = std::getenv("TG_TORCH_PARITY_DIR");
  if (dir == nullptr) GTEST_SKIP() << "run by tests/parity/optim_state_to_torch.py";
  tg::manual_seed(5);
  nn::Linear lin(5, 3);
  optim::AdamOptions o{.lr = 1e-2, .betas = {0.8, 0.99}, .eps = 1e-6, .weight_decay = 0.1, .amsgrad = true};
  optim::AdamOptions o2 = o;
  o2.lr = 5e-3;
  optim::Adam opt({{{lin.weight}, o}, {{lin.bias}, o2}}, o);
  auto step = [&](const Tensor& x, const Tensor& y) {
    opt.zero_grad();
    nn::functional::mse_loss(lin(x), y).backward();
    opt.step();
  };
  for (int i = 0; i < 3; ++i) step(tg::randn({8, 5}), tg::randn({8, 3}));
  Tensor x = tg::randn({8, 5}), y = tg::randn({8, 3});
  StateDict model = lin.state_dict(), before;
  for (const auto& [k, t] : model) before.insert(k, t.clone());
  StateDict opt_before;
  for (const auto& [k, t] : opt.state_dict()) opt_before.insert(k, t.clone());
  step(x, y);
  save_checkpoint(
      std::string(dir) + "/adam_state.safetensors",
      {{"model", before}, {"optimizer", opt_before}, {"x", x}, {"y", y}, {"after", lin}, {"optimizer_after", opt}});
}

// ---- the file: layout, names, metadata, parts of any class with state_dict()

// What a scheduler (or any user object) needs to be a part: state_dict() / load_state_dict().
struct Counter {
  int64_t n = 0;
  StateDict state_dict() const { return {{"n", tg::full({}, n, kInt64)}}; }
  void load_state_dict(const StateDict& sd) { n = sd.at("n").item<int64_t>(); }
};

TEST(Checkpoint, LayoutNamesAndParts) {
  TempDir dir;
  const std::string path = dir.path() + "/ck.safetensors";
  nn::Linear lin(3, 2);
  Counter c{41};
  amp::GradScaler disabled({.enabled = false});
  save_checkpoint(path, {{"model", lin},
                         {"sched", c},
                         {"scaler", disabled},
                         {"extra", StateDict{{"a.b", tg::ones({2})}}},
                         {"step", 7},
                         {"lr", 0.25},
                         {"done", true},
                         {"order", tg::arange(4)}});
  // As a plain safetensors file: prefixed names in the order given, and the metadata.
  StateDict flat = tg::load(path);
  EXPECT_EQ(flat.keys(), (std::vector<std::string>{"model.weight", "model.bias", "sched.n", "extra.a.b", "step", "lr",
                                                   "done", "order"}));
  EXPECT_EQ(flat.at("step").dtype(), kInt64);
  EXPECT_EQ(flat.at("lr").dtype(), kFloat64);
  EXPECT_EQ(flat.at("done").dtype(), kBool);
  EXPECT_EQ(flat.at("step").dim(), 0);
  const SafetensorsMetadata meta = tg::load_metadata(path);
  EXPECT_EQ(meta.at("format"), "tapegrad.checkpoint");
  EXPECT_EQ(meta.at("parts"), "model,sched,scaler,extra");
  EXPECT_EQ(meta.at("values"), "step,lr,done,order");

  Checkpoint ck = load_checkpoint(path);
  EXPECT_EQ(ck.part_names(), (std::vector<std::string>{"model", "sched", "scaler", "extra"}));
  EXPECT_EQ(ck.value_names(), (std::vector<std::string>{"step", "lr", "done", "order"}));
  EXPECT_TRUE(ck.at("scaler").empty());  // an empty part comes back, empty
  EXPECT_EQ(ck.at("extra").keys(), std::vector<std::string>{"a.b"});
  EXPECT_EQ(ck.item<int64_t>("step"), 7);
  EXPECT_EQ(ck.item<double>("lr"), 0.25);
  EXPECT_TRUE(ck.item<bool>("done"));
  EXPECT_EQ(ck.value("order").to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(bytes_of(ck.at("model").at("weight")), bytes_of(lin.weight));
  Counter c2;
  ck.load_into("sched", c2);
  EXPECT_EQ(c2.n, 41);
  EXPECT_TRUE(ck.contains("sched") && ck.contains("step") && !ck.contains("nothing"));
  EXPECT_THROW((void)ck.at("step"), Error);      // a value, not a part
  EXPECT_THROW((void)ck.value("model"), Error);  // a part, not a value
  try {
    (void)ck.at("optimizer");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model,sched,scaler,extra"), std::string::npos) << e.what();
  }
}

// ---- failed saves leave the old file; nothing is written before everything is checked

TEST(Checkpoint, RefusedSaveKeepsOldFile) {
  TempDir dir;
  const std::string path = dir.path() + "/ck.safetensors";
  nn::Linear lin(3, 2);
  save_checkpoint(path, {{"model", lin}, {"step", 1}});
  const Bytes before = file_bytes(path);
  const std::vector<std::vector<CheckpointEntry>> bad = {
      {{"model", lin}, {"model", lin}},            // repeated
      {{"model", lin}, {"step", 1}, {"step", 2}},  // repeated value
      {{"a.b", lin}},                              // '.' in a part name
      {{"", lin}},                                 // empty
      {{"x,y", 1}},                                // ',' would break the metadata list
      {{"model", StateDict{{"w", Tensor()}}}},     // undefined tensor
      {{"model", lin}, {"step", Tensor()}},        // undefined value
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    EXPECT_THROW(save_checkpoint(path, bad[i]), Error) << "case " << i;
    EXPECT_EQ(file_bytes(path), before) << "case " << i;
  }
  EXPECT_THROW(save_checkpoint(dir.path() + "/no/such/dir/ck.safetensors", {{"model", lin}}), Error);
  EXPECT_EQ(dir.files(), std::vector<std::string>{"ck.safetensors"});
  EXPECT_THROW(CheckpointEntry("n", ~uint64_t{0}), Error);  // does not fit the int64 it is stored as
}

TEST(Checkpoint, DiskFullDuringSaveKeepsOldFile) {
  tg_test::NumThreadsGuard single(1);  // the forked child has no pool threads
  TempDir dir;
  const std::string path = dir.path() + "/ck.safetensors";
  nn::Linear small(3, 2), big(256, 256);  // big: 257 KiB
  save_checkpoint(path, {{"model", small}, {"step", 1}});
  const Bytes before = file_bytes(path);
  std::fflush(nullptr);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG, as on a full disk
    rlimit lim{65536, 65536};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(3);
    try {
      save_checkpoint(path, {{"model", big}, {"step", 2}});
    } catch (const Error&) {
      ::_exit(0);
    }
    ::_exit(1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's save did not fail with tg::Error";
  EXPECT_EQ(file_bytes(path), before);
  EXPECT_EQ(load_checkpoint(path).item<int64_t>("step"), 1);
  EXPECT_EQ(dir.files(), std::vector<std::string>{"ck.safetensors"});
}

// ---- corrupt, truncated and foreign files are a tg::Error

TEST(Checkpoint, CorruptOrForeignFilesAreErrors) {
  TempDir dir;
  const std::string path = dir.path() + "/ck.safetensors", bad = dir.path() + "/bad.safetensors";
  nn::Linear lin(16, 16);
  save_checkpoint(path, {{"model", lin}, {"step", 3}});
  const Bytes good = file_bytes(path);
  auto expect_error = [&](const Bytes& b, const std::string& what, const std::string& needle) {
    write_bytes(bad, b);
    try {
      (void)load_checkpoint(bad);
      ADD_FAILURE() << what << ": loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
    }
  };
  for (size_t n : {size_t{0}, size_t{5}, size_t{20}, good.size() / 2, good.size() - 1})
    expect_error(Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n)),
                 "truncated to " + std::to_string(n), "bad.safetensors");
  Bytes flipped = good;
  flipped[8] = '[';  // the header's opening brace
  expect_error(flipped, "header not an object", "bad.safetensors");
  Bytes longer = good;
  longer.push_back(0);
  expect_error(longer, "trailing byte", "bad.safetensors");

  // A plain tg::save file is not a checkpoint.
  tg::save(lin.state_dict(), bad);
  EXPECT_THROW((void)load_checkpoint(bad), Error);
  // Metadata that does not match the tensors.
  tg::save({{"model.weight", tg::ones({1})}, {"stray", tg::ones({1})}}, bad,
           {{"format", "tapegrad.checkpoint"}, {"parts", "model"}, {"values", ""}});
  expect_error(file_bytes(bad), "unlisted value", "'stray'");
  tg::save({{"opt.x", tg::ones({1})}}, bad, {{"format", "tapegrad.checkpoint"}, {"parts", "model"}, {"values", ""}});
  expect_error(file_bytes(bad), "unlisted part", "'opt.x'");
  tg::save({{"model.x", tg::ones({1})}}, bad,
           {{"format", "tapegrad.checkpoint"}, {"parts", "model"}, {"values", "step"}});
  expect_error(file_bytes(bad), "missing value", "'step'");
  tg::save({{"model.x", tg::ones({1})}}, bad,
           {{"format", "tapegrad.checkpoint"}, {"parts", "model,model"}, {"values", ""}});
  expect_error(file_bytes(bad), "listed twice", "twice");
  tg::save({{"model.x", tg::ones({1})}}, bad, {{"format", "tapegrad.checkpoint"}, {"parts", "model"}});
  expect_error(file_bytes(bad), "no values list", "values");
  EXPECT_THROW((void)load_checkpoint(dir.path() + "/missing.safetensors"), Error);
  EXPECT_EQ(load_checkpoint(path).item<int64_t>("step"), 3);
}

// ---- optimizer state for other parameters: a tg::Error naming the parameter and the shapes,
// and the optimizer unchanged

TEST(Checkpoint, OptimizerStateForOtherParametersIsRefused) {
  tg::manual_seed(3);
  auto a = tg::randn({4, 3}).requires_grad_(), b = tg::randn({3}).requires_grad_();
  optim::Adam src({a, b}, {.lr = 0.1});
  (a.pow(2).sum() + b.sum()).backward();
  src.step();
  const StateDict saved = src.state_dict();

  // Same count, other shapes (parameter 1 is [5] instead of [3]).
  auto c = tg::randn({4, 3}).requires_grad_(), d = tg::randn({5}).requires_grad_();
  optim::Adam dst({c, d}, {.lr = 0.5});
  (c.sum() + d.pow(2).sum()).backward();
  dst.step();
  const auto before = snapshot(dst.state_dict(), "");
  try {
    dst.load_state_dict(saved);
    ADD_FAILURE() << "loaded";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("Adam.load_state_dict"), std::string::npos) << m;
    EXPECT_NE(m.find("parameter 1"), std::string::npos) << m;
    EXPECT_NE(m.find("[3]"), std::string::npos) << m;
    EXPECT_NE(m.find("[5]"), std::string::npos) << m;
  }
  EXPECT_EQ(snapshot(dst.state_dict(), ""), before);
  EXPECT_EQ(dst.lr(), 0.5);

  // Other counts.
  optim::Adam one({c}, {.lr = 0.5});
  try {
    one.load_state_dict(saved);
    ADD_FAILURE() << "loaded";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("has 2 parameters"), std::string::npos) << m;
    EXPECT_NE(m.find("has 1"), std::string::npos) << m;
  }
  EXPECT_EQ(one.state(c), nullptr);
  EXPECT_EQ(one.lr(), 0.5);

  // Through a checkpoint file: the same error, nothing changed.
  TempDir dir;
  const std::string path = dir.path() + "/ck.safetensors";
  save_checkpoint(path, {{"optimizer", src}});
  EXPECT_THROW(load_checkpoint(path).load_into("optimizer", dst), Error);
  EXPECT_EQ(snapshot(dst.state_dict(), ""), before);
}

// ---- the generators' state

TEST(RngState, EncodesSeedAndOffset) {
  tg::manual_seed(0x0102030405060708ull);
  Tensor s0 = get_rng_state();
  EXPECT_EQ(s0.dtype(), kUInt8);
  EXPECT_EQ(s0.sizes(), Shape({16}));
  EXPECT_EQ(s0.to_vector<uint8_t>(), (std::vector<uint8_t>{8, 7, 6, 5, 4, 3, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0}));
  (void)tg::rand({5});             // 5 float32 counters, rounded up to 8
  (void)tg::randn({3}, kFloat64);  // 6 counters -> 8
  std::vector<uint8_t> s1 = get_rng_state().to_vector<uint8_t>();
  EXPECT_EQ(s1[8], 16);
  // Restoring replays the same numbers, dropout masks included.
  Tensor saved = get_rng_state();
  Tensor r1 = tg::rand({7});
  Tensor m1 = nn::functional::dropout(tg::ones({100}), 0.5, true);
  set_rng_state(saved);
  EXPECT_EQ(bytes_of(tg::rand({7})), bytes_of(r1));
  EXPECT_EQ(bytes_of(nn::functional::dropout(tg::ones({100}), 0.5, true)), bytes_of(m1));
  // And from a state built by hand: seed 5, offset 4 gives rand's values after one reservation.
  tg::manual_seed(5);
  (void)tg::rand({4});
  Tensor after = tg::rand({3});
  std::vector<uint8_t> hand(16, 0);
  hand[0] = 5;
  hand[8] = 4;
  set_rng_state(tg::tensor(hand, {16}));
  EXPECT_EQ(bytes_of(tg::rand({3})), bytes_of(after));
}

TEST(RngState, CudaGeneratorReplaysCuda) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  const Device dev(kCUDA, 0);
  tg::manual_seed(77);
  (void)tg::rand({10}, dev);  // 10 counters -> 12
  Tensor s = get_rng_state(dev);
  std::vector<uint8_t> b = s.to_vector<uint8_t>();
  EXPECT_EQ(b[0], 77);
  EXPECT_EQ(b[8], 12);
  const Bytes cpu_before = bytes_of(get_rng_state());
  Tensor r = tg::rand({33}, dev);
  Tensor m = nn::functional::dropout(tg::ones({100}, dev), 0.5, true);
  set_rng_state(s, dev);
  EXPECT_EQ(bytes_of(tg::rand({33}, dev)), bytes_of(r));
  EXPECT_EQ(bytes_of(nn::functional::dropout(tg::ones({100}, dev), 0.5, true)), bytes_of(m));
  EXPECT_EQ(bytes_of(get_rng_state()), cpu_before);                                 // the CPU generator is its own
  EXPECT_EQ(bytes_of(get_rng_state(Device(kCUDA))), bytes_of(get_rng_state(dev)));  // current device
}

TEST(RngState, BadStatesAreRefused) {
  tg::manual_seed(11);
  const Bytes before = bytes_of(get_rng_state());
  std::vector<uint8_t> odd(16, 0);
  odd[8] = 2;  // offset 2: not a multiple of 4
  for (const Tensor& bad :
       {tg::zeros({16}), tg::zeros({15}, kUInt8), tg::zeros({2, 8}, kInt64), tg::tensor(odd, {16}), Tensor()})
    EXPECT_THROW(set_rng_state(bad), Error);
  EXPECT_EQ(bytes_of(get_rng_state()), before);
  if (!has_cuda()) {
    EXPECT_THROW((void)get_rng_state(Device(kCUDA)), Error);
    EXPECT_THROW(set_rng_state(get_rng_state(), Device(kCUDA, 0)), Error);
  } else {
    EXPECT_THROW((void)get_rng_state(Device(kCUDA, cuda::device_count())), Error);
  }
}

TEST(RngState, StateDictOfEveryGenerator) {
  tg::manual_seed(21);
  StateDict sd = rng_state_dict();
  std::vector<std::string> keys{"cpu"};
  for (int i = 0; i < cuda::device_count(); ++i) keys.push_back("cuda." + std::to_string(i));
  EXPECT_EQ(sd.keys(), keys);
  Tensor r = tg::rand({9});
  load_rng_state_dict(sd);
  EXPECT_EQ(bytes_of(tg::rand({9})), bytes_of(r));

  // Everything is checked before any generator changes.
  const Bytes before = bytes_of(get_rng_state());
  std::vector<uint8_t> other(16, 0);
  other[0] = 99;
  for (const auto& [key, t] : std::vector<std::pair<std::string, Tensor>>{{"gpu", tg::tensor(other, {16})},
                                                                          {"cuda.x", tg::tensor(other, {16})},
                                                                          {"cuda.-1", tg::tensor(other, {16})},
                                                                          {"cuda.", tg::tensor(other, {16})},
                                                                          {"cuda.64", tg::tensor(other, {16})},
                                                                          {"cuda.0", tg::zeros({3})}}) {
    StateDict bad{{"cpu", tg::tensor(other, {16})}};
    bad.insert(key, t);
    EXPECT_THROW(load_rng_state_dict(bad), Error) << key;
    EXPECT_EQ(bytes_of(get_rng_state()), before) << key;
  }
  StateDict no_cpu;
  EXPECT_THROW(load_rng_state_dict(no_cpu), Error);
  // Non-strict: a generator for a device not present is skipped, the CPU's still loads.
  StateDict foreign{{"cpu", tg::tensor(other, {16})}, {"cuda.64", tg::tensor(other, {16})}};
  load_rng_state_dict(foreign, false);
  EXPECT_EQ(get_rng_state().to_vector<uint8_t>(), other);
}

}  // namespace
}  // namespace tg::testing
