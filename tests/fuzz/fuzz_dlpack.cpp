// tg::from_dlpack of malformed producer structs: the fuzz bytes describe the versioned or
// legacy struct (version, ndim, shape, strides, dtype code/bits/lanes, byte_offset, device)
// over a small real buffer. The producer's deleter must run exactly once, whether the import
// is accepted or refused. An accepted tensor is read in full only when its extent (computed
// here independently) lies inside the buffer and it has at most as many elements as bytes: a producer that lies about its memory is not
// tapegrad's bug.
#include "common.h"

namespace {

constexpr size_t kBufferBytes = 512;
alignas(64) unsigned char g_buffer[kBufferBytes];
int g_deleted = 0;

template <class Managed>
void count_delete(Managed*) { ++g_deleted; }

// Whether every element of the view lies in g_buffer (128-bit arithmetic, no overflow).
// Also bounds the read: a stride-0 view of 2^60 elements is valid, but its float64 copy is not
// something to allocate here.
bool inside_buffer(const DLTensor& dl, const tg::Tensor& t) {
  if (t.numel() == 0) return true;
  const size_t elem = tg::element_size(t.dtype());
  if (t.numel() > static_cast<int64_t>(kBufferBytes)) return false;
  // Not yet refused by from_dlpack: a byte_offset that misaligns the elements (float32 at
  // offset 3 is then read by misaligned loads, undefined behaviour that UBSan reports). Reported
  // on issue #19 for core/dlpack.cpp; until the import refuses it, such a tensor is not read.
  if (dl.byte_offset % elem != 0) return false;
  __int128 lo = static_cast<__int128>(dl.byte_offset), hi = lo;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const __int128 span = static_cast<__int128>(t.size(d) - 1) * t.stride(d) * static_cast<__int128>(elem);
    (span < 0 ? lo : hi) += span;
  }
  return lo >= 0 && hi + static_cast<__int128>(elem) <= static_cast<__int128>(kBufferBytes);
}

}  // namespace

TG_FUZZ_TARGET {
  tg_fuzz::Bytes in{data, size};
  const auto flags = in.get<uint8_t>();
  const bool versioned = flags & 1, with_strides = flags & 2, null_data = (flags & 12) == 12;
  DLTensor dl{};
  dl.data = null_data ? nullptr : g_buffer;
  dl.device.device_type = static_cast<DLDeviceType>(in.get<uint8_t>() % 20);
  dl.device.device_id = in.get<int8_t>();
  dl.ndim = in.get<int8_t>() % 10;
  dl.dtype.code = in.get<uint8_t>();
  dl.dtype.bits = in.get<uint8_t>();
  dl.dtype.lanes = in.get<uint16_t>();
  dl.byte_offset = in.get<uint64_t>();
  if (flags & 16) dl.byte_offset %= kBufferBytes;
  const size_t n = dl.ndim > 0 ? static_cast<size_t>(dl.ndim) : 0;
  std::vector<int64_t> shape(n), strides(n);
  for (size_t i = 0; i < n; ++i) {
    shape[i] = in.get<int64_t>();
    if (flags & 32) shape[i] %= 8;  // mostly small shapes
  }
  for (size_t i = 0; i < n && with_strides; ++i) {
    strides[i] = in.get<int64_t>();
    if (flags & 64) strides[i] %= 16;
  }
  dl.shape = n && (flags & 0x84) != 0x80 ? shape.data() : nullptr;  // sometimes a null shape
  dl.strides = with_strides && n ? strides.data() : nullptr;

  g_deleted = 0;
  const auto deleted_before_import = g_deleted;
  {
    tg::Tensor t;
    bool ok;
    if (versioned) {
      DLManagedTensorVersioned m{};
      m.version.major = in.get<uint8_t>() % 3;
      m.version.minor = in.get<uint8_t>();
      m.flags = in.get<uint8_t>() & 7;
      m.deleter = &count_delete<DLManagedTensorVersioned>;
      m.dl_tensor = dl;
      ok = tg_fuzz::accepts([&] { t = tg::from_dlpack(&m); });
      if (ok && inside_buffer(dl, t) && !null_data) (void)t.to(tg::kFloat64).sum().item<double>();
      t = tg::Tensor();
    } else {
      DLManagedTensor m{};
      m.deleter = &count_delete<DLManagedTensor>;
      m.dl_tensor = dl;
      ok = tg_fuzz::accepts([&] { t = tg::from_dlpack(&m); });
      if (ok && inside_buffer(dl, t) && !null_data) (void)t.to(tg::kFloat64).sum().item<double>();
      t = tg::Tensor();
    }
  }
  if (g_deleted - deleted_before_import != 1) abort();  // the deleter ran never, or twice
  return 0;
}
