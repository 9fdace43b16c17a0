// The RawKernel disk-cache file reader (core/backend/rtc_host.h, shared by the CUDA build's
// core/backend/cuda/rtc_cache.cpp): a file's bytes read for a fixed key. A decoded entry must
// encode to bytes that decode to the same entry.
#include "common.h"
#include <tapegrad/core/backend/rtc_host.h>

namespace rh = tg::cuda::rtc_host;
using tg_fuzz::kTgFuzzRtcKey;

namespace {
// An entry encodes to bytes that decode to the same entry.
void check_round_trip(const rh::CacheEntry& e) {
  auto again = rh::decode_cache_entry(rh::encode_cache_entry(e), e.key);
  if (!again || again->key != e.key || again->lowered_name != e.lowered_name || again->image != e.image ||
      again->is_cubin != e.is_cubin)
    abort();
}
}  // namespace

TG_FUZZ_TARGET {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  std::optional<rh::CacheEntry> e = rh::decode_cache_entry(bytes, kTgFuzzRtcKey);
  if (e) {
    if (e->key != kTgFuzzRtcKey || e->image.empty()) abort();
    check_round_trip(*e);
  }
  // The same through the file reader, with the key the file claims (when it has one) too.
  const auto path = tg_fuzz::scratch_dir() / "rtc.bin";
  tg_fuzz::write_file(path, bytes);
  std::optional<rh::CacheEntry> f = rh::read_cache_file(path.string(), kTgFuzzRtcKey);
  if (f.has_value() != e.has_value()) abort();
  if (bytes.size() >= 16) {
    uint64_t n = 0;
    std::memcpy(&n, bytes.data() + 8, 8);
    if (n <= bytes.size() - 16) {
      const std::string claimed = bytes.substr(16, n);
      if (auto g = rh::decode_cache_entry(bytes, claimed)) check_round_trip(*g);
    }
  }
  (void)rh::read_cache_file((tg_fuzz::scratch_dir() / "missing.bin").string(), kTgFuzzRtcKey);
  return 0;
}
