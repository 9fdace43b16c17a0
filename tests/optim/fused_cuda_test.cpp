// The fused CUDA steps against the CPU loops (same formulas, float32 within 1e-6
// relative; float16 / bfloat16 within one rounding), many parameters spanning
// several launches, mixed devices in one group, and a pointer cache that notices
// new gradients and state.
#include <gtest/gtest.h>

#include "tests/optim/reference.h"

namespace tg::testing {
namespace {

// Many parameters of assorted sizes: more than one launch's worth of tensors and of chunks.
std::vector<Shape> many_shapes() {
  std::vector<Shape> s;
  for (int i = 0; i < 90; ++i) s.push_back({1 + (i * 37) % 301, 1 + i % 7});
  s.push_back({1000, 300});  // 5 chunks of 65536
  s.push_back({0});          // empty
  s.push_back({1});
  return s;
}

template <class Opt, class Options>
void compare_cuda_cpu(const Options& o, DType dtype, double rtol, int steps = 4) {
  tg::manual_seed(42);
  std::vector<Tensor> cpu_p, gpu_p;
  for (const auto& s : many_shapes()) {
    auto t = tg::randn(s).to(dtype);
    cpu_p.push_back(t.clone().requires_grad_());
    gpu_p.push_back(t.to(Device(kCUDA)).requires_grad_());
  }
  Opt cpu_opt(cpu_p, o), gpu_opt(gpu_p, o);
  for (int k = 0; k < steps; ++k) {
    for (size_t i = 0; i < cpu_p.size(); ++i) {
      auto g = tg::randn(cpu_p[i].sizes()).to(dtype);
      cpu_p[i].mutable_grad() = g;
      gpu_p[i].mutable_grad() = g.to(Device(kCUDA));
    }
    cpu_opt.step();
    gpu_opt.step();
  }
  for (size_t i = 0; i < cpu_p.size(); ++i) {
    expect_close(host(gpu_p[i]), host(cpu_p[i]), rtol, rtol, std::string(cpu_opt.name()) + " param " + std::to_string(i));
    if (const auto* st = cpu_opt.state(cpu_p[i]))
      for (const auto& [name, t] : *st)
        expect_close(host(gpu_opt.state(gpu_p[i])->at(name)), host(t), rtol, rtol,
                     std::string(cpu_opt.name()) + " state " + name + " of param " + std::to_string(i));
  }
}

TEST(FusedCuda, AdamEqualsCpu) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  compare_cuda_cpu<optim::Adam>(optim::AdamOptions{.lr = 1e-2}, kFloat32, 1e-6);
  compare_cuda_cpu<optim::Adam>(optim::AdamOptions{.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true}, kFloat32, 1e-6);
  compare_cuda_cpu<optim::AdamW>(optim::AdamWOptions{.lr = 1e-2}, kFloat32, 1e-6);
  compare_cuda_cpu<optim::Adam>(optim::AdamOptions{.lr = 1e-2}, kFloat16, 2e-3);
  compare_cuda_cpu<optim::AdamW>(optim::AdamWOptions{.lr = 1e-2, .amsgrad = true}, kBFloat16, 1e-2);
}

TEST(FusedCuda, SgdEqualsCpu) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  compare_cuda_cpu<optim::SGD>(optim::SGDOptions{.lr = 0.1}, kFloat32, 1e-6);
  compare_cuda_cpu<optim::SGD>(optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-2},
                               kFloat32, 1e-6);
  compare_cuda_cpu<optim::SGD>(optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true}, kFloat16, 2e-3);
  compare_cuda_cpu<optim::SGD>(optim::SGDOptions{.lr = 0.1, .momentum = 0.9}, kBFloat16, 1e-2);
}

TEST(FusedCuda, MixedDevicesInOneGroup) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  auto a = tg::randn({5}).requires_grad_();
  auto b = tg::randn({5}).to(Device(kCUDA)).requires_grad_();
  optim::SGD opt({a, b}, {.lr = 0.5});
  const Vec a0 = host(a), b0 = host(b);
  a.mutable_grad() = tg::ones({5});
  b.mutable_grad() = tg::ones({5}, Device(kCUDA));
  opt.step();  // each device's bucket gets its own step
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_NEAR(host(a)[i], a0[i] - 0.5, 1e-6);
    EXPECT_NEAR(host(b)[i], b0[i] - 0.5, 1e-6);
  }
  // One found_inf cannot serve two devices.
  EXPECT_THROW(opt.step({.found_inf = tg::zeros({}, Device(kCUDA))}), Error);
}

TEST(FusedCuda, NewGradientsAndLoadedStateAreSeen) {
  if (!has_cuda()) GTEST_SKIP() << "no CUDA device";
  // Gradients replaced by new tensors every step (zero_grad(set_to_none) + backward)
  // and state replaced by load_state_dict must reach the kernel, not cached pointers.
  auto p = tg::zeros({3}, Device(kCUDA)).requires_grad_();
  optim::SGD opt({p}, {.lr = 1.0, .momentum = 0.5});
  p.mutable_grad() = tg::ones({3}, Device(kCUDA));
  opt.step();  // buf = 1, p = -1
  p.mutable_grad() = tg::full({3}, 2.0, Device(kCUDA));
  opt.step();  // buf = 0.5 + 2 = 2.5, p = -3.5
  expect_close(host(p), Vec(3, -3.5), 1e-6, 0, "p");
  auto sd = opt.state_dict();
  sd["state.0.momentum_buffer"] = tg::full({3}, 10.0);
  opt.load_state_dict(sd);
  opt.step();  // buf = 5 + 2 = 7, p = -10.5
  expect_close(host(p), Vec(3, -10.5), 1e-6, 0, "p after load");
}

}  // namespace
}  // namespace tg::testing
