// ExportedProgram::load of a program folder whose two files come from the fuzz bytes:
// graph.json, then kWeightsSeparator, then weights.safetensors (no separator: the bytes are
// graph.json and the weights file is empty). An accepted program is run() on inputs of its
// recorded shapes (batch 2) and dtypes.
//
// Bounded inputs: a valid program may legitimately ask for a tensor of any size (expand to
// [1e6, 1e6] is correct and needs 4 TB), and the library has no allocation cap to say no, so
// the harness skips run() for programs whose recorded shapes or size attributes hold more
// than kMaxNumel elements. Sizes whose byte count overflows are kept: the library must refuse
// those itself with a tg::Error.
#include "common.h"
#include <tapegrad/export/program.h>

namespace {

using tg_fuzz::kWeightsSeparator;
constexpr int64_t kMaxNumel = 4096;
constexpr int64_t kOverflowing = int64_t{1} << 60;  // times any element size: past int64

bool bounded(int64_t numel) { return numel <= kMaxNumel || numel >= kOverflowing; }

tg::Shape concrete(const tg::Shape& recorded) {
  std::vector<int64_t> s(recorded.begin(), recorded.end());
  if (!s.empty() && s[0] == tg::exporting::kBatch) s[0] = 2;
  return tg::Shape(s);
}

bool runnable(const tg::exporting::Program& p) {
  for (const auto& v : p.values) {
    const tg::Shape s = concrete(v.shape);
    if (!bounded(tg_fuzz::saturating_numel(std::vector<int64_t>(s.begin(), s.end())))) return false;
  }
  for (const auto& n : p.nodes)
    for (const auto& a : n.attrs)
      if (a.name == "sizes" || a.name == "shape") {
        std::vector<int64_t> sizes = tg::exporting::attr_ints(n, a.name);
        for (auto& d : sizes) d = d < 0 ? 1 : d;  // -1: inferred (reshape), or kept (expand)
        if (!bounded(tg_fuzz::saturating_numel(sizes))) return false;
      }
  return true;
}

}  // namespace

TG_FUZZ_TARGET {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t sep = in.find(kWeightsSeparator);
  const auto dir = tg_fuzz::scratch_dir() / "program";
  std::filesystem::create_directories(dir);
  tg_fuzz::write_file(dir / "graph.json", in.substr(0, sep));
  tg_fuzz::write_file(dir / "weights.safetensors",
                      sep == std::string_view::npos ? std::string_view{} : in.substr(sep + kWeightsSeparator.size()));
  tg::ExportedProgram prog;
  if (!tg_fuzz::accepts([&] { prog = tg::ExportedProgram::load(dir.string()); })) return 0;
  tg_fuzz::accepts([&] { (void)prog.graph(); });
  const tg::exporting::Program& p = prog.program();
  if (!runnable(p)) return 0;
  std::vector<tg::Tensor> inputs;
  for (int id : p.inputs) {
    const auto& v = p.values[id];
    inputs.push_back(tg::ones(concrete(v.shape), v.dtype));
  }
  tg_fuzz::accepts([&] {
    for (const tg::Tensor& out : prog.run(inputs))
      if (out.numel() > 0) (void)out.to(tg::kFloat64).sum().item<double>();
  });
  return 0;
}
