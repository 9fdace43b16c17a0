// .npy reading and writing (npy.h). The reader never trusts the file: the header is parsed by a
// small parser for exactly the dict numpy writes (no Python evaluation), and sizes come from it
// only after they are checked against the file's real size.
#include <tapegrad/data/npy.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include <tapegrad/core/file_io.h>
#include <tapegrad/core/native.h>

namespace tg {

static_assert(std::endian::native == std::endian::little, ".npy I/O assumes a little-endian host");

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr uint64_t kMaxHeaderBytes = 1 << 20;  // numpy's own reader refuses far less (10000 by default)

struct NpyHeader {
  DType dtype = kFloat32;
  bool swap = false;  // big-endian elements
  bool fortran = false;
  Shape shape;
  uint64_t data_start = 0;
};

// The numpy descr of a dtype ('<f4', ...), or null when numpy has none.
const char* descr_of(DType t) {
  switch (t) {
    case DType::Float32: return "<f4";
    case DType::Float64: return "<f8";
    case DType::Float16: return "<f2";
    case DType::Int64: return "<i8";
    case DType::Int32: return "<i4";
    case DType::Bool: return "|b1";
    case DType::UInt8: return "|u1";
    case DType::Int8: return "|i1";
    case DType::Int16: return "<i2";
    case DType::BFloat16: return nullptr;
  }
  return nullptr;
}

// A cursor over the header dict, with errors that name the file.
class Parser {
 public:
  Parser(std::string_view s, const std::string& path) : s_(s), path_(path) {}
  [[noreturn]] void fail(const std::string& what) const {
    TG_ERROR("tg::load_npy('", path_, "'): bad header: ", what, " (header: ", std::string(s_.substr(0, 200)), ")");
  }
  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool eat(char c) {
    skip_space();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }
  std::string quoted() {
    skip_space();
    if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"')) fail("expected a quoted string");
    const char q = s_[i_++];
    const size_t start = i_;
    while (i_ < s_.size() && s_[i_] != q) {
      if (s_[i_] == '\\') fail("escapes are not allowed in the header");
      ++i_;
    }
    if (i_ >= s_.size()) fail("an unterminated string");
    return std::string(s_.substr(start, i_++ - start));
  }
  bool boolean() {
    skip_space();
    if (s_.substr(i_, 4) == "True") {
      i_ += 4;
      return true;
    }
    if (s_.substr(i_, 5) == "False") {
      i_ += 5;
      return false;
    }
    fail("expected True or False");
  }
  int64_t integer() {
    skip_space();
    const size_t start = i_;
    uint64_t v = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      if (v > (static_cast<uint64_t>(INT64_MAX) - 9) / 10) fail("a dimension does not fit in int64");
      v = v * 10 + static_cast<uint64_t>(s_[i_++] - '0');
    }
    if (i_ == start) fail("expected a non-negative integer");
    if (i_ < s_.size() && s_[i_] == 'L') ++i_;  // Python 2's long suffix
    return static_cast<int64_t>(v);
  }
  Shape tuple() {
    expect('(');
    Shape shape;
    if (eat(')')) return shape;
    for (;;) {
      shape.push_back(integer());
      if (shape.size() > 64) fail("more than 64 dimensions");
      if (eat(')')) return shape;
      expect(',');
      if (eat(')')) return shape;
    }
  }
  bool at_end() {
    skip_space();
    return i_ == s_.size();
  }

 private:
  std::string_view s_;
  const std::string& path_;
  size_t i_ = 0;
};

NpyHeader read_header(int fd, const std::string& path) {
  const uint64_t size = detail::file_size(fd, path, "tg::load_npy");
  TG_CHECK(size >= kMagicLen + 4, "tg::load_npy('", path, "'): the file is ", size,
           " bytes, too short for an .npy header");
  unsigned char pre[kMagicLen + 6] = {};
  detail::read_all(fd, pre, std::min<uint64_t>(size, sizeof(pre)), 0, path, "the magic", "tg::load_npy");
  TG_CHECK(std::memcmp(pre, kMagic, kMagicLen) == 0, "tg::load_npy('", path,
           "'): not an .npy file (no \\x93NUMPY magic)");
  const int major = pre[6];
  TG_CHECK(major >= 1 && major <= 3, "tg::load_npy('", path, "'): format version ", major, ".", int{pre[7]},
           " is not 1.0, 2.0 or 3.0");
  uint64_t header_len = 0, prefix = 0;
  if (major == 1) {
    header_len = pre[8] | (uint64_t{pre[9]} << 8);
    prefix = 10;
  } else {
    TG_CHECK(size >= 12, "tg::load_npy('", path, "'): the file ends inside its header length");
    header_len = pre[8] | (uint64_t{pre[9]} << 8) | (uint64_t{pre[10]} << 16) | (uint64_t{pre[11]} << 24);
    prefix = 12;
  }
  TG_CHECK(header_len <= kMaxHeaderBytes, "tg::load_npy('", path, "'): header of ", header_len,
           " bytes (at most ", kMaxHeaderBytes, ")");
  TG_CHECK(prefix + header_len <= size, "tg::load_npy('", path, "'): the header claims ", header_len,
           " bytes but the file has ", size - prefix, " after the length");
  std::string text(header_len, '\0');
  detail::read_all(fd, text.data(), header_len, prefix, path, "the header", "tg::load_npy");

  Parser p(text, path);
  std::optional<std::string> descr;
  std::optional<bool> fortran;
  std::optional<Shape> shape;
  p.expect('{');
  while (!p.eat('}')) {
    const std::string key = p.quoted();
    p.expect(':');
    if (key == "descr" && !descr) {
      descr = p.quoted();
    } else if (key == "fortran_order" && !fortran) {
      fortran = p.boolean();
    } else if (key == "shape" && !shape) {
      shape = p.tuple();
    } else {
      p.fail("unexpected or repeated key '" + key + "'");
    }
    if (!p.eat(',')) {
      p.expect('}');
      break;
    }
  }
  if (!p.at_end()) p.fail("text after the dict");
  if (!descr || !fortran || !shape) p.fail("it needs 'descr', 'fortran_order' and 'shape'");

  NpyHeader h;
  h.fortran = *fortran;
  h.shape = *shape;
  const std::string& d = *descr;
  TG_CHECK(d.size() == 3 && (d[0] == '<' || d[0] == '>' || d[0] == '|' || d[0] == '='), "tg::load_npy('", path,
           "'): dtype '", d, "' is not one tapegrad reads (float32/64/16, int64/32/16/8, uint8, bool)");
  const std::string_view kind = std::string_view(d).substr(1);
  if (kind == "f4") h.dtype = kFloat32;
  else if (kind == "f8") h.dtype = kFloat64;
  else if (kind == "f2") h.dtype = kFloat16;
  else if (kind == "i8") h.dtype = kInt64;
  else if (kind == "i4") h.dtype = kInt32;
  else if (kind == "b1") h.dtype = kBool;
  else if (kind == "u1") h.dtype = kUInt8;
  else if (kind == "i1") h.dtype = kInt8;
  else if (kind == "i2") h.dtype = kInt16;
  else
    TG_ERROR("tg::load_npy('", path, "'): dtype '", d, "' is not one tapegrad reads (float32/64/16, int64/32/16/8, uint8, bool)");
  h.swap = d[0] == '>' && element_size(h.dtype) > 1;
  h.data_start = prefix + header_len;
  // The element count and bytes, overflow-checked and capped, before any allocation.
  uint64_t nbytes = 0;
  try {
    nbytes = detail::storage_nbytes(h.shape, element_size(h.dtype), "tg::load_npy");
  } catch (const Error& e) {
    TG_ERROR("tg::load_npy('", path, "'): ", e.what());
  }
  TG_CHECK(size - h.data_start == nbytes, "tg::load_npy('", path, "'): ", dtype_name(h.dtype), " ", h.shape,
           " needs ", nbytes, " bytes of data but the file has ", size - h.data_start);
  return h;
}

}  // namespace

Tensor load_npy(const std::string& path, std::optional<Device> device) {
  detail::File f = detail::open_for_reading(path, "tg::load_npy");
  const NpyHeader h = read_header(f.get(), path);
  // Fortran order: the data is the transpose's C order.
  Shape stored = h.shape;
  if (h.fortran) std::reverse(stored.begin(), stored.end());
  Tensor t = native::empty(stored, h.dtype, Device(kCPU));
  if (t.nbytes() > 0) detail::read_all(f.get(), t.data_ptr(), t.nbytes(), h.data_start, path, "the data", "tg::load_npy");
  auto* bytes = static_cast<unsigned char*>(t.data_ptr());
  if (h.swap) {
    const size_t es = element_size(h.dtype);
    for (int64_t i = 0; i < t.numel(); ++i) std::reverse(bytes + i * es, bytes + (i + 1) * es);
  }
  if (h.dtype == kBool)  // any nonzero byte is true; keep bool storage canonical (0/1)
    for (int64_t i = 0; i < t.numel(); ++i) bytes[i] = bytes[i] != 0;
  if (h.fortran && t.dim() > 1) {
    Shape dims;
    for (int64_t d = t.dim() - 1; d >= 0; --d) dims.push_back(d);
    t = native::contiguous(native::permute(t, dims));
  }
  if (device && !device->is_cpu()) t = native::to(t, native::resolve(*device), h.dtype);
  return t;
}

void save_npy(const Tensor& t, const std::string& path) {
  TG_CHECK(t.defined(), "tg::save_npy('", path, "'): the tensor is undefined");
  const char* descr = descr_of(t.dtype());
  TG_CHECK(descr != nullptr, "tg::save_npy('", path, "'): numpy has no ", dtype_name(t.dtype()),
           " dtype; convert first, e.g. t.to(tg::kFloat32)");
  (void)detail::storage_nbytes(t.sizes(), t.element_size(), "tg::save_npy");
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (";
  for (int64_t d = 0; d < t.dim(); ++d) dict += std::to_string(t.size(d)) + (t.dim() == 1 || d + 1 < t.dim() ? ", " : "");
  if (t.dim() == 1) dict.pop_back();  // (3,) as numpy writes it
  dict += "), }";
  // Version 1.0 while the header fits its 2-byte length, padded (spaces, then '\n') so the data
  // starts on a 64-byte boundary.
  const bool v1 = dict.size() + 1 + kMagicLen + 4 <= 65535;
  const size_t prefix = kMagicLen + 2 + (v1 ? 2 : 4);
  const size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - prefix - dict.size() - 1, ' ');
  dict.push_back('\n');
  std::string head(kMagic, kMagicLen);
  head.push_back(static_cast<char>(v1 ? 1 : 2));
  head.push_back(0);
  const uint64_t n = dict.size();
  for (int i = 0; i < (v1 ? 2 : 4); ++i) head.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  head += dict;
  const Tensor c = native::contiguous(native::to(t, Device(kCPU), t.dtype()));
  detail::write_atomically(path, "tg::save_npy", [&](int fd) {
    detail::write_all(fd, head.data(), head.size(), path, "tg::save_npy");
    if (c.nbytes() > 0) detail::write_all(fd, c.data_ptr(), c.nbytes(), path, "tg::save_npy");
  });
}

}  // namespace tg
