// The exported program: op schemas, validation, the printed graph and the
// executor behind ExportedProgram::run.
#include <tapegrad/export/program.h>

#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include <tapegrad/autograd/autograd.h>
#include <tapegrad/core/ops.h>
#include <tapegrad/export/export.h>
#include <tapegrad/nn/loss.h>
// ---- issue 15: classification losses
#include <tapegrad/nn/classification.h>
// ---- issue 15: normalization, embedding, dropout
#include <tapegrad/nn/dropout.h>
#include <tapegrad/nn/embedding.h>
#include <tapegrad/nn/normalization.h>
// ---- issue 17: pooling
#include <tapegrad/nn/pooling.h>

// ---- issue 17: convolution
#include <tapegrad/nn/conv.h>
// ---- issue 17: conv_transpose, interpolate, batch_norm, group_norm
#include <tapegrad/nn/batch_norm.h>
#include <tapegrad/nn/upsample.h>

namespace tg::exporting {

const char* value_kind_name(ValueKind k) {
  switch (k) {
    case ValueKind::Input: return "input";
    case ValueKind::Parameter: return "parameter";
    case ValueKind::Buffer: return "buffer";
    case ValueKind::Constant: return "constant";
    case ValueKind::Node: return "node";
  }
  return "?";
}

const OpSchema& op_schema(OpKind op) {
  using T = AttrType;
  static const OpSchema kBinary{2, {}};
  static const OpSchema kUnary{1, {}};
  static const OpSchema kAlpha{2, {{"alpha", T::Scalar}}};
  static const OpSchema kWhere{3, {}};
  static const OpSchema kScalar{1, {{"other", T::Scalar}}};
  static const OpSchema kPowScalar{1, {{"exponent", T::Scalar}}};
  static const OpSchema kClamp{1, {{"lo", T::Scalar}, {"hi", T::Scalar}}};
  static const OpSchema kReduce{1, {{"dims", T::Ints}, {"keepdim", T::Bool}}};
  static const OpSchema kMoment{1, {{"dims", T::Ints}, {"keepdim", T::Bool}, {"correction", T::Int}}};
  static const OpSchema kArgmax{1, {{"keepdim", T::Bool}, {"dim", T::Int, true}}};
  static const OpSchema kTranspose{1, {{"dim0", T::Int}, {"dim1", T::Int}}};
  static const OpSchema kPermute{1, {{"dims", T::Ints}}};
  static const OpSchema kShape{1, {{"shape", T::Ints}}};
  static const OpSchema kExpand{1, {{"sizes", T::Ints}}};
  static const OpSchema kDim{1, {{"dim", T::Int}}};
  static const OpSchema kSqueeze{1, {{"dim", T::Int, true}}};
  static const OpSchema kSlice{1, {{"dim", T::Int}, {"start", T::Int}, {"end", T::Int}, {"step", T::Int}}};
  static const OpSchema kSelect{1, {{"dim", T::Int}, {"index", T::Int}}};
  static const OpSchema kIndexSelect{2, {{"dim", T::Int}}};
  static const OpSchema kCat{-1, {{"dim", T::Int}}};
  static const OpSchema kTo{1, {{"dtype", T::DType}}};
  static const OpSchema kLinear{3, {}, 1};  // x, weight[, bias]
  static const OpSchema kMseLoss{2, {{"reduction", T::Int}}};
  // ---- issue 15: softmax and classification losses
  static const OpSchema kLogSumExp{1, {{"dims", T::Ints}, {"keepdim", T::Bool}}};
  static const OpSchema kCrossEntropy{
      3, {{"reduction", T::Int}, {"ignore_index", T::Int}, {"label_smoothing", T::Scalar}}, 1};  // [, weight]
  static const OpSchema kNllLoss{3, {{"reduction", T::Int}, {"ignore_index", T::Int}}, 1};   // [, weight]
  static const OpSchema kBceWithLogits{
      4, {{"reduction", T::Int}, {"has_weight", T::Bool}, {"has_pos_weight", T::Bool}}, 2};  // [, weight][, pos_weight]
  // ---- issue 15: normalization, embedding, dropout
  static const OpSchema kLayerNorm{3, {{"normalized_shape", T::Ints}, {"eps", T::Scalar}}, 2};  // x[, w[, b]]
  static const OpSchema kRmsNorm{2, {{"normalized_shape", T::Ints}, {"eps", T::Scalar}}, 1};    // x[, w]
  static const OpSchema kEmbedding{2, {}};                                                       // index, weight
  static const OpSchema kDropout{1, {{"p", T::Scalar}}};
  switch (op) {  // no default: a new op in TG_FORALL_OPS is a -Wswitch warning here
    case OpKind::Add:
    case OpKind::Sub: return kAlpha;
    case OpKind::Mul:
    case OpKind::Div:
    case OpKind::Pow:
    case OpKind::Maximum:
    case OpKind::Minimum:
    case OpKind::Eq:
    case OpKind::Ne:
    case OpKind::Lt:
    case OpKind::Le:
    case OpKind::Gt:
    case OpKind::Ge:
    case OpKind::Matmul: return kBinary;
    case OpKind::Linear: return kLinear;
    case OpKind::MseLoss: return kMseLoss;
    case OpKind::Where: return kWhere;
    case OpKind::AddScalar:
    case OpKind::SubScalar:
    case OpKind::RSubScalar:
    case OpKind::MulScalar:
    case OpKind::DivScalar:
    case OpKind::RDivScalar:
    case OpKind::EqScalar:
    case OpKind::NeScalar:
    case OpKind::LtScalar:
    case OpKind::LeScalar:
    case OpKind::GtScalar:
    case OpKind::GeScalar: return kScalar;
    case OpKind::PowScalar: return kPowScalar;
    case OpKind::Clamp: return kClamp;
    case OpKind::Neg:
    case OpKind::Exp:
    case OpKind::Log:
    case OpKind::Sqrt:
    case OpKind::Abs:
    case OpKind::Relu:
    case OpKind::Sigmoid:
    case OpKind::Tanh:
    case OpKind::Gelu:
    case OpKind::Contiguous:
    case OpKind::Clone:
    case OpKind::Alias: return kUnary;
    case OpKind::Sum:
    case OpKind::Mean:
    case OpKind::Amax:
    case OpKind::Amin: return kReduce;
    case OpKind::Var:
    case OpKind::Std: return kMoment;
    case OpKind::Argmax: return kArgmax;
    case OpKind::Transpose: return kTranspose;
    case OpKind::Permute: return kPermute;
    case OpKind::View:
    case OpKind::Reshape: return kShape;
    case OpKind::Expand: return kExpand;
    case OpKind::Unsqueeze: return kDim;
    case OpKind::Squeeze: return kSqueeze;
    case OpKind::Slice: return kSlice;
    case OpKind::Select: return kSelect;
    case OpKind::IndexSelect: return kIndexSelect;
    case OpKind::Cat: return kCat;
    case OpKind::To: return kTo;
    // ---- issue 15: softmax and classification losses
    case OpKind::Softmax:
    case OpKind::LogSoftmax: return kDim;
    case OpKind::LogSumExp: return kLogSumExp;
    case OpKind::CrossEntropy: return kCrossEntropy;
    case OpKind::NllLoss: return kNllLoss;
    case OpKind::BceWithLogits: return kBceWithLogits;
    // ---- issue 15: normalization, embedding, dropout
    case OpKind::LayerNorm: return kLayerNorm;
    case OpKind::RmsNorm: return kRmsNorm;
    case OpKind::Embedding: return kEmbedding;
    case OpKind::Dropout: return kDropout;
    // ---- issue 15: general ops
    case OpKind::Sin:
    case OpKind::Cos:
    case OpKind::Rsqrt:
    case OpKind::Silu:
    case OpKind::GeluTanh: return kUnary;
    case OpKind::Softplus: {
      static const OpSchema kSoftplus{1, {{"beta", T::Scalar}, {"threshold", T::Scalar}}};
      return kSoftplus;
    }
    case OpKind::LeakyRelu: {
      static const OpSchema kLeakyRelu{1, {{"negative_slope", T::Scalar}}};
      return kLeakyRelu;
    }
    case OpKind::Elu: {
      static const OpSchema kElu{1, {{"alpha", T::Scalar}}};
      return kElu;
    }
    case OpKind::MaskedFill: {
      static const OpSchema kMaskedFill{2, {{"value", T::Scalar}}};
      return kMaskedFill;
    }
    case OpKind::Tril:
    case OpKind::Triu: {
      static const OpSchema kTri{1, {{"diagonal", T::Int}}};
      return kTri;
    }
    case OpKind::OneHot: {
      static const OpSchema kOneHot{1, {{"num_classes", T::Int}}};
      return kOneHot;
    }
    case OpKind::Stack: return kCat;
    case OpKind::Gather: return kIndexSelect;  // (input, index), dim
    case OpKind::Scatter:
    case OpKind::ScatterAdd: {
      static const OpSchema kScatter{3, {{"dim", T::Int}}};
      return kScatter;
    }
    case OpKind::ScatterValue: {
      static const OpSchema kScatterValue{2, {{"dim", T::Int}, {"value", T::Scalar}}};
      return kScatterValue;
    }
    case OpKind::IndexAdd: {
      static const OpSchema kIndexAdd{3, {{"dim", T::Int}, {"alpha", T::Scalar}}};
      return kIndexAdd;
    }
    case OpKind::Cumsum: return kDim;
    case OpKind::Sort:
    case OpKind::Argsort: {
      static const OpSchema kSort{1, {{"dim", T::Int}, {"descending", T::Bool}}};
      return kSort;
    }
    case OpKind::Topk:
    case OpKind::TopkIndices: {
      static const OpSchema kTopk{1, {{"k", T::Int}, {"dim", T::Int}, {"largest", T::Bool}}};
      return kTopk;
    }
    // ---- issue 17: pooling
    case OpKind::MaxPool2d:
    case OpKind::MaxPool2dIndices: {
      static const OpSchema kMaxPool{1, {{"kernel_size", T::Ints}, {"stride", T::Ints}, {"padding", T::Ints},
                                         {"dilation", T::Ints}, {"ceil_mode", T::Bool}}};
      return kMaxPool;
    }
    case OpKind::AvgPool2d: {
      static const OpSchema kAvgPool{1, {{"kernel_size", T::Ints}, {"stride", T::Ints}, {"padding", T::Ints},
                                         {"ceil_mode", T::Bool}, {"count_include_pad", T::Bool},
                                         {"divisor_override", T::Int}}};
      return kAvgPool;
    }
    case OpKind::AdaptiveAvgPool2d: {
      static const OpSchema kAdaptivePool{1, {{"output_size", T::Ints}}};
      return kAdaptivePool;
    }
    // ---- issue 17: convolution
    case OpKind::Conv1d:
    case OpKind::Conv2d: {
      static const OpSchema kConv{3,
                                  {{"stride", T::Ints},
                                   {"padding", T::Ints},
                                   {"dilation", T::Ints},
                                   {"groups", T::Int},
                                   {"same", T::Bool}},
                                  1};  // x, weight[, bias]
      return kConv;
    }
    // ---- issue 17: conv_transpose, interpolate, batch_norm, group_norm
    case OpKind::ConvTranspose1d:
    case OpKind::ConvTranspose2d: {
      static const OpSchema kConvT{3,
                                   {{"stride", T::Ints},
                                    {"padding", T::Ints},
                                    {"output_padding", T::Ints},
                                    {"dilation", T::Ints},
                                    {"groups", T::Int}},
                                   1};  // x, weight[, bias]
      return kConvT;
    }
    case OpKind::Interpolate: {
      static const OpSchema kInterp{1,
                                    {{"size", T::Ints},
                                     {"mode", T::Int},
                                     {"align_corners", T::Bool},
                                     {"scale_h", T::Scalar},
                                     {"scale_w", T::Scalar}}};
      return kInterp;
    }
    case OpKind::BatchNorm: {
      static const OpSchema kBatchNorm{3, {{"eps", T::Scalar}}, 2};  // x[, weight[, bias]]
      return kBatchNorm;
    }
    case OpKind::GroupNorm: {
      static const OpSchema kGroupNorm{3, {{"num_groups", T::Int}, {"eps", T::Scalar}}, 2};  // x[, weight[, bias]]
      return kGroupNorm;
    }
  }
  TG_ERROR("export: no schema for op ", static_cast<int>(op));
}

// ---- attributes
const Attr* find_attr(const Node& n, std::string_view name) {
  for (const Attr& a : n.attrs)
    if (a.name == name) return &a;
  return nullptr;
}
namespace {
const Attr& need_attr(const Node& n, std::string_view name) {
  const Attr* a = find_attr(n, name);
  TG_CHECK(a != nullptr, "export: node ", op_name(n.op), " has no attribute '", name, "'");
  return *a;
}
template <typename V>
const V& attr_as(const Node& n, std::string_view name, const char* type) {
  const Attr& a = need_attr(n, name);
  const V* v = std::get_if<V>(&a.value);
  TG_CHECK(v != nullptr, "export: attribute '", name, "' of node ", op_name(n.op), " is not ", type);
  return *v;
}
}  // namespace
int64_t attr_int(const Node& n, std::string_view name) { return attr_as<int64_t>(n, name, "an int"); }
bool attr_bool(const Node& n, std::string_view name) { return attr_as<bool>(n, name, "a bool"); }
std::vector<int64_t> attr_ints(const Node& n, std::string_view name) {
  return attr_as<std::vector<int64_t>>(n, name, "an int list");
}
DType attr_dtype(const Node& n, std::string_view name) { return attr_as<DType>(n, name, "a dtype"); }
Scalar attr_scalar(const Node& n, std::string_view name) {
  const Attr& a = need_attr(n, name);
  if (const auto* i = std::get_if<int64_t>(&a.value)) return Scalar(static_cast<long long>(*i));
  if (const auto* d = std::get_if<double>(&a.value)) return Scalar(*d);
  if (const auto* b = std::get_if<bool>(&a.value)) return Scalar(*b);
  TG_ERROR("export: attribute '", name, "' of node ", op_name(n.op), " is not a scalar");
}

// ---- printing
const char* dtype_short(DType t) {
  switch (t) {
    case DType::Float32: return "f32";
    case DType::Float16: return "f16";
    case DType::BFloat16: return "bf16";
    case DType::Float64: return "f64";
    case DType::Int64: return "i64";
    case DType::Int32: return "i32";
    case DType::Bool: return "b8";
    case DType::UInt8: return "u8";
    case DType::Int8: return "i8";
    case DType::Int16: return "i16";
  }
  return "?";
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += s[i] == kBatch && i == 0 ? std::string("batch") : std::to_string(s[i]);
  }
  return out + "]";
}

namespace {
std::string double_str(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}
std::string value_str(const detail::TraceValue& v) {
  struct Visitor {
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const { return double_str(d); }
    std::string operator()(bool b) const { return b ? "True" : "False"; }
    std::string operator()(const std::vector<int64_t>& l) const { return Shape(l).str(); }
    std::string operator()(DType t) const { return dtype_name(t); }
  };
  return std::visit(Visitor{}, v);
}
// Scalar forms print as the op with the scalar in the operand list: mul(%x, 2.0).
std::string display_name(OpKind op) {
  std::string name = op_name(op);
  const std::string suffix = "_scalar";
  if (name.size() > suffix.size() && name.ends_with(suffix)) name.resize(name.size() - suffix.size());
  return name;
}
}  // namespace

std::string describe_node(const Program& p, const Node& n) {
  std::string s = "%" + p.values.at(n.output).name + " = " + display_name(n.op) + "(";
  bool first = true;
  for (int id : n.inputs) {
    s += (first ? "%" : ", %") + p.values.at(id).name;
    first = false;
  }
  for (const Attr& a : n.attrs) {
    s += first ? "" : ", ";
    first = false;
    const bool positional = a.name == "other" || a.name == "exponent";
    s += positional ? value_str(a.value) : a.name + "=" + value_str(a.value);
  }
  return s + ")";
}

// ---- validation: what load() guarantees before anything runs
void Program::validate(const char* where) const {
  const int nv = static_cast<int>(values.size());
  std::vector<bool> defined(values.size(), false);
  std::set<std::string> names;
  for (const Value& v : values) {
    TG_CHECK(!v.name.empty(), where, ": a value has an empty name");
    TG_CHECK(names.insert(v.name).second, where, ": value name %", v.name, " is defined twice");
    for (size_t d = 0; d < v.shape.size(); ++d)
      TG_CHECK(v.shape[d] >= 0 || (d == 0 && v.shape[d] == kBatch && dynamic_batch), where, ": value %", v.name,
               " has invalid shape ", shape_str(v.shape));
  }
  auto check_id = [&](int id, const char* what) {
    TG_CHECK(id >= 0 && id < nv, where, ": ", what, " refers to value #", id, " of ", nv);
  };
  for (int id : inputs) {
    check_id(id, "an input");
    TG_CHECK(values[id].kind == ValueKind::Input, where, ": input %", values[id].name, " is a ",
             value_kind_name(values[id].kind));
    TG_CHECK(!defined[id], where, ": input %", values[id].name, " is listed twice");
    defined[id] = true;
  }
  for (int id : constants) {
    check_id(id, "a constant");
    const Value& v = values[id];
    TG_CHECK(v.kind == ValueKind::Parameter || v.kind == ValueKind::Buffer || v.kind == ValueKind::Constant, where,
             ": constant %", v.name, " is a ", value_kind_name(v.kind));
    TG_CHECK(!defined[id], where, ": constant %", v.name, " is listed twice");
    defined[id] = true;
    auto it = weights.find(v.key);
    TG_CHECK(it != weights.end(), where, ": the weights have no tensor '", v.key, "' for %", v.name);
    TG_CHECK(it->second.sizes() == v.shape && it->second.dtype() == v.dtype, where, ": weight '", v.key, "' is ",
             dtype_name(it->second.dtype()), it->second.sizes(), ", the graph expects ", dtype_name(v.dtype),
             v.shape);
  }
  for (const Node& n : nodes) {
    check_id(n.output, "a node output");
    const Value& out = values[n.output];
    const std::string node = std::string("node %") + out.name + " (" + op_name(n.op) + ")";
    TG_CHECK(out.kind == ValueKind::Node, where, ": ", node, " writes a ", value_kind_name(out.kind));
    TG_CHECK(!defined[n.output], where, ": ", node, " redefines %", out.name);
    const OpSchema& schema = op_schema(n.op);
    const int ni = static_cast<int>(n.inputs.size());
    const int least = schema.num_inputs < 0 ? 1 : schema.num_inputs - schema.optional_inputs;
    TG_CHECK(ni >= least && (schema.num_inputs < 0 || ni <= schema.num_inputs), where, ": ", node, " has ", ni,
             " operands, expected ",
             schema.num_inputs < 0 ? std::string("at least 1")
             : least == schema.num_inputs
                 ? std::to_string(schema.num_inputs)
                 : std::to_string(least) + " to " + std::to_string(schema.num_inputs));
    for (int id : n.inputs) {
      check_id(id, node.c_str());
      TG_CHECK(defined[id], where, ": ", node, " uses %", values[id].name, " before it is defined");
    }
    for (const Attr& a : n.attrs) {
      bool known = false;
      for (const AttrSpec& s : schema.attrs) known |= a.name == s.name;
      TG_CHECK(known, where, ": ", node, " has unknown attribute '", a.name, "'");
    }
    for (const AttrSpec& s : schema.attrs) {
      const Attr* a = find_attr(n, s.name);
      if (!a) {
        TG_CHECK(s.optional, where, ": ", node, " lacks attribute '", s.name, "'");
        continue;
      }
      bool ok = false;
      switch (s.type) {
        case AttrType::Int: ok = std::holds_alternative<int64_t>(a->value); break;
        case AttrType::Bool: ok = std::holds_alternative<bool>(a->value); break;
        case AttrType::Ints: ok = std::holds_alternative<std::vector<int64_t>>(a->value); break;
        case AttrType::DType: ok = std::holds_alternative<DType>(a->value); break;
        case AttrType::Scalar:
          ok = std::holds_alternative<int64_t>(a->value) || std::holds_alternative<double>(a->value) ||
               std::holds_alternative<bool>(a->value);
          break;
      }
      TG_CHECK(ok, where, ": ", node, " attribute '", s.name, "' has the wrong type");
    }
    defined[n.output] = true;
  }
  TG_CHECK(!outputs.empty(), where, ": the program has no outputs");
  for (int id : outputs) {
    check_id(id, "an output");
    TG_CHECK(defined[id], where, ": output %", values[id].name, " is never defined");
  }
}

// ---- execution
namespace {
DimList dims_of(const Node& n) { return DimList(attr_ints(n, "dims")); }
}  // namespace

Tensor execute(const Node& n, const std::vector<Tensor>& in, DType out_dtype) {
  Tensor widened;  // the operand of a widening unary op, in the recorded result dtype
  switch (n.op) {
    case OpKind::Exp:
    case OpKind::Log:
    case OpKind::Sqrt:
    case OpKind::PowScalar:
      if (!in.empty() && is_floating(in[0].dtype()) && is_floating(out_dtype) && in[0].dtype() != out_dtype)
        widened = in[0].to(out_dtype);
      break;
    default: break;
  }
  auto a = [&]() -> const Tensor& { return widened.defined() ? widened : in.at(0); };
  auto b = [&]() -> const Tensor& { return in.at(1); };
  switch (n.op) {
    case OpKind::Add: return add(a(), b(), attr_scalar(n, "alpha"));
    case OpKind::Sub: return sub(a(), b(), attr_scalar(n, "alpha"));
    case OpKind::Mul: return mul(a(), b());
    case OpKind::Div: return div(a(), b());
    case OpKind::Pow: return pow(a(), b());
    case OpKind::Maximum: return maximum(a(), b());
    case OpKind::Minimum: return minimum(a(), b());
    case OpKind::Where: return where(in.at(0), in.at(1), in.at(2));
    case OpKind::Eq: return eq(a(), b());
    case OpKind::Ne: return ne(a(), b());
    case OpKind::Lt: return lt(a(), b());
    case OpKind::Le: return le(a(), b());
    case OpKind::Gt: return gt(a(), b());
    case OpKind::Ge: return ge(a(), b());
    case OpKind::AddScalar: return add(a(), attr_scalar(n, "other"));
    case OpKind::SubScalar: return sub(a(), attr_scalar(n, "other"));
    case OpKind::RSubScalar: return rsub(a(), attr_scalar(n, "other"));
    case OpKind::MulScalar: return mul(a(), attr_scalar(n, "other"));
    case OpKind::DivScalar: return div(a(), attr_scalar(n, "other"));
    case OpKind::RDivScalar: return rdiv(a(), attr_scalar(n, "other"));
    case OpKind::PowScalar: return pow(a(), attr_scalar(n, "exponent"));
    case OpKind::EqScalar: return a().eq(attr_scalar(n, "other"));
    case OpKind::NeScalar: return a().ne(attr_scalar(n, "other"));
    case OpKind::LtScalar: return a().lt(attr_scalar(n, "other"));
    case OpKind::LeScalar: return a().le(attr_scalar(n, "other"));
    case OpKind::GtScalar: return a().gt(attr_scalar(n, "other"));
    case OpKind::GeScalar: return a().ge(attr_scalar(n, "other"));
    case OpKind::Clamp: return clamp(a(), attr_scalar(n, "lo"), attr_scalar(n, "hi"));
    case OpKind::Neg: return neg(a());
    case OpKind::Exp: return exp(a());
    case OpKind::Log: return log(a());
    case OpKind::Sqrt: return sqrt(a());
    case OpKind::Abs: return abs(a());
    case OpKind::Relu: return relu(a());
    case OpKind::Sigmoid: return sigmoid(a());
    case OpKind::Tanh: return tanh(a());
    case OpKind::Gelu: return gelu(a());
    case OpKind::Sum: return sum(a(), dims_of(n), attr_bool(n, "keepdim"));
    case OpKind::Mean: return mean(a(), dims_of(n), attr_bool(n, "keepdim"));
    case OpKind::Var: return var(a(), dims_of(n), attr_bool(n, "keepdim"), attr_int(n, "correction"));
    case OpKind::Std: return std(a(), dims_of(n), attr_bool(n, "keepdim"), attr_int(n, "correction"));
    case OpKind::Amax: return amax(a(), dims_of(n), attr_bool(n, "keepdim"));
    case OpKind::Amin: return amin(a(), dims_of(n), attr_bool(n, "keepdim"));
    case OpKind::Argmax: {
      std::optional<int64_t> dim;
      if (find_attr(n, "dim")) dim = attr_int(n, "dim");
      return argmax(a(), dim, attr_bool(n, "keepdim"));
    }
    case OpKind::Matmul: return matmul(a(), b());
    case OpKind::Linear: return linear(a(), b(), in.size() > 2 ? in[2] : Tensor());
    case OpKind::MseLoss: {
      const int64_t r = attr_int(n, "reduction");
      TG_CHECK(r >= 0 && r <= 2, "export: mse_loss reduction ", r, " is not 0 (none), 1 (mean) or 2 (sum)");
      return nn::functional::mse_loss(a(), b(), r == 0 ? "none" : r == 1 ? "mean" : "sum");
    }
    case OpKind::Transpose: return a().transpose(attr_int(n, "dim0"), attr_int(n, "dim1"));
    case OpKind::Permute: return a().permute(attr_ints(n, "dims"));
    case OpKind::View: return a().view(attr_ints(n, "shape"));
    case OpKind::Reshape: return a().reshape(attr_ints(n, "shape"));
    case OpKind::Expand: return a().expand(attr_ints(n, "sizes"));
    case OpKind::Unsqueeze: return a().unsqueeze(attr_int(n, "dim"));
    case OpKind::Squeeze: return find_attr(n, "dim") ? a().squeeze(attr_int(n, "dim")) : a().squeeze();
    case OpKind::Slice:
      return a().slice(attr_int(n, "dim"), attr_int(n, "start"), attr_int(n, "end"), attr_int(n, "step"));
    case OpKind::Select: return a().select(attr_int(n, "dim"), attr_int(n, "index"));
    case OpKind::IndexSelect: return a().index_select(attr_int(n, "dim"), b());
    case OpKind::Cat: return cat(in, attr_int(n, "dim"));
    case OpKind::To: return a().to(attr_dtype(n, "dtype"));
    case OpKind::Contiguous: return a().contiguous();
    case OpKind::Clone: return a().clone();
    case OpKind::Alias: return a().detach();
    // ---- issue 15: softmax and classification losses
    case OpKind::Softmax: return softmax(a(), attr_int(n, "dim"));
    case OpKind::LogSoftmax: return log_softmax(a(), attr_int(n, "dim"));
    case OpKind::LogSumExp: return logsumexp(a(), dims_of(n), attr_bool(n, "keepdim"));
    case OpKind::CrossEntropy:
    case OpKind::NllLoss:
    case OpKind::BceWithLogits: {
      const int64_t r = attr_int(n, "reduction");
      TG_CHECK(r >= 0 && r <= 2, "export: ", op_name(n.op), " reduction ", r, " is not 0 (none), 1 (mean) or 2 (sum)");
      const char* red = r == 0 ? "none" : r == 1 ? "mean" : "sum";
      if (n.op == OpKind::CrossEntropy)
        return nn::functional::cross_entropy(
            a(), b(), {.reduction = red, .ignore_index = attr_int(n, "ignore_index"),
                       .label_smoothing = attr_scalar(n, "label_smoothing").to_double(),
                       .weight = in.size() > 2 ? in[2] : Tensor()});
      if (n.op == OpKind::NllLoss)
        return nn::functional::nll_loss(
            a(), b(), {.reduction = red, .ignore_index = attr_int(n, "ignore_index"),
                       .weight = in.size() > 2 ? in[2] : Tensor()});
      size_t k = 2;
      Tensor w = attr_bool(n, "has_weight") ? in.at(k++) : Tensor();
      Tensor pw = attr_bool(n, "has_pos_weight") ? in.at(k++) : Tensor();
      return nn::functional::binary_cross_entropy_with_logits(a(), b(), {.reduction = red, .weight = w, .pos_weight = pw});
    }
    // ---- issue 15: normalization, embedding, dropout
    case OpKind::LayerNorm:
      return nn::functional::layer_norm(a(), Shape(attr_ints(n, "normalized_shape")), in.size() > 1 ? in[1] : Tensor(),
                                        in.size() > 2 ? in[2] : Tensor(), attr_scalar(n, "eps").to_double());
    case OpKind::RmsNorm:
      return nn::functional::rms_norm(a(), Shape(attr_ints(n, "normalized_shape")), in.size() > 1 ? in[1] : Tensor(),
                                      attr_scalar(n, "eps").to_double());
    case OpKind::Embedding: return nn::functional::embedding(a(), b());
    case OpKind::Dropout: return nn::functional::dropout(a(), attr_scalar(n, "p").to_double(), true);
    // ---- issue 15: general ops
    case OpKind::Sin: return sin(a());
    case OpKind::Cos: return cos(a());
    case OpKind::Rsqrt: return rsqrt(a());
    case OpKind::Silu: return silu(a());
    case OpKind::GeluTanh: return gelu(a(), "tanh");
    case OpKind::Softplus: return softplus(a(), attr_scalar(n, "beta"), attr_scalar(n, "threshold"));
    case OpKind::LeakyRelu: return leaky_relu(a(), attr_scalar(n, "negative_slope"));
    case OpKind::Elu: return elu(a(), attr_scalar(n, "alpha"));
    case OpKind::MaskedFill: return masked_fill(a(), b(), attr_scalar(n, "value"));
    case OpKind::Tril: return tril(a(), attr_int(n, "diagonal"));
    case OpKind::Triu: return triu(a(), attr_int(n, "diagonal"));
    case OpKind::OneHot: return one_hot(a(), attr_int(n, "num_classes"));
    case OpKind::Stack: return stack(in, attr_int(n, "dim"));
    case OpKind::Gather: return gather(a(), attr_int(n, "dim"), b());
    case OpKind::Scatter: return scatter(a(), attr_int(n, "dim"), b(), in.at(2));
    case OpKind::ScatterValue: return scatter(a(), attr_int(n, "dim"), b(), attr_scalar(n, "value"));
    case OpKind::ScatterAdd: return scatter_add(a(), attr_int(n, "dim"), b(), in.at(2));
    case OpKind::IndexAdd: return index_add(a(), attr_int(n, "dim"), b(), in.at(2), attr_scalar(n, "alpha"));
    case OpKind::Cumsum: return cumsum(a(), attr_int(n, "dim"));
    case OpKind::Sort: return std::get<0>(sort(a(), attr_int(n, "dim"), attr_bool(n, "descending")));
    case OpKind::Argsort: return argsort(a(), attr_int(n, "dim"), attr_bool(n, "descending"));
    case OpKind::Topk: return std::get<0>(topk(a(), attr_int(n, "k"), attr_int(n, "dim"), attr_bool(n, "largest")));
    case OpKind::TopkIndices:
      return std::get<1>(topk(a(), attr_int(n, "k"), attr_int(n, "dim"), attr_bool(n, "largest")));
    // ---- issue 17: pooling
    case OpKind::MaxPool2d:
    case OpKind::MaxPool2dIndices:
    case OpKind::AvgPool2d: {
      auto pair = [&](const char* name) {
        const std::vector<int64_t> v = attr_ints(n, name);
        TG_CHECK(v.size() == 2, "export: ", op_name(n.op), " attribute ", name, " has ", v.size(), " values, not 2");
        return nn::PoolSize(v[0], v[1]);
      };
      if (n.op != OpKind::AvgPool2d) {
        auto [v, idx] = nn::functional::max_pool2d_with_indices(a(), {.kernel_size = pair("kernel_size"),
                                                                      .stride = pair("stride"),
                                                                      .padding = pair("padding"),
                                                                      .dilation = pair("dilation"),
                                                                      .ceil_mode = attr_bool(n, "ceil_mode")});
        return n.op == OpKind::MaxPool2d ? v : idx;
      }
      const int64_t div = attr_int(n, "divisor_override");
      return nn::functional::avg_pool2d(a(), {.kernel_size = pair("kernel_size"),
                                              .stride = pair("stride"),
                                              .padding = pair("padding"),
                                              .ceil_mode = attr_bool(n, "ceil_mode"),
                                              .count_include_pad = attr_bool(n, "count_include_pad"),
                                              .divisor_override = div ? std::optional<int64_t>(div) : std::nullopt});
    }
    case OpKind::AdaptiveAvgPool2d: {
      const std::vector<int64_t> v = attr_ints(n, "output_size");
      TG_CHECK(v.size() == 2, "export: adaptive_avg_pool2d output_size has ", v.size(), " values, not 2");
      return nn::functional::adaptive_avg_pool2d(a(), {v[0], v[1]});
    }
    // ---- issue 17: convolution
    case OpKind::Conv1d:
    case OpKind::Conv2d: {
      const auto st = attr_ints(n, "stride"), pd = attr_ints(n, "padding"), dl = attr_ints(n, "dilation");
      const size_t d = n.op == OpKind::Conv1d ? 1 : 2;
      TG_CHECK(st.size() == d && pd.size() == d && dl.size() == d, "export: ", op_name(n.op),
               " node with option lists of the wrong length");
      const Tensor bias = in.size() > 2 ? in[2] : Tensor();
      const bool same = attr_bool(n, "same");
      if (d == 1)
        return nn::functional::conv1d(a(), b(), bias,
                                      {.stride = st[0],
                                       .padding = same ? nn::ConvPadding<1>("same") : nn::ConvPadding<1>(pd[0]),
                                       .dilation = dl[0],
                                       .groups = attr_int(n, "groups")});
      return nn::functional::conv2d(
          a(), b(), bias,
          {.stride = {st[0], st[1]},
           .padding = same ? nn::ConvPadding<2>("same") : nn::ConvPadding<2>({pd[0], pd[1]}),
           .dilation = {dl[0], dl[1]},
           .groups = attr_int(n, "groups")});
    }
    // ---- issue 17: conv_transpose, interpolate, batch_norm, group_norm
    case OpKind::ConvTranspose1d:
    case OpKind::ConvTranspose2d: {
      const auto st = attr_ints(n, "stride"), pd = attr_ints(n, "padding"), op = attr_ints(n, "output_padding"),
                 dl = attr_ints(n, "dilation");
      const size_t d = n.op == OpKind::ConvTranspose1d ? 1 : 2;
      TG_CHECK(st.size() == d && pd.size() == d && op.size() == d && dl.size() == d, "export: ", op_name(n.op),
               " node with option lists of the wrong length");
      const Tensor bias = in.size() > 2 ? in[2] : Tensor();
      const int64_t g = attr_int(n, "groups");
      if (d == 1)
        return nn::functional::conv_transpose1d(
            a(), b(), bias, {.stride = st[0], .padding = pd[0], .output_padding = op[0], .groups = g, .dilation = dl[0]});
      return nn::functional::conv_transpose2d(a(), b(), bias,
                                              {.stride = {st[0], st[1]},
                                               .padding = {pd[0], pd[1]},
                                               .output_padding = {op[0], op[1]},
                                               .groups = g,
                                               .dilation = {dl[0], dl[1]}});
    }
    case OpKind::Interpolate: {
      const auto size = attr_ints(n, "size");
      const int64_t mode = attr_int(n, "mode");
      TG_CHECK(mode == 0 || mode == 1, "export: interpolate mode ", mode, " is not 0 (nearest) or 1 (linear)");
      TG_CHECK(size.size() == 1 || size.size() == 2, "export: interpolate with ", size.size(), " output sizes");
      nn::InterpolateFuncOptions o;
      o.mode = mode == 0 ? "nearest" : size.size() == 1 ? "linear" : "bilinear";
      if (mode == 1) o.align_corners = attr_bool(n, "align_corners");
      const double sh = attr_scalar(n, "scale_h").to_double(), sw = attr_scalar(n, "scale_w").to_double();
      if (sw > 0)  // the scale_factor path (output sizes floor(in * s) again, indices from s)
        o.scale_factor = size.size() == 1 ? std::vector<double>{sw} : std::vector<double>{sh, sw};
      else
        o.size = size;
      return nn::functional::interpolate(a(), o);
    }
    case OpKind::BatchNorm:
      return nn::functional::batch_norm(a(), Tensor(), Tensor(), in.size() > 1 ? in[1] : Tensor(),
                                        in.size() > 2 ? in[2] : Tensor(), true, 0.1,
                                        attr_scalar(n, "eps").to_double());
    case OpKind::GroupNorm:
      return nn::functional::group_norm(a(), attr_int(n, "num_groups"), in.size() > 1 ? in[1] : Tensor(),
                                        in.size() > 2 ? in[2] : Tensor(), attr_scalar(n, "eps").to_double());
  }
  TG_ERROR("export: cannot execute op ", static_cast<int>(n.op));
}

}  // namespace tg::exporting

namespace tg {

using exporting::kBatch;
using exporting::Program;

const exporting::Program& ExportedProgram::program() const {
  TG_CHECK(program_ != nullptr, "ExportedProgram: use of an empty program (default-constructed)");
  return *program_;
}
size_t ExportedProgram::num_inputs() const { return program().inputs.size(); }
size_t ExportedProgram::num_nodes() const { return program().nodes.size(); }

std::string ExportedProgram::graph() const {
  const Program& p = program();
  auto decl = [&](int id) {
    const auto& v = p.values[id];
    return "%" + v.name + ": " + exporting::dtype_short(v.dtype) + exporting::shape_str(v.shape);
  };
  std::ostringstream os;
  os << "ExportedProgram" << (p.dynamic_batch ? " (dynamic batch)" : "") << ":\n  inputs:\n";
  for (int id : p.inputs) os << "    " << decl(id) << "\n";
  bool any_param = false, any_const = false;
  for (int id : p.constants) {
    const auto kind = p.values[id].kind;
    if (kind == exporting::ValueKind::Constant) {
      any_const = true;
      continue;
    }
    if (!any_param) os << "  parameters:\n";
    any_param = true;
    os << "    " << decl(id) << "  # " << exporting::value_kind_name(kind) << " '" << p.values[id].key << "'\n";
  }
  if (any_const) {
    os << "  constants:\n";
    for (int id : p.constants)
      if (p.values[id].kind == exporting::ValueKind::Constant) os << "    " << decl(id) << "\n";
  }
  os << "  graph:\n";
  for (const auto& n : p.nodes) {
    const auto& v = p.values[n.output];
    os << "    " << exporting::describe_node(p, n) << " -> " << exporting::dtype_short(v.dtype)
       << exporting::shape_str(v.shape) << "\n";
  }
  os << "    return (";
  for (size_t i = 0; i < p.outputs.size(); ++i) os << (i ? ", %" : "%") << p.values[p.outputs[i]].name;
  os << ")\n";
  return os.str();
}

namespace {
bool shape_matches(const Shape& recorded, const Shape& actual) {
  if (recorded.size() != actual.size()) return false;
  for (size_t d = 0; d < recorded.size(); ++d)
    if (recorded[d] != actual[d] && !(d == 0 && recorded[d] == kBatch)) return false;
  return true;
}
}  // namespace

std::vector<Tensor> ExportedProgram::run(const std::vector<Tensor>& inputs) const {
  const Program& p = program();
  TG_CHECK(inputs.size() == p.inputs.size(), "ExportedProgram.run: expected ", p.inputs.size(), " inputs, got ",
           inputs.size());
  Device device;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& v = p.values[p.inputs[i]];
    TG_CHECK(inputs[i].defined(), "ExportedProgram.run: input ", i, " (%", v.name, ") is undefined");
    TG_CHECK(inputs[i].dtype() == v.dtype && shape_matches(v.shape, inputs[i].sizes()), "ExportedProgram.run: input ",
             i, " (%", v.name, ") is ", dtype_name(inputs[i].dtype()), inputs[i].sizes(), ", the program expects ",
             dtype_name(v.dtype), exporting::shape_str(v.shape));
    if (i == 0) device = inputs[i].device();
    TG_CHECK(inputs[i].device() == device, "ExportedProgram.run: inputs on different devices: ", device, " and ",
             inputs[i].device());
  }
  NoGradGuard no_grad;
  // The weights on the run's device, copied once.
  std::vector<Tensor> weights;
  {
    std::lock_guard<std::mutex> lock(p.cache_mutex);
    auto& cached = p.device_weights[device.str()];
    if (cached.empty() && !p.constants.empty()) {
      for (int id : p.constants) cached.push_back(p.weights.at(p.values[id].key).to(device));
    }
    weights = cached;
  }
  std::vector<Tensor> env(p.values.size());
  for (size_t i = 0; i < inputs.size(); ++i) env[p.inputs[i]] = inputs[i];
  for (size_t i = 0; i < p.constants.size(); ++i) env[p.constants[i]] = weights[i];
  std::vector<Tensor> operands;
  for (const auto& n : p.nodes) {
    operands.clear();
    for (int id : n.inputs) operands.push_back(env[id]);
    const auto& v = p.values[n.output];
    Tensor out = exporting::execute(n, operands, v.dtype);
    TG_CHECK(out.dtype() == v.dtype && shape_matches(v.shape, out.sizes()), "ExportedProgram.run: ",
             exporting::describe_node(p, n), " produced ", dtype_name(out.dtype()), out.sizes(), ", the export recorded ",
             dtype_name(v.dtype), exporting::shape_str(v.shape),
             p.dynamic_batch ? " (a size the trace specialized on the example batch?)" : "");
    env[n.output] = std::move(out);
  }
  std::vector<Tensor> result;
  for (int id : p.outputs) result.push_back(env[id]);
  return result;
}

}  // namespace tg
