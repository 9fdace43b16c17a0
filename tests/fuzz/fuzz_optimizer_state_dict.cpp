// Optimizer::load_state_dict of a state dict read from a safetensors file's bytes, for SGD
// (with momentum), Adam and AdamW (amsgrad), two parameter groups; every accepted load is
// followed by two steps, the second through a GradScaler.
#include "common.h"

namespace {

struct Params {
  tg::Tensor a = leaf({3});
  tg::Tensor b = leaf({2, 2});
  tg::Tensor c = leaf({1});
  static tg::Tensor leaf(tg::Shape s) {
    tg::Tensor t = tg::ones(std::move(s));
    t.requires_grad_(true);
    return t;
  }
  tg::Tensor loss() const { return (a * 2).sum() + (b * b).sum() + c.sum(); }
};

template <class Opt, class Options>
void fuzz_one(const tg::StateDict& sd, Options options) {
  Params p;
  std::vector<tg::optim::ParamGroup<Options>> groups;
  groups.push_back({{p.a, p.b}, options});
  groups.push_back({{p.c}, options});
  Opt opt(groups, options);
  if (!tg_fuzz::accepts([&] { opt.load_state_dict(sd); })) return;
  tg_fuzz::accepts([&] {
    opt.zero_grad();
    p.loss().backward();
    opt.step();
    tg::amp::GradScaler scaler;
    opt.zero_grad();
    scaler.scale(p.loss()).backward();
    scaler.step(opt);
    scaler.update();
    (void)opt.state_dict();
  });
}

}  // namespace

TG_FUZZ_TARGET {
  tg::nn::StateDict loaded;
  if (!tg_fuzz::load_safetensors(data, size, "optim.safetensors", loaded)) return 0;
  const tg::StateDict& sd = loaded;
  tg::optim::SGDOptions sgd;
  sgd.lr = 0.1;
  sgd.momentum = 0.9;
  fuzz_one<tg::optim::SGD>(sd, sgd);
  fuzz_one<tg::optim::Adam>(sd, tg::optim::AdamOptions{});
  tg::optim::AdamWOptions amsgrad;
  amsgrad.amsgrad = true;
  fuzz_one<tg::optim::AdamW>(sd, amsgrad);
  return 0;
}
