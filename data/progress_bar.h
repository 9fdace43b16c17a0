// A training progress bar: epoch, step/total, a bar, it/s (and samples/s when told the batch
// size), the epoch's mean loss and the ETA on one line. On a terminal the line is redrawn in place
// ('\r'); into a file or a pipe (or any std::ostream the caller passes) it prints plain lines every
// `print_every` steps, so a log stays readable. The clock can be replaced, which makes the output
// exactly testable.
//
//   tg::data::ProgressBar bar(loader.size(), {.num_epochs = 30});
//   for (int e = 0; e < 30; ++e) {
//     bar.start_epoch(e);
//     for (auto [x, y] : loader) { ...; bar.update(loss.item<double>()); }
//     bar.finish();            // ends the line; bar.mean_loss() is the epoch's mean loss
//   }
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>

namespace tg::data {

struct ProgressBarOptions {
  int64_t num_epochs = 0;           // shown as "epoch e/num_epochs" (0: "epoch e")
  std::ostream* out = nullptr;      // default std::cout
  std::optional<bool> tty;          // redraw in place; default: `out` is std::cout and stdout is a terminal
  int64_t print_every = 0;          // plain-line mode: a line every this many steps (0: ten per epoch)
  int width = 24;                   // characters inside the bar's brackets (0: no bar)
  std::function<double()> clock;    // seconds, monotonic; default std::chrono::steady_clock
  int64_t batch_size = 0;           // samples per step: > 0 shows samples/s (update's `samples` overrides)
  std::string sample_unit = "samples";  // issue 18: the rate's name, e.g. "tok" for " 5120 tok/s"
};

class ProgressBar {
 public:
  // `total`: steps in one epoch (the bar's 100%); must be >= 0 (0: unknown, no bar or ETA).
  explicit ProgressBar(int64_t total, ProgressBarOptions options = {});

  // Starts epoch `epoch` (0-based, shown 1-based): steps, loss and timer restart.
  void start_epoch(int64_t epoch);
  // One (or `steps`) steps done, with this step's loss (nullopt: no loss to add) and the samples
  // they held (-1: steps * batch_size; e.g. a short last batch passes its size). Draws the line
  // when it is due (every step on a terminal, every print_every steps otherwise, always at the last).
  // Passing samples >= 0 once turns samples/s on for the bar.
  void update(std::optional<double> loss = std::nullopt, int64_t steps = 1, int64_t samples = -1);
  // Ends the epoch's line: on a terminal the final state and a newline; otherwise a last line
  // unless the last update already printed it. Idempotent.
  void finish();

  // The current line's text (without '\r' or '\n').
  std::string line() const;
  int64_t step() const { return step_; }
  int64_t total() const { return total_; }
  // The mean of the losses given this epoch (NaN before the first).
  double mean_loss() const;
  // Steps per second this epoch (0 before any time has passed).
  double rate() const;
  // Samples per second this epoch (0 before any time has passed or without sample counts).
  double samples_rate() const;
  bool is_tty() const { return tty_; }

 private:
  void draw(bool final);
  double now() const;

  int64_t total_;
  ProgressBarOptions opt_;
  std::ostream* out_;
  bool tty_;
  int64_t epoch_ = 0, step_ = 0, loss_count_ = 0, last_printed_ = 0;  // last_printed_: the step last drawn
  int64_t samples_ = 0;
  bool show_samples_ = false;
  double loss_sum_ = 0, start_ = 0;
  size_t last_len_ = 0;
  bool finished_ = false;
};

// "mm:ss", or "h:mm:ss" from an hour on; "--:--" for a negative or non-finite time.
std::string format_duration(double seconds);

}  // namespace tg::data
