// tg::load and tg::load_metadata of a safetensors file's bytes; every tensor loaded is read
// back in full (a reduction over a float64 copy), so that a tensor viewing memory outside
// what was read is caught by ASan.
#include "common.h"

TG_FUZZ_TARGET {
  const auto path = tg_fuzz::scratch_dir() / "in.safetensors";
  tg_fuzz::write_file(path, {reinterpret_cast<const char*>(data), size});
  tg_fuzz::accepts([&] {
    tg::nn::StateDict sd = tg::load(path.string());
    for (const auto& [name, t] : sd) {
      if (t.numel() == 0) continue;
      (void)t.to(tg::kFloat64).sum().item<double>();
    }
  });
  tg_fuzz::accepts([&] { (void)tg::load_metadata(path.string()); });
  return 0;
}
