// tg::data::ProgressBar (data/progress_bar.h) with a fake clock: the exact lines of the plain
// (non-terminal) mode, the in-place redraw of the terminal mode, ETA and it/s arithmetic, and the
// duration format.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.h>

namespace {

using tg::data::ProgressBar;

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

TEST(ProgressBar, PlainLinesEveryNStepsWithRateLossAndEta) {
  std::ostringstream os;
  double t = 100.0;
  ProgressBar bar(10, {.num_epochs = 3, .out = &os, .tty = false, .print_every = 5, .width = 10,
                       .clock = [&] { return t; }});
  EXPECT_FALSE(bar.is_tty());
  bar.start_epoch(0);
  for (int i = 1; i <= 10; ++i) {
    t += 0.5;
    bar.update(static_cast<double>(i));
  }
  bar.finish();
  bar.finish();  // idempotent
  EXPECT_EQ(lines(os.str()), (std::vector<std::string>{
                                 "epoch 1/3 [=====>    ] 5/10 2.0 it/s loss 3.0000 ETA 00:03",
                                 "epoch 1/3 [==========] 10/10 2.0 it/s loss 5.5000 ETA 00:00",
                             }));
  EXPECT_DOUBLE_EQ(bar.mean_loss(), 5.5);
  EXPECT_DOUBLE_EQ(bar.rate(), 2.0);
  EXPECT_EQ(bar.step(), 10);
  // The next epoch starts over; finish() prints the state an update did not.
  os.str("");
  bar.start_epoch(1);
  EXPECT_TRUE(std::isnan(bar.mean_loss()));
  t += 4.0;
  bar.update(0.25, 3);
  bar.finish();
  EXPECT_EQ(lines(os.str()), (std::vector<std::string>{"epoch 2/3 [===>      ] 3/10 0.8 it/s loss 0.2500 ETA 00:09"}));
}

TEST(ProgressBar, TerminalModeRedrawsInPlace) {
  std::ostringstream os;
  double t = 0.0;
  ProgressBar bar(4, {.out = &os, .tty = true, .width = 4, .clock = [&] { return t; }});
  bar.start_epoch(0);
  t = 1.0;
  bar.update(10.0);
  t = 2.0;
  bar.update(-8.0);  // mean 1.0: the line is one character shorter and is padded over
  const std::string s = os.str();
  EXPECT_EQ(s.find('\n'), std::string::npos) << s;
  EXPECT_EQ(s, "\repoch 1 [=>  ] 1/4 1.0 it/s loss 10.0000 ETA 00:03"
               "\repoch 1 [==> ] 2/4 1.0 it/s loss 1.0000 ETA 00:02 ");
  bar.update();
  bar.update();
  bar.finish();
  EXPECT_EQ(os.str().substr(s.size()), "\repoch 1 [===>] 3/4 1.5 it/s loss 1.0000 ETA 00:01"
                                      "\repoch 1 [====] 4/4 2.0 it/s loss 1.0000 ETA 00:00"
                                      "\repoch 1 [====] 4/4 2.0 it/s loss 1.0000 ETA 00:00\n");
}

TEST(ProgressBar, UnknownTotalAndNoBar) {
  std::ostringstream os;
  double t = 0.0;
  ProgressBar bar(0, {.out = &os, .print_every = 2, .width = 0, .clock = [&] { return t; }});
  bar.start_epoch(4);
  t = 1.0;
  bar.update();
  bar.update();
  EXPECT_EQ(os.str(), "epoch 5 2 2.0 it/s\n");
  EXPECT_EQ(bar.line().find("ETA"), std::string::npos);
}

TEST(ProgressBar, SamplesPerSecondFromBatchSizeAndShortLastBatch) {
  std::ostringstream os;
  double t = 0.0;
  ProgressBar bar(3, {.out = &os, .tty = false, .print_every = 1, .width = 0, .clock = [&] { return t; },
                      .batch_size = 64});
  bar.start_epoch(0);
  t = 0.5;
  bar.update(2.0);  // 64 samples in 0.5 s
  t = 1.0;
  bar.update(1.0);  // 128 in 1 s
  t = 2.0;
  bar.update(0.0, 1, 32);  // a short last batch: 160 samples in 2 s
  EXPECT_DOUBLE_EQ(bar.samples_rate(), 80.0);
  EXPECT_EQ(lines(os.str()), (std::vector<std::string>{
                                 "epoch 1 1/3 2.0 it/s 128 samples/s loss 2.0000 ETA 00:01",
                                 "epoch 1 2/3 2.0 it/s 128 samples/s loss 1.5000 ETA 00:01",
                                 "epoch 1 3/3 1.5 it/s 80 samples/s loss 1.0000 ETA 00:00",
                             }));
  bar.start_epoch(1);  // the count restarts with the epoch
  t = 4.0;
  bar.update();
  EXPECT_DOUBLE_EQ(bar.samples_rate(), 32.0);
  // Without batch_size, a sample count given to update() turns samples/s on.
  ProgressBar plain(2, {.out = &os, .tty = false, .clock = [&] { return t; }});
  plain.start_epoch(0);
  EXPECT_EQ(plain.line().find("samples/s"), std::string::npos);
  t = 5.0;
  plain.update(std::nullopt, 1, 10);
  EXPECT_NE(plain.line().find(" 10 samples/s"), std::string::npos) << plain.line();
  EXPECT_THROW(plain.update(std::nullopt, 1, -2), tg::Error);
  EXPECT_THROW(ProgressBar(3, {.batch_size = -1}), tg::Error);
}

// ---- issue 18: the rate's unit (tokens for a language model)
TEST(ProgressBar, SampleUnitNamesTheRate) {
  std::ostringstream os;
  double t = 0.0;
  ProgressBar bar(2, {.out = &os, .tty = false, .width = 0, .clock = [&] { return t; }, .batch_size = 4096,
                      .sample_unit = "tok"});
  bar.start_epoch(0);
  t = 0.25;
  bar.update(3.0);
  EXPECT_EQ(bar.line(), "epoch 1 1/2 4.0 it/s 16384 tok/s loss 3.0000 ETA 00:00");
}

TEST(ProgressBar, DurationFormatAndBadArguments) {
  EXPECT_EQ(tg::data::format_duration(0), "00:00");
  EXPECT_EQ(tg::data::format_duration(59.4), "00:59");
  EXPECT_EQ(tg::data::format_duration(61), "01:01");
  EXPECT_EQ(tg::data::format_duration(3725), "1:02:05");
  EXPECT_EQ(tg::data::format_duration(-1), "--:--");
  EXPECT_EQ(tg::data::format_duration(std::nan("")), "--:--");
  EXPECT_THROW(ProgressBar(-1), tg::Error);
  EXPECT_THROW(ProgressBar(3, {.print_every = -2}), tg::Error);
  std::ostringstream os;
  ProgressBar bar(3, {.out = &os});
  EXPECT_THROW(bar.update(1.0, -1), tg::Error);
}

}  // namespace
