// get_allocator: the allocator registry. Each backend registers the factory of its
// device type (core/backend/cpu/host_allocator.cpp, core/backend/cuda/caching_allocator.cpp,
// core/backend/nocuda/stubs.cpp); this file knows none of them.
#include <tapegrad/core/storage.h>

#include <atomic>
#include <cstddef>

#include <tapegrad/core/backend/backend.h>
#include <tapegrad/core/error.h>

namespace tg {

namespace {
constexpr size_t kDeviceTypes = static_cast<size_t>(kCUDA) + 1;  // DeviceType's values: 0 .. kCUDA
// Zero-initialised before any code runs (constant initialisation), so registering and
// looking up are safe at any time, static initialisers included.
constinit std::atomic<detail::AllocatorFactory> g_factories[kDeviceTypes] = {};

size_t type_index(DeviceType type) {
  const auto i = static_cast<size_t>(type);
  TG_CHECK(i < kDeviceTypes, "get_allocator: unknown device type ", static_cast<int>(type));
  return i;
}
}  // namespace

namespace detail {
void register_allocator_factory(DeviceType type, AllocatorFactory factory) {
  g_factories[type_index(type)].store(factory, std::memory_order_release);
}
}  // namespace detail

Allocator* get_allocator(Device device) {
  std::atomic<detail::AllocatorFactory>& slot = g_factories[type_index(device.type())];
  detail::AllocatorFactory factory = slot.load(std::memory_order_acquire);
  if (factory == nullptr) {
    // First allocation on this device type: setting up its backend registers the factory.
    if (device.is_cpu()) {
      (void)backend::cpu();
    } else {
      (void)backend::cuda();
    }
    factory = slot.load(std::memory_order_acquire);
    TG_CHECK(factory != nullptr, "tensor on ", device, ": no allocator is registered for its device type");
  }
  return factory(device.index());
}

}  // namespace tg
