// The seam between the two halves of the libtorch peer test: plain C types only,
// so that each side keeps its own C++ standard library ABI.
#pragma once
#include <cstdint>

struct DLManagedTensor;

// tapegrad side (tg_side.cpp). Each returns 0 on success, else prints why and returns 1.
// Exports tg::arange(rows * cols) on CUDA as a [rows, cols] float32 tensor; *data is its device pointer.
int tg_export_arange(int64_t rows, int64_t cols, DLManagedTensor** out, void** data);
// Number of tapegrad exports whose memory is still held by a consumer.
int64_t tg_live_exports();
// Imports a CUDA float32 tensor from another library: checks that it aliases `data`, has the
// given sizes/strides and host values `expected` (row-major, numel floats), then doubles it in place.
int tg_import_check_and_double(DLManagedTensor* m, const void* data, const int64_t* sizes, const int64_t* strides,
                               int ndim, const float* expected);
