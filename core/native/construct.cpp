// Tensor construction: TensorImpl, empty tensors, views over shared storage,
// and device resolution.
#include <algorithm>

#include <tapegrad/core/cuda.h>
#include <tapegrad/core/native.h>

namespace tg {

TensorImpl::TensorImpl(std::shared_ptr<Storage> st, Shape sz, Shape str, int64_t off, DType dt)
    : storage(std::move(st)), sizes(std::move(sz)), strides(std::move(str)), offset(off), dtype(dt) {
  device = storage->device();
  refresh();
}

void TensorImpl::refresh() {
  numel = sizes.numel();
  contiguous = true;
  if (numel == 0) return;  // also keeps the product below from overflowing on huge zero-element shapes
  int64_t expected = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    if (sizes[i] == 1) continue;
    if (strides[i] != expected) {
      contiguous = false;
      break;
    }
    expected *= sizes[i];  // at most numel, which fits int64
  }
}

namespace native {

Device resolve(Device d) {
  if (d.is_cpu()) return d;
  int n = cuda::device_count();
  TG_CHECK(n > 0, "tensor on ", d, ": no CUDA device is available",
           (cuda::is_available() ? "" : " (tapegrad built without CUDA, or no GPU/driver present)"));
  if (!d.has_index()) return Device(kCUDA, cuda::current_device());
  TG_CHECK(d.index() < n, "device ", d, " does not exist (", n, " CUDA device(s))");
  return d;
}

Tensor empty(const Shape& sizes, DType dtype, Device device) {
  const size_t nbytes = detail::storage_nbytes(sizes, element_size(dtype), "empty");
  device = resolve(device);
  auto storage = Storage::allocate(nbytes, device);
  return Tensor(std::make_shared<TensorImpl>(std::move(storage), sizes, detail::contiguous_strides(sizes), 0, dtype));
}

Tensor empty_strided(const Shape& sizes, const Shape& strides, DType dtype, Device device) {
  const size_t nbytes = detail::storage_nbytes(sizes, strides, element_size(dtype), "empty_strided");
  device = resolve(device);
  auto storage = Storage::allocate(nbytes, device);
  return Tensor(std::make_shared<TensorImpl>(std::move(storage), sizes, strides, 0, dtype));
}

void* address(const Tensor& t) {
  return static_cast<char*>(t.impl().storage->data()) + t.storage_offset() * static_cast<int64_t>(t.element_size());
}

Tensor make_view(const Tensor& base, Shape sizes, Shape strides, int64_t offset) {
  return Tensor(std::make_shared<TensorImpl>(base.impl().storage, std::move(sizes), std::move(strides), offset,
                                             base.dtype()));
}

}  // namespace native
}  // namespace tg
