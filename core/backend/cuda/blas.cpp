// cuBLAS / cuBLASLt handles, the per-stream workspace, and the gemm of the CUDA
// backend. Row-major C = A B is computed as the column-major C^T = B^T A^T: the
// libraries get (B, A) with m and n swapped, so no data is ever transposed.
// float32 of few output tiles (TF32 off) goes to small_gemm.cu's split-K kernel, other float32 to
// cublasGemmEx, float64 to cublasDgemm; float16 / bfloat16, a float32 C
// from half operands, and every fused epilogue (bias, bias gradient) go to cuBLASLt through a
// plan cached per problem, as does float32 when autotuning (tg::backends::cublas::set_benchmark:
// a plan times the algorithms cuBLASLt's heuristic offers on its first eager call and keeps the
// fastest).
#include <tapegrad/core/backend/cuda/blas.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <tapegrad/core/backend/cuda/done_counters.h>
#include <tapegrad/core/backend/cuda/kernels.cuh>
#include <tapegrad/core/backend/cuda/runtime.h>
#include <tapegrad/core/cuda.h>
#include <tapegrad/core/ops.h>

namespace tg::cuda::detail {
namespace {

constexpr int kMaxDevices = 64;
constexpr size_t kWorkspaceBytes = 32 << 20;

// ---- cuBLAS handles: one per device per thread, from a process-wide pool.
// A thread returns its handles to the pool when it exits (no CUDA call at
// thread exit); the pool itself is never destroyed, so no cublasDestroy runs
// during process teardown, when the CUDA runtime may already be gone.
struct HandlePool {
  std::mutex mu;
  std::array<std::vector<cublasHandle_t>, kMaxDevices> free;
};
HandlePool& handle_pool() {
  static HandlePool* pool = std::make_unique<HandlePool>().release();
  return *pool;
}

struct ThreadHandles {
  std::array<cublasHandle_t, kMaxDevices> h{};
  ~ThreadHandles() {
    HandlePool& pool = handle_pool();
    std::lock_guard<std::mutex> lock(pool.mu);
    for (int d = 0; d < kMaxDevices; ++d)
      if (h[d]) pool.free[d].push_back(h[d]);
  }
};
thread_local ThreadHandles tls_handles;

int resolve(int device) {
  if (device < 0) TG_CUDA_CHECK(cudaGetDevice(&device));
  TG_CHECK(device < kMaxDevices && device < device_count(), "cuBLAS: invalid CUDA device ", device);
  return device;
}

// ---- workspaces: one per (device, stream), so concurrent streams never share one.
struct Workspaces {
  std::mutex mu;
  std::map<std::pair<int, cudaStream_t>, std::shared_ptr<DataPtr>> by_stream;
};
Workspaces& workspaces() {
  static Workspaces* w = std::make_unique<Workspaces>().release();
  return *w;
}

// ---- cuBLASLt plans (descriptors + chosen algorithm), cached per shape.
struct LtDescDelete {
  void operator()(cublasLtMatmulDesc_t d) const { (void)cublasLtMatmulDescDestroy(d); }
};
struct LtLayoutDelete {
  void operator()(cublasLtMatrixLayout_t l) const { (void)cublasLtMatrixLayoutDestroy(l); }
};
struct LtPrefDelete {
  void operator()(cublasLtMatmulPreference_t p) const { (void)cublasLtMatmulPreferenceDestroy(p); }
};
using LtDesc = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, LtDescDelete>;
using LtLayout = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, LtLayoutDelete>;
using LtPref = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, LtPrefDelete>;

struct LtPlan {
  LtDesc desc;
  LtLayout a, b, c;  // in cuBLAS terms: a = our B, b = our A
  cublasLtMatmulAlgo_t algo{};  // the heuristic's first choice
  bool ok = false;  // the heuristic found an algorithm (always true for plans without an epilogue)
  // Every algorithm the heuristic offered (up to kOffered, first choice first), for autotuning.
  std::vector<cublasLtMatmulAlgo_t> offered;
  // Autotuning (tg::backends::cublas::set_benchmark): the fastest offered algorithm, timed once
  // on the plan's first eager call with the switch on; `tuned` is set after `tuned_algo`.
  mutable cublasLtMatmulAlgo_t tuned_algo{};
  mutable std::atomic<bool> tuned{false};
  // Held from setting the desc's epilogue pointer until the matmul is enqueued (threads share
  // plans), and while a plan is tuned.
  mutable std::mutex mu;
};
constexpr int kOffered = 8;
using LtKey = std::array<int64_t, 16>;
struct LtPlans {
  std::mutex mu;
  std::map<LtKey, std::unique_ptr<LtPlan>> plans;  // a plan is immutable once built
};
LtPlans& lt_plans() {
  static LtPlans* p = std::make_unique<LtPlans>().release();
  return *p;
}

// The largest power of two (<= 256) dividing the address: cuBLASLt picks kernels by alignment.
int64_t alignment(const void* p) {
  auto v = reinterpret_cast<uintptr_t>(p);
  int64_t a = 256;
  while (a > 1 && (v % static_cast<uintptr_t>(a)) != 0) a /= 2;
  return a;
}

LtLayout make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  TG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  LtLayout owned(l);
  if (batch > 1) {
    const auto count = static_cast<int32_t>(batch);
    TG_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    TG_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
  return owned;
}

cudaDataType_t lt_type(DType t) {
  switch (t) {
    case kFloat32:
      return CUDA_R_32F;
    case kFloat16:
      return CUDA_R_16F;
    case kBFloat16:
      return CUDA_R_16BF;
    default:
      TG_ERROR("matmul: cuBLASLt path does not support dtype ", dtype_name(t));
  }
}

// Our row-major epilogues in cuBLAS's column-major terms (D = C^T, cuBLAS A = our B): the bias
// runs along D's rows (our columns); our A's row sums are cuBLAS B's sums over k (BGRADB), our
// B's column sums cuBLAS A's (BGRADA).
cublasLtEpilogue_t lt_epilogue(backend::GemmEpilogue e) {
  switch (e) {
    case backend::GemmEpilogue::None:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case backend::GemmEpilogue::Bias:
      return CUBLASLT_EPILOGUE_BIAS;
    case backend::GemmEpilogue::RowSumsA:
      return CUBLASLT_EPILOGUE_BGRADB;
    case backend::GemmEpilogue::ColSumsB:
      return CUBLASLT_EPILOGUE_BGRADA;
    case backend::GemmEpilogue::GeluTanhBackward:
      return CUBLASLT_EPILOGUE_DGELU;  // GELU's tanh form, as GELU_AUX stores its input
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// Where the epilogue's operand pointer goes: the bias vector, or the DGELU's saved input.
cublasLtMatmulDescAttributes_t epilogue_pointer(backend::GemmEpilogue e) {
  return e == backend::GemmEpilogue::GeluTanhBackward ? CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER
                                                      : CUBLASLT_MATMUL_DESC_BIAS_POINTER;
}

// The plan for g, built on first use. A plan with an epilogue the library has no kernel for
// comes back with ok = false (gemm_fuses then says no); without one that is an error.
const LtPlan& lt_plan(const backend::GemmArgs& g, int device) {
  const bool tf32 = g.dtype == kFloat32 && tg::allow_tf32();
  const bool epi = g.epilogue != backend::GemmEpilogue::None;
  const LtKey key = {device,
                     static_cast<int64_t>(g.dtype),
                     g.m,
                     g.n,
                     g.k,
                     g.batch,
                     g.trans_a,
                     g.trans_b,
                     g.lda,
                     g.ldb,
                     g.ldc,
                     g.stride_a,
                     g.stride_b,
                     g.stride_c,
                     alignment(g.a) * 1024 * 1024 + alignment(g.b) * 1024 + alignment(g.c),
                     static_cast<int64_t>(g.c_float32) | static_cast<int64_t>(g.epilogue) << 1 |
                         static_cast<int64_t>(tf32) << 4 | (epi ? alignment(g.epilogue_ptr) : 0) << 8};
  LtPlans& cache = lt_plans();
  std::lock_guard<std::mutex> lock(cache.mu);
  auto it = cache.plans.find(key);
  if (it != cache.plans.end()) return *it->second;

  const cudaDataType_t type = lt_type(g.dtype), c_type = g.c_float32 ? CUDA_R_32F : type;
  auto plan = std::make_unique<LtPlan>();
  cublasLtMatmulDesc_t desc = nullptr;
  TG_CUBLAS_CHECK(
      cublasLtMatmulDescCreate(&desc, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
  plan->desc.reset(desc);
  const cublasOperation_t op_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS "A" is our B
  const cublasOperation_t op_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  TG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  TG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (epi) {
    // The vector has C's type (cuBLASLt's default for bias and bias gradient). The heuristic
    // reads the pointer's alignment; each call sets its own pointer (same alignment class).
    const cublasLtEpilogue_t e = lt_epilogue(g.epilogue);
    TG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e)));
    TG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, epilogue_pointer(g.epilogue), &g.epilogue_ptr,
                                                   sizeof(g.epilogue_ptr)));
    if (g.epilogue == backend::GemmEpilogue::GeluTanhBackward) {
      // The saved input is laid out as D (column-major n x m, ld n), in D's type (the default).
      const int64_t ld = g.n;
      TG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
    }
  }
  // Column-major views: our B is n x k (k x n stored when transposed), our A is k x m (m x k), C is n x m.
  plan->a = g.trans_b ? make_layout(type, g.k, g.n, g.ldb, g.batch, g.stride_b)
                      : make_layout(type, g.n, g.k, g.ldb, g.batch, g.stride_b);
  plan->b = g.trans_a ? make_layout(type, g.m, g.k, g.lda, g.batch, g.stride_a)
                      : make_layout(type, g.k, g.m, g.lda, g.batch, g.stride_a);
  plan->c = make_layout(c_type, g.n, g.m, g.ldc, g.batch, g.stride_c);

  cublasLtMatmulPreference_t pref_raw = nullptr;
  TG_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref_raw));
  LtPref pref(pref_raw);
  const uint64_t ws = kWorkspaceBytes;
  TG_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref_raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const auto align_a = static_cast<uint32_t>(alignment(g.b)), align_b = static_cast<uint32_t>(alignment(g.a)),
             align_c = static_cast<uint32_t>(alignment(g.c));
  TG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                       sizeof(align_a)));
  TG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                       sizeof(align_b)));
  TG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                                       sizeof(align_c)));
  TG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                                       sizeof(align_c)));
  std::array<cublasLtMatmulHeuristicResult_t, kOffered> results{};
  int returned = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(cublaslt_handle(device), desc, plan->a.get(), plan->b.get(), plan->c.get(),
                                     plan->c.get(), pref_raw, kOffered, results.data(), &returned);
  if (!epi) TG_CUBLAS_CHECK(st);  // with an epilogue, any refusal means: not fused, fall back
  plan->ok = st == CUBLAS_STATUS_SUCCESS && returned > 0;
  TG_CHECK(plan->ok || epi, "matmul: cuBLASLt has no algorithm for ", dtype_name(g.dtype), " [", g.batch, ", ", g.m,
           ", ", g.k, "] x [", g.k, ", ", g.n, "]", g.c_float32 ? " with a float32 result" : "");
  if (plan->ok) {
    plan->algo = results[0].algo;
    for (int i = 0; i < returned; ++i)
      if (results[i].workspaceSize <= kWorkspaceBytes) plan->offered.push_back(results[i].algo);
  }
  return *cache.plans.emplace(key, std::move(plan)).first->second;
}

// Autotuning: times each offered algorithm on this call's operands and keeps the fastest. Safe
// to run on the real operands: A and B are only read, C (and a bias gradient) are written with
// beta = 0 and written again by the call that follows. Called with plan.mu held, outside capture.
void lt_tune(const LtPlan& plan, const backend::GemmArgs& g, cublasLtHandle_t lt, void* ws, size_t ws_size,
             cudaStream_t stream) {
  const float alpha = 1.f, beta = 0.f;
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(lt, plan.desc.get(), &alpha, g.b, plan.a.get(), g.a, plan.b.get(), &beta, g.c, plan.c.get(),
                          g.c, plan.c.get(), &algo, ws, ws_size, stream);
  };
  // Events on the current stream (gemm's `stream`), destroyed on every exit.
  tg::cuda::Event e0, e1;
  auto time = [&](const cublasLtMatmulAlgo_t& algo, int reps) -> float {
    e0.record();
    for (int r = 0; r < reps; ++r)
      if (run(algo) != CUBLAS_STATUS_SUCCESS) return -1.f;
    e1.record();
    e1.synchronize();
    return e0.elapsed_ms(e1) / static_cast<float>(reps);
  };
  cublasLtMatmulAlgo_t best = plan.algo;
  float best_ms = -1.f;
  for (const cublasLtMatmulAlgo_t& algo : plan.offered) {
    if (time(algo, 1) < 0) continue;  // warm-up; an algorithm that fails here is skipped
    const float est = time(algo, 1);
    if (est < 0) continue;
    // About 2 ms of calls per round (3 to 50 calls), median of 3 rounds.
    const int reps = std::clamp(static_cast<int>(2.f / std::max(est, 1e-3f)), 3, 50);
    std::array<float, 3> t{};
    for (float& v : t) v = time(algo, reps);
    std::sort(t.begin(), t.end());
    if (t[0] < 0) continue;
    if (best_ms < 0 || t[1] < best_ms) {
      best_ms = t[1];
      best = algo;
    }
  }
  plan.tuned_algo = best;
  plan.tuned.store(true, std::memory_order_release);
}

void check_int(int64_t v, const char* what, const backend::GemmArgs& g) {
  TG_CHECK(v <= INT_MAX, "matmul: ", what, " = ", v, " exceeds the cuBLAS 32-bit limit for [", g.batch, ", ", g.m, ", ",
           g.k, "] x [", g.k, ", ", g.n, "]");
}

}  // namespace

cublasHandle_t cublas_handle(int device) {
  device = resolve(device);
  cublasHandle_t& h = tls_handles.h[device];
  if (!h) {
    HandlePool& pool = handle_pool();
    {
      std::lock_guard<std::mutex> lock(pool.mu);
      if (!pool.free[device].empty()) {
        h = pool.free[device].back();
        pool.free[device].pop_back();
      }
    }
    if (!h) {
      DeviceGuard g(device);
      TG_CUBLAS_CHECK(cublasCreate(&h));
    }
  }
  TG_CUBLAS_CHECK(cublasSetStream(h, current_stream_handle(device)));
  return h;
}

cublasLtHandle_t cublaslt_handle(int device) {
  device = resolve(device);
  // cuBLASLt handles are thread-safe; one per device, kept for the process.
  static std::array<cublasLtHandle_t, kMaxDevices> handles{};
  static std::array<std::once_flag, kMaxDevices> once;
  std::call_once(once[device], [device] {
    DeviceGuard g(device);
    TG_CUBLAS_CHECK(cublasLtCreate(&handles[device]));
  });
  return handles[device];
}

void* cublas_workspace(int device, size_t* nbytes) {
  device = resolve(device);
  cudaStream_t stream = current_stream_handle(device);
  Workspaces& w = workspaces();
  std::lock_guard<std::mutex> lock(w.mu);
  auto it = w.by_stream.find({device, stream});
  if (it == w.by_stream.end())
    it = w.by_stream
             .emplace(std::make_pair(device, stream),
                      std::make_shared<DataPtr>(device_allocate(kWorkspaceBytes, device)))
             .first;
  if (nbytes) *nbytes = kWorkspaceBytes;
  return it->second->get();
}

std::shared_ptr<void> cublas_workspace_ref(int device, cudaStream_t stream) {
  Workspaces& w = workspaces();
  std::lock_guard<std::mutex> lock(w.mu);
  auto it = w.by_stream.find({device, stream});
  return it == w.by_stream.end() ? nullptr : std::shared_ptr<void>(it->second);
}

namespace {
void release_cublas_workspace(int device, cudaStream_t stream) noexcept {
  std::shared_ptr<DataPtr> ws;
  {
    Workspaces& w = workspaces();
    std::lock_guard<std::mutex> lock(w.mu);
    auto it = w.by_stream.find({device, stream});
    if (it == w.by_stream.end()) return;
    ws = std::move(it->second);
    w.by_stream.erase(it);
  }
  // Freed here (outside the lock) unless a captured graph still holds it.
}
}  // namespace

void release_stream_resources(int device, cudaStream_t stream) noexcept {
  release_cublas_workspace(device, stream);
  release_done_counters(device, stream);
}

namespace {
std::atomic<bool> g_small_sgemm{true};
}  // namespace

void set_small_sgemm(bool on) { g_small_sgemm.store(on, std::memory_order_relaxed); }
bool small_sgemm_enabled() { return g_small_sgemm.load(std::memory_order_relaxed); }

bool small_sgemm_applies(const backend::GemmArgs& g) {
  return g.dtype == kFloat32 && small_sgemm_enabled() && !tg::allow_tf32() && kern::small_sgemm_fits(g);
}

void gemm(const backend::GemmArgs& g) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  const int device = g.device.index() >= 0 ? g.device.index() : resolve(-1);
  DeviceGuard guard(device);
  cudaStream_t stream = current_stream_handle(device);
  const size_t esize = g.c_float32 ? sizeof(float) : element_size(g.dtype);  // of C

  if (g.k == 0) {  // an empty sum: C = 0
    if (g.batch == 1 || g.stride_c == g.m * g.n) {
      TG_CUDA_CHECK(cudaMemsetAsync(g.c, 0, static_cast<size_t>(g.batch * g.m * g.n) * esize, stream));
    } else {
      for (int64_t b = 0; b < g.batch; ++b)
        TG_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(g.c) + b * g.stride_c * esize, 0,
                                      static_cast<size_t>(g.m * g.n) * esize, stream));
    }
    return;
  }
  for (auto [v, what] : {std::pair{g.m, "m"},
                         {g.n, "n"},
                         {g.k, "k"},
                         {g.batch, "batch"},
                         {g.lda, "lda"},
                         {g.ldb, "ldb"},
                         {g.ldc, "ldc"}})
    check_int(v, what, g);

  const int m = static_cast<int>(g.m), n = static_cast<int>(g.n), k = static_cast<int>(g.k);
  const int batch = static_cast<int>(g.batch);
  const int lda = static_cast<int>(g.lda), ldb = static_cast<int>(g.ldb), ldc = static_cast<int>(g.ldc);
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;

  switch (g.dtype) {
    case kFloat32: {
      // Few output tiles, full float32: the split-K kernel of small_gemm.cu, epilogue included.
      if (small_sgemm_applies(g)) {
        kern::small_sgemm(g, device, stream);
        return;
      }
      // cuBLASLt, below: fused epilogues, and every float32 matmul when autotuning.
      if (g.epilogue != backend::GemmEpilogue::None || tg::backends::cublas::benchmark()) break;
      cublasHandle_t h = cublas_handle(device);
      size_t ws_size = 0;
      void* ws = cublas_workspace(device, &ws_size);
      TG_CUBLAS_CHECK(cublasSetWorkspace(h, ws, ws_size));
      const float alpha = 1.f, beta = 0.f;
      const cublasComputeType_t compute = tg::allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
      if (batch == 1) {
        TG_CUBLAS_CHECK(cublasGemmEx(h, op_b, op_a, n, m, k, &alpha, g.b, CUDA_R_32F, ldb, g.a, CUDA_R_32F, lda, &beta,
                                     g.c, CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT));
      } else {
        TG_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, op_b, op_a, n, m, k, &alpha, g.b, CUDA_R_32F, ldb, g.stride_b,
                                                   g.a, CUDA_R_32F, lda, g.stride_a, &beta, g.c, CUDA_R_32F, ldc,
                                                   g.stride_c, batch, compute, CUBLAS_GEMM_DEFAULT));
      }
      return;
    }
    case kFloat64: {
      TG_CHECK(g.epilogue == backend::GemmEpilogue::None, "matmul: no fused epilogue for float64 (ask gemm_fuses)");
      cublasHandle_t h = cublas_handle(device);
      size_t ws_size = 0;
      void* ws = cublas_workspace(device, &ws_size);
      TG_CUBLAS_CHECK(cublasSetWorkspace(h, ws, ws_size));
      const double alpha = 1.0, beta = 0.0;
      const auto* a = static_cast<const double*>(g.a);
      const auto* b = static_cast<const double*>(g.b);
      auto* c = static_cast<double*>(g.c);
      if (batch == 1) {
        TG_CUBLAS_CHECK(cublasDgemm(h, op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc));
      } else {
        TG_CUBLAS_CHECK(cublasDgemmStridedBatched(h, op_b, op_a, n, m, k, &alpha, b, ldb, g.stride_b, a, lda,
                                                  g.stride_a, &beta, c, ldc, g.stride_c, batch));
      }
      return;
    }
    case kFloat16:
    case kBFloat16:
      break;  // cuBLASLt, below
    default:
      TG_ERROR("matmul: CUDA gemm does not support dtype ", dtype_name(g.dtype),
               " (float32, float64, float16, bfloat16 only)");
  }

  TG_CHECK(!g.c_float32 || is_reduced_float(g.dtype),
           "matmul: a float32 result is for float16 / bfloat16 operands, got ", dtype_name(g.dtype));
  const LtPlan& plan = lt_plan(g, device);
  TG_CHECK(plan.ok, "matmul: cuBLASLt cannot fuse this epilogue for ", dtype_name(g.dtype), " [", g.m, ", ", g.k,
           "] x [", g.k, ", ", g.n, "] (ask gemm_fuses first)");
  size_t ws_size = 0;
  void* ws = cublas_workspace(device, &ws_size);
  const float alpha = 1.f, beta = 0.f;
  cublasLtHandle_t lt = cublaslt_handle(device);
  const bool benchmark = tg::backends::cublas::benchmark();
  // Autotune on the plan's first eager call with the switch on (never while capturing: a graph
  // replays what it captured, so it gets the tuned choice only if an eager call made it first).
  const bool tune = benchmark && !plan.tuned.load(std::memory_order_acquire) && plan.offered.size() > 1 &&
                    !current_stream_capturing(device);
  if (g.epilogue == backend::GemmEpilogue::None && !tune) {
    const cublasLtMatmulAlgo_t& algo =
        benchmark && plan.tuned.load(std::memory_order_acquire) ? plan.tuned_algo : plan.algo;
    TG_CUBLAS_CHECK(cublasLtMatmul(lt, plan.desc.get(), &alpha, g.b, plan.a.get(), g.a, plan.b.get(), &beta, g.c,
                                   plan.c.get(), g.c, plan.c.get(), &algo, ws, ws_size, stream));
    return;
  }
  std::lock_guard<std::mutex> lock(plan.mu);
  if (g.epilogue != backend::GemmEpilogue::None)
    TG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc.get(), epilogue_pointer(g.epilogue), &g.epilogue_ptr,
                                                   sizeof(g.epilogue_ptr)));
  if (tune && !plan.tuned.load(std::memory_order_acquire)) lt_tune(plan, g, lt, ws, ws_size, stream);
  const cublasLtMatmulAlgo_t& algo =
      benchmark && plan.tuned.load(std::memory_order_acquire) ? plan.tuned_algo : plan.algo;
  TG_CUBLAS_CHECK(cublasLtMatmul(lt, plan.desc.get(), &alpha, g.b, plan.a.get(), g.a, plan.b.get(), &beta, g.c,
                                 plan.c.get(), g.c, plan.c.get(), &algo, ws, ws_size, stream));
}

bool gemm_fuses(const backend::GemmArgs& g) {
  if (g.epilogue == backend::GemmEpilogue::None || small_sgemm_applies(g)) return true;
  if (g.batch != 1 || g.m == 0 || g.n == 0 || g.k == 0 || g.epilogue_ptr == nullptr) return false;
  if (g.dtype != kFloat32 && g.dtype != kFloat16 && g.dtype != kBFloat16) return false;
  for (int64_t v : {g.m, g.n, g.k, g.lda, g.ldb, g.ldc})
    if (v > INT_MAX) return false;
  const int device = g.device.index() >= 0 ? g.device.index() : resolve(-1);
  DeviceGuard guard(device);
  return lt_plan(g, device).ok;
}

}  // namespace tg::cuda::detail
