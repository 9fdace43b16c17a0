// amp::GradScaler::load_state_dict of a state read from the fuzz bytes: records of one key
// byte (one of PyTorch's five keys, or another) and an 8-byte double. Every accepted load is
// followed by a scaled step and update() on the CPU and the getters.
#include "common.h"

TG_FUZZ_TARGET {
  static const char* const kKeys[] = {"scale", "growth_factor", "backoff_factor", "growth_interval",
                                      "_growth_tracker", "other"};
  tg_fuzz::Bytes in{data, size};
  tg::StateDict state;
  while (in.n >= 9) {
    const auto k = in.get<uint8_t>();
    state.insert(kKeys[k % 6], tg::full({}, in.get<double>(), tg::kFloat64));
  }
  const bool scale_first = size % 2;  // load before or after the scale tensors exist
  tg::Tensor w = tg::ones({2});
  w.requires_grad_(true);
  tg::optim::SGDOptions o;
  o.lr = 0.1;
  tg::optim::SGD opt({w}, o);
  tg::amp::GradScaler scaler;
  if (scale_first) tg_fuzz::accepts([&] { (void)scaler.scale(w.sum()); });
  if (!tg_fuzz::accepts([&] { scaler.load_state_dict(state); })) return 0;
  tg_fuzz::accepts([&] {
    scaler.scale(w.sum()).backward();
    scaler.step(opt);
    scaler.update();
    (void)scaler.get_scale();
    (void)scaler.get_growth_tracker();
    (void)scaler.state_dict();
  });
  return 0;
}
