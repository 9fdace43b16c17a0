// The deferred launch queue of launch_queue.h and the cached chain graphs that replay it.
#include <tapegrad/core/backend/cuda/launch_queue.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <utility>

#include <tapegrad/core/backend/cuda/runtime.h>
#include <tapegrad/core/error.h>
#include <tapegrad/core/tensor.h>

namespace tg::cuda::detail {

void* address_noflush(const Tensor& t) {
  if (!t.defined()) return nullptr;
  return static_cast<char*>(t.impl().storage->data()) +
         t.storage_offset() * static_cast<int64_t>(element_size(t.dtype()));
}

std::atomic<bool> g_launches_pending{false};

namespace {

constexpr int kMaxDevices = 64;
constexpr int kChainSizes = 6;  // chains of 2, 4, ..., 64 nodes

static_assert(kMaxBatch == 2 << (kChainSizes - 1), "one chain size per power of two up to kMaxBatch");

__global__ void chain_placeholder_kernel() {}

struct Record {
  std::unique_ptr<DeferredCall> call;  // a deferred call; else a launch of func
  const void* func = nullptr;
  dim3 grid, block;
  void* params[kMaxDeferredArgs] = {};
  alignas(16) unsigned char bytes[kMaxArgBytes];
};

// k dependent kernel nodes, instantiated once per device and size; each flush rewrites the
// nodes' kernels and parameters before a replay. Kept for the process: a destructor would run
// after the CUDA runtime is gone.
struct Chain {
  cudaGraphExec_t exec = nullptr;
  cudaGraphNode_t nodes[kMaxBatch] = {};
};

struct Queue {
  std::mutex mu;
  int count = 0;
  int device = -1;
  cudaStream_t stream = nullptr;
  Record records[kMaxBatch];
  std::array<std::array<Chain, kChainSizes>, kMaxDevices> chains{};
};

Queue& queue() {
  static Queue* q = new Queue();  // never destroyed (see Chain)
  return *q;
}

cudaError_t make_chain(Chain& c, int k) {
  cudaGraph_t g = nullptr;
  cudaError_t err = cudaGraphCreate(&g, 0);
  if (err != cudaSuccess) return err;
  cudaKernelNodeParams p{};
  p.func = reinterpret_cast<void*>(chain_placeholder_kernel);
  p.gridDim = dim3(1);
  p.blockDim = dim3(1);
  for (int i = 0; i < k && err == cudaSuccess; ++i)
    err = cudaGraphAddKernelNode(&c.nodes[i], g, i ? &c.nodes[i - 1] : nullptr, i ? 1 : 0, &p);
  if (err == cudaSuccess) err = cudaGraphInstantiate(&c.exec, g, 0);
  // On success the graph is kept with the exec: its nodes name the exec's nodes in updates.
  if (err != cudaSuccess) {
    (void)cudaGraphDestroy(g);
    c.exec = nullptr;
  }
  return err;
}

int chain_index(int k) {
  int i = 0;
  while ((2 << i) < k) ++i;
  return i;
}

// The launches records[i, i + n) (no calls among them) onto the queue's stream: chains of 2^j
// nodes, a lone one launched.
cudaError_t launch_run(Queue& q, int i, int n) {
  cudaError_t err = cudaSuccess;
  const int end = i + n;
  while (err == cudaSuccess && i < end) {
    const int rem = end - i;
    if (rem == 1) {
      const Record& r = q.records[i];
      err = cudaLaunchKernel(r.func, r.grid, r.block, const_cast<void**>(r.params), 0, q.stream);
      ++i;
      continue;
    }
    int k = kMaxBatch;
    while (k > rem) k >>= 1;
    Chain& c = q.chains[q.device][chain_index(k)];
    if (!c.exec) err = make_chain(c, k);
    for (int j = 0; err == cudaSuccess && j < k; ++j) {
      const Record& r = q.records[i + j];
      cudaKernelNodeParams p{};
      p.func = const_cast<void*>(r.func);
      p.gridDim = r.grid;
      p.blockDim = r.block;
      p.sharedMemBytes = 0;
      p.kernelParams = const_cast<void**>(r.params);
      err = cudaGraphExecKernelNodeSetParams(c.exec, c.nodes[j], &p);
    }
    if (err == cudaSuccess) err = cudaGraphLaunch(c.exec, q.stream);
    i += k;
  }
  return err;
}

// Set while this thread flushes: a deferred call's own flush_launches() (none should happen)
// returns at once instead of taking the queue's lock again.
thread_local bool tls_flushing = false;

// Sends the queue's launches and calls to its stream, in order. The queue is empty afterwards
// even when one fails; the first launch error is returned, a call's tg::Error is kept in `thrown`.
cudaError_t flush_locked(Queue& q, std::exception_ptr& thrown) {
  const int n = q.count;
  if (n == 0) return cudaSuccess;
  q.count = 0;
  tls_flushing = true;
  int prev = -1;
  cudaError_t err = cudaGetDevice(&prev);
  if (err == cudaSuccess && prev != q.device) err = cudaSetDevice(q.device);
  int i = 0;
  while (err == cudaSuccess && !thrown && i < n) {
    if (q.records[i].call) {
      const bool defer_was = tls_defer_allowed;
      tls_defer_allowed = false;  // a call's own launches go to the stream now
      try {
        q.records[i].call->run(q.stream);
      } catch (...) {
        thrown = std::current_exception();
      }
      tls_defer_allowed = defer_was;
      ++i;
      continue;
    }
    int run = 1;
    while (i + run < n && !q.records[i + run].call) ++run;
    err = launch_run(q, i, run);
    i += run;
  }
  for (int j = 0; j < n; ++j) q.records[j].call.reset();
  if (prev >= 0 && prev != q.device) {
    const cudaError_t restore = cudaSetDevice(prev);
    if (err == cudaSuccess) err = restore;
  }
  if (err != cudaSuccess) (void)cudaGetLastError();
  tls_flushing = false;
  // Cleared only now: a thread that read "pending" waits on the lock for these launches, and
  // one that reads "none" finds them already on the stream.
  g_launches_pending.store(false, std::memory_order_release);
  return err;
}

// Whether work for (stream, device) may wait in the queue now (the queue flushed when not).
// Launches for a graph being captured go into that capture now (a chain graph's replay cannot be
// captured); a deferred call may still wait there, as it runs on the stream itself when flushed
// (Graph::capture_end flushes before the capture ends).
bool may_defer(cudaStream_t stream, int device, bool call) {
  if (!launch_batching_enabled()) return false;
  bool ok = tls_defer_allowed && device >= 0 && device < kMaxDevices;
  if (ok) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &st) != cudaSuccess) {
      (void)cudaGetLastError();
      ok = false;
    } else {
      ok = st == cudaStreamCaptureStatusNone || (call && st == cudaStreamCaptureStatusActive);
    }
  }
  if (!ok) flush_launches();
  return ok;
}

void throw_flush_error(cudaError_t err, const std::exception_ptr& thrown) {
  if (thrown) std::rethrow_exception(thrown);
  if (err != cudaSuccess) throw_cuda_error(err, "a batched kernel launch", __FILE__, __LINE__);
}

}  // namespace

bool launch_batching_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("TG_LAUNCH_BATCHING");
    return !(v && (std::strcmp(v, "0") == 0 || std::strcmp(v, "off") == 0));
  }();
  return enabled;
}

void flush_launches_slow() {
  if (tls_flushing) return;
  Queue& q = queue();
  cudaError_t err;
  std::exception_ptr thrown;
  {
    std::lock_guard<std::mutex> lock(q.mu);
    err = flush_locked(q, thrown);
  }
  throw_flush_error(err, thrown);
}

void flush_launches_nothrow() noexcept {
  try {
    flush_launches();
  } catch (const std::exception& e) {
    ::tg::detail::log_warning(e.what());
  }
}

namespace {

// Appends one record on (stream, device), filled by fill(record), flushing first when the queue
// holds another stream's work and after it when the queue is full.
template <class Fill>
void enqueue(cudaStream_t stream, int device, Fill&& fill) {
  Queue& q = queue();
  cudaError_t err = cudaSuccess;
  std::exception_ptr thrown;
  {
    std::lock_guard<std::mutex> lock(q.mu);
    if (q.count > 0 && (q.stream != stream || q.device != device)) err = flush_locked(q, thrown);
    fill(q.records[q.count]);
    q.stream = stream;
    q.device = device;
    ++q.count;
    g_launches_pending.store(true, std::memory_order_release);
    if (q.count == kMaxBatch) {
      const cudaError_t e2 = flush_locked(q, thrown);
      if (err == cudaSuccess) err = e2;
    }
  }
  throw_flush_error(err, thrown);
}

}  // namespace

bool defer_launch(const void* func, dim3 grid, dim3 block, cudaStream_t stream, int device, void* const* args,
                  const size_t* sizes, int nargs) {
  if (!launch_batching_enabled()) return false;
  size_t total = 0;
  for (int a = 0; a < nargs; ++a) total += (sizes[a] + 15) & ~size_t{15};
  if (nargs > kMaxDeferredArgs || total > kMaxArgBytes) {
    flush_launches();
    return false;
  }
  if (!may_defer(stream, device, false)) return false;
  enqueue(stream, device, [&](Record& r) {
    r.func = func;
    r.grid = grid;
    r.block = block;
    size_t off = 0;
    for (int a = 0; a < nargs; ++a) {
      std::memcpy(r.bytes + off, args[a], sizes[a]);
      r.params[a] = r.bytes + off;
      off += (sizes[a] + 15) & ~size_t{15};
    }
  });
  return true;
}

bool defer_call(std::unique_ptr<DeferredCall>& call, cudaStream_t stream, int device) {
  if (!may_defer(stream, device, true)) return false;
  enqueue(stream, device, [&](Record& r) { r.call = std::move(call); });
  return true;
}

bool amend_last_call(cudaStream_t stream, int device, const std::function<bool(DeferredCall&)>& amend) {
  if (!g_launches_pending.load(std::memory_order_acquire)) return false;
  Queue& q = queue();
  std::lock_guard<std::mutex> lock(q.mu);
  if (q.count == 0 || q.stream != stream || q.device != device) return false;
  DeferredCall* c = q.records[q.count - 1].call.get();
  return c != nullptr && amend(*c);
}

}  // namespace tg::cuda::detail
