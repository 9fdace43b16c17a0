// Module::load_state_dict of a state dict read from a safetensors file's bytes: a small
// Sequential(Linear(3, 4), ReLU(), Linear(4, 2)), loaded strictly, then non-strictly, and
// run forward and backward once whenever a load is accepted.
#include "common.h"

namespace {
void train_once(tg::nn::Module& m) {
  tg::Tensor x = tg::ones({2, 3});
  tg::Tensor y = m.forward(x).sum();
  y.backward();
}
}  // namespace

TG_FUZZ_TARGET {
  tg::nn::StateDict sd;
  if (!tg_fuzz::load_safetensors(data, size, "module.safetensors", sd)) return 0;
  for (bool strict : {true, false}) {
    tg::nn::Sequential model(tg::nn::Linear(3, 4), tg::nn::ReLU(), tg::nn::Linear(4, 2));
    if (tg_fuzz::accepts([&] { model.load_state_dict(sd, strict); })) tg_fuzz::accepts([&] { train_once(model); });
  }
  return 0;
}
