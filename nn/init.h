// Parameter initialisers (torch.nn.init): fill a tensor in place without
// recording autograd, drawing from tg's global Philox generator.
#pragma once
#include <string_view>

#include <tapegrad/core/tensor.h>

namespace tg::nn::init {

// fan_in = size(1) * receptive field, fan_out = size(0) * receptive field (tensors of >= 2 dims).
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t);
// The recommended gain for a nonlinearity ("linear", "relu", "tanh", "sigmoid", "leaky_relu" with param).
double calculate_gain(std::string_view nonlinearity, double param = 0.01);

const Tensor& uniform_(const Tensor& t, double a = 0, double b = 1);
const Tensor& normal_(const Tensor& t, double mean = 0, double std = 1);
const Tensor& constant_(const Tensor& t, double value);
const Tensor& zeros_(const Tensor& t);
const Tensor& ones_(const Tensor& t);
// U(-bound, bound), bound = gain * sqrt(3 / fan), gain from nonlinearity and a.
const Tensor& kaiming_uniform_(const Tensor& t, double a = 0, std::string_view mode = "fan_in",
                               std::string_view nonlinearity = "leaky_relu");
// N(0, std^2), std = gain / sqrt(fan), gain from nonlinearity and a (torchvision's ResNet convs:
// mode "fan_out", nonlinearity "relu").
const Tensor& kaiming_normal_(const Tensor& t, double a = 0, std::string_view mode = "fan_in",
                              std::string_view nonlinearity = "leaky_relu");
const Tensor& xavier_uniform_(const Tensor& t, double gain = 1);

}  // namespace tg::nn::init
