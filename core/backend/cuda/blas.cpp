// cuBLAS / cuBLASLt handles, the per-stream workspace, and the gemm of the CUDA
// backend. Row-major C = A B is computed as the column-major C^T = B^T A^T: the
// libraries get (B, A) with m and n swapped, so no data is ever transposed.
// float32 of few output tiles (TF32 off) goes to small_gemm.cu's split-K kernel, other float32 to
// cublasGemmEx, float64 to cublasDgemm; float16 / bfloat16, a float32 C
// from half operands, and every fused epilogue (bias, bias gradient) go to cuBLASLt through a
// plan cached per problem, as does float32 when autotuning (tg::backends::cublas::set_benchmark:
// a plan times the algorithms cuBLASLt's heuristic offers on its first eager call and keeps the
// fastest).
// A linear's float16 / bfloat16 gemm (GemmArgs::deferrable) waits in the launch queue as a deferred
// call (launch_queue.h) until the next op; when that op is a GELU (tanh) of its whole result,
// fuse_into_deferred_gemm turns the gemm's epilogue into cuBLASLt's GELU_AUX(_BIAS): the gemm writes
// the activation and, as its aux output, the linear's own result, and the GELU kernel's pass over
// the data goes (the forward half of GPT-2's MLP fusion; the backward's DGELU is linear_grad's).
// A linear's float32 gemm that small_gemm.cu runs waits the same way, and a ReLU of its result
// joins that kernel's epilogue (an MLP's forward loses its ReLU launches). A linear's float32
// input and weight gradient gemms wait too, and the second joins the first (join_deferred_gemm:
// independent problems, one group launch of small_gemm.cu).
#include <tapegrad/core/backend/cuda/blas.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

#include <tapegrad/core/backend/cuda/done_counters.h>
#include <tapegrad/core/backend/cuda/kernels.cuh>
#include <tapegrad/core/backend/cuda/launch_queue.h>
#include <tapegrad/core/backend/cuda/runtime.h>
#include <tapegrad/core/cuda.h>
#include <tapegrad/core/ops.h>

namespace tg::cuda::detail {
namespace {

constexpr int kMaxDevices = 64;
constexpr int kMaxGemmGroup = kern::kSmallSgemmMaxGroup;  // problems of one small_gemm.cu launch
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
    case backend::GemmEpilogue::GeluTanh:
      return CUBLASLT_EPILOGUE_GELU_AUX;
    case backend::GemmEpilogue::BiasGeluTanh:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case backend::GemmEpilogue::Relu:
    case backend::GemmEpilogue::BiasRelu:
    case backend::GemmEpilogue::ReluBackward:
      break;  // cuBLASLt's ReLU epilogues keep a bit mask, not our tensors: small_gemm.cu's only
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

bool lt_has_epilogue(backend::GemmEpilogue e) {
  return e != backend::GemmEpilogue::Relu && e != backend::GemmEpilogue::BiasRelu &&
         e != backend::GemmEpilogue::ReluBackward;
}

bool has_aux(backend::GemmEpilogue e) {
  return e == backend::GemmEpilogue::GeluTanhBackward || e == backend::GemmEpilogue::GeluTanh ||
         e == backend::GemmEpilogue::BiasGeluTanh;
}

// Sets the call's epilogue pointers on the desc: the bias vector (or bias gradient), and the aux
// matrix (the DGELU's saved input, at epilogue_ptr; GELU_AUX's output, at epilogue_aux).
void set_epilogue_pointers(cublasLtMatmulDesc_t desc, const backend::GemmArgs& g) {
  using E = backend::GemmEpilogue;
  const void* bias = g.epilogue == E::GeluTanhBackward || g.epilogue == E::GeluTanh ? nullptr : g.epilogue_ptr;
  const void* aux = g.epilogue == E::GeluTanhBackward ? g.epilogue_ptr : g.epilogue_aux;
  if (bias != nullptr)
    TG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  if (has_aux(g.epilogue))
    TG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
}

// Whether g names every pointer its epilogue reads or writes.
bool epilogue_pointers_set(const backend::GemmArgs& g) {
  using E = backend::GemmEpilogue;
  switch (g.epilogue) {
    case E::None: return true;
    case E::GeluTanh: return g.epilogue_aux != nullptr;
    case E::BiasGeluTanh: return g.epilogue_ptr != nullptr && g.epilogue_aux != nullptr;
    default: return g.epilogue_ptr != nullptr;
  }
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
                         static_cast<int64_t>(tf32) << 5 | (epi ? alignment(g.epilogue_ptr) : 0) << 8 |
                         (epi ? alignment(g.epilogue_aux) : 0) << 20};
  LtPlans& cache = lt_plans();
  std::lock_guard<std::mutex> lock(cache.mu);
  auto it = cache.plans.find(key);
  if (it != cache.plans.end()) return *it->second;
  if (!lt_has_epilogue(g.epilogue))  // not fused here: gemm_fuses says no
    return *cache.plans.emplace(key, std::make_unique<LtPlan>()).first->second;

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
    set_epilogue_pointers(desc, g);
    if (has_aux(g.epilogue)) {
      // The aux matrix is laid out as D (column-major n x m, ld n), in D's type (the default).
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

// The cuBLASLt matmul of g with plan on `stream` (no flush, no stream lookup: a deferred call
// runs it at the flush). may_tune: autotune a plan not yet tuned when benchmarking is on (never
// while capturing; a deferred call never tunes).
void lt_matmul(const LtPlan& plan, const backend::GemmArgs& g, int device, void* ws, size_t ws_size,
               cudaStream_t stream, bool may_tune) {
  const float alpha = 1.f, beta = 0.f;
  cublasLtHandle_t lt = cublaslt_handle(device);
  const bool benchmark = tg::backends::cublas::benchmark();
  // Autotune on the plan's first eager call with the switch on (never while capturing: a graph
  // replays what it captured, so it gets the tuned choice only if an eager call made it first).
  const bool tune = may_tune && benchmark && !plan.tuned.load(std::memory_order_acquire) && plan.offered.size() > 1 &&
                    !current_stream_capturing(device);
  if (g.epilogue == backend::GemmEpilogue::None && !tune) {
    const cublasLtMatmulAlgo_t& algo =
        benchmark && plan.tuned.load(std::memory_order_acquire) ? plan.tuned_algo : plan.algo;
    TG_CUBLAS_CHECK(cublasLtMatmul(lt, plan.desc.get(), &alpha, g.b, plan.a.get(), g.a, plan.b.get(), &beta, g.c,
                                   plan.c.get(), g.c, plan.c.get(), &algo, ws, ws_size, stream));
    return;
  }
  std::lock_guard<std::mutex> lock(plan.mu);
  if (g.epilogue != backend::GemmEpilogue::None) set_epilogue_pointers(plan.desc.get(), g);
  if (tune && !plan.tuned.load(std::memory_order_acquire)) lt_tune(plan, g, lt, ws, ws_size, stream);
  const cublasLtMatmulAlgo_t& algo =
      benchmark && plan.tuned.load(std::memory_order_acquire) ? plan.tuned_algo : plan.algo;
  TG_CUBLAS_CHECK(cublasLtMatmul(lt, plan.desc.get(), &alpha, g.b, plan.a.get(), g.a, plan.b.get(), &beta, g.c,
                                 plan.c.get(), g.c, plan.c.get(), &algo, ws, ws_size, stream));
}

// A linear's gemm waiting in the launch queue (see the file's first lines). It holds its operands
// (GemmArgs::operands: an allocation made before it runs must not reuse their memory, which a
// gemm amended to write a new tensor would otherwise read while writing) and the workspace (so
// that destroying the stream meanwhile cannot free it).
struct DeferredGemm final : DeferredCall {
  DeferredGemm(const backend::GemmArgs& args, int device, const LtPlan* plan, void* ws, std::shared_ptr<void> ws_owner,
               size_t ws_size)
      : g(args), device(device), plan(plan), ws(ws), ws_owner(std::move(ws_owner)), ws_size(ws_size) {
    for (int i = 0; i < 3; ++i) {
      if (args.operands[i] != nullptr) held[i] = *args.operands[i];
      g.operands[i] = nullptr;  // the caller's, gone once gemm() returns
    }
  }
  void run(cudaStream_t stream) override {
    if (!more.empty()) {
      std::array<backend::GemmArgs, kMaxGemmGroup> all;
      all[0] = g;
      std::copy(more.begin(), more.end(), all.begin() + 1);
      kern::small_sgemm_group(all.data(), static_cast<int>(more.size()) + 1, device, stream);
    } else if (plan == nullptr) {
      kern::small_sgemm(g, device, stream);
    } else {
      lt_matmul(*plan, g, device, ws, ws_size, stream, false);
    }
  }
  backend::GemmArgs g;
  std::array<Tensor, 3> held;
  // Independent float32 problems of small_gemm.cu that joined this one (join_deferred_gemm): one
  // launch runs them all. Their operands are held as g's are.
  std::vector<backend::GemmArgs> more;
  std::vector<Tensor> more_held;
  int device;
  const LtPlan* plan;  // plans live as long as the process; null: a float32 gemm of small_gemm.cu
  void* ws;
  std::shared_ptr<void> ws_owner;  // keeps ws allocated
  size_t ws_size;
};

std::atomic<bool> g_gemm_activation_fusion{true};
std::atomic<int64_t> g_gemm_activation_fusions{0};
std::atomic<bool> g_gemm_grouping{[] {
  const char* e = std::getenv("TG_GEMM_GROUPING");
  return !(e && std::string_view(e) == "0");
}()};
std::atomic<int64_t> g_gemm_groupings{0};

// GEMMs with fewer outputs gain less from a fused activation than deferring costs on the host.
constexpr int64_t kDeferGemmMinOutputs = int64_t{1} << 16;

// Whether g may wait for the next op: a deferrable gemm whose epilogue an activation can extend
// (none or bias), outside autotuning: float16 / bfloat16 ones large enough for cuBLASLt's GELU
// epilogue to pay, or (small) float32 ones that small_gemm.cu runs, whose ReLU epilogue saves a
// launch at any size.
// A small one may also carry another epilogue of small_gemm.cu (a linear's gradients: the input
// gradient through a ReLU, the weight gradient with the bias gradient), for the next small gemm
// to join (join_deferred_gemm).
bool may_defer_gemm(const backend::GemmArgs& g, bool small) {
  using E = backend::GemmEpilogue;
  const bool plain = g.epilogue == E::None || g.epilogue == E::Bias;
  const bool reads_v = g.epilogue_ptr != nullptr && g.epilogue != E::RowSumsA && g.epilogue != E::ColSumsB;
  if (!g.deferrable || g.operands[0] == nullptr || g.operands[1] == nullptr ||
      (reads_v && g.operands[2] == nullptr) || g.batch != 1 || tg::backends::cublas::benchmark())
    return false;
  if (small)
    return (plain && g_gemm_activation_fusion.load(std::memory_order_relaxed)) ||
           g_gemm_grouping.load(std::memory_order_relaxed);
  return plain && g_gemm_activation_fusion.load(std::memory_order_relaxed) && is_reduced_float(g.dtype) &&
         !g.c_float32 && g.m * g.n >= kDeferGemmMinOutputs && g.n % 8 == 0;
}

// The bytes a small float32 gemm reads and writes, as address ranges (small_gemm.cu's epilogues).
struct Span {
  uintptr_t lo = 0, hi = 0;  // [lo, hi); empty when lo == hi
};
Span span_of(const void* p, int64_t rows, int64_t cols, int64_t ld) {
  if (p == nullptr || rows < 1 || cols < 1) return {};
  const auto lo = reinterpret_cast<uintptr_t>(p);
  return {lo, lo + static_cast<uintptr_t>(((rows - 1) * ld + cols) * int64_t{sizeof(float)})};
}
bool overlap(const Span& a, const Span& b) { return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi; }
struct Footprint {
  std::array<Span, 3> reads, writes;
  bool known = true;  // an epilogue or dtype outside small_gemm.cu's: judged dependent
};
Footprint footprint(const backend::GemmArgs& g) {
  using E = backend::GemmEpilogue;
  Footprint f;
  f.known = g.dtype == kFloat32 && !g.c_float32 && g.batch == 1;
  f.reads[0] = g.trans_a ? span_of(g.a, g.k, g.m, g.lda) : span_of(g.a, g.m, g.k, g.lda);
  f.reads[1] = g.trans_b ? span_of(g.b, g.n, g.k, g.ldb) : span_of(g.b, g.k, g.n, g.ldb);
  f.writes[0] = span_of(g.c, g.m, g.n, g.ldc);
  switch (g.epilogue) {
    case E::Bias: f.reads[2] = span_of(g.epilogue_ptr, 1, g.n, g.n); break;
    case E::BiasRelu: f.reads[2] = span_of(g.epilogue_ptr, 1, g.n, g.n); [[fallthrough]];
    case E::Relu: f.writes[1] = span_of(g.epilogue_aux, g.m, g.n, g.n); break;
    case E::ReluBackward: f.reads[2] = span_of(g.epilogue_ptr, g.m, g.n, g.n); break;
    case E::RowSumsA: f.writes[1] = span_of(g.epilogue_ptr, 1, g.m, g.m); break;
    case E::ColSumsB: f.writes[1] = span_of(g.epilogue_ptr, 1, g.n, g.n); break;
    case E::None: break;
    default: f.known = false; break;
  }
  return f;
}
}  // namespace

bool gemms_independent(const backend::GemmArgs& x, const backend::GemmArgs& y) {
  const Footprint fx = footprint(x), fy = footprint(y);
  if (!fx.known || !fy.known) return false;
  for (const Span& w : fy.writes) {
    for (const Span& r : fx.reads)
      if (overlap(w, r)) return false;
    for (const Span& w2 : fx.writes)
      if (overlap(w, w2)) return false;
  }
  for (const Span& r : fy.reads)
    for (const Span& w : fx.writes)
      if (overlap(r, w)) return false;
  return true;
}

namespace {

bool same_call(const backend::GemmArgs& x, const backend::GemmArgs& y) {
  return x.a == y.a && x.b == y.b && x.c == y.c && x.epilogue == y.epilogue && x.epilogue_ptr == y.epilogue_ptr &&
         x.epilogue_aux == y.epilogue_aux && x.m == y.m && x.n == y.n && x.k == y.k;
}

// A small float32 gemm that may wait (g deferrable, called from outside every other CUDA op)
// joins the small float32 gemm(s) waiting last in the launch queue when it is independent of
// each and small_gemm.cu runs them all in one launch: a linear's input gradient and weight
// gradient, which nothing orders, become one kernel. Looks without flushing the queue (the
// caller has not taken the stream handle yet). true: joined, nothing else to do.
bool join_deferred_gemm(const backend::GemmArgs& g, int device) {
  if (!tls_defer_allowed || !g_gemm_grouping.load(std::memory_order_relaxed) ||
      !g_launches_pending.load(std::memory_order_acquire) || !may_defer_gemm(g, true))
    return false;
  const cudaStream_t stream = current_stream_noflush(device);
  std::vector<backend::GemmArgs> members;
  if (!amend_last_call(stream, device, [&](DeferredCall& c) {
        auto* d = dynamic_cast<DeferredGemm*>(&c);
        if (d == nullptr || d->plan != nullptr || d->more.size() + 1 >= static_cast<size_t>(kMaxGemmGroup)) return false;
        members.push_back(d->g);
        members.insert(members.end(), d->more.begin(), d->more.end());
        return true;
      }))
    return false;
  for (const backend::GemmArgs& m : members)
    if (!gemms_independent(m, g)) return false;
  const size_t before = members.size();
  members.push_back(g);
  // The plan outside the queue's lock (occupancy queries, cached after the first).
  if (!kern::small_sgemm_group_fits(members.data(), static_cast<int>(members.size()))) return false;
  const bool joined = amend_last_call(stream, device, [&](DeferredCall& c) {
    auto* d = dynamic_cast<DeferredGemm*>(&c);
    if (d == nullptr || d->plan != nullptr || d->more.size() + 1 != before || !same_call(d->g, members[0])) return false;
    backend::GemmArgs added = g;
    for (int i = 0; i < 3; ++i) {
      if (g.operands[i] != nullptr) d->more_held.push_back(*g.operands[i]);
      added.operands[i] = nullptr;  // the caller's, gone once gemm() returns
    }
    d->more.push_back(added);
    return true;
  });
  if (joined) g_gemm_groupings.fetch_add(1, std::memory_order_relaxed);
  return joined;
}

bool gemm_activation_fusion_enabled() { return g_gemm_activation_fusion.load(std::memory_order_relaxed); }

}  // namespace

void set_gemm_activation_fusion(bool on) { g_gemm_activation_fusion.store(on, std::memory_order_relaxed); }
int64_t gemm_activation_fusions() { return g_gemm_activation_fusions.load(std::memory_order_relaxed); }
void set_gemm_grouping(bool on) { g_gemm_grouping.store(on, std::memory_order_relaxed); }
int64_t gemm_groupings() { return g_gemm_groupings.load(std::memory_order_relaxed); }

namespace {
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
  const bool small = g.dtype == kFloat32 && small_sgemm_applies(g);
  // Before the guard (inside it no launch may wait) and before the stream handle (which flushes).
  if (small && g.deferrable && join_deferred_gemm(g, device)) return;
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
      if (small) {
        if (may_defer_gemm(g, true)) {
          std::unique_ptr<DeferredCall> call = std::make_unique<DeferredGemm>(g, device, nullptr, nullptr, nullptr, 0);
          if (defer_call(call, stream, device)) return;
        }
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
  if (may_defer_gemm(g, false)) {
    std::unique_ptr<DeferredCall> call =
        std::make_unique<DeferredGemm>(g, device, &plan, ws, cublas_workspace_ref(device, stream), ws_size);
    if (defer_call(call, stream, device)) return;
  }
  lt_matmul(plan, g, device, ws, ws_size, stream, true);
}

Tensor fuse_into_deferred_gemm(backend::ElemOp op, const Tensor& a) {
  // GELU (tanh) into cuBLASLt's GELU_AUX(_BIAS) for float16 / bfloat16; ReLU into small_gemm.cu's
  // epilogue for float32.
  const bool gelu = op == backend::ElemOp::GeluTanh && a.defined() && is_reduced_float(a.dtype());
  const bool relu = op == backend::ElemOp::Relu && a.defined() && a.dtype() == kFloat32;
  if ((!gelu && !relu) || !gemm_activation_fusion_enabled() || !a.is_cuda() || !a.is_contiguous() || a.numel() == 0 ||
      !g_launches_pending.load(std::memory_order_acquire))
    return Tensor();
  const int device = a.device().index() >= 0 ? a.device().index() : resolve(-1);
  const cudaStream_t stream = current_stream_noflush(device);
  void* a_ptr = address_noflush(a);  // data_ptr() would flush the gemm this is about
  auto is_result = [&](const DeferredGemm& d) {
    const backend::GemmArgs& g = d.g;
    return d.more.empty() && g.c == a_ptr && g.m * g.n == a.numel() && g.dtype == a.dtype() && g.ldc == g.n &&
           (d.plan == nullptr) == relu &&
           (g.epilogue == backend::GemmEpilogue::None || g.epilogue == backend::GemmEpilogue::Bias);
  };
  backend::GemmArgs seen{};
  if (!amend_last_call(stream, device, [&](DeferredCall& c) {
        auto* d = dynamic_cast<DeferredGemm*>(&c);
        if (d == nullptr || !is_result(*d)) return false;
        seen = d->g;
        return true;
      }))
    return Tensor();
  // The activation's tensor and the plan, outside the queue's lock.
  Tensor out = tg::empty(a.sizes(), TensorOptions().dtype(a.dtype()).device(a.device()));
  backend::GemmArgs fused = seen;
  const bool bias = seen.epilogue == backend::GemmEpilogue::Bias;
  fused.epilogue = relu ? (bias ? backend::GemmEpilogue::BiasRelu : backend::GemmEpilogue::Relu)
                        : (bias ? backend::GemmEpilogue::BiasGeluTanh : backend::GemmEpilogue::GeluTanh);
  fused.epilogue_aux = seen.c;
  fused.c = address_noflush(out);
  DeviceGuard guard(device);
  const LtPlan* plan = nullptr;
  if (relu) {
    if (!kern::small_sgemm_fits(fused)) return Tensor();
  } else {
    plan = &lt_plan(fused, device);
    if (!plan->ok) return Tensor();
  }
  const bool amended = amend_last_call(stream, device, [&](DeferredCall& c) {
    auto* d = dynamic_cast<DeferredGemm*>(&c);
    if (d == nullptr || !is_result(*d) || d->g.a != seen.a || d->g.b != seen.b || d->g.epilogue != seen.epilogue ||
        d->g.epilogue_ptr != seen.epilogue_ptr || d->g.k != seen.k)
      return false;
    d->g = fused;
    d->plan = plan;
    return true;
  });
  if (!amended) return Tensor();
  g_gemm_activation_fusions.fetch_add(1, std::memory_order_relaxed);
  return out;
}

bool gemm_fuses(const backend::GemmArgs& g) {
  if (g.epilogue == backend::GemmEpilogue::None || small_sgemm_applies(g)) return true;
  if (g.batch != 1 || g.m == 0 || g.n == 0 || g.k == 0 || !epilogue_pointers_set(g)) return false;
  if (g.dtype != kFloat32 && g.dtype != kFloat16 && g.dtype != kBFloat16) return false;
  for (int64_t v : {g.m, g.n, g.k, g.lda, g.ldb, g.ldc})
    if (v > INT_MAX) return false;
  const int device = g.device.index() >= 0 ? g.device.index() : resolve(-1);
  DeviceGuard guard(device);
  return lt_plan(g, device).ok;
}

}  // namespace tg::cuda::detail
