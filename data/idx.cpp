// IDX reading and writing (idx.h). The reader never trusts the file: the fixed header is read and
// checked field by field, the shape's byte count is overflow-checked (detail::storage_nbytes), and
// the file's size must match it exactly before the tensor is allocated.
#include <tapegrad/data/idx.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <tapegrad/core/file_io.h>
#include <tapegrad/core/native.h>

namespace tg {

static_assert(std::endian::native == std::endian::little, "IDX I/O assumes a little-endian host");

namespace {

constexpr const char* kLoad = "tg::load_idx";
constexpr const char* kSave = "tg::save_idx";

// The IDX type byte of a dtype, or 0 when IDX has none.
uint8_t type_byte(DType t) {
  switch (t) {
    case DType::UInt8: return 0x08;
    case DType::Int8: return 0x09;
    case DType::Int16: return 0x0B;
    case DType::Int32: return 0x0C;
    case DType::Float32: return 0x0D;
    case DType::Float64: return 0x0E;
    default: return 0;
  }
}

std::optional<DType> dtype_of_byte(uint8_t b) {
  switch (b) {
    case 0x08: return kUInt8;
    case 0x09: return kInt8;
    case 0x0B: return kInt16;
    case 0x0C: return kInt32;
    case 0x0D: return kFloat32;
    case 0x0E: return kFloat64;
    default: return std::nullopt;
  }
}

std::string hex_byte(unsigned char b) {
  const char* digits = "0123456789ABCDEF";
  return std::string("0x") + digits[b >> 4] + digits[b & 15];
}

// Reverses every element's bytes (big-endian file <-> little-endian host).
void swap_elements(void* data, int64_t n, size_t es) {
  if (es == 1) return;
  auto* b = static_cast<unsigned char*>(data);
  for (int64_t i = 0; i < n; ++i) std::reverse(b + i * es, b + (i + 1) * es);
}

}  // namespace

Tensor load_idx(const std::string& path, std::optional<Device> device) {
  detail::File f = detail::open_for_reading(path, kLoad);
  const uint64_t size = detail::file_size(f.get(), path, kLoad);
  TG_CHECK(size >= 4, kLoad, "('", path, "'): ", size, " bytes is too short for an IDX file (the header alone is ",
           "at least 4 bytes)");
  unsigned char magic[4];
  detail::read_all(f.get(), magic, 4, 0, path, "the magic number", kLoad);
  TG_CHECK(magic[0] == 0 && magic[1] == 0, kLoad, "('", path, "'): not an IDX file (the first two bytes are ",
           int{magic[0]}, ", ", int{magic[1]}, "; IDX starts with two zero bytes)");
  const std::optional<DType> dtype = dtype_of_byte(magic[2]);
  TG_CHECK(dtype.has_value(), kLoad, "('", path, "'): unknown IDX type byte ", hex_byte(magic[2]),
           " (0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64)");
  const int ndim = magic[3];
  TG_CHECK(ndim >= 1, kLoad, "('", path, "'): the header declares 0 dims (IDX needs at least one)");
  const uint64_t header = 4 + 4 * static_cast<uint64_t>(ndim);
  TG_CHECK(size >= header, kLoad, "('", path, "'): the header declares ", ndim, " dims (", header,
           " header bytes) but the file has only ", size, " bytes");
  std::vector<unsigned char> raw(4 * static_cast<size_t>(ndim));
  detail::read_all(f.get(), raw.data(), raw.size(), 4, path, "the dims", kLoad);
  Shape shape;
  for (int d = 0; d < ndim; ++d) {
    const unsigned char* p = raw.data() + 4 * d;
    shape.push_back(static_cast<int64_t>((uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) |
                                         uint32_t{p[3]}));
  }
  // The element count and bytes, overflow-checked and capped, before any allocation.
  uint64_t nbytes = 0;
  try {
    nbytes = detail::storage_nbytes(shape, element_size(*dtype), kLoad);
  } catch (const Error& e) {
    TG_ERROR(kLoad, "('", path, "'): ", e.what());
  }
  TG_CHECK(size - header == nbytes, kLoad, "('", path, "'): ", dtype_name(*dtype), " ", shape, " needs ", nbytes,
           " bytes of data but the file has ", size - header, size - header < nbytes ? " (truncated)" : " (trailing bytes)");
  Tensor t = native::empty(shape, *dtype, Device(kCPU));
  if (t.nbytes() > 0) detail::read_all(f.get(), t.data_ptr(), t.nbytes(), header, path, "the data", kLoad);
  swap_elements(t.data_ptr(), t.numel(), element_size(*dtype));
  if (device && !device->is_cpu()) t = native::to(t, native::resolve(*device), *dtype);
  return t;
}

void save_idx(const Tensor& t, const std::string& path) {
  TG_CHECK(t.defined(), kSave, "('", path, "'): the tensor is undefined");
  const uint8_t type = type_byte(t.dtype());
  TG_CHECK(type != 0, kSave, "('", path, "'): IDX has no ", dtype_name(t.dtype()),
           " type (uint8, int8, int16, int32, float32, float64); convert first, e.g. t.to(tg::kFloat32)");
  TG_CHECK(t.dim() >= 1 && t.dim() <= 255, kSave, "('", path, "'): IDX holds 1 to 255 dims, got a ", t.dim(),
           "-d tensor of shape ", t.sizes());
  std::string head;
  head.push_back(0);
  head.push_back(0);
  head.push_back(static_cast<char>(type));
  head.push_back(static_cast<char>(t.dim()));
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t n = t.size(d);
    TG_CHECK(n <= int64_t{0xFFFFFFFF}, kSave, "('", path, "'): dim ", d, " of shape ", t.sizes(),
             " does not fit IDX's 32-bit sizes");
    for (int s = 24; s >= 0; s -= 8) head.push_back(static_cast<char>((n >> s) & 0xff));
  }
  Tensor c = native::contiguous(native::to(t, Device(kCPU), t.dtype()));
  if (element_size(t.dtype()) > 1 && c.numel() > 0) {
    if (c.data_ptr() == t.data_ptr()) c = native::clone(c);  // never swap the caller's bytes
    swap_elements(c.data_ptr(), c.numel(), element_size(t.dtype()));
  }
  detail::write_atomically(path, kSave, [&](int fd) {
    detail::write_all(fd, head.data(), head.size(), path, kSave);
    if (c.nbytes() > 0) detail::write_all(fd, c.data_ptr(), c.nbytes(), path, kSave);
  });
}

}  // namespace tg
