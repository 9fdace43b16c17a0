// The state of the random generators, for checkpoints: each device has one Philox
// generator (a seed and a counter offset) that rand, randn, randperm, the random
// fills and dropout all draw from, so restoring it resumes every random stream.
#pragma once
#include <tapegrad/core/device.h>
#include <tapegrad/core/state_dict.h>
#include <tapegrad/core/tensor.h>

namespace tg {

// The generator of `device` (CUDA without an index: the current device) as a uint8
// [16] CPU tensor: the seed, then the Philox offset, each 8 bytes little-endian
// (the layout of torch.cuda.get_rng_state()). A CUDA device must exist.
Tensor get_rng_state(Device device = Device(kCPU));
// Restores what get_rng_state returned (any device's copy of it); validated first:
// uint8, 16 elements, an offset that is a multiple of 4 (the generator's unit).
void set_rng_state(const Tensor& state, Device device = Device(kCPU));

// Every generator: "cpu", then "cuda.<i>" for each CUDA device present.
StateDict rng_state_dict();
// Restores them all, after checking every entry. Strict: an entry for a device that
// is not present, a missing one or another name is a tg::Error; non-strict skips
// entries for absent devices and leaves generators without an entry as they are.
void load_rng_state_dict(const StateDict& state, bool strict = true);

}  // namespace tg
