// The tapegrad half of the libtorch peer test (see peer.h).
#include <tapegrad/tapegrad.h>

#include <atomic>
#include <cstdio>
#include <vector>

#include "peer.h"

namespace {
std::atomic<int64_t> g_live{0};
void (*g_tg_deleter)(DLManagedTensor*) = nullptr;
}  // namespace

int tg_export_arange(int64_t rows, int64_t cols, DLManagedTensor** out, void** data) {
  tg::Tensor t = tg::arange(rows * cols, tg::TensorOptions().dtype(tg::kFloat32).device(tg::kCUDA)).reshape({rows, cols});
  tg::cuda::synchronize();  // DLPack carries no stream: finish before the consumer reads
  *data = t.data_ptr();
  DLManagedTensor* m = tg::to_dlpack_legacy(t);
  // Wrap the deleter to count how many exports are still alive.
  g_tg_deleter = m->deleter;
  m->deleter = [](DLManagedTensor* self) {
    --g_live;
    g_tg_deleter(self);
  };
  ++g_live;
  *out = m;
  return 0;
}

int64_t tg_live_exports() { return g_live.load(); }

int tg_import_check_and_double(DLManagedTensor* m, const void* data, const int64_t* sizes, const int64_t* strides,
                               int ndim, const float* expected) {
  try {
    tg::Tensor t = tg::from_dlpack(m);
    if (!t.is_cuda() || t.dtype() != tg::kFloat32 || t.dim() != ndim) {
      std::printf("tg side: imported tensor is not a %d-d CUDA float32 tensor\n", ndim);
      return 1;
    }
    if (t.data_ptr() != data) {
      std::printf("tg side: data pointer %p differs from the producer's %p (a copy was made)\n", t.data_ptr(), data);
      return 1;
    }
    for (int d = 0; d < ndim; ++d) {
      if (t.sizes()[d] != sizes[d] || t.strides()[d] != strides[d]) {
        std::printf("tg side: dim %d has size %lld stride %lld, producer says %lld, %lld\n", d,
                    static_cast<long long>(t.sizes()[d]), static_cast<long long>(t.strides()[d]),
                    static_cast<long long>(sizes[d]), static_cast<long long>(strides[d]));
        return 1;
      }
    }
    std::vector<float> got(static_cast<size_t>(t.numel()));
    t.copy_to_host(got.data());
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != expected[i]) {
        std::printf("tg side: element %zu is %g, producer has %g\n", i, got[i], expected[i]);
        return 1;
      }
    }
    t.mul_(2.0);  // visible to the producer: same memory
    tg::cuda::synchronize();
    return 0;
  } catch (const tg::Error& e) {
    std::printf("tg side: %s\n", e.what());
    return 1;
  }
}
