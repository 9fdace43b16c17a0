// Writes the seed corpora of the fuzz targets from files the library itself produces:
//   tg_fuzz_seeds <dir>   ->  <dir>/<target>/<seed>, e.g. tests/fuzz/corpus/safetensors/mlp
// Run by hand after a format change (scripts/fuzz --seeds); the results are committed.
#include <cstdio>

#include "common.h"
#include <tapegrad/core/backend/rtc_host.h>

namespace fs = std::filesystem;
using namespace tg;

namespace {

fs::path g_root;

void seed(const std::string& target, const std::string& name, std::string_view bytes) {
  fs::create_directories(g_root / target);
  tg_fuzz::write_file(g_root / target / name, bytes);
}

std::string saved(const nn::StateDict& sd, const SafetensorsMetadata& meta = {}) {
  const fs::path p = tg_fuzz::scratch_dir() / "seed.safetensors";
  tg::save(sd, p.string(), meta);
  return tg_fuzz::read_file(p);
}

nn::Sequential small_model() { return nn::Sequential(nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 2)); }

Tensor leaf(Shape s) {
  Tensor t = tg::ones(std::move(s));
  t.requires_grad_(true);
  return t;
}

// The optimizer of fuzz_optimizer_state_dict after one step, saved.
template <class Opt, class Options>
std::string optimizer_seed(Options options) {
  Tensor a = leaf({3}), b = leaf({2, 2}), c = leaf({1});
  std::vector<optim::ParamGroup<Options>> groups;
  groups.push_back({{a, b}, options});
  groups.push_back({{c}, options});
  Opt opt(groups, options);
  ((a * 2).sum() + (b * b).sum() + c.sum()).backward();
  opt.step();
  return saved(opt.state_dict());
}

void safetensors_seeds() {
  seed("safetensors", "float32", saved({{"w", tg::ones({2, 3})}, {"b", tg::zeros({3})}}));
  seed("safetensors", "dtypes",
       saved({{"i64", tg::arange(6).reshape({2, 3})},
              {"f16", tg::ones({2}, kFloat16)},
              {"bf16", tg::ones({2}, kBFloat16)},
              {"f64", tg::ones({1}, kFloat64)},
              {"i32", tg::ones({2}, kInt32)},
              {"b8", tg::ones({3}, kBool)},
              {"scalar", tg::ones({}, kFloat32)},
              {"empty", tg::zeros({0, 4})}},
             {{"format", "pt"}, {"note", "seed"}}));
  seed("safetensors", "empty_dict", saved({}));
}

void module_seeds() {
  nn::Sequential m = small_model();
  nn::StateDict sd = m.state_dict();
  seed("module_state_dict", "model", saved(sd));
  nn::StateDict extra = sd;
  extra.insert("extra", tg::ones({1}));
  seed("module_state_dict", "extra_key", saved(extra));
}

void optimizer_seeds() {
  optim::SGDOptions sgd;
  sgd.lr = 0.1;
  sgd.momentum = 0.9;
  seed("optimizer_state_dict", "sgd", optimizer_seed<optim::SGD>(sgd));
  seed("optimizer_state_dict", "adam", optimizer_seed<optim::Adam>(optim::AdamOptions{}));
  optim::AdamWOptions amsgrad;
  amsgrad.amsgrad = true;
  seed("optimizer_state_dict", "adamw_amsgrad", optimizer_seed<optim::AdamW>(amsgrad));
}

void grad_scaler_seeds() {
  static const char* const kKeys[] = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"};
  amp::GradScaler scaler;
  const StateDict state = scaler.state_dict();
  std::string bytes;
  for (uint8_t k = 0; k < 5; ++k) {
    const double v = state.at(kKeys[k]).item<double>();
    bytes += static_cast<char>(k);
    bytes.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  seed("grad_scaler_state_dict", "default", bytes);
}

std::string program_bytes(const ExportedProgram& p) {
  const fs::path dir = tg_fuzz::scratch_dir() / "seed_program";
  fs::remove_all(dir);
  p.save(dir.string());
  return tg_fuzz::read_file(dir / "graph.json") + std::string(tg_fuzz::kWeightsSeparator) +
         tg_fuzz::read_file(dir / "weights.safetensors");
}

void program_seeds() {
  nn::Sequential m = small_model();
  seed("exported_program", "mlp", program_bytes(export_module(m, {tg::ones({2, 3})})));
  seed("exported_program", "mlp_dynamic",
       program_bytes(export_module(m, {tg::ones({2, 3})}, ExportOptions{.dynamic_batch = true})));
  // Views, reductions and scalars: expand, reshape, transpose, clamp, sum, exp.
  auto fn = [](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    Tensor x = in[0].expand({4, 2, 3}).contiguous().reshape({8, 3}).transpose(0, 1);
    Tensor y = x.clamp(-1.0, 2.0).exp().sum({1}, false);
    return {y, in[0].mean({0}, true)};
  };
  seed("exported_program", "ops", program_bytes(export_function(fn, {tg::ones({2, 3})})));
}

void rtc_seeds() {
  namespace rh = cuda::rtc_host;
  seed("rtc_cache", "ptx", rh::encode_cache_entry({tg_fuzz::kTgFuzzRtcKey, "add_one", ".version 8.4\n.target sm_90\n", false}));
  seed("rtc_cache", "cubin", rh::encode_cache_entry({tg_fuzz::kTgFuzzRtcKey, "_Z7add_onePf", std::string("\x7f" "ELF\2\1\1", 7), true}));
  seed("elementwise_signature", "basic", "float x, float y\nfloat z\nadd_xy");
  seed("elementwise_signature", "raw", "raw float table, int64 idx\ndouble out\ngather");
  seed("elementwise_signature", "types", "half a, bfloat16 b, long long c, int32_t d, bool e\n__half o1, float64 o2\nmixed");
}

// Bytes in fuzz_dlpack's order: flags, device type, device id, ndim, dtype code/bits/lanes,
// byte_offset, shape[ndim], strides[ndim] (with flag 2), version major/minor, flags.
std::string dlpack_record(uint8_t flags, uint8_t dev, int8_t ndim, uint8_t code, uint8_t bits, uint16_t lanes,
                          uint64_t byte_offset, std::vector<int64_t> shape, std::vector<int64_t> strides) {
  std::string s;
  auto put = [&](const auto& v) { s.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(flags), put(dev), put(int8_t{0}), put(ndim), put(code), put(bits), put(lanes), put(byte_offset);
  for (auto v : shape) put(v);
  for (auto v : strides) put(v);
  put(uint8_t{1}), put(uint8_t{0}), put(uint8_t{0});
  return s;
}

std::string npy(const Tensor& t) {
  const fs::path p = tg_fuzz::scratch_dir() / "seed.npy";
  tg::save_npy(t, p.string());
  return tg_fuzz::read_file(p);
}

void npy_seeds() {
  seed("npy", "f32_2x3", npy(tg::ones({2, 3})));
  seed("npy", "f64_0d", npy(tg::full({}, 2.5, kFloat64)));
  seed("npy", "i64_1d", npy(tg::arange(5)));
  seed("npy", "bool_empty", npy(tg::zeros({0, 3}, kBool)));
  seed("npy", "f16_3d", npy(tg::ones({2, 1, 2}, kFloat16)));
  // Fortran order and big-endian, as numpy writes them.
  std::string fortran = npy(tg::ones({2, 3}));
  const size_t pos = fortran.find("False");
  fortran.replace(pos, 5, "True ");
  seed("npy", "f32_fortran", fortran);
}

std::string idx(const Tensor& t) {
  const fs::path p = tg_fuzz::scratch_dir() / "seed.idx";
  tg::save_idx(t, p.string());
  return tg_fuzz::read_file(p);
}

void idx_seeds() {
  seed("idx", "u8_images", idx(tg::arange(0, 18, 1, kInt64).reshape({2, 3, 3}).to(kUInt8)));
  seed("idx", "u8_labels", idx(tg::arange(0, 5, 1, kInt64).to(kUInt8)));
  seed("idx", "i8_1d", idx(tg::arange(-3, 3, 1, kInt64).to(kInt8)));
  seed("idx", "i16_2d", idx(tg::arange(0, 6, 1, kInt64).reshape({2, 3}).to(kInt16)));
  seed("idx", "i32_empty", idx(tg::zeros({0, 4}, kInt32)));
  seed("idx", "f32_2x2", idx(tg::ones({2, 2})));
  seed("idx", "f64_1", idx(tg::full({1}, 2.5, kFloat64)));
}

void dlpack_seeds() {
  seed("dlpack", "f32_2x3_versioned", dlpack_record(1, kDLCPU, 2, kDLFloat, 32, 1, 0, {2, 3}, {}));
  seed("dlpack", "f64_strided_legacy", dlpack_record(2, kDLCPU, 2, kDLFloat, 64, 1, 8, {3, 2}, {1, 3}));
  seed("dlpack", "i64_broadcast", dlpack_record(3, kDLCPU, 2, kDLInt, 64, 1, 0, {4, 5}, {0, 1}));
  seed("dlpack", "bf16_pinned", dlpack_record(1, kDLCUDAHost, 1, kDLBfloat, 16, 1, 0, {7}, {}));
  seed("dlpack", "bool_scalar", dlpack_record(1, kDLCPU, 0, kDLBool, 8, 1, 3, {}, {}));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  g_root = argv[1];
  safetensors_seeds();
  module_seeds();
  optimizer_seeds();
  grad_scaler_seeds();
  program_seeds();
  rtc_seeds();
  dlpack_seeds();
  npy_seeds();
  idx_seeds();
  fs::remove_all(tg_fuzz::scratch_dir());
  return 0;
}
