// cuDNN handles, the graph cache and execution (cudnn_graph.h), and tg::backends::cudnn's
// is_available() / version() (core/cuda.h; false / 0 when built without cuDNN).
#include <tapegrad/core/backend/cuda/cudnn_graph.h>

#include <atomic>
#include <mutex>

#include <tapegrad/core/backend/cuda/runtime.h>
#include <tapegrad/core/cuda.h>
#include <tapegrad/core/error.h>

namespace tg::backends::cudnn {
#if defined(TG_HAVE_CUDNN)
bool is_available() { return tg::cuda::is_available() && cudnnGetVersion() > 0; }
int version() { return static_cast<int>(cudnnGetVersion()); }
#else
bool is_available() { return false; }
int version() { return 0; }
#endif
}  // namespace tg::backends::cudnn

#if defined(TG_HAVE_CUDNN)
namespace tg::cuda::cudnn {
namespace {

constexpr int kMaxDevices = 64;

[[noreturn]] void throw_cudnn(cudnnStatus_t st, const char* call) {
  TG_ERROR("cuDNN: ", call, " failed: ", cudnnGetErrorString(st));
}

// Handles: one per device per thread, from a process-wide pool that is never destroyed (no
// cudnnDestroy at exit, when the CUDA runtime may be gone), as the cuBLAS handles.
struct HandlePool {
  std::mutex mu;
  std::vector<cudnnHandle_t> free[kMaxDevices];
};
HandlePool& pool() {
  static HandlePool* p = new HandlePool();
  return *p;
}
struct ThreadHandles {
  cudnnHandle_t h[kMaxDevices] = {};
  ~ThreadHandles() {
    std::lock_guard<std::mutex> lock(pool().mu);
    for (int d = 0; d < kMaxDevices; ++d)
      if (h[d]) pool().free[d].push_back(h[d]);
  }
};
thread_local ThreadHandles tls_handles;

struct Cache {
  std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<BuiltGraph>> graphs;
};
Cache& cache() {
  static Cache* c = new Cache();
  return *c;
}

}  // namespace

cudnnHandle_t handle(int device) {
  TG_CHECK(device >= 0 && device < kMaxDevices, "cuDNN: invalid CUDA device ", device);
  cudnnHandle_t& h = tls_handles.h[device];
  if (!h) {
    {
      std::lock_guard<std::mutex> lock(pool().mu);
      if (!pool().free[device].empty()) {
        h = pool().free[device].back();
        pool().free[device].pop_back();
      }
    }
    if (!h) {
      detail::DeviceGuard guard(device);
      const cudnnStatus_t st = cudnnCreate(&h);
      if (st != CUDNN_STATUS_SUCCESS) {
        h = nullptr;
        throw_cudnn(st, "cudnnCreate");
      }
    }
  }
  const cudnnStatus_t st = cudnnSetStream(h, detail::current_stream_handle(device));
  if (st != CUDNN_STATUS_SUCCESS) throw_cudnn(st, "cudnnSetStream");
  return h;
}

fe::DataType_t data_type(DType dtype) {
  switch (dtype) {
    case DType::Float16: return fe::DataType_t::HALF;
    case DType::BFloat16: return fe::DataType_t::BFLOAT16;
    case DType::Float32: return fe::DataType_t::FLOAT;
    case DType::Float64: return fe::DataType_t::DOUBLE;
    default: TG_ERROR("cuDNN: no data type for ", dtype);
  }
}

fe::graph::Tensor_attributes tensor_attrs(const char* name, int64_t uid, const std::vector<int64_t>& sizes,
                                          const std::vector<int64_t>& strides, DType dtype) {
  return fe::graph::Tensor_attributes()
      .set_name(name)
      .set_uid(uid)
      .set_dim(sizes)
      .set_stride(strides)
      .set_data_type(data_type(dtype));
}

std::shared_ptr<BuiltGraph> get_graph(int device, const std::string& key,
                                      const std::function<std::shared_ptr<fe::graph::Graph>()>& declare) {
  const bool tune = tg::backends::cudnn::benchmark();
  const std::string full = std::to_string(device) + (tune ? "|T|" : "|H|") + key;
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.graphs.find(full);
    if (it != c.graphs.end()) return it->second;
  }
  // Built outside the lock (building takes milliseconds); a racing thread's copy is dropped.
  auto built = std::make_shared<BuiltGraph>();
  built->graph = declare();
  cudnnHandle_t h = handle(device);
  fe::graph::Graph& g = *built->graph;
  auto step = [&](fe::error_t e, const char* what) {
    if (e.is_good()) return true;
    built->error = std::string(what) + ": " + e.get_message();
    return false;
  };
  bool ok = step(g.validate(), "validate") && step(g.build_operation_graph(h), "build_operation_graph") &&
            step(g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), "create_execution_plans") &&
            step(g.check_support(h), "check_support") &&
            step(g.build_plans(tune ? fe::BuildPlanPolicy_t::ALL : fe::BuildPlanPolicy_t::HEURISTICS_CHOICE),
                 "build_plans");
  if (ok) {
    built->workspace = tune ? g.get_autotune_workspace_size() : 0;
    int64_t ws = 0;
    ok = step(g.get_workspace_size(ws), "get_workspace_size");
    built->workspace = std::max(built->workspace, ws);
  }
  built->supported = ok;
  std::lock_guard<std::mutex> lock(c.mu);
  auto [it, inserted] = c.graphs.emplace(full, built);
  return it->second;
}

void execute(const char* op, int device, BuiltGraph& g, std::unordered_map<int64_t, void*>& pack) {
  TG_CHECK(g.supported, op, ": cuDNN has no engine for this problem (", g.error, ")");
  cudnnHandle_t h = handle(device);
  DataPtr ws;
  if (g.workspace > 0) ws = detail::device_allocate(static_cast<size_t>(g.workspace), device);
  if (tg::backends::cudnn::benchmark() && !g.tuned.load() && !detail::current_stream_capturing(device) &&
      !g.tuned.exchange(true)) {
    fe::error_t e = g.graph->autotune(h, pack, ws.get());
    TG_CHECK(e.is_good(), op, ": cuDNN autotune failed: ", e.get_message());
  }
  fe::error_t e = g.graph->execute(h, pack, ws.get());
  TG_CHECK(e.is_good(), op, ": cuDNN execution failed: ", e.get_message());
}

}  // namespace tg::cuda::cudnn
#endif
