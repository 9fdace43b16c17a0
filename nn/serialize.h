// Checkpoints in the safetensors format (https://github.com/huggingface/safetensors):
// an 8-byte little-endian header length N, N bytes of JSON
//   {"__metadata__": {"k": "v"}, "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, ...}
// then the data section, tensors contiguous and little-endian. Names are as
// PyTorch's state_dict names them, so files move between tg and PyTorch.
#pragma once
#include <map>
#include <optional>
#include <string>

#include <tapegrad/core/device.h>
#include <tapegrad/nn/module.h>

namespace tg {

using SafetensorsMetadata = std::map<std::string, std::string>;

// Writes the tensors in the dict's order (any device, dtype, layout) with an
// optional "__metadata__" map. Atomic: writes `path.tmp.<pid>`, fsyncs it, and
// renames it over `path`, so a crash leaves the old file intact.
void save(const nn::StateDict& tensors, const std::string& path, const SafetensorsMetadata& metadata = {});

// Reads a file written by tg::save or by Python's safetensors (entries in data
// order). The header is validated in full before anything sized from the file
// is allocated; every problem is a tg::Error naming the file and the tensor.
// Tensors land on the CPU, or on `device` when given.
nn::StateDict load(const std::string& path, std::optional<Device> device = std::nullopt);

// The "__metadata__" map of a file (empty when it has none); validates like load.
SafetensorsMetadata load_metadata(const std::string& path);

}  // namespace tg
