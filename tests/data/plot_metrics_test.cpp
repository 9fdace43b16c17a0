// scripts/plot_metrics.py on logs MetricsLog writes: with matplotlib, a JSON-lines and a CSV log
// each become a PNG (checked by its signature and IHDR size); without it (simulated on any machine
// by a matplotlib that fails to import) the script says how to install it and exits 1; a bad log
// exits 2. TG_SOURCE_DIR is the repository (tests/CMakeLists.txt).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <tapegrad/tapegrad.h>

namespace {

namespace fs = std::filesystem;

struct Proc {
  int code;
  std::string err;
};

Proc run(const std::string& cmd) {
  FILE* p = ::popen((cmd + " 2>&1 >/dev/null").c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

const std::string kScript = std::string(TG_SOURCE_DIR) + "/scripts/plot_metrics.py";

class PlotMetrics : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system("python3 -c '' >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
    dir_ = fs::temp_directory_path() / ("tg_plot_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& n) const { return (dir_ / n).string(); }
  // A short training run's log: loss falls, accuracy rises, lr decays.
  void write_log(const std::string& p) const {
    tg::data::MetricsLog log(p);
    for (int i = 0; i < 20; ++i)
      log.log(10 * (i + 1), i / 5,
              {{"train_loss", 2.0 / (1 + i)},
               {"test_accuracy", 0.5 + 0.02 * i},
               {"lr", 0.1 * std::pow(0.9, i)},
               {"samples_per_s", 1000.0 + i}});
  }
  static bool have_matplotlib() { return std::system("python3 -c 'import matplotlib' >/dev/null 2>&1") == 0; }
  fs::path dir_;
};

// Width and height from a PNG's IHDR chunk, or {0, 0} when the file is not a PNG.
std::pair<uint32_t, uint32_t> png_size(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  unsigned char h[24] = {};
  in.read(reinterpret_cast<char*>(h), 24);
  const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (in.gcount() != 24 || !std::equal(sig, sig + 8, h) || std::string(reinterpret_cast<char*>(h + 12), 4) != "IHDR")
    return {0, 0};
  auto be = [&](int o) { return uint32_t{h[o]} << 24 | uint32_t{h[o + 1]} << 16 | uint32_t{h[o + 2]} << 8 | h[o + 3]; };
  return {be(16), be(20)};
}

TEST_F(PlotMetrics, JsonLinesAndCsvBecomePngs) {
  if (!have_matplotlib()) GTEST_SKIP() << "python3 has no matplotlib";
  for (const char* name : {"run.jsonl", "run.csv"}) {
    write_log(path(name));
    const std::string png = path(std::string(name) + ".png");
    const Proc r = run("python3 " + kScript + " " + path(name) + " -o " + png);
    ASSERT_EQ(r.code, 0) << name << ": " << r.err;
    const auto [w, h] = png_size(png);
    EXPECT_EQ(w, 700u) << name;  // 7 in at 100 dpi
    EXPECT_GT(h, 500u) << name;  // four panels: loss, accuracy, lr, samples_per_s
  }
  // Default output name: the log's with .png; --x epoch.
  const Proc r = run("python3 " + kScript + " " + path("run.jsonl") + " --x epoch");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_GT(png_size(path("run.png")).first, 0u);
}

TEST_F(PlotMetrics, MissingMatplotlibIsAClearMessageAndExit1) {
  // A matplotlib that fails to import, first on the path.
  fs::create_directories(dir_ / "fake" / "matplotlib");
  std::ofstream(dir_ / "fake" / "matplotlib" / "__init__.py") << "raise ImportError('no matplotlib here')\n";
  write_log(path("run.jsonl"));
  const Proc r = run("PYTHONPATH=" + (dir_ / "fake").string() + " python3 " + kScript + " " + path("run.jsonl"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("matplotlib is not installed"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("pip install matplotlib"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(path("run.png")));
}

TEST_F(PlotMetrics, BadLogsExit2) {
  std::ofstream(path("bad.jsonl")) << "{\"step\": 1, \"loss\": 0.5}\nnot json\n";
  std::ofstream(path("empty.csv")) << "";
  std::ofstream(path("x.txt")) << "step,loss\n1,2\n";
  std::ofstream(path("novals.jsonl")) << "{\"step\": 1, \"epoch\": 0}\n";
  for (const char* name : {"bad.jsonl", "empty.csv", "x.txt", "novals.jsonl", "missing.jsonl"}) {
    const Proc r = run("python3 " + kScript + " " + path(name));
    EXPECT_EQ(r.code, 2) << name << ": " << r.err;
    EXPECT_NE(r.err.find("plot_metrics: "), std::string::npos) << name << ": " << r.err;
  }
}

}  // namespace
