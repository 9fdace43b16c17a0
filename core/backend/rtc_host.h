// The host-only parts of run-time compiled kernels (core/cuda_rtc.h): the RawKernel
// disk-cache file format and ElementwiseKernel's parameter-list parser. Pure C++ with
// no CUDA dependency, compiled in every build, so that tests and the CPU-only fuzz
// build (tests/fuzz) reach the code that reads untrusted bytes. Internal.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <tapegrad/core/dtype.h>

namespace tg::cuda::rtc_host {

uint64_t fnv1a(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ULL);

// ---- disk cache file: magic, key, lowered kernel name, image kind, image, then an
// FNV-1a checksum of all of it (every integer a little-endian u64, strings length-prefixed).
struct CacheEntry {
  std::string key;
  std::string lowered_name;  // the symbol to look up (mangled for C++ names)
  std::string image;         // CUBIN, or PTX text
  bool is_cubin = true;
};
std::string encode_cache_entry(const CacheEntry& e);
// The entry stored in `bytes` for `key`, or nothing when they are foreign, damaged,
// truncated or hold another key (a hash collision only costs a recompile).
std::optional<CacheEntry> decode_cache_entry(const std::string& bytes, const std::string& key);
// decode_cache_entry of a file's contents; nothing when the file cannot be read.
std::optional<CacheEntry> read_cache_file(const std::string& path, const std::string& key);

// ---- ElementwiseKernel's signature: "float x, raw double y, int64 n2"
struct Param {
  std::string type;   // as the generated source spells it
  std::string name;
  DType dtype;
  bool raw = false;   // "raw T name": the whole array, indexed by the body
};
bool is_identifier(const std::string& s);
// One list (`which` is "in_params" or "out_params", for messages); tg::Error on any problem.
std::vector<Param> parse_params(const std::string& list, const char* which, const std::string& kernel);
struct Signature {
  std::vector<Param> ins, outs;
};
// The kernel name and both lists, checked as ElementwiseKernel's constructor does: a C
// identifier, at least one input and one output, no name twice.
Signature parse_signature(const std::string& in_params, const std::string& out_params, const std::string& name);

}  // namespace tg::cuda::rtc_host
