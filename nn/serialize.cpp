// safetensors reading and writing. The loader never trusts the file: sizes come
// from the header only after they are checked against the file's real size.
#include <tapegrad/nn/serialize.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

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

// An fd closed on scope exit (never throws).
class File {
 public:
  explicit File(int fd) : fd_(fd) {}
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }

 private:
  int fd_;
};

std::string errno_str() { return std::strerror(errno); }

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    TG_CHECK(w > 0, "tg::save('", path, "'): write failed: ", errno_str());
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void read_all(int fd, void* data, size_t n, uint64_t offset, const std::string& path, std::string_view what) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, std::min<size_t>(n, size_t{1} << 30), static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    TG_CHECK(r >= 0, "tg::load('", path, "'): reading ", what, " failed: ", errno_str());
    TG_CHECK(r > 0, "tg::load('", path, "'): the file ended while reading ", what);
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
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
  struct stat st {};
  TG_CHECK(::fstat(fd, &st) == 0, "tg::load('", path, "'): stat failed: ", errno_str());
  TG_CHECK(S_ISREG(st.st_mode), "tg::load('", path, "'): not a regular file");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
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

  // One temp file per call (pid and a process-wide counter): two threads saving to one path must
  // not write into the same temp file, which would rename a mix of both into place.
  static std::atomic<uint64_t> save_count{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(save_count.fetch_add(1));
  File f(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  TG_CHECK(f.get() >= 0, "tg::save('", path, "'): cannot create ", tmp, ": ", errno_str());
  try {
    write_all(f.get(), len_bytes, 8, path);
    write_all(f.get(), text.data(), text.size(), path);
    for (const auto& [name, t] : tensors) {
      if (t.numel() == 0) continue;
      // One tensor at a time on the host, so a GPU checkpoint needs no full host copy.
      Tensor c = native::contiguous(native::to(t, Device(kCPU), t.dtype()));
      write_all(f.get(), c.data_ptr(), c.nbytes(), path);
    }
    TG_CHECK(::fsync(f.get()) == 0, "tg::save('", path, "'): fsync failed: ", errno_str());
    TG_CHECK(::close(f.release()) == 0, "tg::save('", path, "'): close failed: ", errno_str());
    TG_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "tg::save('", path, "'): rename from ", tmp,
             " failed: ", errno_str());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  // Make the rename itself durable; failure here leaves a complete file, so only warn.
  std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/') + 1);
  File d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.get() >= 0 && ::fsync(d.get()) != 0) detail::log_warning("tg::save: fsync of directory " + dir + " failed");
}

nn::StateDict load(const std::string& path, std::optional<Device> device) {
  File f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  TG_CHECK(f.get() >= 0, "tg::load('", path, "'): cannot open: ", errno_str());
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
  File f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  TG_CHECK(f.get() >= 0, "tg::load_metadata('", path, "'): cannot open: ", errno_str());
  return read_header(f.get(), path).metadata;
}

}  // namespace tg
