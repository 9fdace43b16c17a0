// ExportedProgram::save_onnx: an ONNX ModelProto (IR version 8, opset 17)
// written straight in the protobuf wire format, no protobuf library: varint and
// length-delimited fields, with the field numbers of onnx/onnx.proto. Each tg op
// lowers to one or a few ONNX nodes; scalars and weights become initializers.
#include <cstring>
#include <fstream>
#include <limits>

#include <tapegrad/autograd/autograd.h>
#include <tapegrad/core/native.h>
#include <tapegrad/core/ops.h>
#include <tapegrad/export/export.h>
#include <tapegrad/export/program.h>
// ---- issue 17: interpolate's index tables
#include <tapegrad/core/backend/upsample_index.h>

namespace tg {

using exporting::Node;
using exporting::Program;
using exporting::Value;

namespace {

// ---- protobuf wire format
class Proto {
 public:
  void varint(uint64_t v) {
    while (v >= 0x80) {
      buf_.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    buf_.push_back(static_cast<char>(v));
  }
  void key(int field, int wire_type) { varint(static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire_type)); }
  void int_field(int field, int64_t v) {  // int32/int64/enum: negative values as 10-byte varints
    key(field, 0);
    varint(static_cast<uint64_t>(v));
  }
  void bytes_field(int field, std::string_view s) {
    key(field, 2);
    varint(s.size());
    buf_.append(s);
  }
  void message_field(int field, const Proto& m) { bytes_field(field, m.buf_); }
  void float_field(int field, float f) {
    key(field, 5);
    char b[4];
    std::memcpy(b, &f, 4);  // little-endian hosts only (x86-64, aarch64)
    buf_.append(b, 4);
  }
  const std::string& bytes() const { return buf_; }

 private:
  std::string buf_;
};

// onnx.proto field numbers
namespace model { constexpr int kIrVersion = 1, kProducerName = 2, kProducerVersion = 3, kGraph = 7, kOpsetImport = 8; }
namespace opset { constexpr int kDomain = 1, kVersion = 2; }
namespace graph { constexpr int kNode = 1, kName = 2, kInitializer = 5, kInput = 11, kOutput = 12; }
namespace node { constexpr int kInput = 1, kOutput = 2, kName = 3, kOpType = 4, kAttribute = 5; }
namespace attr {
constexpr int kName = 1, kF = 2, kI = 3, kInts = 8, kType = 20;
constexpr int kFloat = 1, kInt = 2, kIntsType = 7;
constexpr int kS = 4, kString = 3;  // issue 15: ScatterElements' reduction
}  // namespace attr
namespace tensor_proto { constexpr int kDims = 1, kDataType = 2, kName = 8, kRawData = 9; }
namespace value_info { constexpr int kName = 1, kType = 2; }
namespace type_proto { constexpr int kTensorType = 1, kElemType = 1, kShape = 2; }
namespace shape_proto { constexpr int kDim = 1, kDimValue = 1, kDimParam = 2; }

constexpr int64_t kIrVersion = 8;
constexpr int64_t kOpset = 17;

int onnx_type(DType t) {
  switch (t) {
    case DType::Float32: return 1;
    case DType::Float16: return 10;
    case DType::BFloat16: return 16;
    case DType::Float64: return 11;
    case DType::Int64: return 7;
    case DType::Int32: return 6;
    case DType::Bool: return 9;
    case DType::UInt8: return 2;
    case DType::Int8: return 3;
    case DType::Int16: return 5;
  }
  return 0;
}

struct OnnxAttr {
  std::string name;
  int type;
  int64_t i = 0;
  float f = 0;
  std::vector<int64_t> ints;
  std::string s;  // kString
};
OnnxAttr attr_int(std::string name, int64_t v) { return {std::move(name), attr::kInt, v, 0, {}}; }
OnnxAttr attr_ints(std::string name, std::vector<int64_t> v) { return {std::move(name), attr::kIntsType, 0, 0, std::move(v)}; }

class OnnxGraph {
 public:
  explicit OnnxGraph(const Program& p) : p_(p) {}

  // Emits one node; returns its (single) output name.
  std::string node(const std::string& op, const std::vector<std::string>& inputs, std::string output = "",
                   const std::vector<OnnxAttr>& attrs = {}) {
    if (output.empty()) output = fresh();
    Proto n;
    for (const auto& i : inputs) n.bytes_field(node::kInput, i);
    n.bytes_field(node::kOutput, output);
    n.bytes_field(node::kName, "n" + std::to_string(nodes_.size()) + "_" + op);
    n.bytes_field(node::kOpType, op);
    for (const auto& a : attrs) {
      Proto pa;
      pa.bytes_field(attr::kName, a.name);
      pa.int_field(attr::kType, a.type);
      if (a.type == attr::kInt) pa.int_field(attr::kI, a.i);
      else if (a.type == attr::kFloat) pa.float_field(attr::kF, a.f);
      else if (a.type == attr::kString) pa.bytes_field(attr::kS, a.s);
      else
        for (int64_t v : a.ints) pa.int_field(attr::kInts, v);
      n.message_field(node::kAttribute, pa);
    }
    nodes_.push_back(std::move(n));
    return output;
  }

  // ---- issue 15: a node with several outputs (TopK's values and indices)
  void node_outputs(const std::string& op, const std::vector<std::string>& inputs,
                    const std::vector<std::string>& outputs, const std::vector<OnnxAttr>& attrs) {
    Proto n;
    for (const auto& i : inputs) n.bytes_field(node::kInput, i);
    for (const auto& o : outputs) n.bytes_field(node::kOutput, o);
    n.bytes_field(node::kName, "n" + std::to_string(nodes_.size()) + "_" + op);
    n.bytes_field(node::kOpType, op);
    for (const auto& a : attrs) {
      Proto pa;
      pa.bytes_field(attr::kName, a.name);
      pa.int_field(attr::kType, a.type);
      pa.int_field(attr::kI, a.i);  // int attributes only
      n.message_field(node::kAttribute, pa);
    }
    nodes_.push_back(std::move(n));
  }

  // An initializer holding `t` (any device/layout).
  std::string initializer(const Tensor& t, std::string name = "") {
    if (name.empty()) name = fresh();
    Tensor c = t.to(Device(kCPU)).contiguous();
    std::string raw(c.nbytes(), '\0');
    if (!raw.empty()) c.copy_to_host(raw.data());
    Proto pt;
    for (int64_t d : c.sizes()) pt.int_field(tensor_proto::kDims, d);
    pt.int_field(tensor_proto::kDataType, onnx_type(c.dtype()));
    pt.bytes_field(tensor_proto::kName, name);
    pt.bytes_field(tensor_proto::kRawData, raw);
    inits_.push_back(std::move(pt));
    return name;
  }
  std::string scalar(Scalar s, DType dtype) { return initializer(full({}, s, dtype)); }
  std::string ints(const std::vector<int64_t>& v) {
    return initializer(tensor(v, Shape{static_cast<int64_t>(v.size())}, kInt64));
  }
  // x as `to` (a Cast node when the dtypes differ).
  std::string as(const std::string& x, DType from, DType to) {
    if (from == to) return x;
    return node("Cast", {x}, "", {attr_int("to", onnx_type(to))});
  }

  Proto value_info(const std::string& name, DType dtype, const Shape& shape) const {
    Proto dims;
    for (size_t d = 0; d < shape.size(); ++d) {
      Proto dim;
      if (shape[d] == exporting::kBatch && d == 0) dim.bytes_field(shape_proto::kDimParam, "batch");
      else dim.int_field(shape_proto::kDimValue, shape[d]);
      dims.message_field(shape_proto::kDim, dim);
    }
    Proto tensor_type;
    tensor_type.int_field(type_proto::kElemType, onnx_type(dtype));
    tensor_type.message_field(type_proto::kShape, dims);
    Proto type;
    type.message_field(type_proto::kTensorType, tensor_type);
    Proto vi;
    vi.bytes_field(value_info::kName, name);
    vi.message_field(value_info::kType, type);
    return vi;
  }

  std::string model() const {
    Proto g;
    for (const auto& n : nodes_) g.message_field(graph::kNode, n);
    g.bytes_field(graph::kName, "tapegrad_export");
    for (const auto& t : inits_) g.message_field(graph::kInitializer, t);
    for (int id : p_.inputs) {
      const Value& v = p_.values[id];
      g.message_field(graph::kInput, value_info(v.name, v.dtype, v.shape));
    }
    for (size_t i = 0; i < p_.outputs.size(); ++i) {
      const Value& v = p_.values[p_.outputs[i]];
      g.message_field(graph::kOutput, value_info("output_" + std::to_string(i), v.dtype, v.shape));
    }
    Proto op;
    op.bytes_field(opset::kDomain, "");
    op.int_field(opset::kVersion, kOpset);
    Proto m;
    m.int_field(model::kIrVersion, kIrVersion);
    m.bytes_field(model::kProducerName, "tapegrad");
    m.bytes_field(model::kProducerVersion, version());
    m.message_field(model::kGraph, g);
    m.message_field(model::kOpsetImport, op);
    return m.bytes();
  }

  std::string fresh() { return "_t" + std::to_string(counter_++); }

 private:
  const Program& p_;
  std::vector<Proto> nodes_;
  std::vector<Proto> inits_;
  int counter_ = 0;
};

int64_t wrap(int64_t d, int64_t rank, const Node& n) {
  return detail::wrap_dim(d, rank, op_name(n.op));
}

// The axes a reduction's "dims" attribute names (empty: all), wrapped and sorted.
std::vector<int64_t> reduce_axes(const Node& n, int64_t rank) {
  std::vector<int64_t> dims = exporting::attr_ints(n, "dims");
  if (rank == 0) return {};
  return detail::reduce_dims(DimList(dims), rank, op_name(n.op));
}

// Lowers node n; `in` are the ONNX names of its operands, `out` the name of its result.
void lower(OnnxGraph& g, const Program& p, const Node& n, const std::vector<std::string>& in, const std::string& out) {
  const Value& ov = p.values[n.output];
  const DType odt = ov.dtype;
  auto iv = [&](size_t i) -> const Value& { return p.values[n.inputs.at(i)]; };
  auto in_as = [&](size_t i, DType t) { return g.as(in[i], iv(i).dtype, t); };
  auto unsupported = [&](const std::string& why) {
    TG_ERROR("save_onnx: cannot export ", exporting::describe_node(p, n), ": ", why);
  };
  auto binary = [&](const char* op) { g.node(op, {in_as(0, odt), in_as(1, odt)}, out); };
  auto unary = [&](const char* op) { g.node(op, {in_as(0, odt)}, out); };
  auto with_scalar = [&](const char* op, bool scalar_first) {
    std::string x = in_as(0, odt), s = g.scalar(exporting::attr_scalar(n, "other"), odt);
    g.node(op, scalar_first ? std::vector<std::string>{s, x} : std::vector<std::string>{x, s}, out);
  };
  auto compare = [&](const char* op, bool negate, bool scalar) {
    std::string a, b;
    if (scalar) {
      Scalar s = exporting::attr_scalar(n, "other");
      const DType t = native::result_type(empty({0}, iv(0).dtype), s);
      a = in_as(0, t);
      b = g.scalar(s, t);
    } else {
      const DType t = promote_types(iv(0).dtype, iv(1).dtype);
      a = in_as(0, t);
      b = in_as(1, t);
    }
    if (negate) g.node("Not", {g.node(op, {a, b})}, out);
    else g.node(op, {a, b}, out);
  };
  auto moment = [&](bool is_std) {
    const Value& x = iv(0);
    auto axes = reduce_axes(n, static_cast<int64_t>(x.shape.size()));
    if (axes.empty())
      for (int64_t d = 0; d < static_cast<int64_t>(x.shape.size()); ++d) axes.push_back(d);
    double count = 1;  // in double: a zero-element input may have dims whose product overflows int64
    for (int64_t d : axes) {
      if (x.shape[d] == exporting::kBatch && d == 0) unsupported("var/std over the dynamic batch dim");
      count *= static_cast<double>(x.shape[d]);
    }
    const bool keep = exporting::attr_bool(n, "keepdim");
    std::string xi = in_as(0, odt);
    std::string m = g.node("ReduceMean", {xi}, "", {attr_ints("axes", axes), attr_int("keepdims", 1)});
    std::string d = g.node("Sub", {xi, m});
    std::string s = g.node("ReduceSum", {g.node("Mul", {d, d}), g.ints(axes)}, "", {attr_int("keepdims", keep)});
    const double denom = count - static_cast<double>(exporting::attr_int(n, "correction"));
    if (!is_std) {
      g.node("Div", {s, g.scalar(denom, odt)}, out);
    } else {
      g.node("Sqrt", {g.node("Div", {s, g.scalar(denom, odt)})}, out);
    }
  };
  const int64_t in_rank = n.inputs.empty() ? 0 : static_cast<int64_t>(iv(0).shape.size());

  switch (n.op) {
    case OpKind::Add:
    case OpKind::Sub: {
      std::string b = in_as(1, odt);
      Scalar alpha = exporting::attr_scalar(n, "alpha");
      if (alpha.to_double() != 1) b = g.node("Mul", {b, g.scalar(alpha, odt)});
      g.node(n.op == OpKind::Add ? "Add" : "Sub", {in_as(0, odt), b}, out);
      return;
    }
    case OpKind::Mul: return binary("Mul");
    case OpKind::Div: return binary("Div");
    case OpKind::Pow: return binary("Pow");
    case OpKind::Maximum: return binary("Max");
    case OpKind::Minimum: return binary("Min");
    case OpKind::Where: {
      g.node("Where", {in_as(0, kBool), in_as(1, odt), in_as(2, odt)}, out);
      return;
    }
    case OpKind::Eq: return compare("Equal", false, false);
    case OpKind::Ne: return compare("Equal", true, false);
    case OpKind::Lt: return compare("Less", false, false);
    case OpKind::Le: return compare("LessOrEqual", false, false);
    case OpKind::Gt: return compare("Greater", false, false);
    case OpKind::Ge: return compare("GreaterOrEqual", false, false);
    case OpKind::EqScalar: return compare("Equal", false, true);
    case OpKind::NeScalar: return compare("Equal", true, true);
    case OpKind::LtScalar: return compare("Less", false, true);
    case OpKind::LeScalar: return compare("LessOrEqual", false, true);
    case OpKind::GtScalar: return compare("Greater", false, true);
    case OpKind::GeScalar: return compare("GreaterOrEqual", false, true);
    case OpKind::AddScalar: return with_scalar("Add", false);
    case OpKind::SubScalar: return with_scalar("Sub", false);
    case OpKind::RSubScalar: return with_scalar("Sub", true);
    case OpKind::MulScalar: return with_scalar("Mul", false);
    case OpKind::DivScalar: return with_scalar("Div", false);
    case OpKind::RDivScalar: return with_scalar("Div", true);
    case OpKind::PowScalar: {
      g.node("Pow", {in_as(0, odt), g.scalar(exporting::attr_scalar(n, "exponent"), odt)}, out);
      return;
    }
    case OpKind::Clamp: {
      g.node("Clip",
             {in_as(0, odt), g.scalar(exporting::attr_scalar(n, "lo"), odt),
              g.scalar(exporting::attr_scalar(n, "hi"), odt)},
             out);
      return;
    }
    case OpKind::Neg: return unary("Neg");
    case OpKind::Exp: return unary("Exp");
    case OpKind::Log: return unary("Log");
    case OpKind::Sqrt: return unary("Sqrt");
    case OpKind::Abs: return unary("Abs");
    case OpKind::Relu: return unary("Relu");
    case OpKind::Sigmoid: return unary("Sigmoid");
    case OpKind::Tanh: return unary("Tanh");
    case OpKind::Gelu: {  // opset 17 has no Gelu: 0.5 * x * (1 + erf(x / sqrt(2)))
      std::string x = in_as(0, odt);
      std::string e = g.node("Erf", {g.node("Div", {x, g.scalar(1.4142135623730951, odt)})});
      std::string h = g.node("Mul", {x, g.node("Add", {e, g.scalar(1.0, odt)})});
      g.node("Mul", {h, g.scalar(0.5, odt)}, out);
      return;
    }
    case OpKind::Sum: {
      auto axes = reduce_axes(n, in_rank);
      std::vector<std::string> ins{in_as(0, odt)};
      if (!axes.empty()) ins.push_back(g.ints(axes));
      g.node("ReduceSum", ins, out, {attr_int("keepdims", exporting::attr_bool(n, "keepdim"))});
      return;
    }
    case OpKind::Mean:
    case OpKind::Amax:
    case OpKind::Amin: {
      const char* op = n.op == OpKind::Mean ? "ReduceMean" : n.op == OpKind::Amax ? "ReduceMax" : "ReduceMin";
      auto axes = reduce_axes(n, in_rank);
      std::vector<OnnxAttr> attrs{attr_int("keepdims", exporting::attr_bool(n, "keepdim"))};
      if (!axes.empty()) attrs.push_back(attr_ints("axes", axes));  // opset 17: an attribute
      g.node(op, {in_as(0, odt)}, out, attrs);
      return;
    }
    case OpKind::Var: return moment(false);
    case OpKind::Std: return moment(true);
    case OpKind::Argmax: {
      const bool keep = exporting::attr_bool(n, "keepdim");
      if (exporting::find_attr(n, "dim")) {
        g.node("ArgMax", {in[0]}, out,
               {attr_int("axis", wrap(exporting::attr_int(n, "dim"), std::max<int64_t>(in_rank, 1), n)),
                attr_int("keepdims", keep)});
      } else {
        std::string flat = g.node("Reshape", {in[0], g.ints({-1})});
        std::string r = g.node("ArgMax", {flat}, "", {attr_int("axis", 0), attr_int("keepdims", 0)});
        std::vector<int64_t> shape(ov.shape.begin(), ov.shape.end());
        g.node("Reshape", {r, g.ints(shape)}, out);
      }
      return;
    }
    case OpKind::Matmul: return binary("MatMul");
    case OpKind::Linear: {  // x @ w^T (+ b): opset 17's Gemm takes 2-D operands only
      const int64_t wr = static_cast<int64_t>(iv(1).shape.size());
      if (wr != 2) unsupported("linear with a weight of rank " + std::to_string(wr));
      std::string wt = g.node("Transpose", {in_as(1, odt)}, "", {attr_ints("perm", {1, 0})});
      if (n.inputs.size() < 3) {
        g.node("MatMul", {in_as(0, odt), wt}, out);
      } else {
        g.node("Add", {g.node("MatMul", {in_as(0, odt), wt}), in_as(2, odt)}, out);
      }
      return;
    }
    case OpKind::MseLoss: {  // (input - target)^2, reduced
      std::string d = g.node("Sub", {in_as(0, odt), in_as(1, odt)});
      std::string sq = g.node("Mul", {d, d});
      const int64_t r = exporting::attr_int(n, "reduction");
      if (r == 0) {
        g.node("Identity", {sq}, out);
      } else if (r == 1 || r == 2) {
        g.node(r == 1 ? "ReduceMean" : "ReduceSum", {sq}, out, {attr_int("keepdims", 0)});
      } else {
        unsupported("mse_loss reduction " + std::to_string(r));
      }
      return;
    }
    case OpKind::Transpose: {
      std::vector<int64_t> perm;
      for (int64_t d = 0; d < in_rank; ++d) perm.push_back(d);
      if (in_rank > 0)
        std::swap(perm[wrap(exporting::attr_int(n, "dim0"), in_rank, n)],
                  perm[wrap(exporting::attr_int(n, "dim1"), in_rank, n)]);
      g.node("Transpose", {in[0]}, out, {attr_ints("perm", perm)});
      return;
    }
    case OpKind::Permute: {
      std::vector<int64_t> perm;
      for (int64_t d : exporting::attr_ints(n, "dims")) perm.push_back(wrap(d, in_rank, n));
      g.node("Transpose", {in[0]}, out, {attr_ints("perm", perm)});
      return;
    }
    case OpKind::View:
    case OpKind::Reshape: {
      auto shape = exporting::attr_ints(n, "shape");
      for (int64_t s : shape)
        if (s == 0) unsupported("a reshape to a size-0 dim");
      g.node("Reshape", {in[0], g.ints(shape)}, out);
      return;
    }
    case OpKind::Expand: {
      auto sizes = exporting::attr_ints(n, "sizes");
      for (int64_t& s : sizes)
        if (s == -1) s = 1;  // ONNX Expand broadcasts: 1 keeps the input's size
      g.node("Expand", {in[0], g.ints(sizes)}, out);
      return;
    }
    case OpKind::Unsqueeze: {
      g.node("Unsqueeze", {in[0], g.ints({wrap(exporting::attr_int(n, "dim"), in_rank + 1, n)})}, out);
      return;
    }
    case OpKind::Squeeze: {
      std::vector<int64_t> axes;
      const Shape& s = iv(0).shape;
      if (exporting::find_attr(n, "dim")) {
        if (in_rank > 0) {
          int64_t d = wrap(exporting::attr_int(n, "dim"), in_rank, n);
          if (s[d] == 1) axes.push_back(d);
        }
      } else {
        for (int64_t d = 0; d < in_rank; ++d)
          if (s[d] == 1) axes.push_back(d);
      }
      if (axes.empty()) g.node("Identity", {in[0]}, out);
      else g.node("Squeeze", {in[0], g.ints(axes)}, out);
      return;
    }
    case OpKind::Slice: {
      const int64_t step = exporting::attr_int(n, "step");
      if (step <= 0) unsupported("a non-positive slice step");
      g.node("Slice",
             {in[0], g.ints({exporting::attr_int(n, "start")}), g.ints({exporting::attr_int(n, "end")}),
              g.ints({wrap(exporting::attr_int(n, "dim"), in_rank, n)}), g.ints({step})},
             out);
      return;
    }
    case OpKind::Select: {
      std::string idx = g.initializer(full({}, exporting::attr_int(n, "index"), kInt64));
      g.node("Gather", {in[0], idx}, out, {attr_int("axis", wrap(exporting::attr_int(n, "dim"), in_rank, n))});
      return;
    }
    case OpKind::IndexSelect: {
      std::string idx = in_as(1, kInt64);
      if (iv(1).shape.empty()) idx = g.node("Unsqueeze", {idx, g.ints({0})});
      if (in_rank == 0) unsupported("index_select on a 0-d tensor");
      g.node("Gather", {in[0], idx}, out, {attr_int("axis", wrap(exporting::attr_int(n, "dim"), in_rank, n))});
      return;
    }
    case OpKind::Cat: {
      std::vector<std::string> ins;
      for (size_t i = 0; i < in.size(); ++i) {
        if (iv(i).shape.size() != ov.shape.size()) continue;  // legacy empty 1-D operands take no part
        ins.push_back(in_as(i, odt));
      }
      g.node("Concat", ins, out,
             {attr_int("axis", wrap(exporting::attr_int(n, "dim"), static_cast<int64_t>(ov.shape.size()), n))});
      return;
    }
    case OpKind::To: {
      g.node("Cast", {in[0]}, out, {attr_int("to", onnx_type(exporting::attr_dtype(n, "dtype")))});
      return;
    }
    case OpKind::Contiguous:
    case OpKind::Clone:
    case OpKind::Alias: g.node("Identity", {in[0]}, out); return;
    // ---- issue 15: softmax and classification losses
    case OpKind::Softmax:
    case OpKind::LogSoftmax: {
      const int64_t axis = wrap(exporting::attr_int(n, "dim"), std::max<int64_t>(in_rank, 1), n);
      g.node(n.op == OpKind::Softmax ? "Softmax" : "LogSoftmax", {in_as(0, odt)}, out, {attr_int("axis", axis)});
      return;
    }
    case OpKind::LogSumExp: {
      auto axes = reduce_axes(n, in_rank);
      std::vector<OnnxAttr> attrs{attr_int("keepdims", exporting::attr_bool(n, "keepdim"))};
      if (!axes.empty()) attrs.push_back(attr_ints("axes", axes));
      g.node("ReduceLogSumExp", {in_as(0, odt)}, out, attrs);
      return;
    }
    case OpKind::CrossEntropy:
    case OpKind::NllLoss: {
      // Composite (opset 17's SoftmaxCrossEntropyLoss has no label smoothing): log-probabilities,
      // a one-hot selection against the class indices, per-sample weights, the reduction.
      const int64_t r = exporting::attr_int(n, "reduction");
      if (r < 0 || r > 2) unsupported("reduction " + std::to_string(r));
      if (in_rank < 1) unsupported("0-d input");
      const int64_t cd = in_rank == 1 ? 0 : 1;
      const int64_t c = iv(0).shape[static_cast<size_t>(cd)];
      if (c == exporting::kBatch && cd == 0) unsupported("a dynamic class dim");
      const bool ce = n.op == OpKind::CrossEntropy;
      const double eps = ce ? exporting::attr_scalar(n, "label_smoothing").to_double() : 0.0;
      std::string logp = ce ? g.node("LogSoftmax", {in_as(0, odt)}, "", {attr_int("axis", cd)}) : in_as(0, odt);
      std::vector<int64_t> wshape(static_cast<size_t>(in_rank), 1);
      wshape[static_cast<size_t>(cd)] = c;
      std::string wv = n.inputs.size() > 2 ? g.node("Reshape", {in_as(2, odt), g.ints(wshape)}) : "";
      std::string cdim = g.ints({cd});
      auto rsum = [&](const std::string& x, bool over_class) {
        return over_class ? g.node("ReduceSum", {x, cdim}, "", {attr_int("keepdims", 0)})
                          : g.node("ReduceSum", {x}, "", {attr_int("keepdims", 0)});
      };
      if (is_floating(iv(1).dtype)) {  // probability targets
        if (!ce) unsupported("nll_loss with a floating target");
        std::string t = in_as(1, odt);
        if (eps > 0) t = g.node("Add", {g.node("Mul", {t, g.scalar(1.0 - eps, odt)}), g.scalar(eps / c, odt)});
        std::string prod = g.node("Mul", {logp, t});
        if (!wv.empty()) prod = g.node("Mul", {prod, wv});
        std::string per = g.node("Neg", {rsum(prod, true)});
        if (r == 0) g.node("Identity", {per}, out);
        else if (r == 2) g.node("ReduceSum", {per}, out, {attr_int("keepdims", 0)});
        else g.node("ReduceMean", {per}, out, {attr_int("keepdims", 0)});
        return;
      }
      std::string tgt = in_as(1, kInt64);
      Tensor cls = arange(c, kInt64).reshape(Shape(wshape.begin(), wshape.end()));
      std::string onehot = g.as(g.node("Equal", {g.node("Unsqueeze", {tgt, cdim}), g.initializer(cls)}), kBool, odt);
      std::string valid = g.as(
          g.node("Not", {g.node("Equal", {tgt, g.scalar(Scalar(exporting::attr_int(n, "ignore_index")), kInt64)})}),
          kBool, odt);
      std::string sel = wv.empty() ? onehot : g.node("Mul", {onehot, wv});
      std::string per = g.node("Neg", {rsum(g.node("Mul", {logp, sel}), true)});
      if (eps > 0) {
        std::string smooth = g.node("Neg", {rsum(wv.empty() ? logp : g.node("Mul", {logp, wv}), true)});
        per = g.node("Add", {g.node("Mul", {per, g.scalar(1.0 - eps, odt)}),
                             g.node("Mul", {smooth, g.scalar(eps / static_cast<double>(c), odt)})});
      }
      per = g.node("Mul", {per, valid});
      if (r == 0) {
        g.node("Identity", {per}, out);
      } else if (r == 2) {
        g.node("ReduceSum", {per}, out, {attr_int("keepdims", 0)});
      } else {
        std::string wsum = rsum(g.node("Mul", {rsum(sel, true), valid}), false);
        g.node("Div", {rsum(per, false), wsum}, out);
      }
      return;
    }
    case OpKind::BceWithLogits: {
      const int64_t r = exporting::attr_int(n, "reduction");
      if (r < 0 || r > 2) unsupported("reduction " + std::to_string(r));
      std::string x = in_as(0, odt), y = in_as(1, odt);
      size_t k = 2;
      std::string w = exporting::attr_bool(n, "has_weight") ? in_as(k++, odt) : "";
      std::string pw = exporting::attr_bool(n, "has_pos_weight") ? in_as(k++, odt) : "";
      // (1 - y) x + lw (log(1 + exp(-|x|)) + relu(-x)), lw = (pos_weight - 1) y + 1
      std::string sp = g.node("Add", {g.node("Log", {g.node("Add", {g.node("Exp", {g.node("Neg", {g.node("Abs", {x})})}),
                                                                   g.scalar(1.0, odt)})}),
                                      g.node("Relu", {g.node("Neg", {x})})});
      if (!pw.empty())
        sp = g.node("Mul", {g.node("Add", {g.node("Mul", {g.node("Sub", {pw, g.scalar(1.0, odt)}), y}),
                                           g.scalar(1.0, odt)}),
                            sp});
      std::string per = g.node("Add", {g.node("Mul", {g.node("Sub", {g.scalar(1.0, odt), y}), x}), sp});
      if (!w.empty()) per = g.node("Mul", {per, w});
      if (r == 0) g.node("Identity", {per}, out);
      else g.node(r == 1 ? "ReduceMean" : "ReduceSum", {per}, out, {attr_int("keepdims", 0)});
      return;
    }
    // ---- issue 15: normalization, embedding, dropout
    case OpKind::LayerNorm: {  // opset 17's LayerNormalization (Scale required: ones when absent)
      const auto ns = exporting::attr_ints(n, "normalized_shape");
      const int64_t nd = static_cast<int64_t>(ns.size());
      if (nd == 0 || nd > in_rank) unsupported("layer_norm with normalized_shape of rank " + std::to_string(nd));
      for (int64_t d = 0; d < nd; ++d)
        if (iv(0).shape[in_rank - nd + d] != ns[d]) unsupported("layer_norm's normalized_shape does not end the input's");
      std::vector<std::string> ins{in_as(0, odt)};
      ins.push_back(n.inputs.size() > 1 ? in_as(1, odt) : g.initializer(full(Shape(ns), 1, odt)));
      if (n.inputs.size() > 2) ins.push_back(in_as(2, odt));
      const float eps = static_cast<float>(exporting::attr_scalar(n, "eps").to_double());
      g.node("LayerNormalization", ins, out,
             {attr_int("axis", -nd), OnnxAttr{"epsilon", attr::kFloat, 0, eps, {}}, attr_int("stash_type", 1)});
      return;
    }
    case OpKind::RmsNorm: {  // opset 17 has no RMSNormalization: x / sqrt(mean(x^2) + eps) * w
      const auto ns = exporting::attr_ints(n, "normalized_shape");
      const int64_t nd = static_cast<int64_t>(ns.size());
      if (nd == 0 || nd > in_rank) unsupported("rms_norm with normalized_shape of rank " + std::to_string(nd));
      for (int64_t d = 0; d < nd; ++d)
        if (iv(0).shape[in_rank - nd + d] != ns[d]) unsupported("rms_norm's normalized_shape does not end the input's");
      std::vector<int64_t> axes;
      for (int64_t d = in_rank - nd; d < in_rank; ++d) axes.push_back(d);
      std::string x = in_as(0, odt);
      std::string ms = g.node("ReduceMean", {g.node("Mul", {x, x})}, "", {attr_ints("axes", axes), attr_int("keepdims", 1)});
      std::string rms = g.node("Sqrt", {g.node("Add", {ms, g.scalar(exporting::attr_scalar(n, "eps"), odt)})});
      if (n.inputs.size() > 1) {
        g.node("Mul", {g.node("Div", {x, rms}), in_as(1, odt)}, out);
      } else {
        g.node("Div", {x, rms}, out);
      }
      return;
    }
    case OpKind::Embedding: {  // weight rows gathered by index
      g.node("Gather", {in_as(1, odt), in_as(0, kInt64)}, out, {attr_int("axis", 0)});
      return;
    }
    case OpKind::Dropout: {  // traced only in training mode: ONNX's Dropout with training_mode = true
      std::string ratio = g.scalar(exporting::attr_scalar(n, "p"), odt);
      g.node("Dropout", {in_as(0, odt), ratio, g.initializer(full({}, true, kBool))}, out);
      return;
    }
    // ---- issue 15: general ops
    case OpKind::Sin: return unary("Sin");
    case OpKind::Cos: return unary("Cos");
    case OpKind::Rsqrt: g.node("Reciprocal", {g.node("Sqrt", {in_as(0, odt)})}, out); return;
    case OpKind::Silu: {
      std::string x = in_as(0, odt);
      g.node("Mul", {x, g.node("Sigmoid", {x})}, out);
      return;
    }
    case OpKind::GeluTanh: {  // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
      std::string x = in_as(0, odt);
      std::string x3 = g.node("Mul", {g.node("Mul", {x, x}), x});
      std::string inner = g.node("Add", {x, g.node("Mul", {x3, g.scalar(0.044715, odt)})});
      std::string t = g.node("Tanh", {g.node("Mul", {inner, g.scalar(0.7978845608028654, odt)})});
      std::string h = g.node("Mul", {x, g.node("Add", {t, g.scalar(1.0, odt)})});
      g.node("Mul", {h, g.scalar(0.5, odt)}, out);
      return;
    }
    case OpKind::Softplus: {  // x where beta x > threshold, else Softplus(beta x) / beta
      std::string x = in_as(0, odt);
      Scalar beta = exporting::attr_scalar(n, "beta"), threshold = exporting::attr_scalar(n, "threshold");
      std::string bx = g.node("Mul", {x, g.scalar(beta, odt)});
      std::string sp = g.node("Div", {g.node("Softplus", {bx}), g.scalar(beta, odt)});
      std::string above = g.node("Greater", {bx, g.scalar(threshold, odt)});
      g.node("Where", {above, x, sp}, out);
      return;
    }
    case OpKind::LeakyRelu: {
      OnnxAttr alpha{"alpha", attr::kFloat, 0,
                     static_cast<float>(exporting::attr_scalar(n, "negative_slope").to_double()), {}};
      g.node("LeakyRelu", {in_as(0, odt)}, out, {alpha});
      return;
    }
    case OpKind::Elu: {
      OnnxAttr alpha{"alpha", attr::kFloat, 0, static_cast<float>(exporting::attr_scalar(n, "alpha").to_double()), {}};
      g.node("Elu", {in_as(0, odt)}, out, {alpha});
      return;
    }
    case OpKind::MaskedFill:
      g.node("Where", {in_as(1, kBool), g.scalar(exporting::attr_scalar(n, "value"), odt), in_as(0, odt)}, out);
      return;
    case OpKind::Tril:
    case OpKind::Triu: {
      std::string k = g.initializer(full({}, exporting::attr_int(n, "diagonal"), kInt64));
      g.node("Trilu", {in[0], k}, out, {attr_int("upper", n.op == OpKind::Triu)});
      return;
    }
    case OpKind::OneHot: {
      std::string depth = g.initializer(full({}, exporting::attr_int(n, "num_classes"), kInt64));
      std::string values = g.ints({0, 1});
      g.node("OneHot", {in_as(0, kInt64), depth, values}, out, {attr_int("axis", -1)});
      return;
    }
    case OpKind::Stack: {
      const int64_t d = wrap(exporting::attr_int(n, "dim"), static_cast<int64_t>(ov.shape.size()), n);
      std::vector<std::string> parts;
      for (size_t i = 0; i < in.size(); ++i) parts.push_back(g.node("Unsqueeze", {in_as(i, odt), g.ints({d})}));
      g.node("Concat", parts, out, {attr_int("axis", d)});
      return;
    }
    case OpKind::Gather: {
      if (in_rank == 0) unsupported("gather on a 0-d tensor");
      g.node("GatherElements", {in[0], in_as(1, kInt64)}, out,
             {attr_int("axis", wrap(exporting::attr_int(n, "dim"), in_rank, n))});
      return;
    }
    case OpKind::Scatter:
    case OpKind::ScatterAdd:
    case OpKind::ScatterValue:
    case OpKind::IndexAdd: {
      if (in_rank == 0) unsupported("a scatter into a 0-d tensor");
      const int64_t d = wrap(exporting::attr_int(n, "dim"), in_rank, n);
      std::string idx = in_as(1, kInt64), updates;
      const Shape& ishape = iv(1).shape;
      if (n.op == OpKind::ScatterValue) {
        updates = g.node("Expand", {g.scalar(exporting::attr_scalar(n, "value"), odt),
                                    g.ints(std::vector<int64_t>(ishape.begin(), ishape.end()))});
      } else if (n.op == OpKind::IndexAdd) {  // index broadcast over source's other dims
        const Shape& sshape = iv(2).shape;
        if (sshape.size() != static_cast<size_t>(in_rank)) unsupported("index_add with a 0-d source");
        std::vector<int64_t> r(static_cast<size_t>(in_rank), 1);
        r[d] = -1;
        idx = g.node("Expand", {g.node("Reshape", {idx, g.ints(r)}),
                                g.ints(std::vector<int64_t>(sshape.begin(), sshape.end()))});
        updates = in_as(2, odt);
        Scalar alpha = exporting::attr_scalar(n, "alpha");
        if (alpha.to_double() != 1) updates = g.node("Mul", {updates, g.scalar(alpha, odt)});
      } else {
        updates = in_as(2, odt);
        if (!(iv(2).shape == ishape)) {  // src may be larger than index: ScatterElements wants index's shape
          std::vector<int64_t> zeros(ishape.size(), 0), ends(ishape.begin(), ishape.end());
          updates = g.node("Slice", {updates, g.ints(zeros), g.ints(ends)});
        }
      }
      std::vector<OnnxAttr> attrs{attr_int("axis", d)};
      if (n.op == OpKind::ScatterAdd || n.op == OpKind::IndexAdd) {
        OnnxAttr red{"reduction", attr::kString, 0, 0, {}};
        red.s = "add";
        attrs.push_back(red);
      }
      g.node("ScatterElements", {in_as(0, odt), idx, updates}, out, attrs);
      return;
    }
    case OpKind::Cumsum: {
      const int64_t d = wrap(exporting::attr_int(n, "dim"), std::max<int64_t>(in_rank, 1), n);
      std::string x = in_as(0, odt);
      if (in_rank == 0) x = g.node("Unsqueeze", {x, g.ints({0})});
      std::string axis = g.initializer(full({}, d, kInt64));
      if (in_rank == 0) g.node("Squeeze", {g.node("CumSum", {x, axis}), g.ints({0})}, out);
      else g.node("CumSum", {x, axis}, out);
      return;
    }
    case OpKind::Sort:
    case OpKind::Argsort:
    case OpKind::Topk:
    case OpKind::TopkIndices: {  // TopK: ties keep the lower index first, as a stable sort
      if (in_rank == 0) unsupported("sort / topk of a 0-d tensor");
      const int64_t d = wrap(exporting::attr_int(n, "dim"), in_rank, n);
      const bool is_topk = n.op == OpKind::Topk || n.op == OpKind::TopkIndices;
      if (!is_topk && iv(0).shape[d] == exporting::kBatch && d == 0) unsupported("sort over the dynamic batch dim");
      const int64_t k = is_topk ? exporting::attr_int(n, "k") : iv(0).shape[d];
      const bool largest = is_topk ? exporting::attr_bool(n, "largest") : exporting::attr_bool(n, "descending");
      const bool want_values = n.op == OpKind::Sort || n.op == OpKind::Topk;
      std::string other = g.fresh();
      g.node_outputs("TopK", {in[0], g.ints({k})}, want_values ? std::vector<std::string>{out, other}
                                                                : std::vector<std::string>{other, out},
                     {attr_int("axis", d), attr_int("largest", largest), attr_int("sorted", 1)});
      return;
    }
    // ---- issue 17: pooling: ONNX MaxPool / AveragePool / GlobalAveragePool on [N, C, H, W] (a 3-d
    // input gets a batch dim of 1 around the node)
    case OpKind::MaxPool2dIndices:
      unsupported("max_pool2d's indices (ONNX counts them over the whole tensor)");
      return;
    case OpKind::MaxPool2d:
    case OpKind::AvgPool2d:
    case OpKind::AdaptiveAvgPool2d: {
      if (in_rank != 3 && in_rank != 4) unsupported("pooling of a rank-" + std::to_string(in_rank) + " input");
      std::string x = in_as(0, odt);
      if (in_rank == 3) x = g.node("Unsqueeze", {x, g.ints({0})});
      const std::string y = in_rank == 3 ? g.fresh() : out;
      if (n.op == OpKind::AdaptiveAvgPool2d) {
        const auto os = exporting::attr_ints(n, "output_size");
        const int64_t H = iv(0).shape[in_rank - 2], W = iv(0).shape[in_rank - 1];
        if (os[0] == 1 && os[1] == 1) {
          g.node("GlobalAveragePool", {x}, y);
        } else if (H % os[0] == 0 && W % os[1] == 0) {  // equal windows: a plain AveragePool
          const std::vector<int64_t> k{H / os[0], W / os[1]};
          g.node("AveragePool", {x}, y, {attr_ints("kernel_shape", k), attr_ints("strides", k)});
        } else {
          unsupported("adaptive_avg_pool2d with windows of unequal sizes");
        }
      } else {
        if (exporting::attr_bool(n, "ceil_mode")) unsupported("pooling with ceil_mode (ONNX's output size differs)");
        const auto k = exporting::attr_ints(n, "kernel_size"), st = exporting::attr_ints(n, "stride");
        const auto pad = exporting::attr_ints(n, "padding");
        std::vector<OnnxAttr> attrs{attr_ints("kernel_shape", k), attr_ints("strides", st),
                                    attr_ints("pads", {pad[0], pad[1], pad[0], pad[1]})};
        if (n.op == OpKind::MaxPool2d) {
          attrs.push_back(attr_ints("dilations", exporting::attr_ints(n, "dilation")));
          g.node("MaxPool", {x}, y, attrs);
        } else {
          if (exporting::attr_int(n, "divisor_override") != 0) unsupported("avg_pool2d with divisor_override");
          attrs.push_back(attr_int("count_include_pad", exporting::attr_bool(n, "count_include_pad") ? 1 : 0));
          g.node("AveragePool", {x}, y, attrs);
        }
      }
      if (in_rank == 3) g.node("Squeeze", {y, g.ints({0})}, out);
      return;
    }
    // ---- issue 17: convolution (opset 17's Conv; "same" as explicit pads, the extra one at the end)
    case OpKind::Conv1d:
    case OpKind::Conv2d: {
      const int64_t sd = n.op == OpKind::Conv1d ? 1 : 2;
      if (in_rank != sd + 2) unsupported("an unbatched convolution");
      const auto st = exporting::attr_ints(n, "stride"), dl = exporting::attr_ints(n, "dilation");
      auto pd = exporting::attr_ints(n, "padding");
      std::vector<int64_t> pads(2 * sd);
      for (int64_t i = 0; i < sd; ++i) {
        int64_t before = pd.at(i), after = pd.at(i);
        if (exporting::attr_bool(n, "same")) {
          const int64_t total = dl.at(i) * (iv(1).shape.at(2 + i) - 1);
          before = total / 2;
          after = total - before;
        }
        pads[i] = before;
        pads[sd + i] = after;
      }
      std::vector<std::string> ins{in_as(0, odt), in_as(1, odt)};
      if (n.inputs.size() > 2) ins.push_back(in_as(2, odt));
      g.node("Conv", ins, out,
             {attr_ints("strides", st), attr_ints("pads", pads), attr_ints("dilations", dl),
              attr_int("group", exporting::attr_int(n, "groups"))});
      return;
    }
    // ---- issue 17: conv_transpose (ConvTranspose), interpolate (Gather with the kernels' index and
    // weight tables: the exact PyTorch indices, which Resize's coordinate modes only approximate),
    // batch_norm in training mode (batch statistics from ReduceMean), group_norm (LayerNormalization
    // on [N, groups, -1]; GroupNormalization needs opset 18)
    case OpKind::ConvTranspose1d:
    case OpKind::ConvTranspose2d: {
      const int64_t sd = n.op == OpKind::ConvTranspose1d ? 1 : 2;
      if (in_rank != sd + 2) unsupported("an unbatched transposed convolution");
      const auto pd = exporting::attr_ints(n, "padding");
      std::vector<int64_t> pads(2 * sd);
      for (int64_t i = 0; i < sd; ++i) pads[i] = pads[sd + i] = pd.at(i);
      std::vector<std::string> ins{in_as(0, odt), in_as(1, odt)};
      if (n.inputs.size() > 2) ins.push_back(in_as(2, odt));
      g.node("ConvTranspose", ins, out,
             {attr_ints("strides", exporting::attr_ints(n, "stride")), attr_ints("pads", pads),
              attr_ints("dilations", exporting::attr_ints(n, "dilation")),
              attr_ints("output_padding", exporting::attr_ints(n, "output_padding")),
              attr_int("group", exporting::attr_int(n, "groups"))});
      return;
    }
    case OpKind::Interpolate: {
      if (in_rank != 3 && in_rank != 4) unsupported("interpolate of a rank-" + std::to_string(in_rank) + " input");
      const auto size = exporting::attr_ints(n, "size");
      if (static_cast<int64_t>(size.size()) != in_rank - 2) unsupported("interpolate with a size list of the wrong length");
      backend::Upsample2dArgs a;
      a.mode = exporting::attr_int(n, "mode") == 0 ? backend::UpsampleMode::Nearest : backend::UpsampleMode::Linear;
      a.align_corners = exporting::attr_bool(n, "align_corners");
      const double scale[2] = {exporting::attr_scalar(n, "scale_h").to_double(),
                               exporting::attr_scalar(n, "scale_w").to_double()};
      // One axis: gather the taps i0 (and i1, weighted) along `axis`; W first, then H, as the kernel.
      auto axis_pass = [&](const std::string& x, int64_t axis, int64_t in_size, int64_t out_size, double s) {
        auto run = [&](auto acc) {
          using A = decltype(acc);
          const auto ax = backend::upsample::make_axis<A>(a, in_size, out_size, s);
          std::vector<int64_t> i0(static_cast<size_t>(out_size)), i1(i0.size());
          std::vector<double> l0(i0.size()), l1(i0.size());
          for (int64_t o = 0; o < out_size; ++o) {
            A w0, w1;
            backend::upsample::tap(ax, o, i0[static_cast<size_t>(o)], i1[static_cast<size_t>(o)], w0, w1);
            l0[static_cast<size_t>(o)] = w0;
            l1[static_cast<size_t>(o)] = w1;
          }
          const std::string t0 = g.node("Gather", {x, g.ints(i0)}, "", {attr_int("axis", axis)});
          if (a.mode == backend::UpsampleMode::Nearest) return t0;
          const Shape ws = axis == in_rank - 1 ? Shape{out_size} : Shape{out_size, 1};
          const std::string t1 = g.node("Gather", {x, g.ints(i1)}, "", {attr_int("axis", axis)});
          return g.node("Add", {g.node("Mul", {t0, g.initializer(tensor(l0, ws).to(odt))}),
                                g.node("Mul", {t1, g.initializer(tensor(l1, ws).to(odt))})});
        };
        return odt == kFloat64 ? run(double{}) : run(float{});
      };
      std::string y = axis_pass(in_as(0, odt), in_rank - 1, iv(0).shape[in_rank - 1], size.back(), scale[1]);
      if (in_rank == 4) y = axis_pass(y, 2, iv(0).shape[2], size[0], scale[0]);
      g.node("Identity", {y}, out);
      return;
    }
    case OpKind::BatchNorm:
    case OpKind::GroupNorm: {
      if (in_rank < 2) unsupported("normalization of a rank-" + std::to_string(in_rank) + " input");
      const int64_t C = iv(0).shape[1];
      const double eps = exporting::attr_scalar(n, "eps").to_double();
      std::string x = in_as(0, odt), y;
      if (n.op == OpKind::BatchNorm) {
        std::vector<int64_t> axes{0};
        for (int64_t d = 2; d < in_rank; ++d) axes.push_back(d);
        std::string m = g.node("ReduceMean", {x}, "", {attr_ints("axes", axes), attr_int("keepdims", 1)});
        std::string d = g.node("Sub", {x, m});
        std::string v = g.node("ReduceMean", {g.node("Mul", {d, d})}, "", {attr_ints("axes", axes), attr_int("keepdims", 1)});
        y = g.node("Div", {d, g.node("Sqrt", {g.node("Add", {v, g.scalar(eps, odt)})})});
      } else {
        const int64_t groups = exporting::attr_int(n, "num_groups");
        int64_t per = C / groups;
        for (int64_t d = 2; d < in_rank; ++d) per *= iv(0).shape[d];
        std::string rows = g.node("Reshape", {x, g.ints({0, groups, -1})});
        std::string normed = g.node("LayerNormalization", {rows, g.initializer(full({per}, 1, odt))}, "",
                                    {attr_int("axis", -1), OnnxAttr{"epsilon", attr::kFloat, 0, static_cast<float>(eps), {}},
                                     attr_int("stash_type", 1)});
        y = g.node("Reshape", {normed, g.node("Shape", {x})});
      }
      std::vector<int64_t> cshape{C};
      for (int64_t d = 2; d < in_rank; ++d) cshape.push_back(1);
      if (n.inputs.size() > 1) y = g.node("Mul", {y, g.node("Reshape", {in_as(1, odt), g.ints(cshape)})});
      if (n.inputs.size() > 2) y = g.node("Add", {y, g.node("Reshape", {in_as(2, odt), g.ints(cshape)})});
      g.node("Identity", {y}, out);
      return;
    }
  }
  unsupported("no ONNX lowering for this op");
}

}  // namespace

void ExportedProgram::save_onnx(const std::string& path) const {
  const Program& p = program();
  NoGradGuard no_grad;
  OnnxGraph g(p);
  // Graph inputs keep their names (x, x0, ...); the other values are prefixed so they
  // never collide with them, with generated temporaries (_t*) or with the outputs (output_*).
  auto name = [&](int id) {
    const Value& v = p.values[id];
    return v.kind == exporting::ValueKind::Input ? v.name : "v_" + v.name;
  };
  for (int id : p.constants) g.initializer(p.weights.at(p.values[id].key), name(id));
  for (const Node& n : p.nodes) {
    std::vector<std::string> in;
    for (int id : n.inputs) in.push_back(name(id));
    lower(g, p, n, in, name(n.output));
  }
  for (size_t i = 0; i < p.outputs.size(); ++i) g.node("Identity", {name(p.outputs[i])}, "output_" + std::to_string(i));
  std::string bytes = g.model();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  TG_CHECK(out.good(), "save_onnx: cannot write ", path);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.flush();
  TG_CHECK(out.good(), "save_onnx: error writing ", path);
}

}  // namespace tg
