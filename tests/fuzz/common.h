// Shared pieces of the fuzz targets (tests/fuzz/fuzz_*.cpp). Each target feeds bytes to one
// untrusted-input surface through the public API. The correct answer to bad bytes is a
// tg::Error: it is caught here; anything else (a crash, a sanitizer report, any other
// exception such as std::bad_alloc or a nlohmann::json exception) escapes to libFuzzer,
// which reports it. Inputs are bounded by libFuzzer's -max_len, -timeout and -rss_limit_mb.
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <tapegrad/tapegrad.h>
#include <vector>

namespace tg_fuzz {

// A folder of this process's own under the temp dir, made once and kept for the run.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("tg_fuzz." + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

inline void write_file(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) abort();  // the harness's own failure, not the library's
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Runs f; a tg::Error is the library rejecting the input, which is fine.
template <class F>
bool accepts(F&& f) {
  try {
    f();
    return true;
  } catch (const tg::Error&) {
    return false;
  }
}

// The fuzz input written as a safetensors file named `name` and loaded into `out`; false when
// tg::load rejects it.
inline bool load_safetensors(const uint8_t* data, size_t size, const char* name, tg::nn::StateDict& out) {
  const auto path = scratch_dir() / name;
  write_file(path, {reinterpret_cast<const char*>(data), size});
  return accepts([&] { out = tg::load(path.string()); });
}

// Reads fixed-size values off the front of the fuzz input; zeros once it runs out.
struct Bytes {
  const uint8_t* p;
  size_t n;
  template <class T>
  T get() {
    T v{};
    const size_t k = n < sizeof(T) ? n : sizeof(T);
    std::memcpy(&v, p, k);
    p += k;
    n -= k;
    return v;
  }
  std::string_view rest() const { return {reinterpret_cast<const char*>(p), n}; }
};

// fuzz_exported_program: graph.json, this, then weights.safetensors.
inline constexpr std::string_view kWeightsSeparator = "\n#tg-weights#\n";

// fuzz_rtc_cache: the key its files are read for (as RawKernel's make_key spells one).
inline constexpr const char kTgFuzzRtcKey[] =
    "tapegrad-rtc 1\nnvrtc 12.4\narch sm_90\nname add_one\noptions\nsource\n"
    "extern \"C\" __global__ void add_one(float* x) { x[threadIdx.x] += 1; }";

// A numel bounded for the harness: sizes multiply with saturation at INT64_MAX.
inline int64_t saturating_numel(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) {
    if (s < 0) return -1;
    if (s == 0) return 0;
    n = n > INT64_MAX / s ? INT64_MAX : n * s;
  }
  return n;
}

}  // namespace tg_fuzz

// The corpus a target writes its seeds with (tests/fuzz/seeds.cpp): one file per seed.
#define TG_FUZZ_TARGET extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
