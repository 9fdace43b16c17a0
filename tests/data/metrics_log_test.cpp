// tg::data::MetricsLog (data/metrics_log.h): what it writes is read back by real parsers (nlohmann
// JSON per line; the CSV split and converted here, and by Python's json and csv modules when python3
// is present), values round-trip exactly, non-finite values follow the documented spelling, an
// existing file is refused unless overwrite / append is asked, the lines survive the process (each
// record is written when logged), and bad names are errors naming the log and the name.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.h>

namespace {

namespace fs = std::filesystem;
using tg::data::MetricsLog;

class MetricsLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tg_metrics_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& n) const { return (dir_ / n).string(); }
  static std::vector<std::string> lines(const std::string& p) {
    std::ifstream in(p);
    std::vector<std::string> out;
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
  }
  static std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    for (std::string c; std::getline(ss, c, ',');) out.push_back(c);
    if (!s.empty() && s.back() == ',') out.emplace_back();
    return out;
  }
  static bool have_python() { return std::system("python3 -c 'import json, csv' >/dev/null 2>&1") == 0; }
  fs::path dir_;
};

TEST_F(MetricsLogTest, JsonLinesRoundTripInOrderWithTime) {
  const std::string p = path("run.jsonl");
  const double third = 1.0 / 3.0, tiny = 1.2345678901234567e-300;
  {
    MetricsLog log(p);
    EXPECT_EQ(log.format(), tg::data::MetricsFormat::JsonLines);
    log.log(10, 0, {{"loss", third}, {"lr", 1e-3}});
    // Written before the log is closed: a crash here keeps it.
    ASSERT_EQ(lines(p).size(), 1u);
    log.log(20, 1, {{"loss", tiny}, {"accuracy", 0.875}, {"samples/s", 12345.5}});
    log.log(
        30, 1,
        {{"loss", std::numeric_limits<double>::quiet_NaN()}, {"grad_norm", std::numeric_limits<double>::infinity()}});
    EXPECT_EQ(log.records(), 3);
  }
  const auto ls = lines(p);
  ASSERT_EQ(ls.size(), 3u);
  std::vector<nlohmann::ordered_json> r;
  for (const auto& l : ls) r.push_back(nlohmann::ordered_json::parse(l));
  EXPECT_EQ(r[0]["step"].get<int64_t>(), 10);
  EXPECT_EQ(r[0]["epoch"].get<int64_t>(), 0);
  EXPECT_EQ(r[0]["loss"].get<double>(), third);  // exact: the shortest round-trip form
  EXPECT_EQ(r[0]["lr"].get<double>(), 1e-3);
  EXPECT_EQ(r[1]["loss"].get<double>(), tiny);
  EXPECT_EQ(r[1]["accuracy"].get<double>(), 0.875);
  EXPECT_EQ(r[1]["samples/s"].get<double>(), 12345.5);
  EXPECT_TRUE(r[2]["loss"].is_null());  // JSON has no NaN / Inf
  EXPECT_TRUE(r[2]["grad_norm"].is_null());
  // Keys in the order given, after step, epoch and time.
  std::vector<std::string> keys;
  for (auto it = r[1].begin(); it != r[1].end(); ++it) keys.push_back(it.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"step", "epoch", "time", "loss", "accuracy", "samples/s"}));
  const double t0 = r[0]["time"].get<double>(), t2 = r[2]["time"].get<double>();
  EXPECT_GE(t0, 0.0);
  EXPECT_LE(t0, t2);
  EXPECT_LT(t2, 60.0);
  if (have_python()) {  // a second, independent JSON parser
    const std::string cmd =
        "python3 -c \"import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; "
        "assert r[0]['loss']==1/3 and r[1]['epoch']==1 and r[2]['loss'] is None, r\" " +
        p;
    EXPECT_EQ(std::system(cmd.c_str()), 0);
  }
}

TEST_F(MetricsLogTest, CsvHeaderFromFirstRecordEmptyCellsAndNonFinite) {
  const std::string p = path("run.csv");
  {
    MetricsLog log(p, {.time = false});
    EXPECT_EQ(log.format(), tg::data::MetricsFormat::Csv);
    log.log(1, 0, {{"loss", 0.1}, {"acc", 0.5}});
    EXPECT_EQ(log.columns(), (std::vector<std::string>{"step", "epoch", "loss", "acc"}));
    log.log(2, 0, {{"acc", 2.0 / 3.0}});  // loss left out: an empty cell
    log.log(-1, 3, {{"loss", -std::numeric_limits<double>::infinity()}, {"acc", std::nan("")}});
    try {
      log.log(3, 0, {{"lr", 0.1}});
      ADD_FAILURE() << "a name outside the header was accepted";
    } catch (const tg::Error& e) {
      EXPECT_NE(std::string(e.what()).find("'lr' is not a column of this CSV (step,epoch,loss,acc)"), std::string::npos)
          << e.what();
    }
  }
  const auto ls = lines(p);
  ASSERT_EQ(ls.size(), 4u);
  EXPECT_EQ(ls[0], "step,epoch,loss,acc");
  EXPECT_EQ(ls[1], "1,0,0.1,0.5");
  const auto c2 = split(ls[2]);
  ASSERT_EQ(c2.size(), 4u);
  EXPECT_EQ(c2[2], "");
  EXPECT_EQ(std::stod(c2[3]), 2.0 / 3.0);  // round-trips exactly
  EXPECT_EQ(ls[3], "-1,3,-inf,nan");
  if (have_python()) {
    const std::string cmd =
        "python3 -c \"import csv,sys,math; r=list(csv.DictReader(open(sys.argv[1]))); "
        "assert len(r)==3 and float(r[1]['acc'])==2/3 and r[1]['loss']=='' and "
        "float(r[2]['loss'])==-math.inf and math.isnan(float(r[2]['acc'])), r\" " +
        p;
    EXPECT_EQ(std::system(cmd.c_str()), 0);
  }
}

TEST_F(MetricsLogTest, CsvColumnsUpFrontAndAppendContinuesUnderTheHeader) {
  const std::string p = path("a.csv");
  {
    MetricsLog log(p, {.columns = {"loss", "lr"}});
    log.log(0, 0, {{"lr", 0.5}});
  }
  {
    MetricsLog log(p, {.append = true});
    EXPECT_EQ(log.columns(), (std::vector<std::string>{"step", "epoch", "time", "loss", "lr"}));
    log.log(1, 0, {{"loss", 2.5}});
  }
  try {
    MetricsLog other(p, {.append = true, .columns = {"lr", "loss"}});
    ADD_FAILURE() << "appended under a header with other columns";
  } catch (const tg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not hold the columns asked for"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(MetricsLog(p, {.append = true, .columns = {"loss", "lr"}}));
  const auto ls = lines(p);
  ASSERT_EQ(ls.size(), 3u);
  EXPECT_EQ(ls[0], "step,epoch,time,loss,lr");
  auto c1 = split(ls[1]), c2 = split(ls[2]);
  ASSERT_EQ(c1.size(), 5u);
  ASSERT_EQ(c2.size(), 5u);
  EXPECT_EQ(c1[0], "0");
  EXPECT_EQ(c1[3], "");
  EXPECT_EQ(std::stod(c1[4]), 0.5);
  EXPECT_GE(std::stod(c1[2]), 0.0);
  EXPECT_EQ(c2[0], "1");
  EXPECT_EQ(std::stod(c2[3]), 2.5);
  EXPECT_EQ(c2[4], "");
}

TEST_F(MetricsLogTest, RefusesAnExistingFileUnlessToldAndAppendsOrTruncates) {
  const std::string p = path("r.jsonl");
  { MetricsLog(p).log(1, 0, {{"loss", 1.0}}); }
  try {
    MetricsLog again(p);
    ADD_FAILURE() << "an existing log was reopened";
  } catch (const tg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("the file exists"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
  EXPECT_EQ(lines(p).size(), 1u);  // untouched
  { MetricsLog(p, {.append = true}).log(2, 0, {{"loss", 2.0}}); }
  ASSERT_EQ(lines(p).size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(lines(p)[1])["step"].get<int>(), 2);
  { MetricsLog(p, {.overwrite = true}).log(3, 0, {{"loss", 3.0}}); }
  ASSERT_EQ(lines(p).size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(lines(p)[0])["loss"].get<double>(), 3.0);
  EXPECT_THROW(MetricsLog(p, {.overwrite = true, .append = true}), tg::Error);
}

TEST_F(MetricsLogTest, LinesSurviveAProcessThatDiesWithoutClosing) {
  const std::string p = path("crash.jsonl");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    MetricsLog log(p, {.time = false});
    log.log(1, 0, {{"loss", 0.5}});
    log.log(2, 0, {{"loss", 0.25}});
    std::_Exit(3);  // no destructors, no close
  }
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 3);
  EXPECT_EQ(lines(p),
            (std::vector<std::string>{R"({"step":1,"epoch":0,"loss":0.5})", R"({"step":2,"epoch":0,"loss":0.25})"}));
}

TEST_F(MetricsLogTest, BadNamesFormatsAndUseAfterCloseAreErrors) {
  auto expect_error = [](auto&& fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error (wanted '" << needle << "')";
    } catch (const tg::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([&] { MetricsLog l(path("m.txt")); }, "must end in .jsonl, .ndjson or .csv");
  expect_error([&] { MetricsLog l(path("no/such/dir/m.jsonl")); }, "cannot open for writing");
  MetricsLog j(path("n.jsonl"));
  expect_error([&] { j.log(0, 0, {{"step", 1.0}}); }, "'step' is a reserved name");
  expect_error([&] { j.log(0, 0, {{"time", 1.0}}); }, "'time' is a reserved name");
  expect_error([&] { j.log(0, 0, {{"", 1.0}}); }, "empty name");
  expect_error([&] { j.log(0, 0, {{"loss", 1.0}, {"loss", 2.0}}); }, "'loss' is given twice");
  MetricsLog c(path("n.csv"));
  expect_error([&] { c.log(0, 0, {{"a,b", 1.0}}); }, "holds a comma");
  c.close();
  c.close();  // idempotent
  expect_error([&] { c.log(0, 0, {{"x", 1.0}}); }, "the log is closed");
  EXPECT_EQ(lines(path("n.csv")).size(), 0u);  // nothing was written by the failed calls
  MetricsLog moved(std::move(j));
  moved.log(5, 1, {{"x", 1.0}});
  EXPECT_EQ(lines(path("n.jsonl")).size(), 1u);
}

}  // namespace
