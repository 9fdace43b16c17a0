// Convergence: the regression example's training loop (TensorDataset +
// shuffling DataLoader + Sequential(Linear(64, 1)) + Adam + MSE) at a small
// size on the CPU, on a planted linear target with noise std 0.1. Stated
// result: the last epoch's mean loss < 0.02 (the noise floor is 0.01), and the
// learned weights are within 0.05 of the planted ones.
#include <gtest/gtest.h>

#include <tapegrad/tapegrad.h>

#include <tapegrad/optim/adam.h>

#include <cmath>

namespace {

TEST(TrainRegression, ConvergesOnCpu) {
  tg::manual_seed(0);
  const int64_t rows = 8192, features = 64;
  auto raw = tg::rand({rows, features});
  auto feat = ((raw - raw.mean(0)) / raw.std(0)).contiguous();
  auto w_true = tg::randn({features, 1}) / 8.0;
  auto y = (tg::matmul(feat, w_true) + 0.5 + tg::randn({rows, 1}) * 0.1).contiguous();

  tg::data::TensorDataset ds(feat, y);
  tg::data::DataLoader loader(ds, {.batch_size = 256, .shuffle = true, .seed = 1});
  tg::nn::Sequential net(tg::nn::Linear(features, 1));
  tg::optim::Adam opt(net.parameters(), {.lr = 1e-2});
  double first = 0, last = 0;
  for (int epoch = 0; epoch < 12; ++epoch) {
    tg::Tensor total = tg::zeros({});
    for (auto [xb, yb] : loader) {
      opt.zero_grad();
      auto loss = tg::nn::functional::mse_loss(net(xb), yb);
      loss.backward();
      opt.step();
      total.add_(loss.detach());
    }
    double mean = total.item<double>() / static_cast<double>(loader.size());
    if (epoch == 0) first = mean;
    last = mean;
  }
  EXPECT_LT(last, 0.02) << "first epoch " << first;
  EXPECT_LT(last, first);
  auto w = net.state_dict()["0.weight"].to(tg::kFloat64).contiguous().to_vector<double>();
  auto wt = w_true.to(tg::kFloat64).contiguous().to_vector<double>();
  for (int64_t i = 0; i < features; ++i) EXPECT_NEAR(w[i], wt[i], 0.05) << i;
  EXPECT_NEAR(net.state_dict()["0.bias"].item<double>(), 0.5, 0.05);
}

}  // namespace
