// The classifier example's training (examples/classify.h) on files the test writes itself: an
// easy separable dataset as .npy (float features, int64 labels) and as IDX (uint8 images, uint8
// labels); test accuracy must reach 95%. Parity mode's first loss is checked against a float64
// cross-entropy computed here from the same initial weights; the checkpoint holds torch's names.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../../examples/classify.h"
#include "../autograd/common.h"

namespace {

using tg::Tensor;
using tg::testing::Dev;
namespace fs = std::filesystem;

class ClassifyExample : public ::testing::TestWithParam<Dev> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tg_classify_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(static_cast<int>(GetParam())));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& n) const { return (dir_ / n).string(); }
  std::string dev() const { return GetParam() == Dev::CUDA ? "cuda" : "cpu"; }

  // Labels 0, 1, 2, 0, ... (every class in any run of rows, so in the test rows too).
  static Tensor cyclic_labels(int64_t n, int64_t classes) {
    std::vector<int64_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i % classes;
    return tg::tensor(v);
  }
  // Three Gaussian blobs in 8 dims: centres ~N(0, 4), noise sd 0.5.
  static void blobs(int64_t n, Tensor& x, Tensor& y) {
    tg::manual_seed(11);
    y = cyclic_labels(n, 3);
    const Tensor centres = tg::randn({3, 8}) * 2.0;
    x = (tg::index_select(centres, 0, y) + tg::randn({n, 8}) * 0.5).contiguous();
  }
  fs::path dir_;
};

TEST_P(ClassifyExample, LearnsSeparableNpyData) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  Tensor x, y;
  blobs(600, x, y);
  tg::save_npy(x, path("X.npy"));
  tg::save_npy(y, path("y.npy"));
  classify::Options o{.x = path("X.npy"), .y = path("y.npy"), .test_size = 0.25, .hidden = 32, .epochs = 15,
                      .batch = 32, .lr = 1e-2, .seed = 3, .device = dev(), .out = path("ck.safetensors"),
                      .progress = false};
  std::vector<std::string> log;
  const classify::Result r = classify::train(o, [&](const std::string& s) { log.push_back(s); });
  EXPECT_EQ(r.train_rows, 450);
  EXPECT_EQ(r.test_rows, 150);
  EXPECT_EQ(r.num_classes, 3);
  EXPECT_EQ(r.features, 8);
  ASSERT_EQ(r.epochs.size(), 15u);
  EXPECT_GE(r.epochs.back().test_accuracy, 0.95);
  EXPECT_LT(r.epochs.back().train_loss, r.epochs.front().train_loss);
  // One line per epoch after the header, then the checkpoint.
  ASSERT_EQ(log.size(), 17u);
  EXPECT_NE(log[1].find("epoch 1/15 train_loss"), std::string::npos) << log[1];
  EXPECT_NE(log[1].find("test_acc"), std::string::npos) << log[1];
  const tg::nn::StateDict ck = tg::load(path("ck.safetensors"));
  EXPECT_EQ(ck.at("0.weight").sizes(), (tg::Shape{32, 8}));
  EXPECT_EQ(ck.at("0.bias").sizes(), (tg::Shape{32}));
  EXPECT_EQ(ck.at("2.weight").sizes(), (tg::Shape{3, 32}));
  EXPECT_EQ(ck.at("2.bias").sizes(), (tg::Shape{3}));
}

TEST_P(ClassifyExample, LearnsIdxImagesWithASeparateTestSet) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  // 4x4 uint8 "images": class c lights up row c (value 200), plus noise up to 55.
  tg::manual_seed(5);
  auto make = [&](int64_t n, const std::string& xs, const std::string& ys) {
    const Tensor labels = cyclic_labels(n, 4);
    const Tensor rows = (tg::arange(0, 4, 1, tg::kInt64).reshape({1, 4, 1}) == labels.reshape({n, 1, 1}))
                            .to(tg::kFloat32) * 200.0;
    const Tensor img = (rows + tg::rand({n, 4, 4}) * 55.0).to(tg::kUInt8);
    tg::save_idx(img, xs);
    tg::save_idx(labels.to(tg::kUInt8), ys);
  };
  make(400, path("train-images-idx3-ubyte"), path("train-labels-idx1-ubyte"));
  make(100, path("t10k-images-idx3-ubyte"), path("t10k-labels-idx1-ubyte"));
  classify::Options o{.x = path("train-images-idx3-ubyte"), .y = path("train-labels-idx1-ubyte"),
                      .test_x = path("t10k-images-idx3-ubyte"), .test_y = path("t10k-labels-idx1-ubyte"),
                      .hidden = 16, .epochs = 10, .batch = 16, .lr = 1e-2, .device = dev(), .progress = false};
  const classify::Result r = classify::train(o);
  EXPECT_EQ(r.train_rows, 400);
  EXPECT_EQ(r.test_rows, 100);
  EXPECT_EQ(r.features, 16);
  EXPECT_EQ(r.num_classes, 4);
  EXPECT_GE(r.epochs.back().test_accuracy, 0.95);
}

TEST_P(ClassifyExample, ParityModeFirstLossMatchesAFloat64Reference) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  Tensor x, y;
  blobs(40, x, y);
  tg::save_npy(x, path("X.npy"));
  tg::save_npy(y, path("y.npy"));
  tg::manual_seed(9);
  tg::nn::StateDict init;
  init.insert("0.weight", tg::randn({6, 8}) * 0.3);
  init.insert("0.bias", tg::randn({6}) * 0.1);
  init.insert("2.weight", tg::randn({3, 6}) * 0.3);
  init.insert("2.bias", tg::randn({3}) * 0.1);
  tg::save(init, path("init.safetensors"));
  tg::nn::StateDict order;
  order.insert("order", tg::tensor(std::vector<int64_t>{4, 0, 7, 1, 2, 3, 5, 6}, tg::Shape{2, 4}));
  tg::save(order, path("order.safetensors"));
  classify::Options o{.x = path("X.npy"), .y = path("y.npy"), .test_size = 10, .hidden = 6, .lr = 1e-2,
                      .device = dev(), .init = path("init.safetensors"), .order = path("order.safetensors"),
                      .progress = false};
  const classify::Result r = classify::train(o);
  ASSERT_EQ(r.step_losses.size(), 2u);
  // Step 0's loss from the initial weights, in float64 on the host.
  auto h = [](const Tensor& t) { return tg::testing::host(t); };
  const auto xs = h(x), w1 = h(init.at("0.weight")), b1 = h(init.at("0.bias")), w2 = h(init.at("2.weight")),
             b2 = h(init.at("2.bias")), ys = h(y);
  double total = 0;
  for (int64_t row : {4, 0, 7, 1}) {
    std::vector<double> hid(6), logit(3);
    for (int j = 0; j < 6; ++j) {
      double a = b1[j];
      for (int k = 0; k < 8; ++k) a += w1[j * 8 + k] * xs[row * 8 + k];
      hid[j] = std::max(a, 0.0);
    }
    double mx = -1e300;
    for (int c = 0; c < 3; ++c) {
      logit[c] = b2[c];
      for (int j = 0; j < 6; ++j) logit[c] += w2[c * 6 + j] * hid[j];
      mx = std::max(mx, logit[c]);
    }
    double se = 0;
    for (double l : logit) se += std::exp(l - mx);
    total += mx + std::log(se) - logit[static_cast<int>(ys[row])];
  }
  EXPECT_NEAR(r.step_losses[0], total / 4, 1e-5 * total / 4);
  EXPECT_TRUE(std::isfinite(r.step_losses[1]));
  EXPECT_NE(r.step_losses[1], r.step_losses[0]);  // Adam moved the weights
}

// Gradient accumulation: K micro-batches of B/K rows (each loss weighted by its share) take the
// same optimizer steps as one batch of B rows, including the epoch's short last batch (450 rows:
// 14 batches of 32 and one of 2), so after two epochs the weights agree to float rounding.
TEST(ClassifyAccumulation, MicroBatchesGiveTheSameWeightsAsOneBatch) {
  const fs::path d = fs::temp_directory_path() / ("tg_classify_accum_" + std::to_string(::getpid()));
  fs::create_directories(d);
  tg::manual_seed(11);
  std::vector<int64_t> labels(600);
  for (int i = 0; i < 600; ++i) labels[static_cast<size_t>(i)] = i % 3;
  const Tensor y = tg::tensor(labels);
  const Tensor x = (tg::index_select(tg::randn({3, 8}) * 2.0, 0, y) + tg::randn({600, 8}) * 0.5).contiguous();
  tg::save_npy(x, (d / "X.npy").string());
  tg::save_npy(y, (d / "y.npy").string());
  auto train = [&](int64_t k) {
    const std::string ck = (d / ("ck" + std::to_string(k) + ".safetensors")).string();
    classify::Options o{.x = (d / "X.npy").string(), .y = (d / "y.npy").string(), .test_size = 0.25, .hidden = 16,
                        .epochs = 2, .batch = 32, .lr = 1e-2, .seed = 4, .out = ck, .progress = false,
                        .accum_steps = k};
    classify::Result r = classify::train(o);
    return std::make_pair(std::move(r), tg::load(ck));
  };
  const auto [r1, w1] = train(1);
  for (int64_t k : {2, 4, 8}) {
    const auto [rk, wk] = train(k);
    for (const char* name : {"0.weight", "0.bias", "2.weight", "2.bias"}) {
      const auto a = tg::testing::host(w1.at(name)), b = tg::testing::host(wk.at(name));
      ASSERT_EQ(a.size(), b.size());
      double worst = 0, scale = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        worst = std::max(worst, std::abs(a[i] - b[i]));
        scale = std::max(scale, std::abs(a[i]));
      }
      EXPECT_LE(worst, 2e-5 * std::max(scale, 1.0)) << "K = " << k << ", " << name;
    }
    for (size_t e = 0; e < 2; ++e)
      EXPECT_NEAR(rk.epochs[e].train_loss, r1.epochs[e].train_loss, 1e-5) << "K = " << k;
  }
  // The weights moved: a check that the comparison is not of two untrained nets.
  const auto [r0, w0] = [&] {
    classify::Options o{.x = (d / "X.npy").string(), .y = (d / "y.npy").string(), .test_size = 0.25, .hidden = 16,
                        .epochs = 0, .batch = 32, .lr = 1e-2, .seed = 4, .out = (d / "ck0.safetensors").string(),
                        .progress = false};
    classify::Result r = classify::train(o);
    return std::make_pair(std::move(r), tg::load((d / "ck0.safetensors").string()));
  }();
  EXPECT_GT((w0.at("0.weight") - w1.at("0.weight")).abs().max().item<double>(), 1e-3);
  classify::Options bad{.x = (d / "X.npy").string(), .y = (d / "y.npy").string(), .batch = 32, .progress = false,
                        .accum_steps = 3};
  EXPECT_THROW(classify::train(bad), tg::Error);
  fs::remove_all(d);
}

// The accumulated gradient itself (SGD would show a wrong weighting; Adam, above, is blind to a
// uniform scale): k micro-batches of a batch of 30 rows (full, and split unevenly for k = 4 and 7)
// against the whole batch's gradient and against a float64 cross-entropy gradient of the last layer.
TEST(ClassifyAccumulation, MicroBatchGradientsSumToTheBatchGradient) {
  tg::manual_seed(2);
  tg::nn::Sequential net = classify::make_model(5, 7, 3);
  const Tensor x = tg::randn({30, 5});
  std::vector<int64_t> labels(30);
  for (int i = 0; i < 30; ++i) labels[static_cast<size_t>(i)] = (i * 7) % 3;
  const Tensor y = tg::tensor(labels);
  auto grads = [&](int64_t k, double* loss) {
    for (auto& p : net.parameters()) p.mutable_grad() = Tensor();
    *loss = classify::backward_in_micro_batches(net, x, y, k).item<double>();
    std::vector<std::vector<double>> g;
    for (auto& p : net.parameters()) g.push_back(tg::testing::host(p.grad()));
    return g;
  };
  double l1 = 0;
  const auto g1 = grads(1, &l1);
  // float64 reference for the last layer's bias gradient: mean over rows of softmax - onehot.
  {
    tg::NoGradGuard ng;
    const auto logits = tg::testing::host(net(x));
    std::vector<double> ref(3, 0.0);
    double ref_loss = 0;
    for (int i = 0; i < 30; ++i) {
      double mx = -1e300, se = 0;
      for (int c = 0; c < 3; ++c) mx = std::max(mx, logits[i * 3 + c]);
      for (int c = 0; c < 3; ++c) se += std::exp(logits[i * 3 + c] - mx);
      for (int c = 0; c < 3; ++c) ref[c] += (std::exp(logits[i * 3 + c] - mx) / se - (labels[i] == c)) / 30.0;
      ref_loss += (mx + std::log(se) - logits[i * 3 + labels[i]]) / 30.0;
    }
    EXPECT_NEAR(l1, ref_loss, 1e-5);
    for (int c = 0; c < 3; ++c) EXPECT_NEAR(g1[3][c], ref[c], 1e-6) << c;  // parameters(): 0.w, 0.b, 2.w, 2.b
  }
  for (int64_t k : {2, 3, 4, 7, 30}) {
    double lk = 0;
    const auto gk = grads(k, &lk);
    EXPECT_NEAR(lk, l1, 1e-6) << "k = " << k;
    ASSERT_EQ(gk.size(), g1.size());
    for (size_t p = 0; p < g1.size(); ++p)
      for (size_t i = 0; i < g1[p].size(); ++i) ASSERT_NEAR(gk[p][i], g1[p][i], 1e-6) << "k = " << k << " p " << p;
  }
}

// --metrics: one record per epoch holding what train() reports.
TEST(ClassifyMetrics, OneRecordPerEpochWithTheReportedValues) {
  const fs::path d = fs::temp_directory_path() / ("tg_classify_metrics_" + std::to_string(::getpid()));
  fs::create_directories(d);
  const std::string log = (d / "m.csv").string();
  classify::Options o{.test_size = 0.2, .hidden = 16, .epochs = 3, .batch = 50, .lr = 5e-3, .progress = false,
                      .synthetic = 500, .metrics = log};
  const classify::Result r = classify::train(o);
  EXPECT_EQ(r.num_classes, 10);
  EXPECT_EQ(r.features, 64);
  EXPECT_EQ(r.train_rows, 400);
  std::ifstream in(log);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "step,epoch,time,train_loss,test_accuracy,lr,samples_per_s");
  for (int e = 0; e < 3; ++e) {
    ASSERT_TRUE(std::getline(in, line));
    std::vector<double> c;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) c.push_back(std::stod(cell));
    ASSERT_EQ(c.size(), 7u) << line;
    EXPECT_EQ(c[0], 8.0 * (e + 1));  // 400 rows / 50
    EXPECT_EQ(c[1], e);
    EXPECT_EQ(c[3], r.epochs[static_cast<size_t>(e)].train_loss);  // exact: round-trip printing
    EXPECT_EQ(c[4], r.epochs[static_cast<size_t>(e)].test_accuracy);
    EXPECT_EQ(c[5], 5e-3);
    EXPECT_EQ(c[6], r.epochs[static_cast<size_t>(e)].samples_per_s);
    EXPECT_GT(c[6], 0.0);
  }
  EXPECT_FALSE(std::getline(in, line));
  // An existing log is not overwritten.
  EXPECT_THROW(classify::train(o), tg::Error);
  fs::remove_all(d);
}

TEST(ClassifyExampleErrors, BadInputsAreErrors) {
  const std::string d = (fs::temp_directory_path() / ("tg_classify_err_" + std::to_string(::getpid()))).string();
  fs::create_directories(d);
  tg::save_npy(tg::zeros({5, 2}), d + "/X.npy");
  tg::save_npy(tg::zeros({4}, tg::kInt64), d + "/y4.npy");
  tg::save_npy(tg::zeros({5}), d + "/yf.npy");
  tg::save_npy(tg::zeros({5}, tg::kInt64), d + "/y.npy");
  auto expect_error = [&](classify::Options o, const std::string& needle) {
    o.progress = false;
    try {
      (void)classify::train(o);
      ADD_FAILURE() << "no error (wanted '" << needle << "')";
    } catch (const tg::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({.x = d + "/X.npy", .y = d + "/y4.npy"}, "5 feature rows but 4 labels");
  expect_error({.x = d + "/X.npy", .y = d + "/yf.npy"}, "1-d integer tensor");
  expect_error({.x = d + "/X.npy", .y = d + "/y.npy", .test_size = 5}, "leaves no training rows");
  expect_error({.x = d + "/X.npy", .y = d + "/y.npy", .device = "tpu"}, "cpu or cuda");
  expect_error({.x = d + "/missing", .y = d + "/y.npy"}, "tg::load_idx");
  fs::remove_all(d);
}

INSTANTIATE_TEST_SUITE_P(Dev, ClassifyExample, ::testing::Values(Dev::CPU, Dev::CUDA), tg::testing::dev_name);

}  // namespace
