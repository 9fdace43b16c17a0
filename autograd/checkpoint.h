// Activation checkpointing, as torch.utils.checkpoint: run a segment of the forward without
// keeping its activations, and recompute them in backward.
//
//   auto y = tg::utils::checkpoint([&](const std::vector<tg::Tensor>& in) { return block(in[0]); }, {x});
//
// The non-reentrant form (torch's use_reentrant=False): the forward runs fn and records its ops as
// usual, but the tensors they save for backward go to one recompute frame instead of the nodes
// (autograd::SavedTensorHook), which keeps only `inputs`. The first of those tensors that
// backward needs reruns fn on detached inputs (requiring grad where the inputs do), with the
// random generators (CPU and CUDA Philox) and the autocast state as they were before the forward,
// so dropout masks match and the gradients are those of an uncheckpointed run, and stops once the
// last saved tensor still needed is back (ops after it, a block's trailing dropout, never rerun).
// The segment's own nodes then run in the same pass: autograd::grad, retain_graph (the refilled
// values are kept for the next pass) and create_graph work as without checkpoint, and segments
// nest. A recompute that saves other shapes or a different number of tensors, or an input changed
// in place since the forward, is a tg::Error at backward. Without grad mode checkpoint is a plain
// call.
#pragma once
#include <functional>
#include <vector>

#include <tapegrad/core/tensor.h>

namespace tg::utils {

struct CheckpointOptions {
  // Replay the random generators' state in the recompute (torch's preserve_rng_state).
  bool preserve_rng_state = true;
};

std::vector<Tensor> checkpoint(std::function<std::vector<Tensor>(const std::vector<Tensor>&)> fn,
                               const std::vector<Tensor>& inputs, CheckpointOptions options = {});
// fn returning one tensor.
Tensor checkpoint(std::function<Tensor(const std::vector<Tensor>&)> fn, const std::vector<Tensor>& inputs,
                  CheckpointOptions options = {});

}  // namespace tg::utils
