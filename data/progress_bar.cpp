// The training progress bar (progress_bar.h).
#include <tapegrad/data/progress_bar.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>

#include <tapegrad/core/error.h>

namespace tg::data {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%02lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  return buf;
}

ProgressBar::ProgressBar(int64_t total, ProgressBarOptions options) : total_(total), opt_(std::move(options)) {
  TG_CHECK(total >= 0, "ProgressBar: total must be >= 0, got ", total);
  TG_CHECK(opt_.print_every >= 0 && opt_.width >= 0 && opt_.batch_size >= 0,
           "ProgressBar: print_every, width and batch_size must be >= 0, got ", opt_.print_every, ", ", opt_.width,
           " and ", opt_.batch_size);
  show_samples_ = opt_.batch_size > 0;
  out_ = opt_.out != nullptr ? opt_.out : &std::cout;
  tty_ = opt_.tty.value_or(opt_.out == nullptr && ::isatty(STDOUT_FILENO) != 0);
  if (opt_.print_every == 0) opt_.print_every = std::max<int64_t>(1, total_ / 10);
  start_ = now();
}

double ProgressBar::now() const {
  if (opt_.clock) return opt_.clock();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void ProgressBar::start_epoch(int64_t epoch) {
  epoch_ = epoch;
  step_ = loss_count_ = samples_ = 0;
  loss_sum_ = 0;
  last_printed_ = 0;
  last_len_ = 0;
  finished_ = false;
  start_ = now();
}

double ProgressBar::mean_loss() const {
  return loss_count_ > 0 ? loss_sum_ / static_cast<double>(loss_count_) : std::numeric_limits<double>::quiet_NaN();
}

double ProgressBar::rate() const {
  const double dt = now() - start_;
  return dt > 0 ? static_cast<double>(step_) / dt : 0.0;
}

double ProgressBar::samples_rate() const {
  const double dt = now() - start_;
  return dt > 0 ? static_cast<double>(samples_) / dt : 0.0;
}

std::string ProgressBar::line() const {
  std::string s = "epoch " + std::to_string(epoch_ + 1);
  if (opt_.num_epochs > 0) s += "/" + std::to_string(opt_.num_epochs);
  if (total_ > 0 && opt_.width > 0) {
    const int64_t shown = std::min(step_, total_);
    const auto filled = static_cast<int>(shown * opt_.width / total_);
    s += " [" + std::string(static_cast<size_t>(filled), '=');
    if (filled < opt_.width) s += '>' + std::string(static_cast<size_t>(opt_.width - filled - 1), ' ');
    s += "]";
  }
  s += " " + std::to_string(step_);
  if (total_ > 0) s += "/" + std::to_string(total_);
  char buf[64];
  const double r = rate();
  std::snprintf(buf, sizeof buf, " %.1f it/s", r);
  s += buf;
  if (show_samples_) {
    std::snprintf(buf, sizeof buf, " %.0f ", samples_rate());
    s += buf + opt_.sample_unit + "/s";
  }
  if (loss_count_ > 0) {
    std::snprintf(buf, sizeof buf, " loss %.4f", mean_loss());
    s += buf;
  }
  if (total_ > 0) {
    const double eta = step_ >= total_ ? 0.0 : r > 0 ? static_cast<double>(total_ - step_) / r : -1.0;
    s += " ETA " + format_duration(eta);
  }
  return s;
}

void ProgressBar::update(std::optional<double> loss, int64_t steps, int64_t samples) {
  TG_CHECK(steps >= 0, "ProgressBar::update: steps must be >= 0, got ", steps);
  TG_CHECK(samples >= -1, "ProgressBar::update: samples must be >= 0 (or -1: steps * batch_size), got ", samples);
  step_ += steps;
  if (samples >= 0) show_samples_ = true;
  samples_ += samples >= 0 ? samples : steps * opt_.batch_size;
  if (loss) {
    loss_sum_ += *loss;
    ++loss_count_;
  }
  finished_ = false;
  const bool last = total_ > 0 && step_ >= total_;
  if (tty_ || last || step_ - last_printed_ >= opt_.print_every) draw(false);
}

void ProgressBar::draw(bool final) {
  const std::string s = line();
  if (tty_) {
    // Redraw in place; pad over what a longer previous line left behind.
    *out_ << '\r' << s;
    if (s.size() < last_len_) *out_ << std::string(last_len_ - s.size(), ' ');
    last_len_ = s.size();
    if (final) *out_ << '\n';
  } else {
    *out_ << s << '\n';
  }
  out_->flush();
  last_printed_ = step_;
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (tty_) draw(true);
  else if (last_printed_ != step_) draw(true);  // the last update did not print the final state
}

}  // namespace tg::data
