// Export a module for inference (the seed's torch.export in C++):
// tg::export_module traces forward through the op front-end into a graph of
// public ops with the module's parameters as named constants. The resulting
// tg::ExportedProgram prints, saves (a folder: graph.json + weights.safetensors),
// loads back without the code that defined the model, runs on the CPU or CUDA,
// and writes an ONNX model (opset 17) for other runtimes.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <tapegrad/core/tensor.h>
#include <tapegrad/nn/module.h>

namespace tg {

struct ExportOptions {
  // Mark dim 0 of every input (and of every value derived from it with the same
  // size) symbolic: run() then accepts any batch size.
  bool dynamic_batch = false;
};

namespace exporting {
struct Program;  // the graph and its weights (export/program.h, internal)
}

class ExportedProgram {
 public:
  ExportedProgram() = default;
  explicit ExportedProgram(std::shared_ptr<exporting::Program> program) : program_(std::move(program)) {}

  // A readable listing: inputs, parameters, constants, one line per node, return.
  std::string graph() const;
  // Writes the folder `path` (created if needed): graph.json and weights.safetensors.
  void save(const std::string& path) const;
  // Writes an ONNX ModelProto (IR 8, opset 17). An op it cannot express is a tg::Error.
  void save_onnx(const std::string& path) const;
  // Runs the graph without autograd on the inputs' device (CPU or CUDA); the
  // weights are copied to that device once and cached.
  std::vector<Tensor> run(const std::vector<Tensor>& inputs) const;
  // Reads a folder written by save(); every inconsistency is a tg::Error.
  static ExportedProgram load(const std::string& path);

  bool defined() const { return program_ != nullptr; }
  size_t num_inputs() const;
  size_t num_nodes() const;
  const exporting::Program& program() const;

 private:
  std::shared_ptr<exporting::Program> program_;
};

// Traces fn(example_inputs). Tensors fn reads that no traced op produced are the
// inputs (matched by identity), the entries of `named_constants` (parameters and
// buffers: stored under their names) or anonymous constants captured by value.
ExportedProgram export_function(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
                                const std::vector<Tensor>& example_inputs,
                                const std::vector<std::pair<std::string, Tensor>>& named_constants = {},
                                ExportOptions options = {});

// Traces module.forward(example_inputs[0]) with the module's parameters and buffers as named constants.
ExportedProgram export_module(nn::Module& module, const std::vector<Tensor>& example_inputs,
                              ExportOptions options = {});

}  // namespace tg
