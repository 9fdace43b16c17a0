// tg::cuda::Graph in a build without CUDA (TG_CUDA=OFF): constructing and
// destroying one works; capturing or replaying throws tg::Error.
#include <tapegrad/core/cuda_graph.h>

#include <tapegrad/core/error.h>

namespace tg::cuda {

namespace {
[[noreturn]] void no_graphs(const char* what) {
  TG_ERROR(what, ": CUDA is not available: tapegrad was built without CUDA (TG_CUDA=OFF)");
}
}  // namespace

struct Graph::Impl {};

Graph::Graph() = default;
Graph::~Graph() = default;
Graph::Graph(Graph&& o) noexcept : impl_(std::move(o.impl_)) {}
Graph& Graph::operator=(Graph&& o) noexcept {
  impl_ = std::move(o.impl_);
  return *this;
}
void Graph::capture_begin() { no_graphs("tg::cuda::Graph::capture_begin"); }
void Graph::capture_end() { no_graphs("tg::cuda::Graph::capture_end"); }
void Graph::capture(const std::function<void()>&) { no_graphs("tg::cuda::Graph::capture"); }
void Graph::replay() { no_graphs("tg::cuda::Graph::replay"); }
void Graph::reset() {}
bool Graph::is_captured() const { return false; }
bool Graph::is_capturing() const { return false; }
int Graph::device() const { return -1; }
size_t Graph::num_nodes() const { return 0; }
namespace detail {
bool add_replay_prologue(std::function<void()>) { return false; }
bool stream_capturing(int) { return false; }
}  // namespace detail
void Graph::debug_dot(const std::string&) const { TG_ERROR("tg::cuda::Graph::debug_dot: tapegrad was built without CUDA"); }

}  // namespace tg::cuda
