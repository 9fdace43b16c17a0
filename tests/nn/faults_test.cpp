// Faults survived, nothing lost (CPU): out of memory in the middle of training, a checkpoint
// write killed with SIGKILL, a disk that fills up and a directory that cannot be written during
// tg::save, and a NaN/Inf loss under a GradScaler. Each case checks real values: the bytes of
// every parameter and optimizer state tensor, and the tensors a checkpoint loads back.
#include <gtest/gtest.h>

#include <tapegrad/tapegrad.h>

#include <tapegrad/core/backend/cpu/cpu.h>
#include <tapegrad/optim/adam.h>
#include <tapegrad/optim/sgd.h>

#include <dirent.h>
#include <grp.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "common/num_threads_guard.h"

namespace {

using tg::Tensor;
using Bytes = std::vector<uint8_t>;

Bytes bytes_of(const Tensor& t) {
  Tensor c = t.contiguous();
  Bytes b(c.nbytes());
  c.copy_to_host(b.data());
  return b;
}

Bytes file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), {});
}

// Everything training must not lose: parameters and every optimizer state tensor, by name.
std::map<std::string, Bytes> snapshot(const tg::nn::Module& net, const tg::optim::Optimizer& opt) {
  std::map<std::string, Bytes> out;
  for (const auto& [name, t] : net.state_dict()) out["param." + name] = bytes_of(t);
  for (const auto& [name, t] : opt.state_dict()) out["opt." + name] = bytes_of(t);
  return out;
}

// A fresh directory under the test temp dir, removed with what is in it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "tg_faults_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    const char* d = ::mkdtemp(buf.data());
    if (d == nullptr) ADD_FAILURE() << "mkdtemp " << tmpl << ": " << std::strerror(errno);
    path_ = d ? d : "";
  }
  ~TempDir() {
    if (path_.empty()) return;
    ::chmod(path_.c_str(), 0755);
    for (const auto& f : files()) ::unlink((path_ + "/" + f).c_str());
    ::rmdir(path_.c_str());
  }
  const std::string& path() const { return path_; }
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    if (DIR* d = ::opendir(path_.c_str())) {
      while (dirent* e = ::readdir(d))
        if (std::string n = e->d_name; n != "." && n != "..") out.push_back(n);
      ::closedir(d);
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

 private:
  std::string path_;
};

// Forks run with one CPU thread, so that the child is a copy of a single-threaded process.
using PoolSize = tg_test::NumThreadsGuard;

class MemoryLimit {
 public:
  explicit MemoryLimit(size_t bytes) : old_(tg::cpu::memory_limit()) { tg::cpu::set_memory_limit(bytes); }
  ~MemoryLimit() { tg::cpu::set_memory_limit(old_); }

 private:
  size_t old_;
};

// ---- out of memory in the middle of training

struct Trainer {
  explicit Trainer(const tg::nn::StateDict& init)
      : net(tg::nn::Linear(64, 512), tg::nn::ReLU(), tg::nn::Linear(512, 1)) {
    net.load_state_dict(init);
    opt = std::make_unique<tg::optim::Adam>(net.parameters(), tg::optim::AdamOptions{.lr = 1e-3});
  }
  void step(const Tensor& x, const Tensor& y) {
    opt->zero_grad();
    auto loss = tg::nn::functional::mse_loss(net(x), y);
    loss.backward();
    opt->step();
  }
  tg::nn::Sequential net;
  std::unique_ptr<tg::optim::Adam> opt;
};

TEST(Faults, OutOfMemoryMidTrainingLosesNothing) {
  tg::manual_seed(3);
  tg::nn::StateDict init;
  {
    tg::nn::Sequential proto(tg::nn::Linear(64, 512), tg::nn::ReLU(), tg::nn::Linear(512, 1));
    for (const auto& [name, t] : proto.state_dict()) init.insert(name, t.detach().clone());
  }
  auto small_x = tg::randn({32, 64}), small_y = tg::randn({32, 1});
  auto next_x = tg::randn({32, 64}), next_y = tg::randn({32, 1});
  // 8192 x 512 float32 hidden activations = 16 MiB: past the limit set below.
  auto big_x = tg::randn({8192, 64}), big_y = tg::randn({8192, 1});

  Trainer t(init), twin(init);  // twin never sees the big batch
  for (int i = 0; i < 3; ++i) {
    t.step(small_x, small_y);
    twin.step(small_x, small_y);
  }
  t.opt->zero_grad();  // the last step's gradients go now, not inside the failing step
  const auto before = snapshot(t.net, *t.opt);
  ASSERT_GT(before.size(), 4u);  // parameters, exp_avg, exp_avg_sq, steps
  const size_t held = tg::cpu::allocated_bytes();
  const size_t limit = held + (4u << 20);
  {
    MemoryLimit cap(limit);
    std::string what;
    try {
      t.step(big_x, big_y);
      FAIL() << "a 16 MiB activation under a limit of " << limit << " bytes did not fail";
    } catch (const tg::Error& e) {
      what = e.what();
    }
    // The message names the request and what is held, and they add up to more than the limit.
    std::smatch m;
    ASSERT_TRUE(std::regex_search(what, m, std::regex(R"(requested (\d+) bytes \((\d+) rounded\) with (\d+) bytes held)")))
        << what;
    const size_t requested = std::stoull(m[2]), in_use = std::stoull(m[3]);
    EXPECT_GT(requested + in_use, limit) << what;
    EXPECT_GE(in_use, held) << what;
    EXPECT_NE(what.find(std::to_string(limit)), std::string::npos) << what;

    // Nothing changed, nothing leaked.
    EXPECT_EQ(snapshot(t.net, *t.opt), before);
    EXPECT_EQ(tg::cpu::allocated_bytes(), held);

    // The next step, with a small batch, trains on under the same limit, exactly as the twin.
    t.step(next_x, next_y);
    twin.step(next_x, next_y);
    EXPECT_NE(snapshot(t.net, *t.opt), before);
    EXPECT_EQ(snapshot(t.net, *t.opt), snapshot(twin.net, *twin.opt));
  }
  // Once the limit is lifted the big batch trains too.
  t.step(big_x, big_y);
  twin.step(big_x, big_y);
  EXPECT_EQ(snapshot(t.net, *t.opt), snapshot(twin.net, *twin.opt));
}

// The same on the GPU with AMP: a batch whose fp16 hidden activations (20M x 4096 x 2 bytes,
// 164 GB) exceed the device fails with a tg::Error naming the request and the bytes held, and
// the model, the optimizer and the GradScaler are untouched; the next small step trains on
// exactly as a twin that never saw the big batch, and memory_allocated is back where it was.
TEST(Faults, CudaOutOfMemoryMidAmpTrainingLosesNothing) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  tg::manual_seed(4);
  const tg::Device dev(tg::kCUDA, 0);
  struct AmpTrainer {
    explicit AmpTrainer(const tg::nn::StateDict& init, tg::Device dev)
        : net(tg::nn::Linear(64, 4096), tg::nn::ReLU(), tg::nn::Linear(4096, 1)) {
      net.load_state_dict(init);
      net.to(dev);
      opt = std::make_unique<tg::optim::Adam>(net.parameters(), tg::optim::AdamOptions{.lr = 1e-3});
    }
    void step(const Tensor& x, const Tensor& y) {
      opt->zero_grad();
      Tensor loss;
      {
        tg::amp::autocast guard(tg::kCUDA, tg::kFloat16);
        loss = tg::nn::functional::mse_loss(net(x), y);
      }
      scaler.scale(loss).backward();
      scaler.step(*opt);
      scaler.update();
    }
    std::map<std::string, Bytes> state() const {
      auto s = snapshot(net, *opt);
      for (const auto& [k, v] : scaler.state_dict()) s["scaler." + k] = bytes_of(v);
      return s;
    }
    tg::nn::Sequential net;
    std::unique_ptr<tg::optim::Adam> opt;
    tg::amp::GradScaler scaler;
  };
  tg::nn::StateDict init;
  {
    tg::nn::Sequential proto(tg::nn::Linear(64, 4096), tg::nn::ReLU(), tg::nn::Linear(4096, 1));
    for (const auto& [name, t] : proto.state_dict()) init.insert(name, t.detach().clone());
  }
  auto small_x = tg::randn({32, 64}, dev), small_y = tg::randn({32, 1}, dev);
  AmpTrainer t(init, dev), twin(init, dev);
  for (int i = 0; i < 3; ++i) {
    t.step(small_x, small_y);
    twin.step(small_x, small_y);
  }
  t.opt->zero_grad();
  twin.opt->zero_grad();
  auto big_x = tg::randn({20000000, 64}, dev), big_y = tg::randn({20000000, 1}, dev);
  const auto before = t.state();
  tg::cuda::synchronize();
  const size_t held = tg::cuda::memory_allocated();
  std::string what;
  try {
    t.step(big_x, big_y);
    tg::cuda::synchronize();
    FAIL() << "a 164 GB activation did not fail";
  } catch (const tg::Error& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("CUDA out of memory"), std::string::npos) << what;
  EXPECT_NE(what.find("bytes allocated"), std::string::npos) << what;
  EXPECT_EQ(t.state(), before);
  tg::cuda::synchronize();
  EXPECT_EQ(tg::cuda::memory_allocated(), held);
  big_x = Tensor();
  big_y = Tensor();
  t.step(small_x, small_y);
  twin.step(small_x, small_y);
  EXPECT_NE(t.state(), before);
  EXPECT_EQ(t.state(), twin.state());
}

TEST(Faults, MemoryLimitEnvAndSetter) {
  const size_t old = tg::cpu::memory_limit();
  {
    MemoryLimit cap(1u << 20);
    EXPECT_EQ(tg::cpu::memory_limit(), 1u << 20);
    const size_t held = tg::cpu::allocated_bytes();
    if (held < (1u << 20)) {
      EXPECT_THROW(tg::empty({static_cast<int64_t>(2u << 20)}, tg::kBool), tg::Error);
      EXPECT_EQ(tg::cpu::allocated_bytes(), held);
    }
  }
  EXPECT_EQ(tg::cpu::memory_limit(), old);
  auto t = tg::empty({static_cast<int64_t>(2u << 20)}, tg::kBool);  // no limit: fine
  EXPECT_EQ(t.numel(), 2 << 20);
}

// ---- checkpoints

tg::nn::StateDict checkpoint(float base, int tensors, int64_t floats_each) {
  tg::nn::StateDict d;
  for (int k = 0; k < tensors; ++k)
    d.insert("t" + std::to_string(k), tg::arange(floats_each, tg::kFloat32) * 0.5 + (base + k));
  return d;
}

// Which of `candidates` the loaded dict equals bytewise (tensor by tensor, same names and
// shapes), or -1 for none.
int which(const tg::nn::StateDict& loaded, const std::vector<tg::nn::StateDict>& candidates) {
  for (size_t c = 0; c < candidates.size(); ++c) {
    const auto& want = candidates[c];
    if (loaded.size() != want.size()) continue;
    bool same = true;
    for (const auto& [name, t] : want) {
      const Tensor* got = loaded.find(name);
      if (got == nullptr || got->sizes() != t.sizes() || got->dtype() != t.dtype() || bytes_of(*got) != bytes_of(t)) {
        same = false;
        break;
      }
    }
    if (same) return static_cast<int>(c);
  }
  return -1;
}

bool is_tmp(const std::string& name) { return name.find(".tmp.") != std::string::npos; }

TEST(Faults, CheckpointWriteKilledAtRandomPoints) {
  PoolSize single(1);
  TempDir dir;
  const std::string path = dir.path() + "/model.safetensors";
  // 16 tensors of 64 KiB: a save is 17+ writes, an fsync and a rename.
  const auto a = checkpoint(1.f, 16, 16384), b = checkpoint(-7.f, 16, 16384);
  tg::save(a, path);
  const Bytes a_bytes = file_bytes(path);

  // How long one save takes here, to spread the kills over it.
  auto t0 = std::chrono::steady_clock::now();
  tg::save(a, dir.path() + "/timing.safetensors");
  const auto save_us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0);
  ::unlink((dir.path() + "/timing.safetensors").c_str());

  std::mt19937 rng(12345);
  std::uniform_int_distribution<int64_t> delay(0, std::max<int64_t>(200, 3 * save_us.count()));
  int saw_tmp_left = 0, saw_a = 0, saw_b = 0;
  for (int round = 0; round < 24; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::fflush(nullptr);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0) << std::strerror(errno);
    if (pid == 0) {
      // The child saves the two checkpoints in turn until it is killed.
      for (int i = 0;; ++i) tg::save(i % 2 == 0 ? b : a, path);
    }
    ::usleep(static_cast<useconds_t>(delay(rng)));
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;

    // The path holds one complete checkpoint, never a torn one.
    int got = -1;
    ASSERT_NO_THROW(got = which(tg::load(path), {a, b}));
    ASSERT_NE(got, -1);
    (got == 0 ? saw_a : saw_b)++;
    if (got == 0) EXPECT_EQ(file_bytes(path), a_bytes);
    // The killed child's temp file may remain: it is never the checkpoint's name.
    for (const auto& f : dir.files()) {
      if (f == "model.safetensors") continue;
      EXPECT_TRUE(is_tmp(f)) << f;
      EXPECT_EQ(f.rfind("model.safetensors.tmp." + std::to_string(pid) + ".", 0), 0u) << f;
      ++saw_tmp_left;
      ::unlink((dir.path() + "/" + f).c_str());
    }
  }
  // The kills landed mid-write at least once (otherwise nothing was tested).
  EXPECT_GT(saw_tmp_left, 0) << "a=" << saw_a << " b=" << saw_b;

  // A stale temp file with garbage next to the checkpoint is not read by load.
  tg::save(a, path);
  {
    std::ofstream stale(path + ".tmp.999999", std::ios::binary);
    stale << "not a checkpoint";
  }
  EXPECT_EQ(which(tg::load(path), {a, b}), 0);
  EXPECT_EQ(file_bytes(path), a_bytes);
}

// Two threads saving to one path at once: each save has its own temp file, so the path always
// holds one of the two checkpoints whole (one shared temp file would rename a mix of both).
TEST(Faults, ConcurrentSavesToOnePathNeverMix) {
  TempDir dir;
  const std::string path = dir.path() + "/model.safetensors";
  const auto a = checkpoint(1.f, 8, 8192), b = checkpoint(-3.f, 8, 8192);  // same layout, other bytes
  std::atomic<int> errors{0};
  auto saver = [&](const tg::nn::StateDict& d) {
    for (int i = 0; i < 20; ++i) {
      try {
        tg::save(d, path);
      } catch (const tg::Error&) {
        ++errors;
      }
    }
  };
  std::thread ta(saver, std::cref(a)), tb(saver, std::cref(b));
  std::atomic<int> torn{0};
  for (int i = 0; i < 20; ++i) {
    try {
      if (which(tg::load(path), {a, b}) == -1) ++torn;
    } catch (const tg::Error&) {
      // not written yet
    }
  }
  ta.join();
  tb.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(torn.load(), 0);
  EXPECT_NE(which(tg::load(path), {a, b}), -1);
  EXPECT_EQ(dir.files(), std::vector<std::string>{"model.safetensors"});
}

// Exit codes of the save children below.
enum ChildResult : int { kGotError = 10, kNoError = 11, kOtherException = 12, kTmpLeft = 13, kSetupFailed = 14 };

// In the child: save, expect a tg::Error whose message contains `expect`, and no temp file left.
[[noreturn]] void child_save_expecting_error(const tg::nn::StateDict& d, const std::string& path,
                                             const std::string& expect) {
  int rc = kNoError;
  try {
    tg::save(d, path);
  } catch (const tg::Error& e) {
    rc = std::string(e.what()).find(expect) != std::string::npos ? kGotError : kOtherException;
    if (rc != kGotError) std::fprintf(stderr, "unexpected message: %s\n", e.what());
  } catch (...) {
    rc = kOtherException;
  }
  if (rc == kGotError && ::access((path + ".tmp." + std::to_string(::getpid())).c_str(), F_OK) == 0) rc = kTmpLeft;
  std::fflush(nullptr);
  ::_exit(rc);
}

int wait_child(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(Faults, DiskFullDuringSaveKeepsOldFile) {
  PoolSize single(1);
  TempDir dir;
  const std::string path = dir.path() + "/model.safetensors";
  const auto a = checkpoint(1.f, 4, 1024), b = checkpoint(2.f, 8, 65536);  // b is 2 MiB
  tg::save(a, path);
  const Bytes a_bytes = file_bytes(path);
  for (rlim_t cap : {rlim_t{0}, rlim_t{4096}, rlim_t{1} << 20}) {
    SCOPED_TRACE("RLIMIT_FSIZE " + std::to_string(cap));
    std::fflush(nullptr);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG, as on a full disk
      rlimit lim{cap, cap};
      if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(kSetupFailed);
      child_save_expecting_error(b, path, "write failed");
    }
    EXPECT_EQ(wait_child(pid), kGotError);
    EXPECT_EQ(file_bytes(path), a_bytes);
    EXPECT_EQ(which(tg::load(path), {a, b}), 0);
    EXPECT_EQ(dir.files(), std::vector<std::string>{"model.safetensors"});
  }
}

// Whether this process can create files in a 0555 directory anyway (root, CAP_DAC_OVERRIDE).
bool writes_ignore_permissions(const std::string& dir) {
  const std::string probe = dir + "/probe";
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) return false;
  ::close(fd);
  ::unlink(probe.c_str());
  return true;
}

TEST(Faults, ReadOnlyDirectoryDuringSaveKeepsOldFile) {
  PoolSize single(1);
  TempDir dir;
  const std::string path = dir.path() + "/model.safetensors";
  const auto a = checkpoint(1.f, 4, 1024), b = checkpoint(2.f, 4, 2048);
  tg::save(a, path);
  const Bytes a_bytes = file_bytes(path);
  ASSERT_EQ(::chmod(dir.path().c_str(), 0555), 0);
  if (!writes_ignore_permissions(dir.path())) {
    EXPECT_THROW(
        {
          try {
            tg::save(b, path);
          } catch (const tg::Error& e) {
            EXPECT_NE(std::string(e.what()).find("cannot create"), std::string::npos) << e.what();
            throw;
          }
        },
        tg::Error);
  } else {
    // Root ignores the mode: save from a child that has dropped to an unprivileged user, for
    // which the 0555 directory (owned by root) is read-only.
    std::fflush(nullptr);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(kSetupFailed);
      if (writes_ignore_permissions(dir.path())) ::_exit(kSetupFailed);
      child_save_expecting_error(b, path, "cannot create");
    }
    const int rc = wait_child(pid);
    if (rc == kSetupFailed) {
      ::chmod(dir.path().c_str(), 0755);
      GTEST_SKIP() << "running as root, where a 0555 directory is still writable, and a child cannot drop to "
                      "uid 65534 here (no CAP_SETUID): the read-only case cannot be provoked";
    }
    EXPECT_EQ(rc, kGotError);
  }
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  EXPECT_EQ(file_bytes(path), a_bytes);
  EXPECT_EQ(which(tg::load(path), {a, b}), 0);
  EXPECT_EQ(dir.files(), std::vector<std::string>{"model.safetensors"});
}

// ---- NaN / Inf in the loss under a GradScaler (CPU)

struct AmpRig {
  explicit AmpRig(const tg::nn::StateDict& init) : net(16, 4) {
    net.load_state_dict(init);
    opt = std::make_unique<tg::optim::Adam>(net.parameters(), tg::optim::AdamOptions{.lr = 1e-2});
  }
  // One scaled step; returns the loss.
  float step(tg::amp::GradScaler& scaler, const Tensor& x, const Tensor& y, double loss_factor = 1.0) {
    opt->zero_grad();
    auto loss = tg::nn::functional::mse_loss(net(x), y) * loss_factor;
    scaler.scale(loss).backward();
    scaler.step(*opt);
    scaler.update();
    return loss.item<float>();
  }
  tg::nn::Linear net;
  std::unique_ptr<tg::optim::Adam> opt;
};

void check_bad_loss_skipped(bool nan_input) {
  tg::manual_seed(9);
  tg::nn::StateDict init;
  {
    tg::nn::Linear proto(16, 4);
    for (const auto& [name, t] : proto.state_dict()) init.insert(name, t.detach().clone());
  }
  auto x = tg::randn({8, 16}), y = tg::randn({8, 4});
  auto x2 = tg::randn({8, 16}), y2 = tg::randn({8, 4});
  AmpRig rig(init), twin(init);  // the twin never sees the bad batch
  tg::amp::GradScaler scaler({.init_scale = 1024, .growth_interval = 100}), twin_scaler({.init_scale = 1024});
  for (int i = 0; i < 2; ++i) {
    rig.step(scaler, x, y);
    twin.step(twin_scaler, x, y);
  }
  const auto before = snapshot(rig.net, *rig.opt);
  const auto scaler_before = scaler.get_scale();
  Tensor bad_x = x.clone();
  double factor = 1.0;
  if (nan_input)
    bad_x.view({-1}).slice(0, 5, 6).fill_(std::numeric_limits<double>::quiet_NaN());
  else
    factor = std::numeric_limits<double>::infinity();
  const float bad_loss = rig.step(scaler, bad_x, y, factor);
  EXPECT_FALSE(std::isfinite(bad_loss)) << bad_loss;
  EXPECT_EQ(snapshot(rig.net, *rig.opt), before);  // bit-identical: step skipped
  EXPECT_EQ(scaler.get_scale(), scaler_before * 0.5);
  EXPECT_EQ(scaler.get_growth_tracker(), 0);
  // Training goes on as if the bad batch had never come (power-of-two scales are exact).
  rig.step(scaler, x2, y2);
  twin.step(twin_scaler, x2, y2);
  EXPECT_NE(snapshot(rig.net, *rig.opt), before);
  EXPECT_EQ(snapshot(rig.net, *rig.opt), snapshot(twin.net, *twin.opt));
}

TEST(Faults, NaNLossWithGradScalerSkipsStepBitIdentical) { check_bad_loss_skipped(true); }
TEST(Faults, InfLossWithGradScalerSkipsStepBitIdentical) { check_bad_loss_skipped(false); }

}  // namespace
