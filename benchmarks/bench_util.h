// Helpers shared by the benchmark programs: the median of repeated timings and the
// one-JSON-line-per-workload output that compare_torch.py reads.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <string>
#include <vector>

namespace tg::bench {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Repeats count and filter from the command line: --reps N, --only SUBSTRING.
struct Options {
  int warmup = 3;
  int reps = 15;
  std::string only;
  bool wants(const std::string& workload) const { return only.empty() || workload.find(only) != std::string::npos; }
};

inline Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      o.reps = std::max(10, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--warmup") && i + 1 < argc)
      o.warmup = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc)
      o.only = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--reps N>=10] [--warmup N] [--only SUBSTRING]\n", argv[0]);
      std::exit(2);
    }
  }
  return o;
}

// {"workload": ..., "value": ..., "unit": ..., "ms": <median time>, <extra>}
inline void emit(const std::string& workload, double value, const char* unit, double ms,
                 const std::string& extra = "") {
  std::printf("{\"workload\": \"%s\", \"value\": %.6g, \"unit\": \"%s\", \"ms\": %.6g%s%s}\n", workload.c_str(), value,
              unit, ms, extra.empty() ? "" : ", ", extra.c_str());
  std::fflush(stdout);
}

// n pseudo-random bytes (a fixed LCG: the same images in every program and run), e.g. the pixels of
// the DataLoader benchmarks' uint8 images.
inline std::vector<uint8_t> random_bytes(size_t n) {
  std::vector<uint8_t> px(n);
  uint32_t state = 12345;
  for (uint8_t& p : px) p = static_cast<uint8_t>((state = state * 1664525u + 1013904223u) >> 24);
  return px;
}

}  // namespace tg::bench
