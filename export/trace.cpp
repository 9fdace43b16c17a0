// tg::export_function / tg::export_module: run forward once with a Tracer
// installed (core/trace.h) and turn what the op front-end reports into a Program.
#include <algorithm>
#include <cctype>
#include <limits>
#include <unordered_map>

#include <tapegrad/autograd/autograd.h>
#include <tapegrad/core/trace.h>
#include <tapegrad/export/export.h>
#include <tapegrad/export/program.h>

namespace tg {

namespace exporting {
namespace {

std::string sanitize(const std::string& name) {
  std::string s;
  for (char c : name) s += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return s;
}

class GraphTracer final : public detail::Tracer {
 public:
  GraphTracer(Program& p, const std::vector<std::pair<std::string, Tensor>>& named, int64_t batch)
      : p_(p), batch_(batch) {
    for (const auto& [name, t] : named)
      if (t.defined()) named_.emplace(t.impl_ptr().get(), std::make_pair(name, t));
  }

  int add_input(const Tensor& t, const std::string& name) {
    TG_CHECK(ids_.find(t.impl_ptr().get()) == ids_.end(), "export: example input ", name,
             " is the same tensor as an earlier input");
    int id = new_value(name, ValueKind::Input, t, !p_.dynamic_batch ? false : true);
    p_.inputs.push_back(id);
    return id;
  }

  void record(OpKind op, const Tensor& out, std::vector<Tensor> inputs, std::vector<detail::TraceAttr> attrs) override {
    for (const Tensor& t : inputs)
      if (t.impl_ptr() == out.impl_ptr()) return;  // the op returned its input: nothing new
    detail::TracerGuard pause(nullptr);  // the ops the tracer itself runs (snapshots) are not the model's
    Node n;
    n.op = op;
    bool batched_in = false;
    for (const Tensor& t : inputs) {
      TG_CHECK(t.defined(), "export: op ", op_name(op), " got an undefined tensor");
      int id = value_of(t);
      n.inputs.push_back(id);
      batched_in = batched_in || batched_[id];
    }
    const bool batched = p_.dynamic_batch && batched_in && out.dim() >= 1 && out.size(0) == batch_;
    for (auto& a : attrs) n.attrs.push_back({a.name, std::move(a.value)});
    if (batched) generalize(n, out, inputs);
    n.output = new_value(std::to_string(++node_count_), ValueKind::Node, out, batched);
    p_.nodes.push_back(std::move(n));
  }

  // The value a tensor stands for; tensors no traced op produced become constants.
  int value_of(const Tensor& t) {
    auto it = ids_.find(t.impl_ptr().get());
    if (it != ids_.end()) return it->second;
    auto nt = named_.find(t.impl_ptr().get());
    ValueKind kind = ValueKind::Constant;
    std::string key, name;
    if (nt != named_.end()) {
      key = nt->second.first;
      bool is_buffer = key.rfind("buffer:", 0) == 0;
      if (is_buffer) key = key.substr(7);
      kind = is_buffer ? ValueKind::Buffer : ValueKind::Parameter;
      name = (is_buffer ? "b_" : "p_") + sanitize(key);
    } else {
      key = "_constant." + std::to_string(const_count_);
      name = "c" + std::to_string(const_count_++);
    }
    int id = new_value(name, kind, t, false);
    p_.values[id].key = key;
    // A snapshot: later training does not change the exported program.
    p_.weights[key] = t.detach().clone();
    p_.constants.push_back(id);
    return id;
  }

  // A tensor that a traced op produced or consumed was modified in place
  // afterwards (e.g. y.add_(1) inside forward): the graph would be wrong.
  void check_versions() const {
    for (size_t i = 0; i < alive_.size(); ++i)
      TG_CHECK(alive_[i].version() == versions_[i], "export: %", p_.values[i].name,
               " was modified in place during forward; in-place ops cannot be traced (use the out-of-place op)");
  }

 private:
  int new_value(const std::string& name, ValueKind kind, const Tensor& t, bool batched) {
    Value v;
    v.name = name;
    v.kind = kind;
    v.shape = t.sizes();
    v.dtype = t.dtype();
    if (batched) v.shape[0] = kBatch;
    const int id = static_cast<int>(p_.values.size());
    p_.values.push_back(std::move(v));
    ids_[t.impl_ptr().get()] = id;
    batched_.push_back(batched);
    alive_.push_back(t);  // keeps the TensorImpl (and its address) alive for the trace
    versions_.push_back(t.version());
    return id;
  }

  // Rewrites attributes that spell out the example batch size so that the node
  // works for any batch (where possible; run() checks every recorded shape).
  void generalize(Node& n, const Tensor& out, const std::vector<Tensor>& inputs) {
    auto set_ints = [&](const char* name, std::vector<int64_t> v) {
      for (auto& a : n.attrs)
        if (a.name == name) {
          a.value = std::move(v);  // names are unique: v is used once
          return;
        }
    };
    if (n.op == OpKind::View || n.op == OpKind::Reshape) {
      std::vector<int64_t> shape(out.sizes().begin(), out.sizes().end());
      shape[0] = -1;
      set_ints("shape", shape);
    } else if (n.op == OpKind::Expand && inputs[0].dim() == out.dim() && batched_[value_of(inputs[0])]) {
      std::vector<int64_t> sizes(out.sizes().begin(), out.sizes().end());
      sizes[0] = -1;
      set_ints("sizes", sizes);
    } else if (n.op == OpKind::Slice) {
      // A full slice of the batch dim: keep it full for any batch.
      const Attr* dim = find_attr(n, "dim");
      if (dim && std::get<int64_t>(dim->value) == 0 && attr_int(n, "start") == 0 && attr_int(n, "step") == 1 &&
          attr_int(n, "end") >= batch_)
        for (auto& a : n.attrs)
          if (a.name == "end") a.value = std::numeric_limits<int64_t>::max();
    }
  }

  Program& p_;
  int64_t batch_;
  std::unordered_map<const TensorImpl*, std::pair<std::string, Tensor>> named_;
  std::unordered_map<const TensorImpl*, int> ids_;
  std::vector<bool> batched_;
  std::vector<Tensor> alive_;
  std::vector<uint32_t> versions_;
  int node_count_ = 0;
  int const_count_ = 0;
};

}  // namespace
}  // namespace exporting

ExportedProgram export_function(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
                                const std::vector<Tensor>& example_inputs,
                                const std::vector<std::pair<std::string, Tensor>>& named_constants,
                                ExportOptions options) {
  TG_CHECK(!example_inputs.empty(), "export: needs at least one example input");
  auto program = std::make_shared<exporting::Program>();
  program->dynamic_batch = options.dynamic_batch;
  int64_t batch = -1;
  for (size_t i = 0; i < example_inputs.size(); ++i) {
    const Tensor& t = example_inputs[i];
    TG_CHECK(t.defined(), "export: example input ", i, " is undefined");
    if (options.dynamic_batch) {
      TG_CHECK(t.dim() >= 1, "export: dynamic_batch needs inputs with a batch dim; input ", i, " has shape ",
               t.sizes());
      if (i == 0) batch = t.size(0);
      TG_CHECK(t.size(0) == batch, "export: dynamic_batch: inputs disagree on the batch size: ", batch, " vs ",
               t.size(0), " (input ", i, ")");
    }
  }
  exporting::GraphTracer tracer(*program, named_constants, batch);
  for (size_t i = 0; i < example_inputs.size(); ++i)
    tracer.add_input(example_inputs[i], example_inputs.size() == 1 ? "x" : "x" + std::to_string(i));
  std::vector<Tensor> outputs;
  {
    NoGradGuard no_grad;  // inference graph: no autograd records, no re-aliased outputs
    detail::TracerGuard guard(&tracer);
    outputs = fn(example_inputs);
  }
  TG_CHECK(!outputs.empty(), "export: forward returned no tensors");
  for (const Tensor& t : outputs) {
    TG_CHECK(t.defined(), "export: forward returned an undefined tensor");
    program->outputs.push_back(tracer.value_of(t));
  }
  tracer.check_versions();
  program->validate("export");
  return ExportedProgram(std::move(program));
}

ExportedProgram export_module(nn::Module& module, const std::vector<Tensor>& example_inputs, ExportOptions options) {
  TG_CHECK(example_inputs.size() == 1, "export_module: Module::forward takes one tensor, got ", example_inputs.size(),
           " example inputs");
  std::vector<std::pair<std::string, Tensor>> named = module.named_parameters();
  for (auto& [name, t] : module.named_buffers()) named.emplace_back("buffer:" + name, t);
  return export_function([&module](const std::vector<Tensor>& in) { return std::vector<Tensor>{module.forward(in[0])}; },
                         example_inputs, named, options);
}

}  // namespace tg
