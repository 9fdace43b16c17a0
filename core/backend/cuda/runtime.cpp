// The CUDA runtime layer: checked-call errors, device guards, the per-thread
// current stream of each device, and the public tg::cuda API of core/cuda.h
// (devices, streams, events). The allocator counters live in caching_allocator.cpp.
#include <tapegrad/core/backend/cuda/runtime.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <tapegrad/core/backend/cuda/launch_queue.h>
#include <tapegrad/core/cuda.h>

namespace tg::cuda {
namespace detail {
namespace {

// Enough for any host we run on; indexes the per-thread stream table.
constexpr int kMaxDevices = 64;

const char* base_name(const char* file) {
  const char* slash = std::strrchr(file, '/');
  return slash ? slash + 1 : file;
}

// The current stream of each device for this thread; nullptr is the legacy default stream.
thread_local std::array<cudaStream_t, kMaxDevices> tls_streams{};

int checked_device(int device, const char* what) {
  if (device < 0) device = current_device();
  const int n = device_count();
  TG_CHECK(device >= 0 && device < n, what, ": invalid CUDA device ", device, " (", n, " device(s) available)");
  return device;
}

}  // namespace

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  // Clear the (non-sticky) error so later launch checks do not report it again.
  (void)cudaGetLastError();
  throw Error(::tg::detail::str_cat("CUDA error: ", call, " failed: ", cudaGetErrorString(err), " (",
                                    cudaGetErrorName(err), ") at ", base_name(file), ":", line));
}

void throw_cublas_error(cublasStatus_t st, const char* call, const char* file, int line) {
  throw Error(::tg::detail::str_cat("cuBLAS error: ", call, " failed: ", cublasGetStatusString(st), " (",
                                    cublasGetStatusName(st), ") at ", base_name(file), ":", line));
}

DeviceGuard::DeviceGuard(int device) {
  TG_CUDA_CHECK(cudaGetDevice(&prev_));
  if (device >= 0 && device != prev_)
    TG_CUDA_CHECK(cudaSetDevice(device));
  else
    prev_ = -1;  // nothing to restore
  ++tls_cuda_op_depth;  // last: a throwing constructor leaves it as it was
}

DeviceGuard::~DeviceGuard() {
  --tls_cuda_op_depth;
  if (prev_ >= 0) {
    cudaError_t err = cudaSetDevice(prev_);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      ::tg::detail::log_warning(
          ::tg::detail::str_cat("DeviceGuard: cudaSetDevice(", prev_, ") failed: ", cudaGetErrorString(err)));
    }
  }
}

bool current_stream_capturing(int device) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  TG_CUDA_CHECK(cudaStreamIsCapturing(current_stream_handle(device), &st));
  return st != cudaStreamCaptureStatusNone;
}

namespace {
std::atomic<int> g_dependent_launch{-1};  // -1: TG_DEPENDENT_LAUNCH not read yet
}

bool dependent_launch(int device) {
  int on = g_dependent_launch.load(std::memory_order_relaxed);
  if (on < 0) {
    // On unless TG_DEPENDENT_LAUNCH=0 (benchmarks/NOTES.md, "programmatic dependent launch").
    const char* v = std::getenv("TG_DEPENDENT_LAUNCH");
    on = v && std::strcmp(v, "0") == 0 ? 0 : 1;
    int expected = -1;
    if (!g_dependent_launch.compare_exchange_strong(expected, on)) on = expected;
  }
  if (!on) return false;
  // sm_90+ only (griddepcontrol); asked once per device.
  static std::array<std::atomic<int>, kMaxDevices> major{};
  if (device < 0 || device >= kMaxDevices) return false;
  int m = major[device].load(std::memory_order_relaxed);
  if (m == 0) {
    if (cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      (void)cudaGetLastError();
      m = -1;
    }
    major[device].store(m, std::memory_order_relaxed);
  }
  return m >= 9;
}

bool dependent_launch_setting() {
  (void)dependent_launch(-1);  // reads TG_DEPENDENT_LAUNCH once
  return g_dependent_launch.load(std::memory_order_relaxed) == 1;
}

void set_dependent_launch(bool on) { g_dependent_launch.store(on ? 1 : 0, std::memory_order_relaxed); }

cudaStream_t current_stream_noflush(int device) {
  if (device < 0) TG_CUDA_CHECK(cudaGetDevice(&device));
  TG_CHECK(device < kMaxDevices, "current_stream: device ", device, " out of range");
  return tls_streams[device];
}

cudaStream_t current_stream_handle(int device) {
  flush_launches();
  return current_stream_noflush(device);
}

}  // namespace detail

// ---- devices

bool is_available() { return device_count() > 0; }

int device_count() {
  // Cached: the answer does not change within a process, and the query is slow
  // without a driver. Errors (no driver, no device) mean "no GPU", not a failure.
  static const int count = [] {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return n < detail::kMaxDevices ? n : detail::kMaxDevices;
  }();
  return count;
}

int runtime_version() {
  int v = 0;
  TG_CUDA_CHECK(cudaRuntimeGetVersion(&v));
  return v;
}

int current_device() {
  TG_CHECK(is_available(), "tg::cuda::current_device: no CUDA device available");
  int d = 0;
  TG_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

void set_device(int index) {
  const int n = device_count();
  TG_CHECK(index >= 0 && index < n, "tg::cuda::set_device: invalid device ", index, " (", n, " device(s) available)");
  TG_CUDA_CHECK(cudaSetDevice(index));
}

void synchronize(int device) {
  device = detail::checked_device(device, "tg::cuda::synchronize");
  detail::DeviceGuard g(device);
  detail::flush_launches();
  TG_CUDA_CHECK(cudaDeviceSynchronize());
}

// ---- streams

Stream::Stream() : Stream(-1) {}

Stream::Stream(int device) {
  TG_CHECK(is_available(), "tg::cuda::Stream: no CUDA device available");
  device_ = detail::checked_device(device, "tg::cuda::Stream");
  detail::DeviceGuard g(device_);
  cudaStream_t s = nullptr;
  // Non-blocking: user streams must not serialize with the legacy default stream.
  TG_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  handle_ = s;
  owned_ = true;
}

Stream Stream::wrap(void* handle, int device) {
  TG_CHECK(is_available(), "tg::cuda::Stream::wrap: no CUDA device available");
  return Stream(handle, detail::checked_device(device, "tg::cuda::Stream::wrap"), false);
}

Stream::Stream(Stream&& o) noexcept : handle_(o.handle_), device_(o.device_), owned_(o.owned_) {
  o.handle_ = nullptr;
  o.owned_ = false;
}

Stream& Stream::operator=(Stream&& o) noexcept {
  // Swap: `o` releases what this stream owned when it is destroyed.
  std::swap(handle_, o.handle_);
  std::swap(device_, o.device_);
  std::swap(owned_, o.owned_);
  return *this;
}

Stream::~Stream() {
  if (owned_ && handle_) {
    // Finish the queued work first: the caching allocator keys cached blocks by
    // stream handle, and a later stream may be given this same handle.
    detail::flush_launches_nothrow();
    cudaError_t err = cudaStreamSynchronize(static_cast<cudaStream_t>(handle_));
    // Its cuBLAS workspace and counters go back to the cache (a graph captured on this stream
    // keeps its own reference to the workspace).
    if (err == cudaSuccess) detail::release_stream_resources(device_, static_cast<cudaStream_t>(handle_));
    if (err == cudaSuccess) err = cudaStreamDestroy(static_cast<cudaStream_t>(handle_));
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      ::tg::detail::log_warning(
          ::tg::detail::str_cat("tg::cuda::Stream: destroying the stream failed: ", cudaGetErrorString(err)));
    }
  }
  handle_ = nullptr;
  owned_ = false;
}

void* Stream::handle() const {
  detail::flush_launches();  // whatever the caller does with the stream comes after our work
  return handle_;
}

void Stream::synchronize() const {
  detail::flush_launches();
  TG_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(handle_)));
}

bool Stream::query() const {
  detail::flush_launches();
  cudaError_t err = cudaStreamQuery(static_cast<cudaStream_t>(handle_));
  if (err == cudaErrorNotReady) return false;
  TG_CUDA_CHECK(err);
  return true;
}

Stream current_stream(int device) {
  TG_CHECK(is_available(), "tg::cuda::current_stream: no CUDA device available");
  device = detail::checked_device(device, "tg::cuda::current_stream");
  return Stream::wrap(detail::current_stream_handle(device), device);
}

void set_current_stream(const Stream& s) {
  TG_CHECK(s.device() >= 0 && s.device() < device_count(), "tg::cuda::set_current_stream: invalid device ", s.device());
  detail::tls_streams[s.device()] = static_cast<cudaStream_t>(s.handle());
}

StreamGuard::StreamGuard(const Stream& s) : prev_device_(current_device()), device_(s.device()) {
  TG_CHECK(device_ >= 0 && device_ < device_count(), "tg::cuda::StreamGuard: invalid device ", device_);
  prev_stream_ = detail::tls_streams[device_];
  if (device_ != prev_device_) TG_CUDA_CHECK(cudaSetDevice(device_));
  detail::tls_streams[device_] = static_cast<cudaStream_t>(s.handle());
}

StreamGuard::~StreamGuard() {
  detail::tls_streams[device_] = static_cast<cudaStream_t>(prev_stream_);
  if (device_ != prev_device_) {
    if (cudaSetDevice(prev_device_) != cudaSuccess) {
      (void)cudaGetLastError();
      ::tg::detail::log_warning("tg::cuda::StreamGuard: could not restore the previous device");
    }
  }
}

// ---- events

// The CUDA event is created lazily on the device of the first stream it is
// recorded on (as PyTorch does), so an Event can be declared before choosing a device.
Event::Event() = default;

Event::Event(Event&& o) noexcept : handle_(o.handle_), device_(o.device_) {
  o.handle_ = nullptr;
  o.device_ = -1;
}

Event& Event::operator=(Event&& o) noexcept {
  std::swap(handle_, o.handle_);
  std::swap(device_, o.device_);
  return *this;
}

Event::~Event() {
  if (handle_) {
    cudaError_t err = cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      ::tg::detail::log_warning(
          ::tg::detail::str_cat("tg::cuda::Event: cudaEventDestroy failed: ", cudaGetErrorString(err)));
    }
  }
  handle_ = nullptr;
}

void Event::record() { record(current_stream()); }

void Event::record(const Stream& s) {
  if (!handle_) {
    detail::DeviceGuard g(s.device());
    cudaEvent_t e = nullptr;
    TG_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));  // timing enabled
    handle_ = e;
    device_ = s.device();
  }
  TG_CHECK(device_ == s.device(), "tg::cuda::Event::record: event belongs to cuda:", device_,
           " but the stream is on cuda:", s.device());
  TG_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(handle_), static_cast<cudaStream_t>(s.handle())));
}

void Event::synchronize() const {
  if (handle_) TG_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_)));
}

bool Event::query() const {
  if (!handle_) return true;
  cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(handle_));
  if (err == cudaErrorNotReady) return false;
  TG_CUDA_CHECK(err);
  return true;
}

void Event::wait(const Stream& s) const {
  if (handle_)
    TG_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(s.handle()), static_cast<cudaEvent_t>(handle_), 0));
}

float Event::elapsed_ms(const Event& end) const {
  TG_CHECK(handle_ && end.handle_, "tg::cuda::Event::elapsed_ms: both events must be recorded first");
  TG_CHECK(device_ == end.device_, "tg::cuda::Event::elapsed_ms: events on different devices (cuda:", device_,
           " and cuda:", end.device_, ")");
  // Waiting for `end` makes the call well defined when the user forgot to synchronize.
  TG_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(end.handle_)));
  float ms = 0;
  TG_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(handle_), static_cast<cudaEvent_t>(end.handle_)));
  return ms;
}

}  // namespace tg::cuda
