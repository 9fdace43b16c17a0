// The ONNX Runtime check the export tests share: save the program as ONNX, run it in ONNX Runtime
// (python3 with onnx, onnxruntime and numpy; tests skip that part without them) on the same
// inputs, and compare with ExportedProgram::run.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "common.h"

namespace tg_export_test {

inline bool have_onnx_python() {
  static const bool ok =
      std::system("python3 -c 'import onnx, onnxruntime, numpy' > /dev/null 2>&1") == 0;
  return ok;
}

// Checks the model, feeds `inputs` to ONNX Runtime and compares its outputs with
// `expected` (all float32 here). Tensors travel as raw little-endian files.
inline constexpr const char* kScript = R"PY(
import sys, json, numpy as np, onnx, onnxruntime as ort
spec = json.load(open(sys.argv[1]))
model = onnx.load(spec["model"])
onnx.checker.check_model(model, full_check=True)
sess = ort.InferenceSession(spec["model"], providers=["CPUExecutionProvider"])
feeds = {}
for i, (name, path, shape, dtype) in enumerate(spec["inputs"]):
    feeds[name] = np.fromfile(path, dtype=dtype).reshape(shape)
outs = sess.run(None, feeds)
worst = 0.0
for got, (path, shape, dtype) in zip(outs, spec["expected"]):
    want = np.fromfile(path, dtype=dtype).reshape(shape)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)) / (1 + np.abs(want.astype(np.float64))))) if want.size else 0.0
    worst = max(worst, err)
print("onnxruntime max rel err", worst)
sys.exit(0 if worst <= 1e-5 else 3)
)PY";

inline const char* np_dtype(tg::DType t) {
  switch (t) {
    case tg::kFloat32: return "float32";
    case tg::kFloat64: return "float64";
    case tg::kInt64: return "int64";
    case tg::kBool: return "bool";
    default: return "float32";
  }
}

inline std::string write_raw(const std::string& dir, const std::string& name, const tg::Tensor& t) {
  auto path = (std::filesystem::path(dir) / (name + ".bin")).string();
  std::string bytes(t.nbytes(), '\0');
  t.contiguous().copy_to_host(bytes.data());
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

inline std::string shape_json(const tg::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

// Saves the ONNX file, runs the script on `inputs`, and expects ORT to match ep.run(inputs).
inline void check_with_onnxruntime(const tg::ExportedProgram& ep, const std::vector<tg::Tensor>& inputs,
                            const std::vector<std::string>& names) {
  const auto dir = scratch("onnx");
  std::filesystem::create_directories(dir);
  const auto model = (std::filesystem::path(dir) / "model.onnx").string();
  ep.save_onnx(model);
  auto expected = ep.run(inputs);
  std::string spec = "{\"model\": \"" + model + "\", \"inputs\": [";
  for (size_t i = 0; i < inputs.size(); ++i)
    spec += std::string(i ? ", " : "") + "[\"" + names[i] + "\", \"" + write_raw(dir, "in" + std::to_string(i), inputs[i]) +
            "\", " + shape_json(inputs[i]) + ", \"" + np_dtype(inputs[i].dtype()) + "\"]";
  spec += "], \"expected\": [";
  for (size_t i = 0; i < expected.size(); ++i)
    spec += std::string(i ? ", " : "") + "[\"" + write_raw(dir, "out" + std::to_string(i), expected[i]) + "\", " +
            shape_json(expected[i]) + ", \"" + np_dtype(expected[i].dtype()) + "\"]";
  spec += "]}";
  const auto spec_path = (std::filesystem::path(dir) / "spec.json").string();
  const auto script_path = (std::filesystem::path(dir) / "check.py").string();
  std::ofstream(spec_path) << spec;
  std::ofstream(script_path) << kScript;
  const std::string cmd = "python3 " + script_path + " " + spec_path;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// Runs fn eagerly and through the exported program (and its saved/loaded copy): same shapes,
// dtypes and values (1e-6); the graph holds each op of `ops`; then ONNX Runtime when present.
inline void check_export(const std::function<std::vector<tg::Tensor>(const std::vector<tg::Tensor>&)>& fn,
                         const std::vector<tg::Tensor>& in, const std::vector<std::string>& names,
                         const std::vector<std::string>& ops) {
  auto ep = tg::export_function(fn, in);
  const std::string g = ep.graph();
  for (const auto& s : ops) EXPECT_NE(g.find(s + "("), std::string::npos) << s << "\n" << g;
  const auto path = (std::filesystem::path(scratch("tgx")) / "p.tgx").string();
  ep.save(path);
  auto loaded = tg::ExportedProgram::load(path);
  const auto want = fn(in), got = ep.run(in), got2 = loaded.run(in);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].sizes(), want[i].sizes()) << i;
    EXPECT_EQ(got[i].dtype(), want[i].dtype()) << i;
    expect_close(to_f64(got[i]), to_f64(want[i]), 1e-6);
    expect_close(to_f64(got2[i]), to_f64(want[i]), 1e-6);
  }
  if (have_onnx_python()) check_with_onnxruntime(ep, in, names);
}

}  // namespace tg_export_test
