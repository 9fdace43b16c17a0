// Run-time compiled kernels (rtc_internal.h): the caches. In memory for the process, by key;
// on disk so that a new process skips NVRTC.
//
// Disk cache file: magic, key, lowered kernel name, image kind, image, then an
// FNV-1a checksum of all of it (the format: core/backend/rtc_host.h). The full key is
// stored and compared, so a hash collision or a truncated / corrupt file only costs a
// recompile. Files are written to a temporary name and renamed, so readers never see
// half a file.
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include <tapegrad/core/backend/cuda/rtc_internal.h>
#include <tapegrad/core/backend/rtc_host.h>

namespace tg::cuda {

namespace rtc {

namespace {

using rtc_host::fnv1a;

std::string hex64(uint64_t v) {
  static const char* const kDigits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[i] = kDigits[v & 15];
  return s;
}

}  // namespace

std::mutex& cache_mutex() {
  static std::mutex mu;
  return mu;
}
std::unordered_map<std::string, std::shared_ptr<CompiledKernel>>& memory_cache() {
  static std::unordered_map<std::string, std::shared_ptr<CompiledKernel>> cache;
  return cache;
}

bool disk_cache_enabled() {
  const char* off = std::getenv("TG_RTC_NO_DISK_CACHE");
  return !(off && *off && std::string(off) != "0");
}

std::string cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/tapegrad";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/tapegrad";
  return "";
}

std::string cache_path(const std::string& dir, const std::string& key) {
  return dir + "/rtc-" + hex64(fnv1a(key.data(), key.size())) +
         hex64(fnv1a(key.data(), key.size(), 0x84222325cbf29ce4ULL)) + ".bin";
}

// ---- disk cache (the format: core/backend/rtc_host.h)

// The cached kernel for `key`, or nothing when the file is missing, foreign or damaged.
std::shared_ptr<CompiledKernel> read_cache(const std::string& path, const std::string& key) {
  std::optional<rtc_host::CacheEntry> e = rtc_host::read_cache_file(path, key);
  if (!e) return nullptr;
  auto k = std::make_shared<CompiledKernel>();
  k->key = std::move(e->key);
  k->lowered_name = std::move(e->lowered_name);
  k->image = std::move(e->image);
  k->is_cubin = e->is_cubin;
  return k;
}

void write_cache(const std::string& dir, const std::string& path, const CompiledKernel& k) {
  const std::string buf = rtc_host::encode_cache_entry({k.key, k.lowered_name, k.image, k.is_cubin});
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = tg::detail::str_cat(path, ".tmp.", ::getpid(), ".", counter++);
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return;  // a read-only or missing cache directory only costs recompiles
    f.write(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (!f.good()) {
      f.close();
      std::filesystem::remove(tmp, ec);
      return;
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

}  // namespace rtc

// ---- test hooks

void detail::rtc_clear_memory_cache() {
  std::lock_guard<std::mutex> lock(rtc::cache_mutex());
  rtc::memory_cache().clear();
}
std::string detail::rtc_cache_dir() { return rtc::disk_cache_enabled() ? rtc::cache_dir() : ""; }

}  // namespace tg::cuda
