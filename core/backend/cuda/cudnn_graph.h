// cuDNN through cudnn-frontend's graph API, shared by every op that uses it (convolution,
// attention): the cuDNN handle of (device, thread) bound to the current stream, a process-wide
// cache of built graphs keyed by a string the op composes (its shapes, strides, dtypes and
// options), workspaces from tapegrad's caching allocator, and the autotune switch
// (tg::backends::cudnn::set_benchmark). Ops declare a graph with tensor uids they choose and
// execute it with a uid -> pointer map. Only with TG_HAVE_CUDNN (CMake defines it when cuDNN's
// library and cudnn-frontend's headers are both found).
#pragma once
#if defined(TG_HAVE_CUDNN)
#include <cudnn_frontend.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include <tapegrad/core/dtype.h>

namespace tg::cuda::cudnn {

namespace fe = cudnn_frontend;

// The handle of `device` for this thread, bound to the device's current stream (deferred
// elementwise launches are flushed first, so cuDNN's work runs after them).
cudnnHandle_t handle(int device);

// cuDNN's data type for a floating dtype (float16, bfloat16, float32, float64).
fe::DataType_t data_type(DType dtype);

// A built graph and its workspace size. `supported` is false when cuDNN offered no engine for
// it; `error` then says why (the caller falls back or raises).
struct BuiltGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
  bool supported = false;
  std::atomic<bool> tuned{false};  // autotuned already (benchmark mode)
  std::string error;
};

// The graph cached under (device, key), built on first use: `declare` makes the graph's tensors
// and operations; this validates it, builds the operation graph, asks the heuristics (mode A,
// then the fallback list), checks support and builds the plans (every candidate when benchmark
// mode is on, so the first execution can time them). Failures are cached too.
std::shared_ptr<BuiltGraph> get_graph(int device, const std::string& key,
                                      const std::function<std::shared_ptr<fe::graph::Graph>()>& declare);

// Runs a supported graph on the device's current stream with a workspace from the caching
// allocator. In benchmark mode the first execution outside stream capture autotunes the plan
// (its outputs are then recomputed by the real execution). `op` names the caller in errors.
void execute(const char* op, int device, BuiltGraph& g, std::unordered_map<int64_t, void*>& pack);

// The tensor attributes of a dense tensor with these sizes and strides (elements), a uid and
// a data type, as the ops declare them.
fe::graph::Tensor_attributes tensor_attrs(const char* name, int64_t uid, const std::vector<int64_t>& sizes,
                                          const std::vector<int64_t>& strides, DType dtype);

}  // namespace tg::cuda::cudnn
#endif
