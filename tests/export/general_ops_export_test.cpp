// Issue 15's general ops through export: traced as themselves, replayed by run() to the eager
// values, saved and loaded, and lowered to ONNX (checked with ONNX Runtime when python3 has onnx,
// onnxruntime and numpy; that part is skipped with one line otherwise).
#include <cstdlib>
#include <fstream>

#include "common.h"

using namespace tg_export_test;
namespace fs = std::filesystem;

namespace {

bool have_onnx_python() {
  static const bool ok = std::system("python3 -c 'import onnx, onnxruntime, numpy' > /dev/null 2>&1") == 0;
  return ok;
}

// Checks the model, feeds `inputs` to ONNX Runtime and compares its outputs with
// `expected` (all float32 here). Tensors travel as raw little-endian files.
constexpr const char* kScript = R"PY(
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

const char* np_dtype(tg::DType t) {
  switch (t) {
    case tg::kFloat32:
      return "float32";
    case tg::kFloat64:
      return "float64";
    case tg::kInt64:
      return "int64";
    case tg::kBool:
      return "bool";
    default:
      return "float32";
  }
}

std::string write_raw(const std::string& dir, const std::string& name, const tg::Tensor& t) {
  auto path = (fs::path(dir) / (name + ".bin")).string();
  std::string bytes(t.nbytes(), '\0');
  t.contiguous().copy_to_host(bytes.data());
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string shape_json(const tg::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

// Saves the ONNX file, runs the script on `inputs`, and expects ORT to match ep.run(inputs).
void check_with_onnxruntime(const tg::ExportedProgram& ep, const std::vector<tg::Tensor>& inputs,
                            const std::vector<std::string>& names) {
  const auto dir = scratch("onnx");
  fs::create_directories(dir);
  const auto model = (fs::path(dir) / "model.onnx").string();
  ep.save_onnx(model);
  auto expected = ep.run(inputs);
  std::string spec = "{\"model\": \"" + model + "\", \"inputs\": [";
  for (size_t i = 0; i < inputs.size(); ++i)
    spec += std::string(i ? ", " : "") + "[\"" + names[i] + "\", \"" +
            write_raw(dir, "in" + std::to_string(i), inputs[i]) + "\", " + shape_json(inputs[i]) + ", \"" +
            np_dtype(inputs[i].dtype()) + "\"]";
  spec += "], \"expected\": [";
  for (size_t i = 0; i < expected.size(); ++i)
    spec += std::string(i ? ", " : "") + "[\"" + write_raw(dir, "out" + std::to_string(i), expected[i]) + "\", " +
            shape_json(expected[i]) + ", \"" + np_dtype(expected[i].dtype()) + "\"]";
  spec += "]}";
  const auto spec_path = (fs::path(dir) / "spec.json").string();
  const auto script_path = (fs::path(dir) / "check.py").string();
  std::ofstream(spec_path) << spec;
  std::ofstream(script_path) << kScript;
  const std::string cmd = "python3 " + script_path + " " + spec_path;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// Runs fn eagerly and through the exported program (and its saved/loaded copy), and ORT.
void check_export(const std::function<std::vector<tg::Tensor>(const std::vector<tg::Tensor>&)>& fn,
                  const std::vector<tg::Tensor>& in, const std::vector<std::string>& names,
                  const std::vector<std::string>& ops) {
  auto ep = tg::export_function(fn, in);
  const std::string g = ep.graph();
  for (const auto& s : ops) EXPECT_NE(g.find(s + "("), std::string::npos) << s << "\n" << g;
  const auto path = (fs::path(scratch("tgx")) / "p.tgx").string();
  ep.save(path);
  auto loaded = tg::ExportedProgram::load(path);
  const auto want = fn(in), got = ep.run(in), got2 = loaded.run(in);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].dtype(), want[i].dtype()) << i;
    expect_close(to_f64(got[i]), to_f64(want[i]), 1e-6);
    expect_close(to_f64(got2[i]), to_f64(want[i]), 1e-6);
  }
  if (have_onnx_python()) check_with_onnxruntime(ep, in, names);
}

}  // namespace

TEST(ExportGeneralOps, UnaryAndActivations) {
  tg::manual_seed(21);
  auto fn = [](const std::vector<tg::Tensor>& in) {
    auto x = in[0];
    return std::vector<tg::Tensor>{x.sin(),
                                   x.cos(),
                                   (x.abs() + 0.5).rsqrt(),
                                   tg::silu(x),
                                   x.gelu("tanh"),
                                   tg::softplus(x * 8, 2.0, 3.0),
                                   tg::leaky_relu(x, 0.2),
                                   tg::elu(x, 1.5)};
  };
  check_export(fn, {tg::randn({4, 5})}, {"x"},
               {"sin", "cos", "rsqrt", "silu", "gelu_tanh", "softplus", "leaky_relu", "elu"});
}

TEST(ExportGeneralOps, MaskingStackAndOneHot) {
  tg::manual_seed(22);
  auto fn = [](const std::vector<tg::Tensor>& in) {
    auto x = in[0], y = in[1];
    auto mask = x > 0.3;
    auto idx = (y.abs() * 2).clamp(0, 2.9).to(tg::kInt64);  // int64 in [0, 2]
    return std::vector<tg::Tensor>{x.masked_fill(mask, -1.5), tg::tril(x, -1), x.triu(1), tg::stack({x, y, x * y}, 1),
                                   tg::one_hot(idx, 3).to(tg::kFloat32)};
  };
  check_export(fn, {tg::randn({4, 4}), tg::randn({4, 4})}, {"x0", "x1"},
               {"masked_fill", "tril", "triu", "stack", "one_hot"});
}

TEST(ExportGeneralOps, GatherScatterIndexAdd) {
  tg::manual_seed(23);
  auto gi = tg::tensor<int64_t>({2, 0, 1, 1, 0, 2}, {2, 3});
  auto si = tg::tensor<int64_t>({2, 0, 1, 3}, {2, 2});  // no repeated target: the set form is then exact
  auto ii = tg::tensor<int64_t>({3, 0}, {2});
  auto fn = [&](const std::vector<tg::Tensor>& in) {
    auto x = in[0], y = in[1];  // [4, 3], [2, 3]
    return std::vector<tg::Tensor>{tg::gather(x, 0, gi), tg::scatter(x, 0, si, y), x.scatter(1, gi.slice(0, 0, 1), 7.0),
                                   tg::scatter_add(x, 0, gi, y), tg::index_add(x, 0, ii, y, 0.5)};
  };
  check_export(fn, {tg::randn({4, 3}), tg::randn({2, 3})}, {"x0", "x1"},
               {"gather", "scatter", "scatter_value", "scatter_add", "index_add"});
}

TEST(ExportGeneralOps, CumsumSortTopk) {
  tg::manual_seed(24);
  auto fn = [](const std::vector<tg::Tensor>& in) {
    auto x = in[0];
    auto [v, i] = tg::sort(x, 1);
    auto [tv, ti] = tg::topk(x, 2, 0, false);
    return std::vector<tg::Tensor>{x.cumsum(1), tg::cumsum(x, 0), v, i, tg::argsort(x, 0, true), tv, ti};
  };
  check_export(fn, {tg::randn({4, 5})}, {"x"}, {"cumsum", "sort", "argsort", "topk", "topk_indices"});
}
