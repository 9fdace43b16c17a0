// tg::load_idx of an IDX file's bytes; every tensor loaded is read back in full (a reduction
// over a float64 copy), so that a tensor viewing memory outside what was read is caught by ASan.
#include "common.h"

TG_FUZZ_TARGET {
  const auto path = tg_fuzz::scratch_dir() / "in.idx";
  tg_fuzz::write_file(path, {reinterpret_cast<const char*>(data), size});
  tg_fuzz::accepts([&] {
    tg::Tensor t = tg::load_idx(path.string());
    if (t.numel() > 0) (void)t.to(tg::kFloat64).sum().item<double>();
  });
  return 0;
}
