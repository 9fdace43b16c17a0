// ResNet-18 with torchvision's module layout, so its state_dict names are torchvision's
// (conv1, bn1, layer1.0.conv1, layer2.0.downsample.0 / .1, ..., fc) and a state_dict saved from
// torchvision.models.resnet18(num_classes = C) as safetensors loads with load_state_dict.
// BasicBlock, the standard stem (7x7 stride-2 conv, 3x3 stride-2 max pool), adaptive average
// pool to 1x1, so any input of 32x32 or more works (CIFAR size included). Initialisation as
// torchvision's: convs kaiming_normal_(mode "fan_out", "relu"), batch norms weight 1 / bias 0,
// fc as nn.Linear. Header-only so that the example stays a program a user can copy; the tests
// (tests/nn/resnet_test.cpp) include it. Each "bn then relu" is one nn::BatchNormReLU2d (batch
// norm and ReLU fused in its kernels; a BatchNorm2d's parameters, buffers and names).
#pragma once
#include <tapegrad/tapegrad.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>

namespace resnet {

// torchvision.models.resnet.BasicBlock: conv3x3(stride) - bn - relu - conv3x3 - bn, plus the
// identity (or downsample = Sequential(conv1x1(stride), bn) when the shape changes), then relu.
class BasicBlock : public tg::nn::Module {
 public:
  BasicBlock(int64_t inplanes, int64_t planes, int64_t stride = 1) {
    using tg::nn::BatchNorm2d;
    using tg::nn::Conv2d;
    conv1 = register_module(
        "conv1", std::make_shared<Conv2d>(inplanes, planes, 3,
                                          tg::nn::Conv2dOptions{.stride = stride, .padding = 1, .bias = false}));
    bn1 = register_module("bn1", std::make_shared<tg::nn::BatchNormReLU2d>(planes));  // bn1, then relu: fused
    conv2 = register_module(
        "conv2", std::make_shared<Conv2d>(planes, planes, 3, tg::nn::Conv2dOptions{.padding = 1, .bias = false}));
    bn2 = register_module("bn2", std::make_shared<BatchNorm2d>(planes));
    if (stride != 1 || inplanes != planes) {
      downsample = register_module(
          "downsample", std::make_shared<tg::nn::Sequential>(
                            Conv2d(inplanes, planes, 1, tg::nn::Conv2dOptions{.stride = stride, .bias = false}),
                            BatchNorm2d(planes)));
    }
  }
  tg::Tensor forward(const tg::Tensor& x) override {
    tg::Tensor out = (*bn1)((*conv1)(x));  // relu(bn1(conv1(x)))
    out = (*bn2)((*conv2)(out));
    return tg::relu(out + (downsample ? (*downsample)(x) : x));
  }
  std::string name() const override { return "BasicBlock"; }

  std::shared_ptr<tg::nn::Conv2d> conv1, conv2;
  std::shared_ptr<tg::nn::BatchNorm2d> bn1, bn2;
  std::shared_ptr<tg::nn::Sequential> downsample;  // null when the block keeps the shape
};

// torchvision.models.resnet18(num_classes): [2, 2, 2, 2] BasicBlocks of 64, 128, 256, 512 channels.
class ResNet18 : public tg::nn::Module {
 public:
  explicit ResNet18(int64_t num_classes = 1000) {
    TG_CHECK(num_classes > 0, "resnet::ResNet18: num_classes must be > 0, got ", num_classes);
    conv1 = register_module("conv1", std::make_shared<tg::nn::Conv2d>(
                                         3, 64, 7, tg::nn::Conv2dOptions{.stride = 2, .padding = 3, .bias = false}));
    bn1 = register_module("bn1", std::make_shared<tg::nn::BatchNormReLU2d>(64));  // bn1, then relu: fused
    maxpool = register_module("maxpool", std::make_shared<tg::nn::MaxPool2d>(3, 2, 1));
    int64_t inplanes = 64;
    const std::array<int64_t, 4> planes{64, 128, 256, 512};
    for (size_t i = 0; i < planes.size(); ++i) {
      const int64_t stride = i == 0 ? 1 : 2;
      layers[i] = register_module("layer" + std::to_string(i + 1),
                                  std::make_shared<tg::nn::Sequential>(BasicBlock(inplanes, planes[i], stride),
                                                                       BasicBlock(planes[i], planes[i], 1)));
      inplanes = planes[i];
    }
    avgpool = register_module("avgpool", std::make_shared<tg::nn::AdaptiveAvgPool2d>(1));
    fc = register_module("fc", std::make_shared<tg::nn::Linear>(512, num_classes));
    // torchvision's init: Linear keeps its default; convs and batch norms as below.
    for (const auto& [name, p] : named_parameters()) {
      if (p.dim() == 4) {
        tg::nn::init::kaiming_normal_(p, 0, "fan_out", "relu");
      }
    }
  }
  // x [N, 3, H, W] -> logits [N, num_classes].
  tg::Tensor forward(const tg::Tensor& x) override {
    TG_CHECK(x.dim() == 4 && x.size(1) == 3, "resnet::ResNet18: expected input [N, 3, H, W], got ", x.sizes());
    tg::Tensor h = (*maxpool)((*bn1)((*conv1)(x)));  // maxpool(relu(bn1(conv1(x))))
    for (auto& layer : layers) h = (*layer)(h);
    h = (*avgpool)(h);
    return (*fc)(h.reshape({h.size(0), -1}));
  }
  std::string name() const override { return "ResNet18"; }

  std::shared_ptr<tg::nn::Conv2d> conv1;
  std::shared_ptr<tg::nn::BatchNorm2d> bn1;
  std::shared_ptr<tg::nn::MaxPool2d> maxpool;
  std::array<std::shared_ptr<tg::nn::Sequential>, 4> layers;  // layer1 .. layer4
  std::shared_ptr<tg::nn::AdaptiveAvgPool2d> avgpool;
  std::shared_ptr<tg::nn::Linear> fc;
};

}  // namespace resnet
