// tg::cuda::Graph: capture a sequence of GPU work once (a whole training step:
// forward, backward, fused optimizer, GradScaler) and replay it with one launch,
// taking the per-op host overhead off the loop. Modelled on torch.cuda.CUDAGraph.
//
//   tg::cuda::Stream side;                    // warm up and capture off the default stream
//   tg::cuda::Graph graph;
//   {
//     tg::cuda::StreamGuard guard(side);
//     for (int i = 0; i < 3; ++i) step();     // caches blocks, cuBLAS workspace, optimizer state
//     graph.capture([&] { step(); });         // records the step; nothing runs yet
//   }
//   for (...) { static_x.copy_(next_batch); graph.replay(); }
//
// What to know:
//  - Nothing runs during capture. Replays run the recorded kernels on the same
//    memory: tensors the step allocated while capturing (its outputs, new gradients,
//    the loss) live in the graph's private memory pool and are overwritten by each
//    replay; read them after replay(). That memory returns to the allocator's cache
//    when the Graph is destroyed or reset.
//  - Feed new inputs by copying into the tensors the step read while capturing
//    (static_x.copy_(batch)) before replay(). Host values are frozen into the graph:
//    scalars, shapes, pointers, and the random-number offsets of tg::rand / randn /
//    randperm called inside the step repeat identically at every replay.
//  - index_select skips its bounds check (a read-back of the indices) while capturing:
//    indices must be valid, as inside any replayed step.
//  - The step must not wait for the GPU (item(), cpu(), to_vector(), printing a CUDA
//    tensor, blocking copies): such a call breaks the capture and capture() throws a
//    tg::Error naming it; the allocator and streams keep working afterwards.
//  - Warm up eagerly on the capture stream first (as PyTorch recommends), so lazily
//    created state (optimizer buffers, cuBLAS plans) exists before capture.
//  - Captured on the legacy default stream, capture_begin switches to an internal
//    side stream for the capture and restores the current stream in capture_end.
//    replay() launches on the current stream of the graph's device.
#pragma once
#include <string>
#include <cstddef>
#include <functional>
#include <memory>

namespace tg::cuda {

class Graph {
 public:
  Graph();
  ~Graph();
  Graph(Graph&& o) noexcept;
  Graph& operator=(Graph&& o) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Begins capturing this thread's work on the current device's current stream
  // (cudaStreamCaptureModeThreadLocal). The device is synchronised first.
  void capture_begin();
  // Ends the capture and instantiates the graph; throws if the capture was broken.
  void capture_end();
  // capture_begin(); fn(); capture_end(). If fn throws, the capture is ended and
  // discarded and a tg::Error says why (the original message included).
  void capture(const std::function<void()>& fn);
  // Launches the captured work on the current stream of the graph's device.
  void replay();
  // Drops the captured graph (synchronising the device) and returns its memory pool
  // to the cache; the Graph can capture again afterwards.
  void reset();

  bool is_captured() const;   // a graph is ready to replay
  bool is_capturing() const;  // between capture_begin and capture_end
  int device() const;         // the capture's device, -1 before the first capture
  size_t num_nodes() const;   // nodes of the captured graph (0 when none)
  // Writes the captured graph in Graphviz form (cudaGraphDebugDotPrint: one node per
  // kernel, copy or memset, with kernel names and launch shapes), for reading what a
  // captured step launches.
  void debug_dot(const std::string& path) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

namespace detail {
// For state a capture freezes and that can go stale between replays (the lower-precision copies
// of parameters, core/cast_copies.h): while this thread captures into a tg::cuda::Graph, adds
// `fn` to what that graph runs on the current stream before each of its replays and returns
// true; returns false (dropping fn) when this thread is not capturing into one.
bool add_replay_prologue(std::function<void()> fn);
// Whether the current stream of CUDA device `device` is being captured (by a tg::cuda::Graph or
// by the caller's own cudaStreamBeginCapture); true when that cannot be told. False without CUDA.
bool stream_capturing(int device);
}  // namespace detail

}  // namespace tg::cuda
