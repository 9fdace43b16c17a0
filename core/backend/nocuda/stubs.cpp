// The tg::cuda API when tapegrad is built without CUDA (TG_CUDA=OFF): queries
// answer "no GPU", memory counters are 0, and everything that needs a GPU throws.
#include <tapegrad/core/backend/backend.h>
#include <tapegrad/core/cuda.h>
#include <tapegrad/core/error.h>

namespace tg {
namespace backend {
// No CUDA backend; its first use registers the allocator factory of CUDA devices, which throws.
Backend* cuda() {
  static const bool registered = [] {
    detail::register_allocator_factory(kCUDA, [](int index) -> Allocator* {
      TG_ERROR("tensor on ", Device(kCUDA, index), ": tapegrad was built without CUDA (TG_CUDA=OFF)");
    });
    return true;
  }();
  (void)registered;
  return nullptr;
}
}  // namespace backend

namespace cuda {
namespace {
[[noreturn]] void no_cuda(const char* what) {
  TG_ERROR(what, ": CUDA is not available: tapegrad was built without CUDA (TG_CUDA=OFF)");
}
}  // namespace

bool is_available() { return false; }
int device_count() { return 0; }
int runtime_version() { return 0; }
int current_device() { no_cuda("tg::cuda::current_device"); }
void set_device(int) { no_cuda("tg::cuda::set_device"); }
void synchronize(int) { no_cuda("tg::cuda::synchronize"); }

Stream::Stream() { no_cuda("tg::cuda::Stream"); }
Stream::Stream(int) { no_cuda("tg::cuda::Stream"); }
Stream Stream::wrap(void*, int) { no_cuda("tg::cuda::Stream::wrap"); }
Stream::Stream(Stream&& o) noexcept : handle_(o.handle_), device_(o.device_), owned_(o.owned_) {}
Stream& Stream::operator=(Stream&&) noexcept { return *this; }
Stream::~Stream() = default;
void* Stream::handle() const { return handle_; }
void Stream::synchronize() const { no_cuda("tg::cuda::Stream::synchronize"); }
bool Stream::query() const { no_cuda("tg::cuda::Stream::query"); }

Stream current_stream(int) { no_cuda("tg::cuda::current_stream"); }
void set_current_stream(const Stream&) { no_cuda("tg::cuda::set_current_stream"); }

StreamGuard::StreamGuard(const Stream&) : prev_stream_(nullptr), prev_device_(-1), device_(-1) {
  no_cuda("tg::cuda::StreamGuard");
}
StreamGuard::~StreamGuard() = default;

Event::Event() { no_cuda("tg::cuda::Event"); }
Event::Event(Event&&) noexcept {}
Event& Event::operator=(Event&&) noexcept { return *this; }
Event::~Event() = default;
void Event::record() { no_cuda("tg::cuda::Event::record"); }
void Event::record(const Stream&) { no_cuda("tg::cuda::Event::record"); }
void Event::synchronize() const { no_cuda("tg::cuda::Event::synchronize"); }
bool Event::query() const { no_cuda("tg::cuda::Event::query"); }
void Event::wait(const Stream&) const { no_cuda("tg::cuda::Event::wait"); }
float Event::elapsed_ms(const Event&) const { no_cuda("tg::cuda::Event::elapsed_ms"); }

size_t memory_allocated(int) { return 0; }
size_t max_memory_allocated(int) { return 0; }
size_t memory_reserved(int) { return 0; }
void reset_peak_memory_stats(int) {}
void empty_cache() {}

}  // namespace cuda
}  // namespace tg

namespace tg::backends::cudnn {
bool is_available() { return false; }
int version() { return 0; }
}  // namespace tg::backends::cudnn
