// The elementwise engine's front-end: type promotion, broadcasting, and the
// ElementwiseIter (broadcast strides, coalesced dims) every backend loops over.
// Also copies between dtypes, layouts and devices.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <tapegrad/core/cast_copies.h>
#include <tapegrad/core/native.h>

namespace tg {
namespace backend {

int elem_op_arity(ElemOp op) {
  static constexpr int kArity[] = {
#define TG_ELEM_ARITY(name, n) n,
      TG_ELEMENTWISE_OPS(TG_ELEM_ARITY)
#undef TG_ELEM_ARITY
  };
  return kArity[static_cast<int>(op)];
}

const char* elem_op_name(ElemOp op) {
  static constexpr const char* kNames[] = {
#define TG_ELEM_NAME(name, n) #name,
      TG_ELEMENTWISE_OPS(TG_ELEM_NAME)
#undef TG_ELEM_NAME
  };
  return kNames[static_cast<int>(op)];
}

const char* reduce_op_name(ReduceOp op) {
  static constexpr const char* kNames[] = {
#define TG_REDUCE_NAME(name, str) str,
      TG_REDUCE_OPS(TG_REDUCE_NAME)
#undef TG_REDUCE_NAME
  };
  const auto i = static_cast<size_t>(op);
  return i < sizeof(kNames) / sizeof(kNames[0]) ? kNames[i] : "reduce";
}

bool has_mixed_form(ElemOp op, const DType* dtypes) {
  switch (op) {
    case ElemOp::Exp: case ElemOp::Log: case ElemOp::Sqrt: case ElemOp::PowScalar:
      return dtypes[0] == kFloat32 && is_reduced_float(dtypes[1]);
    case ElemOp::Div: case ElemOp::PowScalarBackward:
      return is_reduced_float(dtypes[0]) && dtypes[1] == kFloat32 && dtypes[2] == dtypes[0];
    case ElemOp::Mul: case ElemOp::SqrtBackward:
      return is_reduced_float(dtypes[0]) && dtypes[1] == kFloat32 && dtypes[2] == kFloat32;
    case ElemOp::Add: case ElemOp::Sub:  // float32 +- float16 / bfloat16, either side: an autocast
      // model's float32 residual stream plus a block's half output, without a cast pass first
      return dtypes[0] == kFloat32 && ((dtypes[1] == kFloat32 && is_reduced_float(dtypes[2])) ||
                                       (is_reduced_float(dtypes[1]) && dtypes[2] == kFloat32));
    default:
      return false;
  }
}

namespace {
thread_local uint64_t t_dispatches = 0;
}
uint64_t dispatch_count() { return t_dispatches; }

void Backend::copy_bytes(void*, Device dst_device, const void*, Device src_device, size_t, bool) {
  TG_ERROR("copy from ", src_device, " to ", dst_device, ": no such copy on this backend");
}
DataPtr Backend::host_staging(size_t nbytes) { return get_allocator(Device(kCPU))->allocate(nbytes); }

Backend& get(DeviceType type) {
  ++t_dispatches;
  if (type == kCPU) return cpu();
  Backend* b = cuda();
  TG_CHECK(b != nullptr, "CUDA op requested but tapegrad was built without CUDA (TG_CUDA=OFF)");
  return *b;
}

}  // namespace backend

namespace native {
using backend::ElemOp;
using backend::ElementwiseIter;

namespace {

bool is_comparison(ElemOp op) {
  switch (op) {
    case ElemOp::Eq: case ElemOp::Ne: case ElemOp::Lt: case ElemOp::Le: case ElemOp::Gt: case ElemOp::Ge:
    case ElemOp::EqScalar: case ElemOp::NeScalar: case ElemOp::LtScalar: case ElemOp::LeScalar:
    case ElemOp::GtScalar: case ElemOp::GeScalar:
      return true;
    default:
      return false;
  }
}

// Ops whose kernels exist for floating dtypes only: integer inputs are promoted to float32 first.
bool is_float_only(ElemOp op) {
  switch (op) {
    case ElemOp::Exp: case ElemOp::Log: case ElemOp::Sqrt: case ElemOp::Sigmoid: case ElemOp::Tanh:
    case ElemOp::Gelu: case ElemOp::PowScalar: case ElemOp::Pow: case ElemOp::Div: case ElemOp::DivScalar:
    case ElemOp::RDivScalar: case ElemOp::ReluBackward: case ElemOp::GeluBackward: case ElemOp::SigmoidBackward:
    case ElemOp::TanhBackward: case ElemOp::ClampBackward: case ElemOp::AbsBackward:
    case ElemOp::PowScalarBackward: case ElemOp::SqrtBackward:
    // ---- issue 15: general ops
    case ElemOp::Sin: case ElemOp::Cos: case ElemOp::Rsqrt: case ElemOp::Silu: case ElemOp::GeluTanh:
    case ElemOp::Softplus: case ElemOp::LeakyRelu: case ElemOp::Elu: case ElemOp::RsqrtBackward:
    case ElemOp::SiluBackward: case ElemOp::GeluTanhBackward: case ElemOp::SoftplusBackward:
    case ElemOp::LeakyReluBackward: case ElemOp::EluBackward:
      return true;
    default:
      return false;
  }
}

// The user-facing name for messages: "AddScalar" -> "add", "ReluBackward" -> "relu_backward".
const char* op_label(ElemOp op) {
  static const std::vector<std::string> labels = [] {
    std::vector<std::string> out;
    for (int i = 0; i <= static_cast<int>(ElemOp::Where); ++i) {
      std::string n = backend::elem_op_name(static_cast<ElemOp>(i)), r;
      if (n.size() > 6 && n.compare(n.size() - 6, 6, "Scalar") == 0) n.resize(n.size() - 6);
      for (size_t j = 0; j < n.size(); ++j) {
        char c = n[j];
        if (c >= 'A' && c <= 'Z') {
          if (j > 0 && !(n[j - 1] >= 'A' && n[j - 1] <= 'Z')) r += '_';
          r += static_cast<char>(c - 'A' + 'a');
        } else {
          r += c;
        }
      }
      out.push_back(r == "copy" ? "copy_" : r);
    }
    return out;
  }();
  return labels[static_cast<size_t>(op)].c_str();
}

void check_same_device(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = *ts.begin();
  for (const Tensor* t : ts) {
    TG_CHECK(t->device() == first->device(), op, ": expected all tensors on one device, got ", first->device(),
             " and ", t->device());
  }
}

// The result of an elementwise op: channels-last (NHWC strides) when an input of the result's
// 4-d shape is (and is not also row-major), so that images keep their memory format through
// activations and residual adds, as in PyTorch; row-major otherwise.
Tensor empty_out(const Shape& shape, DType dtype, Device device, std::initializer_list<const Tensor*> inputs) {
  if (shape.size() == 4)
    for (const Tensor* t : inputs)
      if (t->sizes() == shape && !t->is_contiguous() && t->is_contiguous(MemoryFormat::ChannelsLast))
        return empty_strided(shape, {shape[1] * shape[2] * shape[3], 1, shape[3] * shape[1], shape[1]}, dtype, device);
  return empty(shape, dtype, device);
}

// Builds the iter for `out` (already allocated with the broadcast shape) and inputs
// broadcastable to it. Size-1 dims are dropped; adjacent dims that are contiguous
// in every operand are merged.
ElementwiseIter make_iter(const Tensor& out, std::initializer_list<const Tensor*> inputs, const char* op) {
  ElementwiseIter it;
  it.noperands = 1 + static_cast<int>(inputs.size());
  it.numel = out.numel();
  it.device = out.device();
  const int nd = static_cast<int>(out.dim());
  int64_t shape[64];
  int64_t strides[backend::kMaxOperands][64];
  TG_CHECK(nd <= 64, op, ": tensors with more than 64 dims are not supported");
  const Tensor* ops[backend::kMaxOperands];
  ops[0] = &out;
  int k = 1;
  for (const Tensor* t : inputs) ops[k++] = t;
  for (int o = 0; o < it.noperands; ++o) {
    const Tensor& t = *ops[o];
    it.dtypes[o] = t.dtype();
    it.data[o] = static_cast<char*>(address(t));
    const int tnd = static_cast<int>(t.dim());
    for (int d = 0; d < nd; ++d) {
      int td = d - (nd - tnd);
      int64_t sz = td >= 0 ? t.sizes()[td] : 1;
      strides[o][d] = (td >= 0 && sz != 1) ? t.strides()[td] : 0;
    }
  }
  if (it.numel == 0) {  // nothing runs (run() returns), and huge zero-element dims must not be multiplied
    it.ndim = 0;
    it.contiguous = true;
    return it;
  }
  // Drop size-1 dims, then merge dim d into the next-inner one when contiguous for all operands.
  int n = 0;
  for (int d = 0; d < nd; ++d) {
    if (out.sizes()[d] == 1) continue;
    shape[n] = out.sizes()[d];
    for (int o = 0; o < it.noperands; ++o) strides[o][n] = strides[o][d];
    ++n;
  }
  // A non-row-major out (a channels-last image, a transposed view written in place): visit its
  // dims in memory order (strides descending, stable), so dense operands coalesce.
  if (!out.is_contiguous()) {
    int order[64];
    for (int d = 0; d < n; ++d) order[d] = d;
    std::stable_sort(order, order + n, [&](int p, int q) { return strides[0][p] > strides[0][q]; });
    int64_t tshape[64], tstrides[backend::kMaxOperands][64];
    for (int d = 0; d < n; ++d) {
      tshape[d] = shape[order[d]];
      for (int o = 0; o < it.noperands; ++o) tstrides[o][d] = strides[o][order[d]];
    }
    for (int d = 0; d < n; ++d) {
      shape[d] = tshape[d];
      for (int o = 0; o < it.noperands; ++o) strides[o][d] = tstrides[o][d];
    }
  }
  int m = 0;  // coalesced count, building from the outermost
  for (int d = 0; d < n; ++d) {
    if (m > 0) {
      bool merge = true;
      for (int o = 0; o < it.noperands && merge; ++o) merge = strides[o][m - 1] == strides[o][d] * shape[d];
      if (merge) {
        shape[m - 1] *= shape[d];
        for (int o = 0; o < it.noperands; ++o) strides[o][m - 1] = strides[o][d];
        continue;
      }
    }
    shape[m] = shape[d];
    for (int o = 0; o < it.noperands; ++o) strides[o][m] = strides[o][d];
    ++m;
  }
  TG_CHECK(m <= backend::kMaxDims, op, ": too many non-mergeable dims (", m, " > ", backend::kMaxDims, ")");
  it.ndim = m;
  bool contig = true;
  for (int d = 0; d < m; ++d) {
    it.shape[d] = shape[d];
    for (int o = 0; o < it.noperands; ++o) it.strides[o][d] = strides[o][d];
  }
  if (m > 1) contig = false;
  if (m == 1)
    for (int o = 0; o < it.noperands; ++o) contig = contig && strides[o][0] == 1;
  it.contiguous = contig;
  return it;
}

void run(ElemOp op, ElementwiseIter& it) {
  if (it.numel == 0) return;
  backend::get(it.device.type()).elementwise(op, it);
}

void set_scalar(ElementwiseIter& it, int i, DType compute, Scalar s) {
  if (is_floating(compute)) {
    it.dparams[i] = s.to_double();
  } else {
    it.iparams[i] = s.to_int();  // saturated from a double (Scalar)
    it.dparams[i] = s.to_double();
  }
}

Tensor as_dtype(const Tensor& t, DType d) { return t.dtype() == d ? t : to(t, t.device(), d); }

}  // namespace

DType result_type(const Tensor& a, const Tensor& b) {
  bool za = a.dim() == 0, zb = b.dim() == 0;
  if (za == zb) return promote_types(a.dtype(), b.dtype());
  // A 0-d tensor only promotes across categories (bool < integer < floating), as in PyTorch.
  const Tensor& dimmed = za ? b : a;
  const Tensor& zero = za ? a : b;
  auto cat = [](DType t) { return t == kBool ? 0 : is_floating(t) ? 2 : 1; };
  if (cat(zero.dtype()) > cat(dimmed.dtype())) return promote_types(dimmed.dtype(), zero.dtype());
  return dimmed.dtype();
}

DType result_type(const Tensor& a, const Scalar& s) {
  DType t = a.dtype();
  if (s.is_bool()) return t;
  if (s.is_integral()) return t == kBool ? kInt64 : t;
  return is_floating(t) ? t : kFloat32;
}

Tensor unary(ElemOp op, const Tensor& a, double p0, double p1) {
  const char* name = op_label(op);
  // A linear's gemm still waiting in the CUDA launch queue may take this activation as its epilogue
  // (the backend knows which ops its library fuses).
  if (a.is_cuda()) {
    Tensor fused = backend::get(a.device().type()).fuse_into_deferred_gemm(op, a);
    if (fused.defined()) return fused;
  }
  if (op == ElemOp::PowScalar && is_integral(a.dtype(), true) && p0 == std::floor(p0)) {
    // Integer power of an integer tensor stays integral, as in PyTorch: exact in float64 up to 2^53.
    TG_CHECK(p0 >= 0, "pow: integers to negative integer powers are not allowed (exponent ", p0, ", dtype ",
             a.dtype(), ")");
    DType out_dtype = a.dtype() == kBool ? kInt64 : a.dtype();
    return to(unary(ElemOp::PowScalar, to(a, a.device(), kFloat64), p0), a.device(), out_dtype);
  }
  DType compute = a.dtype();
  if (is_float_only(op) && !is_floating(compute)) compute = kFloat32;
  if (compute == kBool && op != ElemOp::Copy) compute = kInt64;
  Tensor in = as_dtype(a, compute);
  Tensor out = empty_out(a.sizes(), is_comparison(op) ? kBool : compute, a.device(), {&a});
  ElementwiseIter it = make_iter(out, {&in}, name);
  it.dparams[0] = p0;
  it.dparams[1] = p1;
  it.iparams[0] = Scalar::saturate_to_int64(p0);
  it.iparams[1] = Scalar::saturate_to_int64(p1);
  run(op, it);
  return out;
}

Tensor unary_to(ElemOp op, const Tensor& a, DType result, double p0, double p1) {
  const char* name = op_label(op);
  TG_CHECK(is_floating(a.dtype()) && is_floating(result) && !is_comparison(op), name,
           ": an explicit result dtype needs floating operands, got ", a.dtype(), " to ", result);
  const DType dtypes[] = {result, a.dtype()};
  if (!backend::has_mixed_form(op, dtypes))
    return as_dtype(unary(op, as_dtype(a, promote_types(a.dtype(), result)), p0, p1), result);
  Tensor out = empty_out(a.sizes(), result, a.device(), {&a});
  ElementwiseIter it = make_iter(out, {&a}, name);
  set_scalar(it, 0, kFloat32, Scalar(p0));
  set_scalar(it, 1, kFloat32, Scalar(p1));
  run(op, it);
  return out;
}

Tensor binary(ElemOp op, const Tensor& a, const Tensor& b, double p0, double p1) {
  const char* name = op_label(op);
  check_same_device(name, {&a, &b});
  DType compute = result_type(a, b);
  if (is_float_only(op) && !is_floating(compute)) compute = kFloat32;
  if (compute == kBool && !(op == ElemOp::Eq || op == ElemOp::Ne)) compute = kInt64;  // bool arithmetic in int64
  Shape shape = detail::broadcast_shapes(a.sizes(), b.sizes(), name);
  // A widening mixed form reads both inputs as they are (exact: nothing is rounded on the way in).
  // Only where compute is the inputs' promoted dtype: a narrowing form (binary_to's) would skip the
  // rounding of a 0-d float32 operand that promotion within floating types casts to the half dtype.
  const DType dtypes[] = {compute, a.dtype(), b.dtype()};
  const bool mixed = a.dtype() != b.dtype() && compute == promote_types(a.dtype(), b.dtype()) &&
                     backend::has_mixed_form(op, dtypes);
  Tensor x = mixed ? a : as_dtype(a, compute), y = mixed ? b : as_dtype(b, compute);
  Tensor out = empty_out(shape, is_comparison(op) ? kBool : compute, a.device(), {&a, &b});
  ElementwiseIter it = make_iter(out, {&x, &y}, name);
  set_scalar(it, 0, compute, Scalar(p0));
  set_scalar(it, 1, compute, Scalar(p1));
  if (!is_floating(compute)) it.iparams[0] = Scalar::saturate_to_int64(p0);
  run(op, it);
  return out;
}

Tensor binary_to(ElemOp op, const Tensor& a, const Tensor& b, DType result, double p0, double p1) {
  const char* name = op_label(op);
  check_same_device(name, {&a, &b});
  TG_CHECK(is_floating(a.dtype()) && is_floating(b.dtype()) && is_floating(result) && !is_comparison(op), name,
           ": an explicit result dtype needs floating operands, got ", a.dtype(), " and ", b.dtype(), " to ", result);
  const DType dtypes[] = {result, a.dtype(), b.dtype()};
  if (!backend::has_mixed_form(op, dtypes)) {
    const DType compute = promote_types(result_type(a, b), result);
    return as_dtype(binary(op, as_dtype(a, compute), as_dtype(b, compute), p0, p1), result);
  }
  Shape shape = detail::broadcast_shapes(a.sizes(), b.sizes(), name);
  Tensor out = empty_out(shape, result, a.device(), {&a, &b});
  ElementwiseIter it = make_iter(out, {&a, &b}, name);
  set_scalar(it, 0, kFloat32, Scalar(p0));
  set_scalar(it, 1, kFloat32, Scalar(p1));
  run(op, it);
  return out;
}

Tensor scalar_op(ElemOp op, const Tensor& a, Scalar s) {
  const char* name = op_label(op);
  DType compute = is_comparison(op) ? a.dtype() : result_type(a, s);
  if (is_comparison(op) && !s.is_integral() && !is_floating(compute)) compute = kFloat32;
  if (is_float_only(op) && !is_floating(compute)) compute = kFloat32;
  if (compute == kBool && !(op == ElemOp::EqScalar || op == ElemOp::NeScalar)) compute = kInt64;
  Tensor in = as_dtype(a, compute);
  Tensor out = empty_out(a.sizes(), is_comparison(op) ? kBool : compute, a.device(), {&a});
  ElementwiseIter it = make_iter(out, {&in}, name);
  set_scalar(it, 0, compute, s);
  run(op, it);
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_same_device("where", {&cond, &a, &b});
  TG_CHECK(cond.dtype() == kBool, "where: condition must be bool, got ", cond.dtype());
  DType compute = result_type(a, b);
  Shape shape = detail::broadcast_shapes(detail::broadcast_shapes(cond.sizes(), a.sizes(), "where"), b.sizes(), "where");
  Tensor x = as_dtype(a, compute), y = as_dtype(b, compute);
  Tensor out = empty_out(shape, compute, a.device(), {&a, &b, &cond});
  ElementwiseIter it = make_iter(out, {&cond, &x, &y}, "where");
  run(ElemOp::Where, it);
  return out;
}

namespace {
// In-place results: self keeps its shape and dtype; the inputs must broadcast to it.
void check_out_shape(const Tensor& self, const Shape& result, const char* op) {
  TG_CHECK(result == self.sizes(), op, ": the result of shape ", result, " cannot be written in place into shape ",
           self.sizes());
}
// As PyTorch: an in-place result may narrow within its category but not cross down (float into int).
void check_out_dtype(const Tensor& self, DType result, const char* op) {
  auto cat = [](DType t) { return t == kBool ? 0 : is_floating(t) ? 2 : 1; };
  TG_CHECK(cat(result) <= cat(self.dtype()), op, ": result dtype ", result, " cannot be written in place into a ",
           self.dtype(), " tensor");
}
}  // namespace

void unary_out(ElemOp op, const Tensor& self, const Tensor& a, double p0, double p1) {
  const char* name = op_label(op);
  check_same_device(name, {&self, &a});
  // Fast path (relu_, exp_, ...): a floating self, its own dtype throughout: the kernel writes into self.
  if (is_floating(self.dtype()) && a.dtype() == self.dtype() && a.sizes() == self.sizes() && !is_comparison(op)) {
    ElementwiseIter it = make_iter(self, {&a}, name);
    it.dparams[0] = p0;
    it.dparams[1] = p1;
    it.iparams[0] = Scalar::saturate_to_int64(p0);
    it.iparams[1] = Scalar::saturate_to_int64(p1);
    run(op, it);
    return;
  }
  Tensor r = unary(op, a, p0, p1);
  check_out_shape(self, r.sizes(), name);
  check_out_dtype(self, r.dtype(), name);
  copy_(self, r);
}

void binary_out(ElemOp op, const Tensor& self, const Tensor& a, const Tensor& b, double p0) {
  const char* name = op_label(op);
  check_same_device(name, {&self, &a, &b});
  Shape shape = detail::broadcast_shapes(a.sizes(), b.sizes(), name);
  check_out_shape(self, shape, name);
  DType compute = result_type(a, b);
  if (is_float_only(op) && !is_floating(compute)) compute = kFloat32;
  check_out_dtype(self, compute, name);
  // Fast path: self is one of the inputs and everything has self's dtype: run the kernel straight into self.
  if (compute == self.dtype() && a.dtype() == compute && b.dtype() == compute && !is_comparison(op) &&
      compute != kBool) {
    ElementwiseIter it = make_iter(self, {&a, &b}, name);
    set_scalar(it, 0, compute, Scalar(p0));
    if (!is_floating(compute)) it.iparams[0] = Scalar::saturate_to_int64(p0);
    run(op, it);
    return;
  }
  copy_(self, binary(op, a, b, p0));
}

void scalar_op_out(ElemOp op, const Tensor& self, const Tensor& a, Scalar s) {
  const char* name = op_label(op);
  check_same_device(name, {&self, &a});
  check_out_shape(self, a.sizes(), name);
  DType compute = result_type(a, s);
  if (is_float_only(op) && !is_floating(compute)) compute = kFloat32;
  check_out_dtype(self, compute, name);
  if (compute == self.dtype() && a.dtype() == compute && !is_comparison(op) && compute != kBool) {
    ElementwiseIter it = make_iter(self, {&a}, name);
    set_scalar(it, 0, compute, s);
    run(op, it);
    return;
  }
  copy_(self, scalar_op(op, a, s));
}

void fill_(const Tensor& self, Scalar v) {
  ElementwiseIter it = make_iter(self, {}, "fill_");
  set_scalar(it, 0, self.dtype(), v);
  if (self.dtype() == kBool) it.iparams[0] = v.to_double() != 0;
  run(ElemOp::Fill, it);
}

namespace {
// src converted to dtype and materialised densely with exactly `shape` (broadcast applied), on src's device.
Tensor dense_as(const Tensor& src, DType dtype, const Shape& shape) {
  if (src.dtype() == dtype && src.is_contiguous() && src.sizes() == shape) return src;
  Tensor out = empty(shape, dtype, src.device());
  ElementwiseIter it = make_iter(out, {&src}, "copy_");
  run(ElemOp::Copy, it);
  return out;
}
}  // namespace

void copy_(const Tensor& dst, const Tensor& src, bool non_blocking) {
  Shape shape = detail::broadcast_shapes(dst.sizes(), src.sizes(), "copy_");
  TG_CHECK(shape == dst.sizes(), "copy_: source of shape ", src.sizes(), " cannot be broadcast to destination shape ",
           dst.sizes());
  if (dst.numel() == 0) return;
  if (dst.device() == src.device()) {
    ElementwiseIter it = make_iter(dst, {&src}, "copy_");
    run(ElemOp::Copy, it);
    return;
  }
  // Across devices: dense bytes through the device's backend (one DMA), converting dtype and
  // layout on the side that has them.
  TG_CHECK(backend::cuda() != nullptr, "copy_: from ", src.device(), " to ", dst.device(),
           ": tapegrad was built without CUDA (TG_CUDA=OFF)");
  const size_t nbytes = dst.nbytes();
  backend::Backend& be = backend::get(src.is_cpu() ? dst.device().type() : src.device().type());
  Tensor moved = dense_as(src, dst.dtype(), shape);  // on src's device
  Tensor target = dst.is_contiguous() ? dst : empty(shape, dst.dtype(), dst.device());
  be.copy_bytes(target.data_ptr(), dst.device(), moved.data_ptr(), src.device(), nbytes, non_blocking);
  if (!target.is_same(dst)) copy_(dst, target);
}

Tensor to(const Tensor& a, Device device, DType dtype, bool non_blocking) {
  device = resolve(device);
  if (a.device() == device && a.dtype() == dtype) return a;
  if (a.device() == device && a.is_cuda()) {
    // A kernel that wrote a beside its cast left it as a's twin (core/cast_copies.h): no launch.
    if (Tensor low = detail::take_cast_twin(a, dtype); low.defined()) return low;
  }
  Tensor out;
  if (device.is_cpu() && !a.is_cpu()) {
    // Device -> host lands in the device backend's staging memory (CUDA: pinned, from the caching
    // host allocator): the DMA runs at full speed and repeated cpu() calls reuse faulted pages.
    const size_t nbytes = detail::storage_nbytes(a.sizes(), element_size(dtype), "to");
    auto storage = std::make_shared<Storage>(backend::get(a.device().type()).host_staging(nbytes), nbytes, Device(kCPU));
    out = Tensor(std::make_shared<TensorImpl>(std::move(storage), a.sizes(), detail::contiguous_strides(a.sizes()),
                                              0, dtype));
  }
  if (!out.defined()) out = a.device() == device ? empty_out(a.sizes(), dtype, device, {&a}) : empty(a.sizes(), dtype, device);
  copy_(out, a, non_blocking);
  return out;
}

Tensor add_n(const std::vector<Tensor>& ts) {
  TG_CHECK(!ts.empty(), "add_n: no tensors");
  if (ts.size() == 1) return ts[0];
  const Tensor& first = ts[0];
  for (const Tensor& t : ts)
    TG_CHECK(t.sizes() == first.sizes() && t.dtype() == first.dtype() && t.device() == first.device(), "add_n: got ",
             t.sizes(), " ", t.dtype(), " on ", t.device(), " beside ", first.sizes(), " ", first.dtype(), " on ",
             first.device());
  if (!is_floating(first.dtype())) {
    Tensor acc = ts[0];
    for (size_t i = 1; i < ts.size(); ++i) acc = native::add(acc, ts[i]);
    return acc;
  }
  // Identical views are counted, not re-read (often every contribution is the same expanded
  // gradient of a sum): a repeated one becomes one scaled copy, a lone strided one a dense
  // copy; then one fused launch per kMaxAddN dense operands.
  std::vector<std::pair<Tensor, int64_t>> unique;
  for (const Tensor& t : ts) {
    auto it = std::find_if(unique.begin(), unique.end(), [&](const auto& u) {
      return u.first.impl().storage == t.impl().storage && u.first.storage_offset() == t.storage_offset() &&
             u.first.strides() == t.strides();
    });
    if (it != unique.end()) ++it->second;
    else unique.emplace_back(t, 1);
  }
  std::vector<Tensor> level;
  for (auto& [t, count] : unique) {
    if (count > 1) level.push_back(scalar_op(ElemOp::MulScalar, t, Scalar(static_cast<double>(count))));
    else level.push_back(t.is_contiguous() ? t : clone(t));
  }
  while (level.size() > 1) {  // each pass sums groups of up to kMaxAddN
    std::vector<Tensor> next;
    for (size_t i = 0; i < level.size(); i += backend::kMaxAddN) {
      size_t n = std::min<size_t>(backend::kMaxAddN, level.size() - i);
      if (n == 1) {
        next.push_back(level[i]);
        continue;
      }
      std::vector<Tensor> group(level.begin() + static_cast<std::ptrdiff_t>(i),
                                level.begin() + static_cast<std::ptrdiff_t>(i + n));
      Tensor out = empty(first.sizes(), first.dtype(), first.device());
      if (out.numel() > 0) backend::get(first.device().type()).add_n(out, group);
      next.push_back(out);
    }
    level = std::move(next);
  }
  return level[0];
}

Tensor contiguous(const Tensor& a) { return a.is_contiguous() ? a : clone(a); }

bool is_nhwc(const Tensor& a) {
  return a.dim() == 4 && !a.is_contiguous() && a.is_contiguous(MemoryFormat::ChannelsLast);
}

Tensor contiguous_channels_last(const Tensor& a) {
  if (a.is_contiguous(MemoryFormat::ChannelsLast)) return a;
  return native::permute(contiguous(native::permute(a, Shape{0, 2, 3, 1})), Shape{0, 3, 1, 2});
}

Tensor clone(const Tensor& a) {
  Tensor out = empty(a.sizes(), a.dtype(), a.device());
  copy_(out, a);
  return out;
}

}  // namespace native
}  // namespace tg
