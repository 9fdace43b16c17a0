// The training-metrics log (metrics_log.h).
#include <tapegrad/data/metrics_log.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>

#include <tapegrad/core/error.h>
#include <tapegrad/core/file_io.h>

namespace tg::data {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The shortest text that reads back to `v`; nan / inf / -inf for the non-finite.
std::string csv_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::vector<std::string> split_csv_header(const std::string& line) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = line.find(',', start);
    out.push_back(line.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace

MetricsFormat metrics_format_for(const std::string& path) {
  if (ends_with(path, ".jsonl") || ends_with(path, ".ndjson")) return MetricsFormat::JsonLines;
  if (ends_with(path, ".csv")) return MetricsFormat::Csv;
  TG_ERROR("MetricsLog('", path, "'): unknown format: the name must end in .jsonl, .ndjson or .csv");
}

struct MetricsLog::Impl {
  std::string path;
  MetricsLogOptions opt;
  MetricsFormat format;
  std::optional<detail::File> file;
  std::vector<std::string> columns;  // CSV: the header's fields once known
  bool header_written = false;
  double t0 = 0;
  int64_t records = 0;
};

MetricsLog::MetricsLog(std::string path, MetricsLogOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = std::move(path);
  m.opt = std::move(options);
  m.format = metrics_format_for(m.path);
  TG_CHECK(!(m.opt.overwrite && m.opt.append), "MetricsLog('", m.path, "'): overwrite and append exclude each other");
  int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC;
  if (m.opt.overwrite)
    flags |= O_TRUNC;
  else if (!m.opt.append)
    flags |= O_EXCL;
  const int fd = ::open(m.path.c_str(), flags, 0644);
  if (fd < 0 && errno == EEXIST)
    TG_ERROR("MetricsLog('", m.path, "'): the file exists; pass overwrite = true to replace it or append = true ",
             "to continue it");
  TG_CHECK(fd >= 0, "MetricsLog('", m.path, "'): cannot open for writing: ", detail::errno_str());
  m.file.emplace(fd);
  if (m.format == MetricsFormat::Csv) {
    // Appending to a CSV that has a header: its columns are this log's.
    const uint64_t size = detail::file_size(fd, m.path, "MetricsLog");
    if (m.opt.append && size > 0) {
      const detail::File rd = detail::open_for_reading(m.path, "MetricsLog");
      std::string head(static_cast<size_t>(std::min<uint64_t>(size, 1 << 16)), '\0');
      detail::read_all(rd.get(), head.data(), head.size(), 0, m.path, "the CSV header", "MetricsLog");
      const size_t nl = head.find('\n');
      TG_CHECK(nl != std::string::npos, "MetricsLog('", m.path, "'): no complete CSV header line to append under");
      std::string line = head.substr(0, nl);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      m.columns = split_csv_header(line);
      TG_CHECK(m.columns.size() >= 2 && m.columns[0] == "step" && m.columns[1] == "epoch", "MetricsLog('", m.path,
               "'): the CSV header must start with step,epoch, got '", line, "'");
      TG_CHECK(!m.opt.time || (m.columns.size() >= 3 && m.columns[2] == "time"), "MetricsLog('", m.path,
               "'): time is on but the CSV header has no time column after step,epoch: '", line, "'");
      if (!m.opt.columns.empty()) {
        const std::vector<std::string> named(m.columns.begin() + (m.opt.time ? 3 : 2), m.columns.end());
        TG_CHECK(named == m.opt.columns, "MetricsLog('", m.path, "'): the CSV's header '", line,
                 "' does not hold the columns asked for");
      }
      m.header_written = true;
    } else if (!m.opt.columns.empty()) {
      m.columns = {"step", "epoch"};
      if (m.opt.time) m.columns.emplace_back("time");
      m.columns.insert(m.columns.end(), m.opt.columns.begin(), m.opt.columns.end());
    }
  }
  m.t0 = now_s();
}

MetricsLog::~MetricsLog() { close(); }
MetricsLog::MetricsLog(MetricsLog&&) noexcept = default;
MetricsLog& MetricsLog::operator=(MetricsLog&&) noexcept = default;

void MetricsLog::close() {
  if (impl_) impl_->file.reset();
}

const std::string& MetricsLog::path() const {
  TG_CHECK(impl_ != nullptr, "MetricsLog: use of a moved-from log");
  return impl_->path;
}

MetricsFormat MetricsLog::format() const {
  TG_CHECK(impl_ != nullptr, "MetricsLog: use of a moved-from log");
  return impl_->format;
}

const std::vector<std::string>& MetricsLog::columns() const {
  TG_CHECK(impl_ != nullptr, "MetricsLog: use of a moved-from log");
  return impl_->columns;
}

int64_t MetricsLog::records() const { return impl_ ? impl_->records : 0; }

void MetricsLog::log(int64_t step, int64_t epoch, const std::vector<std::pair<std::string, double>>& values) {
  TG_CHECK(impl_ != nullptr, "MetricsLog::log: use of a moved-from log");
  Impl& m = *impl_;
  TG_CHECK(m.file.has_value(), "MetricsLog::log('", m.path, "'): the log is closed");
  const bool csv = m.format == MetricsFormat::Csv;
  for (size_t i = 0; i < values.size(); ++i) {
    const std::string& k = values[i].first;
    TG_CHECK(!k.empty(), "MetricsLog::log('", m.path, "'): a value has an empty name");
    TG_CHECK(k != "step" && k != "epoch" && !(m.opt.time && k == "time"), "MetricsLog::log('", m.path, "'): '", k,
             "' is a reserved name (step, epoch", m.opt.time ? ", time" : "", ")");
    TG_CHECK(!csv || k.find_first_of(",\"\r\n") == std::string::npos, "MetricsLog::log('", m.path, "'): the CSV ",
             "column name '", k, "' holds a comma, quote or line break");
    for (size_t j = 0; j < i; ++j)
      TG_CHECK(values[j].first != k, "MetricsLog::log('", m.path, "'): '", k, "' is given twice");
  }
  const double t = now_s() - m.t0;
  std::string text;
  if (!csv) {
    nlohmann::ordered_json rec;
    rec["step"] = step;
    rec["epoch"] = epoch;
    if (m.opt.time) rec["time"] = t;
    for (const auto& [k, v] : values) rec[k] = v;  // a non-finite double dumps as null
    text = rec.dump() + "\n";
  } else {
    if (m.columns.empty()) {
      m.columns = {"step", "epoch"};
      if (m.opt.time) m.columns.emplace_back("time");
      for (const auto& kv : values) m.columns.push_back(kv.first);
    }
    // Every name must be a column; cells in the header's order, empty where no value was given.
    const size_t fixed = m.opt.time ? 3 : 2;
    std::vector<const double*> cell(m.columns.size(), nullptr);
    for (const auto& kv : values) {
      const auto it = std::find(m.columns.begin() + static_cast<std::ptrdiff_t>(fixed), m.columns.end(), kv.first);
      if (it == m.columns.end()) {
        std::string header;
        for (const auto& c : m.columns) header += (header.empty() ? "" : ",") + c;
        TG_ERROR("MetricsLog::log('", m.path, "'): '", kv.first, "' is not a column of this CSV (", header,
                 "); name every column in the first record or in MetricsLogOptions::columns");
      }
      cell[static_cast<size_t>(it - m.columns.begin())] = &kv.second;
    }
    if (!m.header_written) {
      for (size_t i = 0; i < m.columns.size(); ++i) text += (i ? "," : "") + m.columns[i];
      text += "\n";
    }
    text += std::to_string(step) + "," + std::to_string(epoch);
    if (m.opt.time) text += "," + csv_number(t);
    for (size_t i = fixed; i < m.columns.size(); ++i) text += "," + (cell[i] ? csv_number(*cell[i]) : std::string());
    text += "\n";
  }
  // One write per record (the header goes with the first): O_APPEND puts it whole at the end.
  detail::write_all(m.file->get(), text.data(), text.size(), m.path, "MetricsLog::log");
  m.header_written = true;
  ++m.records;
}

}  // namespace tg::data
