// A training-metrics log: one record per log() call, step, epoch and any named doubles (loss, lr,
// accuracy, samples/s, ...), as JSON lines (".jsonl", ".ndjson") or CSV (".csv"), chosen by the
// file's extension. Each record is one write(2) to a file opened with O_APPEND, so a run that
// crashes keeps every line it logged, and a reader (scripts/plot_metrics.py) can follow it live.
//
//   tg::data::MetricsLog log("run1/metrics.jsonl");             // refuses an existing file
//   log.log(step, epoch, {{"loss", 0.31}, {"lr", 1e-3}});
//   // {"step":120,"epoch":2,"time":4.52,"loss":0.31,"lr":0.001}
//
// JSON lines: one object per line, keys in the order given; a non-finite value is null. CSV: a
// header "step,epoch[,time],names..." fixed by the first record (or by `columns`), a later name
// not in it is an error, a name left out is an empty cell; non-finite values are nan / inf / -inf.
// Numbers are written in the shortest form that reads back to the same double.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tg::data {

enum class MetricsFormat { JsonLines, Csv };

struct MetricsLogOptions {
  bool overwrite = false;            // an existing file is truncated (otherwise it is an error)
  bool append = false;               // an existing file is continued (CSV: its header gives the columns)
  bool time = true;                  // a "time" field: seconds since the log was opened (steady clock)
  std::vector<std::string> columns;  // CSV: the named columns up front (default: the first record's names)
};

class MetricsLog {
 public:
  // Opens `path` (".jsonl"/".ndjson": JSON lines, ".csv": CSV; anything else is an error). The file
  // must not exist unless `overwrite` or `append` says what to do with it.
  explicit MetricsLog(std::string path, MetricsLogOptions options = {});
  ~MetricsLog();
  MetricsLog(MetricsLog&&) noexcept;
  MetricsLog& operator=(MetricsLog&&) noexcept;

  // One record. Names must be non-empty, distinct, and not "step", "epoch" or "time" (when time is on).
  void log(int64_t step, int64_t epoch, const std::vector<std::pair<std::string, double>>& values);
  // Closes the file (later log() calls are errors). Idempotent; the destructor calls it.
  void close();

  const std::string& path() const;
  MetricsFormat format() const;
  // The CSV header's fields (step, epoch, [time,] names); empty for JSON lines or before the first record.
  const std::vector<std::string>& columns() const;
  int64_t records() const;  // records written by this object

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The format a path's extension selects; a tg::Error for any other extension.
MetricsFormat metrics_format_for(const std::string& path);

}  // namespace tg::data
