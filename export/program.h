// The exported program's data: values (inputs, constants, node outputs), nodes
// (op, operand ids, attributes, recorded output shape and dtype) and weights,
// plus the per-op schema that validation, execution and ONNX lowering share.
// Internal to export/.
#pragma once
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <tapegrad/core/op_list.h>
#include <tapegrad/core/tensor.h>
#include <tapegrad/core/trace.h>

namespace tg::exporting {

inline constexpr int kFormatVersion = 1;
inline constexpr const char* kFormatName = "tapegrad.exported_program";
inline constexpr int64_t kBatch = -1;  // a symbolic dim 0 in a recorded shape

enum class ValueKind { Input, Parameter, Buffer, Constant, Node };
const char* value_kind_name(ValueKind k);

struct Value {
  std::string name;  // printed as %name; unique in the program
  ValueKind kind = ValueKind::Node;
  std::string key;   // constants: their entry in the weights file
  Shape shape;       // dim 0 may be kBatch
  DType dtype = kFloat32;
};

struct Attr {
  std::string name;
  detail::TraceValue value;
};

struct Node {
  OpKind op = OpKind::Add;
  std::vector<int> inputs;  // value ids
  std::vector<Attr> attrs;
  int output = -1;          // value id
};

// What an op takes: how many tensor operands (-1: one or more) and which attributes.
enum class AttrType { Int, Scalar, Bool, Ints, DType };
struct AttrSpec {
  const char* name;
  AttrType type;
  bool optional = false;
};
struct OpSchema {
  int num_inputs;  // -1: one or more
  std::vector<AttrSpec> attrs;
  int optional_inputs = 0;  // trailing operands that may be left out (linear's bias)
};
const OpSchema& op_schema(OpKind op);

struct Program {
  bool dynamic_batch = false;
  std::vector<Value> values;
  std::vector<int> inputs;     // value ids, in call order
  std::vector<int> constants;  // value ids (parameters, buffers, anonymous constants)
  std::vector<Node> nodes;     // in execution order
  std::vector<int> outputs;    // value ids
  std::map<std::string, Tensor> weights;  // by Value::key

  // run(): the weights copied to a device, by device string.
  mutable std::mutex cache_mutex;
  mutable std::map<std::string, std::vector<Tensor>> device_weights;

  // Checks everything load() must guarantee (ids in range and defined before
  // use, schemas, weights present with the recorded shape and dtype).
  void validate(const char* where) const;
};

// Attribute access for the executor and the ONNX writer (the schema was checked).
const Attr* find_attr(const Node& n, std::string_view name);
int64_t attr_int(const Node& n, std::string_view name);
bool attr_bool(const Node& n, std::string_view name);
Scalar attr_scalar(const Node& n, std::string_view name);
std::vector<int64_t> attr_ints(const Node& n, std::string_view name);
DType attr_dtype(const Node& n, std::string_view name);

// "%3 = add(%1, %x, alpha=1)": for messages.
std::string describe_node(const Program& p, const Node& n);
std::string shape_str(const Shape& s);  // [batch, 4]
const char* dtype_short(DType t);       // f32, bf16, b8, ...

// Runs one node on its operands (public ops, so the semantics are the library's). `out_dtype` is
// the dtype the trace recorded: a unary float op recorded with a wider result than its operand
// (exp of a float16 tensor into float32, as autocast runs it in one kernel) widens it first.
Tensor execute(const Node& n, const std::vector<Tensor>& in, DType out_dtype);

}  // namespace tg::exporting
