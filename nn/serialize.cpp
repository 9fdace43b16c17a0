// safetensors reading and writing. The loader never trusts the file: sizes come
// from the header only after they are checked against the file's real size.
#include <tapegrad/nn/serialize.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include <tapegrad/core/file_io.h>
#include <tapegrad/core/native.h>

namespace tg {

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;  // as the reference implementation

const char* st_name(DType t) {
  switch (t) {
#define TG_ST_NAME(T, name, st) \
  case DType::name:             \
    return st;
    TG_FORALL_DTYPES(TG_ST_NAME)
#undef TG_ST_NAME
  }
  return "?";
}

std::optional<DType> st_dtype(std::string_view s) {
#define TG_ST_PARSE(T, name, st) \
  if (s == st) return DType::name;
  TG_FORALL_DTYPES(TG_ST_PARSE)
#undef TG_ST_PARSE
  return std::nullopt;
}

using detail::File;
void read_all(int fd, void* data, size_t n, uint64_t offset, const std::string& path, std::string_view what) {
  detail::read_all(fd, data, n, offset, path, what, "tg::load");
}

// ---- header validation
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

struct Header {
  std::vector<Entry> entries;  // sorted by data offset
  SafetensorsMetadata metadata;
  uint64_t data_start = 0;  // 8 + header length
};

uint64_t as_u64(const nlohmann::json& v, const std::string& path, const std::string& name, const char* field) {
  TG_CHECK(v.is_number_integer(), "tg::load('", path, "'): tensor '", name, "': ", field, " must hold integers, got ",
           v.dump());
  TG_CHECK(v.is_number_unsigned(), "tg::load('", path, "'): tensor '", name, "': ", field,
           " must be non-negative, got ", v.dump());
  return v.get<uint64_t>();
}

Header read_header(int fd, const std::string& path) {
  const uint64_t file_size = detail::file_size(fd, path, "tg::load");
  TG_CHECK(file_size >= 8, "tg::load('", path, "'): the file is ", file_size,
           " bytes, too short for the 8-byte header length of a safetensors file");
  unsigned char len_bytes[8];
  read_all(fd, len_bytes, 8, 0, path, "the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  TG_CHECK(n <= file_size - 8, "tg::load('", path, "'): the header length ", n, " runs past the end of the file (",
           file_size, " bytes)");
  TG_CHECK(n <= kMaxHeaderBytes, "tg::load('", path, "'): the header length ", n, " exceeds the limit of ",
           kMaxHeaderBytes, " bytes");
  std::string text(n, '\0');
  read_all(fd, text.data(), n, 8, path, "the header");

  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    TG_ERROR("tg::load('", path, "'): the header is not valid JSON: ", e.what());
  }
  TG_CHECK(j.is_object(), "tg::load('", path, "'): the header must be a JSON object, got ", j.type_name());

  Header h;
  h.data_start = 8 + n;
  const uint64_t data_size = file_size - h.data_start;
  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      TG_CHECK(v.is_object(), "tg::load('", path, "'): __metadata__ must be an object of strings, got ", v.type_name());
      for (const auto& [k, s] : v.items()) {
        TG_CHECK(s.is_string(), "tg::load('", path, "'): __metadata__ entry '", k, "' must be a string, got ",
                 s.type_name());
        h.metadata[k] = s.get<std::string>();
      }
      continue;
    }
    TG_CHECK(v.is_object(), "tg::load('", path, "'): tensor '", name, "': entry must be an object, got ",
             v.type_name());
    auto field = [&](const char* key) -> const nlohmann::json& {
      auto it = v.find(key);
      TG_CHECK(it != v.end(), "tg::load('", path, "'): tensor '", name, "': missing '", key, "'");
      return *it;
    };
    const auto& jd = field("dtype");
    TG_CHECK(jd.is_string(), "tg::load('", path, "'): tensor '", name, "': dtype must be a string, got ", jd.dump());
    std::optional<DType> dt = st_dtype(jd.get<std::string>());
    TG_CHECK(dt.has_value(), "tg::load('", path, "'): tensor '", name, "': unknown or unsupported dtype '",
             jd.get<std::string>(), "' (supported: F32 F16 BF16 F64 I64 I32 BOOL)");
    const auto& js = field("shape");
    TG_CHECK(js.is_array(), "tg::load('", path, "'): tensor '", name, "': shape must be an array, got ", js.dump());
    Shape shape;
    uint64_t count = 1;
    bool overflow = false;
    for (const auto& d : js) {
      uint64_t s = as_u64(d, path, name, "shape");
      TG_CHECK(s <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), "tg::load('", path, "'): tensor '",
               name, "': dimension ", s, " is too large");
      overflow = overflow || __builtin_mul_overflow(count, s, &count);
      shape.push_back(static_cast<int64_t>(s));
    }
    uint64_t nbytes = 0;
    overflow = overflow || __builtin_mul_overflow(count, static_cast<uint64_t>(element_size(*dt)), &nbytes) ||
               count > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    TG_CHECK(!overflow, "tg::load('", path, "'): tensor '", name, "': shape ", js.dump(), " of ", jd.get<std::string>(),
             " overflows the byte count");
    const auto& jo = field("data_offsets");
    TG_CHECK(jo.is_array() && jo.size() == 2, "tg::load('", path, "'): tensor '", name,
             "': data_offsets must be [begin, end], got ", jo.dump());
    const uint64_t b = as_u64(jo[0], path, name, "data_offsets"), e = as_u64(jo[1], path, name, "data_offsets");
    TG_CHECK(b <= e, "tg::load('", path, "'): tensor '", name, "': data_offsets [", b, ", ", e, "] are reversed");
    TG_CHECK(e <= data_size, "tg::load('", path, "'): tensor '", name, "': data_offsets [", b, ", ", e,
             "] run past the data section of ", data_size, " bytes");
    TG_CHECK(e - b == nbytes, "tg::load('", path, "'): tensor '", name, "': shape ", js.dump(), " of ",
             jd.get<std::string>(), " needs ", nbytes, " bytes but data_offsets [", b, ", ", e, "] hold ", e - b);
    h.entries.push_back(Entry{name, *dt, std::move(shape), b, e});
  }
  std::sort(h.entries.begin(), h.entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  // The ranges tile the data section exactly: no overlap, no gap, nothing after.
  uint64_t pos = 0;
  for (size_t i = 0; i < h.entries.size(); ++i) {
    const Entry& en = h.entries[i];
    TG_CHECK(en.begin >= pos, "tg::load('", path, "'): tensor '", en.name, "': data_offsets [", en.begin, ", ", en.end,
             "] overlap tensor '", h.entries[i - 1].name, "' ending at ", pos);
    TG_CHECK(en.begin == pos, "tg::load('", path, "'): tensor '", en.name, "': data_offsets begin at ", en.begin,
             " leaving a gap after offset ", pos);
    pos = en.end;
  }
  TG_CHECK(pos == data_size, "tg::load('", path, "'): the tensors cover ", pos, " bytes but the data section has ",
           data_size);
  return h;
}

}  // namespace

void save(const nn::StateDict& tensors, const std::string& path, const SafetensorsMetadata& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    TG_CHECK(!name.empty() && name != "__metadata__", "tg::save('", path, "'): invalid tensor name '", name, "'");
    TG_CHECK(t.defined(), "tg::save('", path, "'): tensor '", name, "' is undefined");
    const uint64_t nbytes = tg::detail::storage_nbytes(t.sizes(), t.element_size(), "tg::save");
    header[name] = {{"dtype", st_name(t.dtype())},
                    {"shape", std::vector<int64_t>(t.sizes().begin(), t.sizes().end())},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // pad as Python's writer does, so the data is 8-byte aligned
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));

  detail::write_atomically(path, "tg::save", [&](int fd) {
    detail::write_all(fd, len_bytes, 8, path, "tg::save");
    detail::write_all(fd, text.data(), text.size(), path, "tg::save");
    for (const auto& [name, t] : tensors) {
      if (t.numel() == 0) continue;
      // One tensor at a time on the host, so a GPU checkpoint needs no full host copy.
      Tensor c = native::contiguous(native::to(t, Device(kCPU), t.dtype()));
      detail::write_all(fd, c.data_ptr(), c.nbytes(), path, "tg::save");
    }
  });
}

nn::StateDict load(const std::string& path, std::optional<Device> device) {
  File f = detail::open_for_reading(path, "tg::load");
  Header h = read_header(f.get(), path);
  nn::StateDict out;
  for (const Entry& e : h.entries) {
    Tensor t = native::empty(e.shape, e.dtype, Device(kCPU));
    if (e.end > e.begin) read_all(f.get(), t.data_ptr(), e.end - e.begin, h.data_start + e.begin, path, e.name);
    if (e.dtype == kBool) {
      // Any nonzero byte is true; keep bool storage canonical (0/1).
      auto* p = static_cast<unsigned char*>(t.data_ptr());
      for (int64_t i = 0; i < t.numel(); ++i) p[i] = p[i] != 0;
    }
    if (device && !device->is_cpu()) t = native::to(t, native::resolve(*device), e.dtype);
    out.insert(e.name, std::move(t));
  }
  return out;
}

SafetensorsMetadata load_metadata(const std::string& path) {
  File f = detail::open_for_reading(path, "tg::load_metadata");
  return read_header(f.get(), path).metadata;
}

}  // namespace tg
