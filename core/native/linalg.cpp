// matmul front-end: 1-D, 2-D and batched operands with broadcast batch dims.
// Transposed views reach the BLAS as transpose flags, never as copies. Also
// linear (x W^T + b as one gemm with a fused bias) and the gemms of its backward.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>

#include <tapegrad/core/native.h>

namespace tg {

namespace {
std::atomic<bool> g_allow_tf32{false};
}
void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

namespace native {
namespace {

thread_local uint64_t t_wide_gemms = 0;

struct MatLayout {
  bool trans;
  int64_t ld;
};

// How a rows x cols matrix with strides (rs, cs) can be handed to the BLAS, if at all.
std::optional<MatLayout> mat_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  if ((cols <= 1 || cs == 1) && (rows <= 1 || rs >= std::max<int64_t>(cols, 1)))
    return MatLayout{false, rows <= 1 ? std::max<int64_t>(cols, 1) : rs};
  if ((rows <= 1 || rs == 1) && (cols <= 1 || cs >= std::max<int64_t>(rows, 1)))
    return MatLayout{true, cols <= 1 ? std::max<int64_t>(rows, 1) : cs};
  return std::nullopt;
}

// The single stride that walks the flattened batch dims of t (already expanded to the
// batch shape), if one exists.
std::optional<int64_t> batch_stride(const Tensor& t, int64_t nbatch_dims) {
  int64_t stride = 0;
  bool have = false;
  int64_t inner = 1;  // elements per step so far (in batch units)
  for (int64_t d = nbatch_dims - 1; d >= 0; --d) {
    int64_t sz = t.sizes()[d], st = t.strides()[d];
    if (sz == 1) continue;
    if (!have) {
      stride = st;
      have = true;
    } else if (st != stride * inner) {
      return std::nullopt;
    }
    inner *= sz;
  }
  return stride;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) { return matmul(a, b, a.dtype()); }

Tensor matmul(const Tensor& a, const Tensor& b, DType out_dtype) {
  TG_CHECK(a.device() == b.device(), "matmul: tensors on different devices: ", a.device(), " and ", b.device());
  TG_CHECK(a.dtype() == b.dtype(), "matmul: expected both operands to have the same dtype, got ", a.dtype(), " and ",
           b.dtype(), " (shapes ", a.sizes(), " and ", b.sizes(), ")");
  TG_CHECK(is_floating(a.dtype()), "matmul: dtype ", a.dtype(), " is not supported (floating types only)");
  TG_CHECK(out_dtype == a.dtype() || (out_dtype == kFloat32 && is_reduced_float(a.dtype())), "matmul: result dtype ",
           out_dtype, " for ", a.dtype(), " operands (float32 results are for float16 / bfloat16 operands only)");
  TG_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both operands need at least 1 dim, got shapes ", a.sizes(), " and ",
           b.sizes());
  // 1-D operands become matrices, and the added dim is removed from the result.
  if (a.dim() == 1 && b.dim() == 1) {
    TG_CHECK(a.sizes()[0] == b.sizes()[0], "matmul: shapes ", a.sizes(), " and ", b.sizes(), " cannot be multiplied (",
             a.sizes()[0], " vs ", b.sizes()[0], ")");
    return native::squeeze(native::matmul(native::unsqueeze(a, 0), native::unsqueeze(b, 1), out_dtype), std::nullopt);
  }
  if (a.dim() == 1) return native::squeeze(native::matmul(native::unsqueeze(a, 0), b, out_dtype), -2);
  if (b.dim() == 1) return native::squeeze(native::matmul(a, native::unsqueeze(b, 1), out_dtype), -1);

  const int64_t m = a.sizes()[a.dim() - 2], k = a.sizes()[a.dim() - 1];
  const int64_t k2 = b.sizes()[b.dim() - 2], n = b.sizes()[b.dim() - 1];
  TG_CHECK(k == k2, "matmul: shapes ", a.sizes(), " and ", b.sizes(), " cannot be multiplied (", k, " vs ", k2, ")");
  Shape abatch(a.sizes().begin(), a.sizes().end() - 2), bbatch(b.sizes().begin(), b.sizes().end() - 2);
  for (size_t i = 0; i < std::min(abatch.size(), bbatch.size()); ++i) {
    int64_t x = abatch[abatch.size() - 1 - i], y = bbatch[bbatch.size() - 1 - i];
    TG_CHECK(x == y || x == 1 || y == 1, "matmul: batch dims of shapes ", a.sizes(), " and ", b.sizes(),
             " cannot be broadcast (", x, " vs ", y, ")");
  }
  Shape batch = detail::broadcast_shapes(abatch, bbatch, "matmul");
  const int64_t nb = static_cast<int64_t>(batch.size());
  Shape out_shape = batch;
  out_shape.push_back(m);
  out_shape.push_back(n);
  Tensor out = empty(out_shape, out_dtype, a.device());
  if (out.numel() == 0) return out;
  if (k == 0) {
    fill_(out, 0);
    return out;
  }
  auto prepare = [&](Tensor t, int64_t rows, int64_t cols) {
    Shape full = batch;
    full.push_back(rows);
    full.push_back(cols);
    Tensor e = expand(t, full);
    auto lay = mat_layout(rows, cols, e.strides()[nb], e.strides()[nb + 1]);
    auto bs = batch_stride(e, nb);
    if (!lay || !bs) {  // an awkward layout: copy to dense row-major
      e = contiguous(e);
      lay = mat_layout(rows, cols, e.strides()[nb], e.strides()[nb + 1]);
      bs = batch_stride(e, nb);
    }
    return std::make_tuple(e, *lay, *bs);
  };
  auto [ea, la, sa] = prepare(a, m, k);
  auto [eb, lb, sb] = prepare(b, k, n);
  backend::GemmArgs g{};
  g.dtype = a.dtype();
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = batch.numel();
  g.a = ea.data_ptr();
  g.b = eb.data_ptr();
  g.c = out.data_ptr();
  g.trans_a = la.trans;
  g.trans_b = lb.trans;
  g.lda = la.ld;
  g.ldb = lb.ld;
  g.ldc = n;
  g.stride_a = g.batch > 1 ? sa : 0;
  g.stride_b = g.batch > 1 ? sb : 0;
  g.stride_c = m * n;
  g.device = a.device();
  g.c_float32 = out_dtype != a.dtype();
  if (g.c_float32) ++t_wide_gemms;
  backend::get(a.device().type()).gemm(g);
  return out;
}

uint64_t wide_gemm_count() { return t_wide_gemms; }

// ---- linear
namespace {

std::atomic<bool> g_fuse_bias_grad{[] {
  const char* v = std::getenv("TG_FUSE_BIAS_GRAD");
  return v == nullptr || std::strcmp(v, "0") != 0;
}()};
std::atomic<bool> g_small_out_grad{[] {
  const char* v = std::getenv("TG_LINEAR_SMALL_OUT_GRAD");
  return v == nullptr || std::strcmp(v, "0") != 0;
}()};

// t (..., c) as a 2-D (rows, c) view when the leading dims merge into one stride (always for
// 1-D and 2-D); nullopt otherwise.
std::optional<Tensor> as_rows(const Tensor& t) {
  const int64_t nd = t.dim(), c = t.sizes()[nd - 1];
  if (nd == 2) return t;
  int64_t rows = 1, rs = std::max<int64_t>(c, 1) * t.strides()[nd - 1], expect = -1;
  for (int64_t d = nd - 2; d >= 0; --d) {
    const int64_t sz = t.sizes()[d], st = t.strides()[d];
    if (sz == 1) continue;
    if (expect < 0)
      rs = st;
    else if (st != expect)
      return std::nullopt;
    expect = st * sz;
    rows *= sz;
  }
  return native::make_view(t, {rows, c}, {rs, t.strides()[nd - 1]}, t.storage_offset());
}

// as_rows, copying to contiguous first when the view does not exist.
Tensor rows_of(const Tensor& t) {
  if (auto r = as_rows(t)) return *r;
  return *as_rows(native::contiguous(t));
}

// A 2-D t (or its transpose) as a gemm operand, copied to row-major when the BLAS cannot take
// its layout as it is.
struct Operand {
  Tensor t;  // keeps a copy alive
  MatLayout lay;
};
Operand operand(const Tensor& t, bool transposed) {
  auto lay_of = [&](const Tensor& u) {
    const int64_t r = u.sizes()[0], c = u.sizes()[1], rs = u.strides()[0], cs = u.strides()[1];
    return transposed ? mat_layout(c, r, cs, rs) : mat_layout(r, c, rs, cs);
  };
  if (auto lay = lay_of(t)) return {t, *lay};
  Tensor c = native::contiguous(t);
  return {c, *lay_of(c)};
}

backend::GemmArgs gemm_args(const Operand& a, const Operand& b, const Tensor& c, int64_t m, int64_t n, int64_t k) {
  backend::GemmArgs g{};
  g.dtype = a.t.dtype();
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = 1;
  g.a = address(a.t);
  g.b = address(b.t);
  g.c = address(c);
  g.trans_a = a.lay.trans;
  g.trans_b = b.lay.trans;
  g.lda = a.lay.ld;
  g.ldb = b.lay.ld;
  g.ldc = n;
  g.device = c.device();
  g.c_float32 = c.dtype() != g.dtype;
  if (g.c_float32) ++t_wide_gemms;
  return g;
}

// sum over rows of g2 (rows, c) into a fresh [c] of `dtype` (accumulated in float either way).
Tensor sum_rows(const Tensor& g2, DType dtype) {
  Tensor out = native::empty({1, g2.sizes()[1]}, dtype, g2.device());
  if (out.numel() > 0)
    backend::get(g2.device().type()).reduce(backend::ReduceArgs{backend::ReduceOp::Sum, g2, out, {0}});
  return native::make_view(out, {g2.sizes()[1]}, {1}, out.storage_offset());
}

// The weight (and bias) gradient of a linear with few outputs on CUDA, in one backend launch
// (backend::linear_grad_weight_bias), when x and g fold to rows without a copy. Why out <= 8:
// each element of x read feeds `out` FMAs; at 8 that is 2 FMA/byte for float32 and 4 for
// half, under the H200's ~7 FMA/byte (CUDA-core float FMA vs HBM), so the kernel reads x at
// bandwidth as the gemm would, with 8 x 8 accumulators per thread at most; cuBLAS runs such a
// gemm (k = rows) as a split dot product plus a second kernel, and the bias sum is a third.
// Wider, the tensor-core gemm pays off. false: not this path, nothing done.
bool small_out_weight_grad(const Tensor& g, const Tensor& x, bool w_col_major, DType w_dtype, bool need_b,
                           DType b_dtype, Tensor& gw, Tensor& gb) {
  const DType dt = x.dtype();
  if (!g.device().is_cuda() || !linear_small_out_grad() || g.dtype() != dt ||
      (dt != kFloat32 && dt != kFloat16 && dt != kBFloat16) || (w_dtype != dt && w_dtype != kFloat32) ||
      (need_b && b_dtype != dt && b_dtype != kFloat32))
    return false;
  const int64_t out_f = g.sizes()[g.dim() - 1], in_f = x.sizes()[x.dim() - 1];
  if (out_f < 1 || out_f > backend::kMaxLinearGradOut || in_f < 1 || in_f > backend::kMaxLinearGradIn) return false;
  std::optional<Tensor> g2 = as_rows(g), x2 = as_rows(x);
  if (!g2 || !x2 || x2->sizes()[0] < 1 || (in_f > 1 && x2->strides()[1] != 1)) return false;
  // Column-major weight: [in, out] dense, viewed transposed (the weight's layout).
  Tensor c = w_col_major ? native::empty({in_f, out_f}, w_dtype, g.device())
                         : native::empty({out_f, in_f}, w_dtype, g.device());
  gw = w_col_major ? native::transpose(c, 0, 1) : c;
  if (need_b) gb = native::empty({out_f}, b_dtype, g.device());
  if (w_dtype != dt) ++t_wide_gemms;  // stored in float32 as a wide gemm would
  backend::get(g.device().type()).linear_grad_weight_bias(gw, gb, *g2, *x2);
  return true;
}

}  // namespace

void set_fuse_bias_grad(bool on) { g_fuse_bias_grad.store(on, std::memory_order_relaxed); }
bool fuse_bias_grad() { return g_fuse_bias_grad.load(std::memory_order_relaxed); }
void set_linear_small_out_grad(bool on) { g_small_out_grad.store(on, std::memory_order_relaxed); }
bool linear_small_out_grad() { return g_small_out_grad.load(std::memory_order_relaxed); }

void check_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  TG_CHECK(x.defined() && w.defined(), "linear: input and weight must be defined tensors");
  TG_CHECK(w.dim() == 2, "linear: weight must be 2-D [out_features, in_features], got shape ", w.sizes());
  TG_CHECK(x.dim() >= 1 && x.sizes()[x.dim() - 1] == w.sizes()[1], "linear: input of shape ", x.sizes(),
           " does not match weight of shape ", w.sizes(), " (its last dim must be in_features = ", w.sizes()[1], ")");
  TG_CHECK(!b.defined() || (b.dim() == 1 && b.sizes()[0] == w.sizes()[0]), "linear: bias of shape ",
           b.defined() ? b.sizes().str() : std::string(), " does not match weight of shape ", w.sizes(), " (expected [",
           w.sizes()[0], "])");
  TG_CHECK(x.device() == w.device() && (!b.defined() || b.device() == w.device()),
           "linear: tensors on different devices: input ", x.device(), ", weight ", w.device(),
           b.defined() ? ", bias " + b.device().str() : std::string());
  TG_CHECK(x.dtype() == w.dtype() && (!b.defined() || b.dtype() == w.dtype()), "linear: expected one dtype, got input ",
           x.dtype(), ", weight ", w.dtype(),
           b.defined() ? std::string(", bias ") + dtype_name(b.dtype()) : std::string(), " (shapes ", x.sizes(),
           " and ", w.sizes(), ")");
  TG_CHECK(is_floating(x.dtype()), "linear: dtype ", x.dtype(), " is not supported (floating types only)");
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  check_linear(x, w, b);
  const int64_t out_f = w.sizes()[0], in_f = w.sizes()[1];
  Shape out_shape = x.sizes();
  out_shape[out_shape.size() - 1] = out_f;
  std::optional<Tensor> x2 = as_rows(x);
  const int64_t rows = x2 ? x2->sizes()[0] : 0;
  auto la = x2 ? mat_layout(rows, in_f, x2->strides()[0], x2->strides()[1]) : std::nullopt;
  auto lb = mat_layout(in_f, out_f, w.strides()[1], w.strides()[0]);  // W^T
  if (x2 && la && lb && rows > 0 && out_f > 0 && in_f > 0 && (!b.defined() || b.strides()[0] == 1 || out_f == 1)) {
    Tensor out = native::empty({rows, out_f}, x.dtype(), x.device());
    backend::GemmArgs g = gemm_args({*x2, *la}, {w, *lb}, out, rows, out_f, in_f);
    g.deferrable = true;  // an activation called next may still join it (Backend::fuse_into_deferred_gemm)
    g.operands[0] = &*x2;
    g.operands[1] = &w;
    g.operands[2] = b.defined() ? &b : nullptr;
    backend::Backend& be = backend::get(x.device().type());
    if (b.defined()) {
      g.epilogue = backend::GemmEpilogue::Bias;
      g.epilogue_ptr = b.data_ptr();
      if (!be.gemm_fuses(g)) {
        g.epilogue = backend::GemmEpilogue::None;
        g.epilogue_ptr = nullptr;
      }
    }
    be.gemm(g);
    if (b.defined() && g.epilogue == backend::GemmEpilogue::None) native::binary_out(backend::ElemOp::Add, out, out, b);
    return native::make_view(out, out_shape, detail::contiguous_strides(out_shape), 0);
  }
  Tensor y = native::matmul(x, native::transpose(w, 0, 1));
  return b.defined() ? native::add(y, b) : y;
}

namespace {
// A linear's input gradient g W as one gemm over g's rows (epilogue None, or ReluBackward /
// GeluTanhBackward reading the activation's saved input x); undefined where the shapes do not
// fold to rows or the backend has no such epilogue. A float32 one may wait in the backend's
// launch queue (deferrable) so that the weight gradient's gemm, which nothing orders against it,
// joins it in one launch (CUDA: small_gemm.cu's group launch).
Tensor linear_grad_input_gemm(const Tensor& g, const Tensor& w, backend::GemmEpilogue epi, const Tensor& x) {
  if (w.dim() != 2 || g.dim() < 1) return Tensor();
  const int64_t out_f = w.sizes()[0], in_f = w.sizes()[1];
  Shape out_shape = g.sizes();
  out_shape[out_shape.size() - 1] = in_f;
  if (g.sizes()[g.dim() - 1] != out_f || w.dtype() != g.dtype() || w.device() != g.device()) return Tensor();
  std::optional<Tensor> g2 = as_rows(g);
  if (!g2) return Tensor();
  const int64_t rows = g2->sizes()[0];
  auto la = mat_layout(rows, out_f, g2->strides()[0], g2->strides()[1]);
  auto lb = mat_layout(out_f, in_f, w.strides()[0], w.strides()[1]);
  if (!la || !lb || rows == 0 || out_f == 0 || in_f == 0) return Tensor();
  Tensor out = native::empty({rows, in_f}, g.dtype(), g.device());
  backend::GemmArgs args = gemm_args({*g2, *la}, {w, *lb}, out, rows, in_f, out_f);
  args.epilogue = epi;
  args.epilogue_ptr = x.defined() ? address(x) : nullptr;
  args.deferrable = g.dtype() == kFloat32;
  args.operands[0] = &*g2;
  args.operands[1] = &w;
  args.operands[2] = x.defined() ? &x : nullptr;
  backend::Backend& be = backend::get(g.device().type());
  if (epi != backend::GemmEpilogue::None && !be.gemm_fuses(args)) return Tensor();
  be.gemm(args);
  return native::make_view(out, out_shape, detail::contiguous_strides(out_shape), 0);
}
}  // namespace

Tensor linear_grad_input(const Tensor& g, const Tensor& w, DType out_dtype) {
  if (out_dtype == g.dtype() && g.dtype() == kFloat32 && g.device().is_cuda()) {
    Tensor gx = linear_grad_input_gemm(g, w, backend::GemmEpilogue::None, Tensor());
    if (gx.defined()) return gx;
  }
  return native::matmul(g, w, out_dtype);
}

// GELU (tanh) on half types only: cuBLASLt's DGELU is GELU's tanh form evaluated to about 2e-4
// relative (measured against ours on the H200), below float16 / bfloat16 rounding but not float32's.
// ReLU on float32 (a mask: exact), where the backend's small-gemm kernel takes the problem.
Tensor linear_grad_input_pointwise(const Tensor& g, const Tensor& w, backend::ElemOp bwd, const Tensor& x) {
  const bool gelu = bwd == backend::ElemOp::GeluTanhBackward && is_reduced_float(g.dtype());
  const bool relu = bwd == backend::ElemOp::ReluBackward && g.dtype() == kFloat32;
  if ((!gelu && !relu) || w.dim() != 2 || g.dim() < 1) return Tensor();
  Shape out_shape = g.sizes();
  out_shape[out_shape.size() - 1] = w.sizes()[1];
  if (x.sizes() != out_shape || x.dtype() != g.dtype() || x.device() != g.device() || !x.is_contiguous())
    return Tensor();
  return linear_grad_input_gemm(g, w, gelu ? backend::GemmEpilogue::GeluTanhBackward : backend::GemmEpilogue::ReluBackward,
                                x);
}

std::pair<Tensor, Tensor> linear_grad_weight_bias(const Tensor& g, const Tensor& x, bool need_w, bool w_col_major,
                                                  DType w_dtype, bool need_b, DType b_dtype) {
  Tensor gw, gb;
  if (need_w && small_out_weight_grad(g, x, w_col_major, w_dtype, need_b, b_dtype, gw, gb)) return {gw, gb};
  Tensor g2 = rows_of(g);
  const int64_t rows = g2.sizes()[0], out_f = g2.sizes()[1];
  if (need_w) {
    Tensor x2 = rows_of(x);
    const int64_t in_f = x2.sizes()[1];
    // Row-major weight: [out, in] = g2^T x2, the bias gradient being A's row sums. Column-major
    // weight: [in, out] = x2^T g2 viewed transposed, the bias gradient being B's column sums.
    Tensor c = w_col_major ? native::empty({in_f, out_f}, w_dtype, g.device())
                           : native::empty({out_f, in_f}, w_dtype, g.device());
    if (rows == 0 || c.numel() == 0) {
      native::fill_(c, 0);
    } else {
      Operand og = operand(g2, !w_col_major), ox = operand(x2, w_col_major);
      backend::GemmArgs args =
          w_col_major ? gemm_args(ox, og, c, in_f, out_f, rows) : gemm_args(og, ox, c, out_f, in_f, rows);
      // float32: it may join the input gradient's gemm waiting in the launch queue (see
      // linear_grad_input_gemm).
      args.deferrable = w_dtype == kFloat32 && g2.dtype() == kFloat32;
      args.operands[0] = w_col_major ? &ox.t : &og.t;
      args.operands[1] = w_col_major ? &og.t : &ox.t;
      backend::Backend& be = backend::get(g.device().type());
      // cuBLASLt runs BGRAD as its own pass over g (about 2.2-2.9 TB/s on the H200, often after a
      // split-K reduce): it saves a launch on small gradients, but from ~1M elements the backend's
      // column reduction reads g faster (GPT-2 124M step: 61.5 -> 60.7 ms without the epilogue).
      constexpr int64_t kFuseBiasGradMaxNumel = int64_t{1} << 20;
      if (need_b && b_dtype == w_dtype && fuse_bias_grad() && g2.numel() <= kFuseBiasGradMaxNumel) {
        gb = native::empty({out_f}, b_dtype, g.device());
        args.epilogue = w_col_major ? backend::GemmEpilogue::ColSumsB : backend::GemmEpilogue::RowSumsA;
        args.epilogue_ptr = address(gb);  // written: not an operand to hold (see GemmArgs::operands)
        if (!be.gemm_fuses(args)) {
          args.epilogue = backend::GemmEpilogue::None;
          args.epilogue_ptr = nullptr;
          gb = Tensor();
        }
      }
      be.gemm(args);
    }
    gw = w_col_major ? native::transpose(c, 0, 1) : c;
  }
  if (need_b && !gb.defined()) gb = sum_rows(g2, b_dtype);
  return {gw, gb};
}

}  // namespace native

namespace backend {
void Backend::linear_grad_weight_bias(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  TG_ERROR("linear backward: no one-launch weight gradient on this device (gemm + reduction instead)");
}
}  // namespace backend
}  // namespace tg
