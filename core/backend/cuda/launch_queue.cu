// The deferred launch queue of launch_queue.h and the cached chain graphs that replay it.
#include <tapegrad/core/backend/cuda/launch_queue.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>

#include <tapegrad/core/backend/cuda/runtime.h>
#include <tapegrad/core/error.h>

namespace tg::cuda::detail {

std::atomic<bool> g_launches_pending{false};

namespace {

constexpr int kMaxDevices = 64;
constexpr int kChainSizes = 6;  // chains of 2, 4, ..., 64 nodes

static_assert(kMaxBatch == 2 << (kChainSizes - 1), "one chain size per power of two up to kMaxBatch");

__global__ void chain_placeholder_kernel() {}

struct Record {
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

// Sends the queue's launches to its stream, in order. The queue is empty afterwards even when
// a launch fails; the first error is returned.
cudaError_t flush_locked(Queue& q) {
  const int n = q.count;
  if (n == 0) return cudaSuccess;
  q.count = 0;
  int prev = -1;
  cudaError_t err = cudaGetDevice(&prev);
  if (err == cudaSuccess && prev != q.device) err = cudaSetDevice(q.device);
  int i = 0;
  while (err == cudaSuccess && i < n) {
    const int rem = n - i;
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
  if (prev >= 0 && prev != q.device) {
    const cudaError_t restore = cudaSetDevice(prev);
    if (err == cudaSuccess) err = restore;
  }
  if (err != cudaSuccess) (void)cudaGetLastError();
  // Cleared only now: a thread that read "pending" waits on the lock for these launches, and
  // one that reads "none" finds them already on the stream.
  g_launches_pending.store(false, std::memory_order_release);
  return err;
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
  Queue& q = queue();
  cudaError_t err;
  {
    std::lock_guard<std::mutex> lock(q.mu);
    err = flush_locked(q);
  }
  if (err != cudaSuccess) throw_cuda_error(err, "a batched kernel launch", __FILE__, __LINE__);
}

void flush_launches_nothrow() noexcept {
  try {
    flush_launches();
  } catch (const std::exception& e) {
    ::tg::detail::log_warning(e.what());
  }
}

bool defer_launch(const void* func, dim3 grid, dim3 block, cudaStream_t stream, int device, void* const* args,
                  const size_t* sizes, int nargs) {
  if (!launch_batching_enabled()) return false;
  if (!tls_defer_allowed) {
    flush_launches();
    return false;
  }
  size_t total = 0;
  for (int a = 0; a < nargs; ++a) total += (sizes[a] + 15) & ~size_t{15};
  bool ok = nargs <= kMaxDeferredArgs && total <= kMaxArgBytes && device >= 0 && device < kMaxDevices;
  if (ok) {
    // Work for a graph being captured goes into that capture, now.
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &st) != cudaSuccess) {
      (void)cudaGetLastError();
      ok = false;
    } else {
      ok = st == cudaStreamCaptureStatusNone;
    }
  }
  if (!ok) {
    flush_launches();
    return false;
  }
  Queue& q = queue();
  cudaError_t err = cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(q.mu);
    if (q.count > 0 && (q.stream != stream || q.device != device)) err = flush_locked(q);
    Record& r = q.records[q.count];
    r.func = func;
    r.grid = grid;
    r.block = block;
    size_t off = 0;
    for (int a = 0; a < nargs; ++a) {
      std::memcpy(r.bytes + off, args[a], sizes[a]);
      r.params[a] = r.bytes + off;
      off += (sizes[a] + 15) & ~size_t{15};
    }
    q.stream = stream;
    q.device = device;
    ++q.count;
    g_launches_pending.store(true, std::memory_order_release);
    if (q.count == kMaxBatch) {
      const cudaError_t e2 = flush_locked(q);
      if (err == cudaSuccess) err = e2;
    }
  }
  if (err != cudaSuccess) throw_cuda_error(err, "a batched kernel launch", __FILE__, __LINE__);
  return true;
}

}  // namespace tg::cuda::detail
