// numpy's .npy format (https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html):
// the 6-byte magic "\x93NUMPY", a version (1.0, 2.0 or 3.0), a little-endian header length (2
// bytes in 1.0, 4 after), an ASCII Python dict literal
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// padded so the data starts on a 64-byte boundary, then the elements. Files move between
// tapegrad and np.save / np.load.
#pragma once
#include <optional>
#include <string>

#include <tapegrad/core/device.h>
#include <tapegrad/core/tensor.h>

namespace tg {

// Reads an .npy file: float32 / float64 / float16, int64 / int32 / int16 / int8, uint8 and bool, little- or
// big-endian, C or Fortran order (the result is contiguous either way). The header is validated
// in full, and the file's size checked against it, before anything sized from it is allocated;
// every problem is a tg::Error naming the file. The tensor lands on the CPU, or on `device`.
Tensor load_npy(const std::string& path, std::optional<Device> device = std::nullopt);

// Writes `t` (any device, layout) as a version 1.0 .npy file (2.0 when the header needs it),
// atomically: a crash leaves the old file intact. bfloat16, which numpy has no dtype for, is a
// tg::Error (convert with .to(tg::kFloat32) first).
void save_npy(const Tensor& t, const std::string& path);

}  // namespace tg
