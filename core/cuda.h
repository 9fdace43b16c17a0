// The public CUDA runtime API: availability, devices, streams, events and the
// caching allocator's counters. Built without CUDA, is_available() is false and
// everything that needs a GPU throws tg::Error.
#pragma once
#include <cstddef>
#include <cstdint>

#include <tapegrad/core/device.h>

namespace tg::cuda {

bool is_available();
int device_count();
int runtime_version();  // e.g. 13000
int current_device();
void set_device(int index);
void synchronize(int device = -1);  // -1: the current device

// A CUDA stream (RAII, move-only). Stream() creates a new non-blocking stream on
// the current device; Stream::wrap borrows an existing handle without owning it.
class Stream {
 public:
  Stream();
  explicit Stream(int device);
  static Stream wrap(void* handle, int device);
  Stream(Stream&& o) noexcept;
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();
  // cudaStream_t. Work tapegrad deferred (small elementwise launches are batched) is sent to
  // the GPU first, so what the caller enqueues on the handle runs after it.
  void* handle() const;
  int device() const { return device_; }
  void synchronize() const;
  bool query() const;  // true when all work is done

 private:
  Stream(void* handle, int device, bool owned) : handle_(handle), device_(device), owned_(owned) {}
  void* handle_ = nullptr;
  int device_ = 0;
  bool owned_ = false;
};

// The stream the ops of this thread run on for a device (default: the legacy default stream).
Stream current_stream(int device = -1);
void set_current_stream(const Stream& s);

// Makes `s` the current stream of its device (and that device current) for a scope.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& s);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  void* prev_stream_;
  int prev_device_;
  int device_;
};

// A CUDA event with timing enabled (RAII, move-only).
class Event {
 public:
  Event();
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();
  void record();                 // on the current stream of the current device
  void record(const Stream& s);
  void synchronize() const;
  bool query() const;
  void wait(const Stream& s) const;  // make s wait for this event
  float elapsed_ms(const Event& end) const;  // time from this event to `end`
  void* handle() const { return handle_; }

 private:
  void* handle_ = nullptr;
  int device_ = -1;
};

// Caching allocator counters, in bytes (device -1: current).
size_t memory_allocated(int device = -1);
size_t max_memory_allocated(int device = -1);
size_t memory_reserved(int device = -1);
void reset_peak_memory_stats(int device = -1);
void empty_cache();

}  // namespace tg::cuda

// cuDNN, which runs convolution and fused attention on CUDA (as torch.backends.cudnn).
namespace tg::backends::cudnn {
bool is_available();  // built with cuDNN (and cudnn-frontend) and a GPU is present
int version();        // cuDNN's run-time version, e.g. 91900; 0 when not built with it
// Autotune: time every engine for each new problem (shape, dtype, layout) on its first run and
// keep the fastest, as torch.backends.cudnn.benchmark. Default false (heuristics' first choice).
void set_benchmark(bool on);
bool benchmark();
// TF32 tensor cores for float32 convolutions; default true, as torch.backends.cudnn.allow_tf32.
void set_allow_tf32(bool allow);
bool allow_tf32();
}  // namespace tg::backends::cudnn

// cuBLAS / cuBLASLt, which run matmul and linear on CUDA.
namespace tg::backends::cublas {
// Autotune, as cudnn::set_benchmark for matmuls (PyTorch's torch.cuda.tunable): each new problem
// (shape, dtype, layout, fused epilogue) times every algorithm cuBLASLt's heuristic offers on its
// first eager call and keeps the fastest; float32 matmuls then go through cuBLASLt too (except
// those of few output tiles, which tapegrad's own split-K kernel runs either way). Default
// false (the heuristic's first choice). Like cudnn's, the choice is made by timing, so two runs
// may pick different algorithms and differ in the last bits.
void set_benchmark(bool on);
bool benchmark();
}  // namespace tg::backends::cublas
