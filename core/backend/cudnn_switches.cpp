// The switches of tg::backends::cudnn and tg::backends::cublas (core/cuda.h), in every build:
// ops read them when they build or run a cuDNN graph (core/backend/cuda/cudnn_graph.cpp) or a
// cuBLASLt matmul (core/backend/cuda/blas.cpp).
#include <atomic>

#include <tapegrad/core/cuda.h>

namespace tg::backends::cudnn {
namespace {
std::atomic<bool> g_benchmark{false};
std::atomic<bool> g_allow_tf32{true};
}  // namespace
void set_benchmark(bool on) { g_benchmark.store(on, std::memory_order_relaxed); }
bool benchmark() { return g_benchmark.load(std::memory_order_relaxed); }
void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }
}  // namespace tg::backends::cudnn

namespace tg::backends::cublas {
namespace {
std::atomic<bool> g_benchmark{false};
}  // namespace
void set_benchmark(bool on) { g_benchmark.store(on, std::memory_order_relaxed); }
bool benchmark() { return g_benchmark.load(std::memory_order_relaxed); }
}  // namespace tg::backends::cublas
