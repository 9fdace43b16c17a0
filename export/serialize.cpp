// ExportedProgram::save / load: a folder holding graph.json (the program, see
// below) and weights.safetensors (the constants, written by nn/serialize).
//
// graph.json: {"format": "tapegrad.exported_program", "version": 1, "dynamic_batch": bool,
//   "inputs": [value...], "constants": [value + "kind" + "key"...],
//   "nodes": [{"op": name, "inputs": [value names], "attrs": {name: value}, "output": value}...],
//   "outputs": [value names]}
// where a value is {"name", "dtype", "shape"} (shape -1 at dim 0: the batch).
// Attribute values: JSON int, float (non-finite as "inf" / "-inf" / "nan"), bool,
// int list, or {"dtype": name}.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include <tapegrad/export/export.h>
#include <tapegrad/export/program.h>
#include <tapegrad/nn/serialize.h>

namespace tg {

using exporting::Program;
using exporting::Value;
using exporting::ValueKind;
using Json = nlohmann::ordered_json;

namespace {

constexpr const char* kGraphFile = "graph.json";
constexpr const char* kWeightsFile = "weights.safetensors";

Json value_json(const Value& v) {
  Json j = Json::object();
  j["name"] = v.name;
  j["dtype"] = dtype_name(v.dtype);
  j["shape"] = std::vector<int64_t>(v.shape.begin(), v.shape.end());
  return j;
}

Json attr_json(const detail::TraceValue& v) {
  struct Visitor {
    Json operator()(int64_t i) const { return i; }
    Json operator()(double d) const {
      if (std::isnan(d)) return "nan";
      if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
      return d;
    }
    Json operator()(bool b) const { return b; }
    Json operator()(const std::vector<int64_t>& l) const { return l; }
    Json operator()(DType t) const { return Json{{"dtype", dtype_name(t)}}; }
  };
  return std::visit(Visitor{}, v);
}

// ---- loading: every access checks the JSON type first and names what it read.
struct Reader {
  std::string file;

  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    TG_ERROR("ExportedProgram.load(", file, "): ", where, ": ", what);
  }
  const Json& field(const Json& obj, const char* key, const std::string& where) const {
    if (!obj.is_object()) fail(where, "expected a JSON object");
    auto it = obj.find(key);
    if (it == obj.end()) fail(where, std::string("missing field '") + key + "'");
    return *it;
  }
  std::string str(const Json& j, const std::string& where) const {
    if (!j.is_string()) fail(where, "expected a string");
    return j.get<std::string>();
  }
  int64_t integer(const Json& j, const std::string& where) const {
    if (!j.is_number_integer()) fail(where, "expected an integer");
    return j.get<int64_t>();
  }
  std::vector<int64_t> ints(const Json& j, const std::string& where) const {
    if (!j.is_array()) fail(where, "expected a list of integers");
    std::vector<int64_t> out;
    for (const auto& e : j) out.push_back(integer(e, where));
    return out;
  }
  const Json& array(const Json& j, const std::string& where) const {
    if (!j.is_array()) fail(where, "expected a list");
    return j;
  }
  DType dtype(const Json& j, const std::string& where) const {
    const std::string s = str(j, where);
    for (int i = 0; i < kNumDTypes; ++i)
      if (s == dtype_name(static_cast<DType>(i))) return static_cast<DType>(i);
    fail(where, "unknown dtype '" + s + "'");
  }
  Value value(const Json& j, ValueKind kind, const std::string& where) const {
    Value v;
    v.kind = kind;
    v.name = str(field(j, "name", where), where + ".name");
    v.dtype = dtype(field(j, "dtype", where), where + ".dtype");
    v.shape = ints(field(j, "shape", where), where + ".shape");
    return v;
  }
  detail::TraceValue attr(const Json& j, const std::string& where) const {
    if (j.is_boolean()) return j.get<bool>();
    if (j.is_number_integer()) return j.get<int64_t>();
    if (j.is_number_float()) return j.get<double>();
    if (j.is_string()) {
      const std::string s = j.get<std::string>();
      if (s == "inf") return std::numeric_limits<double>::infinity();
      if (s == "-inf") return -std::numeric_limits<double>::infinity();
      if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
      fail(where, "unexpected string attribute '" + s + "'");
    }
    if (j.is_array()) return ints(j, where);
    if (j.is_object()) return dtype(field(j, "dtype", where), where + ".dtype");
    fail(where, "unsupported attribute value");
  }
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TG_CHECK(in.good(), "ExportedProgram.load: cannot open ", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  TG_CHECK(!in.bad(), "ExportedProgram.load: error reading ", path);
  return ss.str();
}

std::shared_ptr<Program> parse_program(const Json& root, const Reader& r) {
  auto p = std::make_shared<Program>();
  const std::string format = r.str(r.field(root, "format", "header"), "format");
  if (format != exporting::kFormatName) r.fail("header", "not an exported program (format '" + format + "')");
  const int64_t version = r.integer(r.field(root, "version", "header"), "version");
  if (version != exporting::kFormatVersion)
    r.fail("header", "format version " + std::to_string(version) + " is not supported (this build reads " +
                         std::to_string(exporting::kFormatVersion) + ")");
  const Json& dyn = r.field(root, "dynamic_batch", "header");
  if (!dyn.is_boolean()) r.fail("dynamic_batch", "expected a bool");
  p->dynamic_batch = dyn.get<bool>();

  std::unordered_map<std::string, int> ids;
  auto add = [&](Value v, const std::string& where) {
    if (!ids.emplace(v.name, static_cast<int>(p->values.size())).second)
      r.fail(where, "value %" + v.name + " is defined twice");
    p->values.push_back(std::move(v));
    return static_cast<int>(p->values.size()) - 1;
  };
  auto lookup = [&](const Json& j, const std::string& where) {
    const std::string name = r.str(j, where);
    auto it = ids.find(name);
    if (it == ids.end()) r.fail(where, "%" + name + " is used before it is defined");
    return it->second;
  };

  const Json& inputs = r.array(r.field(root, "inputs", "header"), "inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string where = "inputs[" + std::to_string(i) + "]";
    p->inputs.push_back(add(r.value(inputs[i], ValueKind::Input, where), where));
  }
  const Json& constants = r.array(r.field(root, "constants", "header"), "constants");
  for (size_t i = 0; i < constants.size(); ++i) {
    const std::string where = "constants[" + std::to_string(i) + "]";
    const std::string kind = r.str(r.field(constants[i], "kind", where), where + ".kind");
    ValueKind k;
    if (kind == "parameter") k = ValueKind::Parameter;
    else if (kind == "buffer") k = ValueKind::Buffer;
    else if (kind == "constant") k = ValueKind::Constant;
    else r.fail(where, "unknown constant kind '" + kind + "'");
    Value v = r.value(constants[i], k, where);
    v.key = r.str(r.field(constants[i], "key", where), where + ".key");
    p->constants.push_back(add(std::move(v), where));
  }
  const Json& nodes = r.array(r.field(root, "nodes", "header"), "nodes");
  for (size_t i = 0; i < nodes.size(); ++i) {
    std::string where = "nodes[" + std::to_string(i) + "]";
    const Json& jn = nodes[i];
    exporting::Node n;
    const std::string op = r.str(r.field(jn, "op", where), where + ".op");
    if (!op_from_name(op, n.op)) r.fail(where, "unknown op '" + op + "'");
    where += " (" + op + ")";
    const Json& ins = r.array(r.field(jn, "inputs", where), where + ".inputs");
    for (const auto& e : ins) n.inputs.push_back(lookup(e, where + ".inputs"));
    const Json& attrs = r.field(jn, "attrs", where);
    if (!attrs.is_object()) r.fail(where + ".attrs", "expected a JSON object");
    for (auto it = attrs.begin(); it != attrs.end(); ++it)
      n.attrs.push_back({it.key(), r.attr(it.value(), where + ".attrs." + it.key())});
    n.output = add(r.value(r.field(jn, "output", where), ValueKind::Node, where + ".output"), where);
    p->nodes.push_back(std::move(n));
  }
  const Json& outputs = r.array(r.field(root, "outputs", "header"), "outputs");
  for (const auto& e : outputs) p->outputs.push_back(lookup(e, "outputs"));
  return p;
}

}  // namespace

void ExportedProgram::save(const std::string& path) const {
  const Program& p = program();
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(path, ec);
  TG_CHECK(!ec && fs::is_directory(path), "ExportedProgram.save: cannot create the folder ", path,
           ec ? ": " + ec.message() : std::string());
  Json root = Json::object();
  root["format"] = exporting::kFormatName;
  root["version"] = exporting::kFormatVersion;
  root["dynamic_batch"] = p.dynamic_batch;
  root["inputs"] = Json::array();
  for (int id : p.inputs) root["inputs"].push_back(value_json(p.values[id]));
  root["constants"] = Json::array();
  nn::StateDict weights;
  for (int id : p.constants) {
    const Value& v = p.values[id];
    Json j = value_json(v);
    j["kind"] = exporting::value_kind_name(v.kind);
    j["key"] = v.key;
    root["constants"].push_back(std::move(j));
    weights.insert(v.key, p.weights.at(v.key));
  }
  root["nodes"] = Json::array();
  for (const auto& n : p.nodes) {
    Json jn = Json::object();
    jn["op"] = op_name(n.op);
    jn["inputs"] = Json::array();
    for (int id : n.inputs) jn["inputs"].push_back(p.values[id].name);
    jn["attrs"] = Json::object();
    for (const auto& a : n.attrs) jn["attrs"][a.name] = attr_json(a.value);
    jn["output"] = value_json(p.values[n.output]);
    root["nodes"].push_back(std::move(jn));
  }
  root["outputs"] = Json::array();
  for (int id : p.outputs) root["outputs"].push_back(p.values[id].name);

  const std::string graph_path = (fs::path(path) / kGraphFile).string();
  {
    std::ofstream out(graph_path, std::ios::binary | std::ios::trunc);
    TG_CHECK(out.good(), "ExportedProgram.save: cannot write ", graph_path);
    out << root.dump(1) << "\n";
    out.flush();
    TG_CHECK(out.good(), "ExportedProgram.save: error writing ", graph_path);
  }
  tg::save(weights, (fs::path(path) / kWeightsFile).string(), {{"format", exporting::kFormatName}});
}

ExportedProgram ExportedProgram::load(const std::string& path) {
  namespace fs = std::filesystem;
  TG_CHECK(fs::is_directory(path), "ExportedProgram.load: ", path,
           " is not a folder written by ExportedProgram::save (graph.json + weights.safetensors)");
  const std::string graph_path = (fs::path(path) / kGraphFile).string();
  Reader r{graph_path};
  std::shared_ptr<Program> p;
  try {
    Json root = Json::parse(read_file(graph_path));
    p = parse_program(root, r);
  } catch (const nlohmann::json::exception& e) {
    TG_ERROR("ExportedProgram.load(", graph_path, "): invalid JSON: ", e.what());
  }
  nn::StateDict weights = tg::load((fs::path(path) / kWeightsFile).string());
  for (const auto& [key, t] : weights) p->weights[key] = t;
  TG_CHECK(weights.size() == p->constants.size(), "ExportedProgram.load(", path, "): the weights file holds ",
           weights.size(), " tensors, the graph uses ", p->constants.size());
  p->validate(("ExportedProgram.load(" + path + ")").c_str());
  return ExportedProgram(std::move(p));
}

}  // namespace tg
