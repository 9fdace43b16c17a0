// get_allocator: the host caching allocator for the CPU, the CUDA caching
// allocator of the device otherwise.
#include <tapegrad/core/storage.h>

#include <memory>
#include <mutex>
#include <vector>

#include <tapegrad/core/backend/cpu/cpu.h>
#include <tapegrad/core/error.h>
#ifdef TG_WITH_CUDA
#include <tapegrad/core/backend/cuda/runtime.h>
#endif

namespace tg {

namespace {
#ifdef TG_WITH_CUDA
class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int device) : device_(device) {}
  DataPtr allocate(size_t nbytes) override { return cuda::detail::device_allocate(nbytes, device_); }

 private:
  int device_;
};
#endif
}  // namespace

Allocator* get_allocator(Device device) {
  if (device.is_cpu()) return cpu::host_allocator();
#ifdef TG_WITH_CUDA
  constexpr int kMaxDevices = 64;
  static CudaAllocator* allocators[kMaxDevices] = {};
  static std::once_flag once;
  std::call_once(once, [] {
    static std::vector<std::unique_ptr<CudaAllocator>> owned;
    for (int i = 0; i < kMaxDevices; ++i) {
      owned.push_back(std::make_unique<CudaAllocator>(i));
      allocators[i] = owned.back().get();
    }
  });
  TG_CHECK(device.index() >= 0 && device.index() < kMaxDevices, "get_allocator: bad device ", device);
  return allocators[device.index()];
#else
  TG_ERROR("tensor on ", device, ": tapegrad was built without CUDA (TG_CUDA=OFF)");
#endif
}

}  // namespace tg
