// The libtorch half of the DLPack peer test: a CUDA tensor goes tapegrad -> torch
// and torch -> tapegrad with the same data pointer and equal values, and the
// producer's memory is released when the consumer lets go.
#include <ATen/DLConvertor.h>
#include <torch/torch.h>

#include <cstdio>
#include <vector>

#include "peer.h"

namespace {
int fail(const char* what) {
  std::printf("torch_peer: FAILED: %s\n", what);
  return 1;
}
}  // namespace

int main() {
  if (!torch::cuda::is_available()) {
    std::printf("torch_peer: libtorch sees no CUDA device; skipped\n");
    return 0;
  }
  // tapegrad -> torch
  {
    DLManagedTensor* m = nullptr;
    void* data = nullptr;
    if (tg_export_arange(3, 5, &m, &data) != 0) return fail("tapegrad export");
    at::Tensor t = at::fromDLPack(m);
    if (!t.is_cuda()) return fail("torch got a non-CUDA tensor");
    if (t.data_ptr() != data) return fail("torch's data pointer differs from tapegrad's");
    if (t.dim() != 2 || t.size(0) != 3 || t.size(1) != 5) return fail("torch sees another shape");
    at::Tensor want = torch::arange(15, torch::dtype(torch::kFloat32).device(torch::kCUDA)).reshape({3, 5});
    if (!torch::equal(t, want)) return fail("torch sees other values than tapegrad exported");
    if (tg_live_exports() != 1) return fail("the export is not alive while torch holds it");
    t = at::Tensor();
    torch::cuda::synchronize();
    if (tg_live_exports() != 0) return fail("tapegrad's deleter did not run when torch let go");
    std::printf("torch_peer: tapegrad -> torch OK (same pointer %p, equal values, deleter ran)\n", data);
  }
  // torch -> tapegrad, a strided (transposed) view
  {
    at::Tensor base = torch::arange(12, torch::dtype(torch::kFloat32).device(torch::kCUDA)).reshape({3, 4});
    at::Tensor view = base.t();  // [4, 3], strides [1, 4]
    at::Tensor expected = view.contiguous().cpu();
    std::vector<int64_t> sizes(view.sizes().begin(), view.sizes().end());
    std::vector<int64_t> strides(view.strides().begin(), view.strides().end());
    torch::cuda::synchronize();
    DLManagedTensor* m = at::toDLPack(view);
    if (tg_import_check_and_double(m, view.data_ptr(), sizes.data(), strides.data(), 2,
                                   expected.data_ptr<float>()) != 0)
      return fail("tapegrad import of torch's tensor");
    if (!torch::equal(base.cpu(), torch::arange(12, torch::kFloat32).reshape({3, 4}) * 2))
      return fail("tapegrad's in-place write is not visible to torch (not the same memory)");
    std::printf("torch_peer: torch -> tapegrad OK (same pointer %p, strides kept, in-place write shared)\n",
                view.data_ptr());
  }
  std::printf("torch_peer: OK\n");
  return 0;
}
