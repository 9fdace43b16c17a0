// examples/resnet.h's ResNet-18 against torchvision's resnet18: state_dict names, order and shapes
// (the list below is torchvision's, written out), parameter counts (torchvision: 11,689,512 for
// 1000 classes, 11,181,642 for 10), the initialisation's statistics, forward shapes, bad input,
// and a safetensors save / load round trip. Its numbers are checked against a float64 NumPy
// ResNet-18 by tests/parity/resnet_numpy_check.py and against torchvision by resnet_parity.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "../../examples/resnet.h"
#include "../common/error_of.h"

namespace {

using tg::Shape;
using tg::Tensor;

// torchvision.models.resnet18(num_classes=C).state_dict(): names in order, shapes ("C" = classes).
std::vector<std::pair<std::string, Shape>> torchvision_resnet18(int64_t C) {
  return {
      {"conv1.weight", {64, 3, 7, 7}},
      {"bn1.weight", {64}},
      {"bn1.bias", {64}},
      {"bn1.running_mean", {64}},
      {"bn1.running_var", {64}},
      {"bn1.num_batches_tracked", {}},
      {"layer1.0.conv1.weight", {64, 64, 3, 3}},
      {"layer1.0.bn1.weight", {64}},
      {"layer1.0.bn1.bias", {64}},
      {"layer1.0.bn1.running_mean", {64}},
      {"layer1.0.bn1.running_var", {64}},
      {"layer1.0.bn1.num_batches_tracked", {}},
      {"layer1.0.conv2.weight", {64, 64, 3, 3}},
      {"layer1.0.bn2.weight", {64}},
      {"layer1.0.bn2.bias", {64}},
      {"layer1.0.bn2.running_mean", {64}},
      {"layer1.0.bn2.running_var", {64}},
      {"layer1.0.bn2.num_batches_tracked", {}},
      {"layer1.1.conv1.weight", {64, 64, 3, 3}},
      {"layer1.1.bn1.weight", {64}},
      {"layer1.1.bn1.bias", {64}},
      {"layer1.1.bn1.running_mean", {64}},
      {"layer1.1.bn1.running_var", {64}},
      {"layer1.1.bn1.num_batches_tracked", {}},
      {"layer1.1.conv2.weight", {64, 64, 3, 3}},
      {"layer1.1.bn2.weight", {64}},
      {"layer1.1.bn2.bias", {64}},
      {"layer1.1.bn2.running_mean", {64}},
      {"layer1.1.bn2.running_var", {64}},
      {"layer1.1.bn2.num_batches_tracked", {}},
      {"layer2.0.conv1.weight", {128, 64, 3, 3}},
      {"layer2.0.bn1.weight", {128}},
      {"layer2.0.bn1.bias", {128}},
      {"layer2.0.bn1.running_mean", {128}},
      {"layer2.0.bn1.running_var", {128}},
      {"layer2.0.bn1.num_batches_tracked", {}},
      {"layer2.0.conv2.weight", {128, 128, 3, 3}},
      {"layer2.0.bn2.weight", {128}},
      {"layer2.0.bn2.bias", {128}},
      {"layer2.0.bn2.running_mean", {128}},
      {"layer2.0.bn2.running_var", {128}},
      {"layer2.0.bn2.num_batches_tracked", {}},
      {"layer2.0.downsample.0.weight", {128, 64, 1, 1}},
      {"layer2.0.downsample.1.weight", {128}},
      {"layer2.0.downsample.1.bias", {128}},
      {"layer2.0.downsample.1.running_mean", {128}},
      {"layer2.0.downsample.1.running_var", {128}},
      {"layer2.0.downsample.1.num_batches_tracked", {}},
      {"layer2.1.conv1.weight", {128, 128, 3, 3}},
      {"layer2.1.bn1.weight", {128}},
      {"layer2.1.bn1.bias", {128}},
      {"layer2.1.bn1.running_mean", {128}},
      {"layer2.1.bn1.running_var", {128}},
      {"layer2.1.bn1.num_batches_tracked", {}},
      {"layer2.1.conv2.weight", {128, 128, 3, 3}},
      {"layer2.1.bn2.weight", {128}},
      {"layer2.1.bn2.bias", {128}},
      {"layer2.1.bn2.running_mean", {128}},
      {"layer2.1.bn2.running_var", {128}},
      {"layer2.1.bn2.num_batches_tracked", {}},
      {"layer3.0.conv1.weight", {256, 128, 3, 3}},
      {"layer3.0.bn1.weight", {256}},
      {"layer3.0.bn1.bias", {256}},
      {"layer3.0.bn1.running_mean", {256}},
      {"layer3.0.bn1.running_var", {256}},
      {"layer3.0.bn1.num_batches_tracked", {}},
      {"layer3.0.conv2.weight", {256, 256, 3, 3}},
      {"layer3.0.bn2.weight", {256}},
      {"layer3.0.bn2.bias", {256}},
      {"layer3.0.bn2.running_mean", {256}},
      {"layer3.0.bn2.running_var", {256}},
      {"layer3.0.bn2.num_batches_tracked", {}},
      {"layer3.0.downsample.0.weight", {256, 128, 1, 1}},
      {"layer3.0.downsample.1.weight", {256}},
      {"layer3.0.downsample.1.bias", {256}},
      {"layer3.0.downsample.1.running_mean", {256}},
      {"layer3.0.downsample.1.running_var", {256}},
      {"layer3.0.downsample.1.num_batches_tracked", {}},
      {"layer3.1.conv1.weight", {256, 256, 3, 3}},
      {"layer3.1.bn1.weight", {256}},
      {"layer3.1.bn1.bias", {256}},
      {"layer3.1.bn1.running_mean", {256}},
      {"layer3.1.bn1.running_var", {256}},
      {"layer3.1.bn1.num_batches_tracked", {}},
      {"layer3.1.conv2.weight", {256, 256, 3, 3}},
      {"layer3.1.bn2.weight", {256}},
      {"layer3.1.bn2.bias", {256}},
      {"layer3.1.bn2.running_mean", {256}},
      {"layer3.1.bn2.running_var", {256}},
      {"layer3.1.bn2.num_batches_tracked", {}},
      {"layer4.0.conv1.weight", {512, 256, 3, 3}},
      {"layer4.0.bn1.weight", {512}},
      {"layer4.0.bn1.bias", {512}},
      {"layer4.0.bn1.running_mean", {512}},
      {"layer4.0.bn1.running_var", {512}},
      {"layer4.0.bn1.num_batches_tracked", {}},
      {"layer4.0.conv2.weight", {512, 512, 3, 3}},
      {"layer4.0.bn2.weight", {512}},
      {"layer4.0.bn2.bias", {512}},
      {"layer4.0.bn2.running_mean", {512}},
      {"layer4.0.bn2.running_var", {512}},
      {"layer4.0.bn2.num_batches_tracked", {}},
      {"layer4.0.downsample.0.weight", {512, 256, 1, 1}},
      {"layer4.0.downsample.1.weight", {512}},
      {"layer4.0.downsample.1.bias", {512}},
      {"layer4.0.downsample.1.running_mean", {512}},
      {"layer4.0.downsample.1.running_var", {512}},
      {"layer4.0.downsample.1.num_batches_tracked", {}},
      {"layer4.1.conv1.weight", {512, 512, 3, 3}},
      {"layer4.1.bn1.weight", {512}},
      {"layer4.1.bn1.bias", {512}},
      {"layer4.1.bn1.running_mean", {512}},
      {"layer4.1.bn1.running_var", {512}},
      {"layer4.1.bn1.num_batches_tracked", {}},
      {"layer4.1.conv2.weight", {512, 512, 3, 3}},
      {"layer4.1.bn2.weight", {512}},
      {"layer4.1.bn2.bias", {512}},
      {"layer4.1.bn2.running_mean", {512}},
      {"layer4.1.bn2.running_var", {512}},
      {"layer4.1.bn2.num_batches_tracked", {}},
      {"fc.weight", {C, 512}},
      {"fc.bias", {C}},
  };
}

// Same shape and bit-equal values (as float64, which holds every float32 and int64 used here).
bool same(const Tensor& a, const Tensor& b) {
  return a.sizes() == b.sizes() && (a.to(tg::kFloat64) - b.to(tg::kFloat64)).abs().max().item<double>() == 0;
}

int64_t count(const tg::nn::Module& m) {
  int64_t n = 0;
  for (const Tensor& p : m.parameters()) n += p.numel();
  return n;
}

TEST(ResNet18, StateDictHasTorchvisionNamesOrderAndShapes) {
  for (int64_t classes : {10, 1000}) {
    tg::manual_seed(0);
    resnet::ResNet18 model(classes);
    const tg::nn::StateDict sd = model.state_dict();
    const auto want = torchvision_resnet18(classes);
    ASSERT_EQ(sd.size(), want.size());
    size_t i = 0;
    for (const auto& [name, t] : sd) {
      EXPECT_EQ(name, want[i].first) << "entry " << i;
      EXPECT_EQ(t.sizes(), want[i].second) << name;
      EXPECT_EQ(t.dtype(), name.ends_with("num_batches_tracked") ? tg::kInt64 : tg::kFloat32) << name;
      ++i;
    }
    EXPECT_EQ(model.named_parameters().size(), 62u);  // torchvision: 62 parameters, 60 buffers
    EXPECT_EQ(model.named_buffers().size(), 60u);
  }
}

TEST(ResNet18, ParameterCountsAreTorchvisions) {
  EXPECT_EQ(count(resnet::ResNet18(10)), 11181642);
  EXPECT_EQ(count(resnet::ResNet18(1000)), 11689512);
  EXPECT_EQ(count(resnet::ResNet18()), 11689512);  // num_classes defaults to 1000, as torchvision
}

// torchvision's init: convs N(0, 2 / fan_out) (kaiming_normal_, fan_out, relu); batch norms 1 / 0 and
// running stats 0 / 1; fc as nn.Linear, U(+-1 / sqrt(512)).
TEST(ResNet18, InitialisationIsTorchvisions) {
  tg::manual_seed(3);
  resnet::ResNet18 model(10);
  const Tensor w = model.layers[3]->named_parameters()[0].second;  // layer4.0.conv1.weight [512, 256, 3, 3]
  ASSERT_EQ(w.sizes(), Shape({512, 256, 3, 3}));
  const double want_std = std::sqrt(2.0 / (512.0 * 9.0));
  EXPECT_NEAR(w.mean().item<double>(), 0.0, 0.01 * want_std);
  EXPECT_NEAR(w.std().item<double>(), want_std, 0.005 * want_std);  // 1.2M samples: ~0.07% sd of the estimate
  const Tensor c1 = model.conv1->weight;                            // fan_out 64 * 49
  EXPECT_NEAR(c1.std().item<double>(), std::sqrt(2.0 / (64.0 * 49.0)), 0.03 * std::sqrt(2.0 / (64.0 * 49.0)));
  EXPECT_EQ(model.bn1->weight.min().item<float>(), 1.0f);
  EXPECT_EQ(model.bn1->weight.max().item<float>(), 1.0f);
  EXPECT_EQ(model.bn1->bias.abs().max().item<float>(), 0.0f);
  EXPECT_EQ(model.bn1->running_var.min().item<float>(), 1.0f);
  const double bound = 1.0 / std::sqrt(512.0);
  EXPECT_LE(model.fc->weight.abs().max().item<double>(), bound);
  EXPECT_GT(model.fc->weight.abs().max().item<double>(), 0.95 * bound);
}

TEST(ResNet18, ForwardShapesForCifarAndImagenetSizes) {
  tg::manual_seed(1);
  resnet::ResNet18 model(10);
  model.eval();
  tg::NoGradGuard no_grad;
  EXPECT_EQ(model(tg::randn({2, 3, 32, 32})).sizes(), Shape({2, 10}));
  EXPECT_EQ(model(tg::randn({1, 3, 64, 48})).sizes(), Shape({1, 10}));
  // After the stem and 3 stride-2 stages a 32x32 image is 1x1 before the average pool.
  Tensor h = (*model.maxpool)(tg::relu((*model.bn1)((*model.conv1)(tg::randn({1, 3, 32, 32})))));
  EXPECT_EQ(h.sizes(), Shape({1, 64, 8, 8}));
  for (auto& layer : model.layers) h = (*layer)(h);
  EXPECT_EQ(h.sizes(), Shape({1, 512, 1, 1}));
}

TEST(ResNet18, BadInputIsAnErrorNamingTheModelAndShape) {
  resnet::ResNet18 model(10);
  const std::string msg = tg::testing::error_of([&] { model(tg::randn({2, 1, 32, 32})); });
  EXPECT_NE(msg.find("ResNet18"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 1, 32, 32]"), std::string::npos) << msg;
  const std::string zero = tg::testing::error_of([] { resnet::ResNet18 bad(0); });
  EXPECT_NE(zero.find("num_classes must be > 0, got 0"), std::string::npos) << zero;
}

TEST(ResNet18, SaveLoadRoundTripGivesTheSameModel) {
  namespace fs = std::filesystem;
  const std::string path =
      (fs::temp_directory_path() / ("tg_resnet18_" + std::to_string(::getpid()) + ".safetensors")).string();
  tg::manual_seed(5);
  resnet::ResNet18 a(10);
  // One training-mode forward moves the running statistics off their initial values.
  a(tg::randn({4, 3, 32, 32}));
  tg::save(a.state_dict(), path);
  tg::manual_seed(6);
  resnet::ResNet18 b(10);
  b.load_state_dict(tg::load(path));
  fs::remove(path);
  const tg::nn::StateDict sa = a.state_dict(), sb = b.state_dict();
  for (const auto& [name, t] : sa) {
    EXPECT_TRUE(same(t, sb.at(name))) << name;
  }
  EXPECT_EQ(sb.at("layer2.0.bn1.num_batches_tracked").item<int64_t>(), 1);
  a.eval();
  b.eval();
  tg::NoGradGuard no_grad;
  const Tensor x = tg::randn({2, 3, 32, 32});
  EXPECT_TRUE(same(a(x), b(x)));
}

}  // namespace
