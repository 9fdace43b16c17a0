// The host-only parts of run-time compiled kernels (core/backend/rtc_host.h), moved out of
// core/backend/cuda/nvrtc.cpp (now core/backend/cuda/rtc_*.cpp, raw_kernel.cpp,
// elementwise_kernel.cpp) unchanged so that every build compiles them.
#include <tapegrad/core/backend/rtc_host.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <utility>

#include <tapegrad/core/error.h>

namespace tg::cuda::rtc_host {

uint64_t fnv1a(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

// ---- disk cache

namespace {

constexpr char kMagic[8] = {'T', 'G', 'R', 'T', 'C', '0', '0', '1'};

void put_u64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); }
void put_str(std::string& out, const std::string& s) {
  put_u64(out, s.size());
  out += s;
}

struct Reader {
  const std::string& buf;
  size_t pos = 0;
  bool get_u64(uint64_t* v) {
    if (buf.size() - pos < sizeof(*v)) return false;
    std::memcpy(v, buf.data() + pos, sizeof(*v));
    pos += sizeof(*v);
    return true;
  }
  bool get_str(std::string* s) {
    uint64_t n = 0;
    if (!get_u64(&n) || buf.size() - pos < n) return false;
    s->assign(buf.data() + pos, n);
    pos += n;
    return true;
  }
};

}  // namespace

std::string encode_cache_entry(const CacheEntry& e) {
  std::string buf(kMagic, sizeof(kMagic));
  put_str(buf, e.key);
  put_str(buf, e.lowered_name);
  put_u64(buf, e.is_cubin ? 1 : 0);
  put_str(buf, e.image);
  put_u64(buf, fnv1a(buf.data(), buf.size()));
  return buf;
}

std::optional<CacheEntry> decode_cache_entry(const std::string& buf, const std::string& key) {
  if (buf.size() < sizeof(kMagic) + 8 || std::memcmp(buf.data(), kMagic, sizeof(kMagic)) != 0) return std::nullopt;
  uint64_t stored_sum = 0;
  std::memcpy(&stored_sum, buf.data() + buf.size() - 8, 8);
  if (fnv1a(buf.data(), buf.size() - 8) != stored_sum) return std::nullopt;
  std::string body = buf.substr(0, buf.size() - 8);
  Reader r{body, sizeof(kMagic)};
  CacheEntry k;
  uint64_t is_cubin = 0;
  if (!r.get_str(&k.key) || k.key != key || !r.get_str(&k.lowered_name) || !r.get_u64(&is_cubin) ||
      !r.get_str(&k.image) || r.pos != body.size() || k.image.empty())
    return std::nullopt;
  k.is_cubin = is_cubin != 0;
  return k;
}

std::optional<CacheEntry> read_cache_file(const std::string& path, const std::string& key) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::nullopt;
  std::string buf((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return decode_cache_entry(buf, key);
}

// ---- ElementwiseKernel's signature

namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

}  // namespace

bool is_identifier(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

std::vector<Param> parse_params(const std::string& list, const char* which, const std::string& kernel) {
  std::vector<Param> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    item = trim(item);
    TG_CHECK(!item.empty(), "ElementwiseKernel '", kernel, "': empty entry in ", which, " \"", list, "\"");
    // Normalize spaces, then split off the last word as the name.
    std::stringstream ws(item);
    std::vector<std::string> words;
    for (std::string w; ws >> w;) words.push_back(w);
    TG_CHECK(words.size() >= 2, "ElementwiseKernel '", kernel, "': \"", item, "\" in ", which,
             " needs a type and a name (e.g. \"double a\")");
    const bool raw = words[0] == "raw";
    if (raw) words.erase(words.begin());
    TG_CHECK(words.size() >= 2, "ElementwiseKernel '", kernel, "': \"", item, "\" in ", which,
             " needs a type and a name after raw (e.g. \"raw float x\")");
    std::string name = words.back();
    words.pop_back();
    std::string type;
    for (const auto& w : words) type += (type.empty() ? "" : " ") + w;
    static const std::map<std::string, std::pair<std::string, DType>> kTypes = {
        {"float", {"float", kFloat32}},         {"float32", {"float", kFloat32}},
        {"double", {"double", kFloat64}},       {"float64", {"double", kFloat64}},
        {"int", {"int", kInt32}},               {"int32", {"int", kInt32}},
        {"int32_t", {"int", kInt32}},           {"long long", {"long long", kInt64}},
        {"int64", {"long long", kInt64}},       {"int64_t", {"long long", kInt64}},
        {"bool", {"bool", kBool}},              {"half", {"__half", kFloat16}},
        {"__half", {"__half", kFloat16}},       {"float16", {"__half", kFloat16}},
        {"bfloat16", {"__nv_bfloat16", kBFloat16}}, {"__nv_bfloat16", {"__nv_bfloat16", kBFloat16}},
        {"unsigned char", {"unsigned char", kUInt8}}, {"uint8", {"unsigned char", kUInt8}},
        {"uint8_t", {"unsigned char", kUInt8}},     {"signed char", {"signed char", kInt8}},
        {"int8", {"signed char", kInt8}},           {"int8_t", {"signed char", kInt8}},
        {"short", {"short", kInt16}},               {"int16", {"short", kInt16}},
        {"int16_t", {"short", kInt16}},
    };
    auto it = kTypes.find(type);
    TG_CHECK(it != kTypes.end(), "ElementwiseKernel '", kernel, "': unknown type \"", type, "\" in ", which,
             " (float, double, int, long long / int64, bool, half, bfloat16, uint8, int8, int16)");
    TG_CHECK(is_identifier(name) && name != "i" && name != "n" && name.rfind("_tg_", 0) != 0, "ElementwiseKernel '",
             kernel, "': \"", name, "\" in ", which, " is not a usable parameter name (i and n are reserved)");
    out.push_back(Param{it->second.first, name, it->second.second, raw});
  }
  return out;
}

Signature parse_signature(const std::string& in_params, const std::string& out_params, const std::string& name) {
  TG_CHECK(is_identifier(name), "ElementwiseKernel: the name \"", name, "\" is not a C identifier");
  Signature sig;
  sig.ins = parse_params(in_params, "in_params", name);
  sig.outs = parse_params(out_params, "out_params", name);
  TG_CHECK(!sig.ins.empty(), "ElementwiseKernel '", name, "': needs at least one input");
  TG_CHECK(!sig.outs.empty(), "ElementwiseKernel '", name, "': needs at least one output");
  std::vector<std::string> names;
  for (const auto* list : {&sig.ins, &sig.outs})
    for (const auto& p : *list) {
      TG_CHECK(std::find(names.begin(), names.end(), p.name) == names.end(), "ElementwiseKernel '", name,
               "': parameter name \"", p.name, "\" appears twice");
      names.push_back(p.name);
    }
  return sig;
}

}  // namespace tg::cuda::rtc_host
