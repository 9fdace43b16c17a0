// Learning-rate schedules: builds each tg::optim::lr_scheduler class on an SGD (or Adam) with two
// parameter groups (lr 0.1 and 0.02), steps it 100 times, and prints every group's lr after the
// constructor and after each step (and the cycled momentum / beta1 for OneCycleLR) as one JSON
// object. tests/parity/lr_scheduler_parity.py runs the same configurations in PyTorch and compares.
//
//   lr_schedules [--steps N]
#include <tapegrad/tapegrad.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ls = tg::optim::lr_scheduler;

namespace {

struct Run {
  std::vector<std::vector<double>> lrs, momentum;
};

// The ReduceLROnPlateau metric at step e: improving for 30 steps, then a plateau with wiggles.
double plateau_metric(int e) { return e < 30 ? 10.0 - 0.2 * e : 4.0 + 0.001 * ((e * 7) % 5); }

std::vector<tg::Tensor> one_param(int n) { return {tg::zeros({n}, tg::kFloat64).requires_grad_()}; }

std::unique_ptr<tg::optim::SGD> make_sgd() {
  using Group = tg::optim::ParamGroup<tg::optim::SGDOptions>;
  return std::make_unique<tg::optim::SGD>(
      std::vector<Group>{{one_param(3), {.lr = 0.1, .momentum = 0.9}}, {one_param(2), {.lr = 0.02, .momentum = 0.9}}},
      tg::optim::SGDOptions{.lr = 0.1});
}

// Steps a scheduler made by `make` on `opt`; `momentum` reads the cycled value of a group.
Run run(tg::optim::Optimizer& opt, const std::function<std::unique_ptr<ls::LRScheduler>(tg::optim::Optimizer&)>& make,
        int steps, const std::function<double(size_t)>& momentum = {}) {
  Run r;
  auto s = make(opt);
  auto* plateau = dynamic_cast<ls::ReduceLROnPlateau*>(s.get());
  auto record = [&] {
    r.lrs.push_back(s->get_last_lr());
    if (momentum) {
      std::vector<double> m;
      for (size_t g = 0; g < opt.num_param_groups(); ++g) m.push_back(momentum(g));
      r.momentum.push_back(m);
    }
  };
  record();
  for (int e = 0; e < steps; ++e) {
    if (plateau != nullptr)
      plateau->step(plateau_metric(e));
    else
      s->step();
    record();
  }
  return r;
}

void print_rows(const std::vector<std::vector<double>>& rows) {
  std::printf("[");
  for (size_t i = 0; i < rows.size(); ++i) {
    std::printf("%s[", i ? "," : "");
    for (size_t g = 0; g < rows[i].size(); ++g) std::printf("%s%.17g", g ? "," : "", rows[i][g]);
    std::printf("]");
  }
  std::printf("]");
}

}  // namespace

int main(int argc, char** argv) try {
  int steps = 100;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: lr_schedules [--steps N]\n");
      return 2;
    }
  }
  using Make = std::function<std::unique_ptr<ls::LRScheduler>(tg::optim::Optimizer&)>;
  std::vector<std::pair<std::string, Make>> sgd_cases = {
      {"StepLR", [](auto& o) { return std::make_unique<ls::StepLR>(o, 7, 0.5); }},
      {"MultiStepLR",
       [](auto& o) {
         return std::make_unique<ls::MultiStepLR>(o, std::vector<int64_t>{10, 25, 25, 60}, 0.3);
       }},
      {"ConstantLR", [](auto& o) { return std::make_unique<ls::ConstantLR>(o, 0.25, 12); }},
      {"LinearLR", [](auto& o) { return std::make_unique<ls::LinearLR>(o, 0.2, 0.9, 30); }},
      {"ExponentialLR", [](auto& o) { return std::make_unique<ls::ExponentialLR>(o, 0.97); }},
      {"CosineAnnealingLR", [](auto& o) { return std::make_unique<ls::CosineAnnealingLR>(o, 40, 0.001); }},
      {"CosineAnnealingWarmRestarts",
       [](auto& o) { return std::make_unique<ls::CosineAnnealingWarmRestarts>(o, 10, 2, 0.0005); }},
      {"LambdaLR",
       [](auto& o) {
         return std::make_unique<ls::LambdaLR>(
             o, std::vector<std::function<double(int64_t)>>{[](int64_t e) { return 1.0 / (1.0 + 0.05 * e); },
                                                            [](int64_t e) { return std::pow(0.99, e); }});
       }},
      {"SequentialLR",
       [](auto& o) {
         auto a = std::make_shared<ls::LinearLR>(o, 0.1, 1.0, 5);
         auto b = std::make_shared<ls::CosineAnnealingLR>(o, 60);
         return std::make_unique<ls::SequentialLR>(o, std::vector<std::shared_ptr<ls::LRScheduler>>{a, b},
                                                   std::vector<int64_t>{5});
       }},
      {"SequentialLR3",
       [](auto& o) {
         auto a = std::make_shared<ls::ConstantLR>(o, 0.5, 3);
         auto b = std::make_shared<ls::ExponentialLR>(o, 0.9);
         auto c = std::make_shared<ls::StepLR>(o, 10, 0.5);
         return std::make_unique<ls::SequentialLR>(o, std::vector<std::shared_ptr<ls::LRScheduler>>{a, b, c},
                                                   std::vector<int64_t>{10, 30});
       }},
      {"SequentialLRWarmRestarts",
       [](auto& o) {
         auto a = std::make_shared<ls::ConstantLR>(o, 0.5, 5);
         auto b = std::make_shared<ls::CosineAnnealingWarmRestarts>(o, 10, 1, 0.001);
         return std::make_unique<ls::SequentialLR>(o, std::vector<std::shared_ptr<ls::LRScheduler>>{a, b},
                                                   std::vector<int64_t>{8});
       }},
      {"ReduceLROnPlateau",
       [](auto& o) {
         return std::make_unique<ls::ReduceLROnPlateau>(
             o, ls::ReduceLROnPlateauOptions{
                    .factor = 0.7, .patience = 3, .threshold = 0.01, .cooldown = 2, .min_lr = {1e-3}});
       }},
      {"ReduceLROnPlateauMaxAbs",
       [](auto& o) {
         return std::make_unique<ls::ReduceLROnPlateau>(o, ls::ReduceLROnPlateauOptions{.mode = "max",
                                                                                        .factor = 0.5,
                                                                                        .patience = 2,
                                                                                        .threshold = 0.05,
                                                                                        .threshold_mode = "abs",
                                                                                        .min_lr = {1e-3, 1e-4}});
       }},
  };
  std::printf("{");
  bool first = true;
  auto emit = [&](const std::string& name, const Run& r) {
    std::printf("%s\n\"%s\": {\"lr\": ", first ? "" : ",", name.c_str());
    print_rows(r.lrs);
    if (!r.momentum.empty()) {
      std::printf(", \"momentum\": ");
      print_rows(r.momentum);
    }
    std::printf("}");
    first = false;
  };
  for (const auto& [name, make] : sgd_cases) {
    auto opt = make_sgd();
    emit(name, run(*opt, make, steps));
  }
  {  // 1cycle, two phases, cosine, SGD momentum cycled
    auto opt = make_sgd();
    emit("OneCycleLR", run(
                           *opt,
                           [&](auto& o) {
                             return std::make_unique<ls::OneCycleLR>(o, std::vector<double>{0.5, 0.1},
                                                                     ls::OneCycleLROptions{.total_steps = steps});
                           },
                           steps, [&](size_t g) { return opt->param_groups()[g].options.momentum; }));
  }
  {  // 1cycle, three phases, linear, Adam's beta1 cycled
    using Group = tg::optim::ParamGroup<tg::optim::AdamOptions>;
    tg::optim::Adam opt(std::vector<Group>{{one_param(3), {.lr = 0.1, .betas = {0.9, 0.98}}},
                                           {one_param(2), {.lr = 0.02, .betas = {0.9, 0.98}}}},
                        tg::optim::AdamOptions{.lr = 0.1});
    emit("OneCycleLRLinearThreePhaseAdam",
         run(
             opt,
             [&](auto& o) {
               return std::make_unique<ls::OneCycleLR>(o, 0.8,
                                                       ls::OneCycleLROptions{.epochs = steps / 10,
                                                                             .steps_per_epoch = 10,
                                                                             .pct_start = 0.25,
                                                                             .anneal_strategy = "linear",
                                                                             .base_momentum = {0.8},
                                                                             .max_momentum = {0.9},
                                                                             .div_factor = 10,
                                                                             .final_div_factor = 100,
                                                                             .three_phase = true});
             },
             steps, [&](size_t g) { return opt.param_groups()[g].options.betas.first; }));
  }
  std::printf("\n}\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "lr_schedules: %s\n", e.what());
  return 1;
}
