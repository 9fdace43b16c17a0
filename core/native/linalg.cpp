// matmul front-end: 1-D, 2-D and batched operands with broadcast batch dims.
// Transposed views reach the BLAS as transpose flags, never as copies.
#include <atomic>
#include <optional>

#include "core/native.h"

namespace tg {

namespace {
std::atomic<bool> g_allow_tf32{false};
}
void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

namespace native {
namespace {

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

Tensor matmul(const Tensor& a, const Tensor& b) {
  TG_CHECK(a.device() == b.device(), "matmul: tensors on different devices: ", a.device(), " and ", b.device());
  TG_CHECK(a.dtype() == b.dtype(), "matmul: expected both operands to have the same dtype, got ", a.dtype(), " and ",
           b.dtype(), " (shapes ", a.sizes(), " and ", b.sizes(), ")");
  TG_CHECK(is_floating(a.dtype()), "matmul: dtype ", a.dtype(), " is not supported (floating types only)");
  TG_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both operands need at least 1 dim, got shapes ", a.sizes(), " and ",
           b.sizes());
  // 1-D operands become matrices, and the added dim is removed from the result.
  if (a.dim() == 1 && b.dim() == 1) {
    TG_CHECK(a.sizes()[0] == b.sizes()[0], "matmul: shapes ", a.sizes(), " and ", b.sizes(), " cannot be multiplied (",
             a.sizes()[0], " vs ", b.sizes()[0], ")");
    return native::squeeze(native::matmul(native::unsqueeze(a, 0), native::unsqueeze(b, 1)), std::nullopt);
  }
  if (a.dim() == 1) return native::squeeze(native::matmul(native::unsqueeze(a, 0), b), -2);
  if (b.dim() == 1) return native::squeeze(native::matmul(a, native::unsqueeze(b, 1)), -1);

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
  Tensor out = empty(out_shape, a.dtype(), a.device());
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
  backend::get(a.device().type()).gemm(g);
  return out;
}

}  // namespace native
}  // namespace tg
