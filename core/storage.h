// Storage: a reference-counted block of device or host memory shared by a tensor
// and all of its views, with the version counter that autograd checks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include <tapegrad/core/device.h>

namespace tg {

// Owning pointer to raw memory with a plain-function deleter (no std::function,
// so the hot path allocates nothing beyond the block itself).
class DataPtr {
 public:
  using Deleter = void (*)(void* ctx);
  DataPtr() = default;
  DataPtr(void* data, void* ctx, Deleter deleter, Device device)
      : data_(data), ctx_(ctx), deleter_(deleter), device_(device) {}
  DataPtr(const DataPtr&) = delete;
  DataPtr& operator=(const DataPtr&) = delete;
  DataPtr(DataPtr&& o) noexcept { *this = std::move(o); }
  DataPtr& operator=(DataPtr&& o) noexcept {
    if (this != &o) {
      reset();
      data_ = o.data_;
      ctx_ = o.ctx_;
      deleter_ = o.deleter_;
      device_ = o.device_;
      o.data_ = o.ctx_ = nullptr;
      o.deleter_ = nullptr;
    }
    return *this;
  }
  ~DataPtr() { reset(); }
  void reset() {
    if (deleter_) deleter_(ctx_);
    data_ = ctx_ = nullptr;
    deleter_ = nullptr;
  }
  void* get() const { return data_; }
  void* context() const { return ctx_; }
  Deleter deleter() const { return deleter_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  void* ctx_ = nullptr;
  Deleter deleter_ = nullptr;
  Device device_;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual DataPtr allocate(size_t nbytes) = 0;
};

// The allocator for a device: the caching host allocator for the CPU, the
// stream-aware caching allocator of that CUDA device otherwise. Throws when the
// device type's backend is not built in (CUDA with TG_CUDA=OFF).
Allocator* get_allocator(Device device);

namespace detail {
// The registry get_allocator reads: one factory per device type, which returns the
// allocator object of a device index (the same object for the same index, never
// destroyed) or throws. Each backend registers its own when it is first set up
// (backend::cpu(), backend::cuda(): core/backend/{cpu,cuda,nocuda}); get_allocator
// sets up the backend of a device type it finds unregistered, so no static
// initialisation order is involved. Registering again replaces the factory.
using AllocatorFactory = Allocator* (*)(int device_index);
void register_allocator_factory(DeviceType type, AllocatorFactory factory);
}  // namespace detail

namespace detail {
// Whether tg::InferenceMode (autograd/autograd.h) is on for this thread.
inline thread_local bool tls_inference_mode = false;
}  // namespace detail

class Storage {
 public:
  Storage(DataPtr data, size_t nbytes) : data_(std::move(data)), nbytes_(nbytes), device_(data_.device()) {}
  Storage(DataPtr data, size_t nbytes, Device device) : data_(std::move(data)), nbytes_(nbytes), device_(device) {}
  void* data() const { return data_.get(); }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  uint32_t version() const { return version_; }
  // Every in-place write bumps the version, except on an inference tensor's storage inside
  // tg::InferenceMode (nothing can have saved it).
  void bump_version() {
    if (!(inference_ && detail::tls_inference_mode)) ++version_;
  }
  // Allocated inside tg::InferenceMode: an inference tensor's storage (no version bumps from the
  // in-place ops inside the mode; never saved for backward).
  bool is_inference() const { return inference_; }
  const DataPtr& data_ptr() const { return data_; }
  // What another part of the library keeps with this memory and that goes away with it: the
  // lower-precision copies of a parameter (core/cast_copies.h, the one user, under its lock).
  std::shared_ptr<void>& attachment() { return attachment_; }

  static std::shared_ptr<Storage> allocate(size_t nbytes, Device device) {
    return std::make_shared<Storage>(get_allocator(device)->allocate(nbytes), nbytes, device);
  }

 private:
  DataPtr data_;
  size_t nbytes_;
  Device device_;
  uint32_t version_ = 0;
  bool inference_ = detail::tls_inference_mode;
  std::shared_ptr<void> attachment_;
};

}  // namespace tg
