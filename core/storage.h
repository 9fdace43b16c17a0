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
// stream-aware caching allocator of that CUDA device otherwise.
Allocator* get_allocator(Device device);

class Storage {
 public:
  Storage(DataPtr data, size_t nbytes) : data_(std::move(data)), nbytes_(nbytes), device_(data_.device()) {}
  Storage(DataPtr data, size_t nbytes, Device device) : data_(std::move(data)), nbytes_(nbytes), device_(device) {}
  void* data() const { return data_.get(); }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  uint32_t version() const { return version_; }
  void bump_version() { ++version_; }
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
  std::shared_ptr<void> attachment_;
};

}  // namespace tg
