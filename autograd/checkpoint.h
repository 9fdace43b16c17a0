// Activation checkpointing, as torch.utils.checkpoint: run a segment of the forward without
// keeping its activations, and recompute them in backward.
//
//   auto y = tg::utils::checkpoint([&](const std::vector<tg::Tensor>& in) { return block(in[0]); }, {x});
//
// The forward runs fn without recording (no saved activations) and records one node; its
// backward re-runs fn with recording on, on detached inputs (requiring grad where the inputs do),
// with the random generators (CPU and CUDA Philox) and the autocast state as they were before
// the forward, so dropout masks match and the gradients are those of an uncheckpointed run; then
// it backpropagates through the recomputed graph. Parameters fn uses get their .grad() written by
// that nested backward (as PyTorch's reentrant checkpoint: so it cannot run under
// tg::autograd::grad, which is an error). Under grad mode every floating output requires grad
// (fn may use parameters that are not among the inputs); without grad mode checkpoint is a plain call.
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
