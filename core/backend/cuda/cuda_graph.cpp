// tg::cuda::Graph (core/cuda_graph.h): stream capture into a cudaGraph_t,
// instantiation and replay, with a graph-private memory pool in the caching
// allocator and an arena of "blocks done" counters (done_counters.h), both living
// exactly as long as the captured graph.
#include <tapegrad/core/cuda_graph.h>

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <tapegrad/core/backend/cuda/done_counters.h>
#include <tapegrad/core/backend/cuda/launch_queue.h>
#include <tapegrad/core/backend/cuda/runtime.h>
#include <tapegrad/core/cuda.h>
#include <tapegrad/core/error.h>

namespace tg::cuda {
namespace {

constexpr int kMaxDevices = 64;

// One side stream per device for captures begun on the legacy default stream, which
// cannot be captured. Never destroyed: the allocator and the cuBLAS workspace table
// keep cached state keyed by the stream handle.
cudaStream_t internal_capture_stream(int device) {
  TG_CHECK(device >= 0 && device < kMaxDevices, "tg::cuda::Graph: device ", device, " out of range");
  static std::array<cudaStream_t, kMaxDevices> streams{};
  static std::array<std::once_flag, kMaxDevices> once;
  std::call_once(once[device], [device] {
    detail::DeviceGuard g(device);
    cudaStream_t s = nullptr;
    TG_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    streams[device] = s;
  });
  return streams[device];
}

bool is_legacy(cudaStream_t s) { return s == nullptr || s == cudaStreamLegacy; }

void set_stream(int device, cudaStream_t s) { set_current_stream(Stream::wrap(s, device)); }

void warn(const std::string& what) { ::tg::detail::log_warning("tg::cuda::Graph: " + what); }

struct GraphState;
// The Graph this thread is capturing into (captures are thread-local: cudaStreamCaptureModeThreadLocal).
thread_local GraphState* tls_capturing = nullptr;

// Everything a Graph owns; the methods below keep it consistent.
struct GraphState {
  int device = -1;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  uint64_t pool = 0;  // the allocator's graph pool (0: none)
  bool capturing = false;
  cudaStream_t stream = nullptr;       // the capture stream
  bool switched = false;               // the capture replaced the legacy default stream...
  cudaStream_t prev_stream = nullptr;  // ...which is restored at the end
  std::thread::id thread;              // the capturing thread
  unsigned long long capture_id = 0;   // the capture's id while capturing (its counter arena's key)
  DataPtr counter_arena;               // zeroed before the capture; captured launches take slices
  std::shared_ptr<void> workspace;     // the capture stream's cuBLAS workspace, which replays use
  std::vector<std::function<void()>> prologues;  // run before each replay (detail::add_replay_prologue)

  // Routes allocations back to the general cache and restores the current stream. Never throws.
  void leave_capture() noexcept {
    if (tls_capturing == this) tls_capturing = nullptr;
    detail::clear_capture_counter_arena(capture_id);
    detail::graph_pool_capture_end(device);
    if (switched) {
      try {
        set_stream(device, prev_stream);
      } catch (const std::exception& e) {
        warn(std::string("could not restore the current stream: ") + e.what());
      }
    }
    capturing = false;
    switched = false;
  }

  // Ends an unfinished capture and throws its graph away. Never throws.
  void abort_capture() noexcept {
    if (!capturing) return;
    // A call still waiting in the launch queue (a deferred gemm) belongs to this capture: it goes
    // into it (and is thrown away with it), not onto the stream after the capture ends.
    detail::flush_launches_nothrow();
    cudaGraph_t g = nullptr;
    const cudaError_t err = cudaStreamEndCapture(stream, &g);
    if (g) (void)cudaGraphDestroy(g);
    if (err != cudaSuccess) (void)cudaGetLastError();  // an invalidated capture reports here; that is expected
    if (err == cudaErrorStreamCaptureWrongThread)
      warn("the capture was begun by another thread and could not be ended here");
    leave_capture();
  }

  // Drops the graph and hands its pool back. Replays may still run, so the device is
  // synchronised first; when that fails the pool stays reserved (never reused while in use).
  void drop() {
    abort_capture();
    prologues.clear();
    if (!exec && !graph && !pool && !counter_arena.get()) return;
    detail::DeviceGuard g(device);
    detail::flush_launches();
    TG_CUDA_CHECK(cudaDeviceSynchronize());
    if (exec) {
      cudaGraphExec_t e = std::exchange(exec, nullptr);
      TG_CUDA_CHECK(cudaGraphExecDestroy(e));
    }
    if (graph) {
      cudaGraph_t gr = std::exchange(graph, nullptr);
      TG_CUDA_CHECK(cudaGraphDestroy(gr));
    }
    if (pool) detail::graph_pool_release(device, std::exchange(pool, 0));
    counter_arena.reset();
    workspace.reset();
  }

  // drop() for failure paths and destructors: logs instead of throwing.
  void drop_quietly() noexcept {
    try {
      drop();
    } catch (const std::exception& e) {
      warn(std::string("releasing the graph failed (its memory stays reserved): ") + e.what());
      exec = nullptr;
      graph = nullptr;
      pool = 0;
      (void)std::make_unique<DataPtr>(std::move(counter_arena)).release();  // a replay may still use it
      (void)std::make_unique<std::shared_ptr<void>>(std::move(workspace)).release();
    }
  }
};

}  // namespace

struct Graph::Impl : GraphState {};

Graph::Graph() : impl_(std::make_unique<Impl>()) {}

Graph::~Graph() {
  if (impl_) impl_->drop_quietly();
}

Graph::Graph(Graph&& o) noexcept : impl_(std::move(o.impl_)) {}

Graph& Graph::operator=(Graph&& o) noexcept {
  if (this != &o) {
    if (impl_) impl_->drop_quietly();
    impl_ = std::move(o.impl_);
  }
  return *this;
}

void Graph::capture_begin() {
  TG_CHECK(is_available(), "tg::cuda::Graph::capture_begin: no CUDA device available");
  if (!impl_) impl_ = std::make_unique<Impl>();  // a moved-from Graph is usable again
  Impl& m = *impl_;
  TG_CHECK(!m.capturing, "tg::cuda::Graph::capture_begin: already capturing on cuda:", m.device,
           "; call capture_end() first");
  TG_CHECK(!m.exec, "tg::cuda::Graph::capture_begin: this Graph already holds a captured graph (cuda:", m.device,
           "); call reset() first or use another Graph");

  const int device = current_device();
  const cudaStream_t current = detail::current_stream_handle(device);
  const bool switched = is_legacy(current);
  const cudaStream_t stream = switched ? internal_capture_stream(device) : current;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  TG_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  TG_CHECK(status == cudaStreamCaptureStatusNone, "tg::cuda::Graph::capture_begin: the ",
           switched ? "internal capture stream" : "current stream", " of cuda:", device,
           " is already capturing (another Graph or thread?)",
           switched ? "; make a tg::cuda::Stream current with tg::cuda::StreamGuard for this capture" : "");

  if (switched) set_stream(device, stream);
  uint64_t pool = 0;
  bool routed = false;
  DataPtr arena;  // back to the cache (stream-ordered) if the capture does not start
  try {
    // State that cannot be created under capture: the cuBLAS handles and this stream's workspace.
    (void)detail::cublas_handle(device);
    (void)detail::cublaslt_handle(device);
    (void)detail::cublas_workspace(device, nullptr);
    // Done counters for the captured launches, zeroed here so that the graph holds no
    // memset node for them (general memory: the graph's pool is routed below).
    constexpr size_t kArenaBytes = sizeof(unsigned) * detail::kCaptureArenaCounters;
    arena = detail::device_allocate(kArenaBytes, device);
    TG_CUDA_CHECK(cudaMemsetAsync(arena.get(), 0, kArenaBytes, stream));
    // Queued work (and that memset) finishes first, so memory freed before the capture and
    // cached blocks the graph's pool takes over are idle.
    TG_CUDA_CHECK(cudaDeviceSynchronize());
    pool = detail::graph_pool_create(device);
    detail::graph_pool_capture_begin(device, pool);
    routed = true;
    TG_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  } catch (...) {
    if (routed) detail::graph_pool_capture_end(device);
    if (pool) {
      try {
        detail::graph_pool_release(device, pool);
      } catch (const std::exception& e) {
        warn(e.what());
      }
    }
    if (switched) {
      try {
        set_stream(device, current);
      } catch (const std::exception& e) {
        warn(e.what());
      }
    }
    throw;
  }
  // The arena serves only this capture (not one other code begins on this thread meanwhile).
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  if (cudaStreamGetCaptureInfo(stream, &capturing, &id) == cudaSuccess && capturing == cudaStreamCaptureStatusActive)
    detail::set_capture_counter_arena(device, id, static_cast<unsigned*>(arena.get()), detail::kCaptureArenaCounters);
  else
    (void)cudaGetLastError();  // no arena: done_counters falls back to a memset per launch
  m.capture_id = id;
  m.counter_arena = std::move(arena);
  m.device = device;
  m.stream = stream;
  m.switched = switched;
  m.prev_stream = current;
  m.pool = pool;
  m.capturing = true;
  m.thread = std::this_thread::get_id();
  tls_capturing = &m;
}

void Graph::capture_end() {
  TG_CHECK(impl_ && impl_->capturing, "tg::cuda::Graph::capture_end: not capturing (call capture_begin() first)");
  Impl& m = *impl_;
  TG_CHECK(m.thread == std::this_thread::get_id(),
           "tg::cuda::Graph::capture_end: must be called by the thread that began the capture");
  const int device = m.device;
  // A call still waiting in the launch queue (a deferred gemm) is part of the captured work.
  try {
    detail::flush_launches();
  } catch (const std::exception& e) {
    m.drop_quietly();
    TG_ERROR("tg::cuda::Graph::capture_end: the captured work failed on cuda:", device,
             " and the capture was discarded. Cause: ", e.what());
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t err = cudaStreamEndCapture(m.stream, &graph);
  m.leave_capture();
  if (err != cudaSuccess || !graph) {
    (void)cudaGetLastError();
    if (graph) (void)cudaGraphDestroy(graph);
    m.drop_quietly();
    TG_ERROR("tg::cuda::Graph::capture_end: the capture on cuda:", device, " failed: ", cudaGetErrorString(err), " (",
             cudaGetErrorName(err),
             "). A call that is not allowed while capturing ran in the captured region: a host synchronisation "
             "(item(), cpu(), to_vector(), printing a CUDA tensor, a Stream/Event synchronize), a blocking copy, or "
             "work on another stream that was not joined back to the capture stream");
  }
  m.graph = graph;
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  if (inst != cudaSuccess) {
    (void)cudaGetLastError();
    m.drop_quietly();
    TG_ERROR("tg::cuda::Graph::capture_end: cudaGraphInstantiate failed on cuda:", device, ": ",
             cudaGetErrorString(inst), " (", cudaGetErrorName(inst), ")");
  }
  m.exec = exec;
  m.workspace = detail::cublas_workspace_ref(device, m.stream);
  // Uploading now keeps that one-time cost out of the first replay.
  detail::DeviceGuard g(device);
  TG_CUDA_CHECK(cudaGraphUpload(exec, m.stream));
}

void Graph::capture(const std::function<void()>& fn) {
  TG_CHECK(static_cast<bool>(fn), "tg::cuda::Graph::capture: empty function");
  capture_begin();
  Impl& m = *impl_;
  try {
    fn();
  } catch (const std::exception& e) {
    const int device = m.device;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const bool invalidated =
        cudaStreamIsCapturing(m.stream, &status) == cudaSuccess && status == cudaStreamCaptureStatusInvalidated;
    (void)cudaGetLastError();
    m.drop_quietly();
    TG_ERROR("tg::cuda::Graph::capture: the captured work failed on cuda:", device, " and the capture was discarded",
             invalidated ? " (a call not allowed while capturing broke it: a host synchronisation such as item(), "
                           "cpu(), to_vector() or printing a CUDA tensor, or a blocking copy)"
                         : "",
             ". Cause: ", e.what());
  } catch (...) {
    m.drop_quietly();
    throw;
  }
  capture_end();
}

namespace detail {
bool add_replay_prologue(std::function<void()> fn) {
  if (tls_capturing == nullptr) return false;
  tls_capturing->prologues.push_back(std::move(fn));
  return true;
}
bool stream_capturing(int device) {
  try {
    return current_stream_capturing(device);
  } catch (const Error&) {
    return true;  // the query failed (e.g. an implicit capture dependency): capturing is the safe answer
  }
}
}  // namespace detail

void Graph::replay() {
  TG_CHECK(!is_capturing(), "tg::cuda::Graph::replay: still capturing; call capture_end() first");
  TG_CHECK(is_captured(), "tg::cuda::Graph::replay: nothing captured (call capture() first)");
  Impl& m = *impl_;
  detail::DeviceGuard g(m.device);
  for (const auto& prologue : m.prologues) prologue();
  TG_CUDA_CHECK(cudaGraphLaunch(m.exec, detail::current_stream_handle(m.device)));
}

void Graph::reset() {
  if (impl_) impl_->drop();
}

bool Graph::is_captured() const { return impl_ && impl_->exec; }
bool Graph::is_capturing() const { return impl_ && impl_->capturing; }
int Graph::device() const { return impl_ ? impl_->device : -1; }

void Graph::debug_dot(const std::string& path) const {
  TG_CHECK(impl_ && impl_->graph, "tg::cuda::Graph::debug_dot: nothing captured");
  TG_CUDA_CHECK(cudaGraphDebugDotPrint(impl_->graph, path.c_str(), cudaGraphDebugDotFlagsVerbose));
}

size_t Graph::num_nodes() const {
  if (!impl_ || !impl_->graph) return 0;
  size_t n = 0;
  TG_CUDA_CHECK(cudaGraphGetNodes(impl_->graph, nullptr, &n));
  return n;
}

}  // namespace tg::cuda
