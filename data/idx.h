// The IDX format of the MNIST files (http://yann.lecun.com/exdb/mnist/, "THE IDX FILE FORMAT"):
// two zero bytes, a type byte (0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32,
// 0x0E float64), the number of dims (1 byte), each dim as a big-endian uint32, then the elements
// in C order, big-endian. train-images-idx3-ubyte is uint8 [60000, 28, 28]; the labels file is
// uint8 [60000]. Files move between tapegrad and any MNIST loader (gzip them yourself).
#pragma once
#include <optional>
#include <string>

#include <tapegrad/core/device.h>
#include <tapegrad/core/tensor.h>

namespace tg {

// Reads an IDX file into a contiguous tensor of the file's type (uint8, int8, int16, int32,
// float32, float64), on the CPU or on `device`. The header is validated, and the file's size
// must equal what the header describes exactly, before anything sized from the file is
// allocated; every problem is a tg::Error naming the file.
Tensor load_idx(const std::string& path, std::optional<Device> device = std::nullopt);

// Writes `t` (any device, layout; uint8, int8, int16, int32, float32 or float64, 1 to 255 dims,
// each below 2^32) as an IDX file, atomically: a crash leaves the old file intact. Other dtypes
// and 0-d tensors, which IDX cannot hold, are a tg::Error.
void save_idx(const Tensor& t, const std::string& path);

}  // namespace tg
