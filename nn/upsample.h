// interpolate (PyTorch's torch.nn.functional.interpolate, modes "nearest", "linear" (3-d) and
// "bilinear" (4-d)) and the module nn::Upsample, on the CPU and CUDA, differentiable. Backward
// gathers each input element's gradient from the outputs that read it: deterministic, no atomics.
#pragma once
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include <tapegrad/nn/module.h>

namespace tg::nn {

// One value per spatial dim, or one for all; empty when not given (PyTorch's None).
struct InterpolateSize {
  InterpolateSize() = default;
  InterpolateSize(int64_t v) : values{v} {}                          // NOLINT(google-explicit-constructor)
  InterpolateSize(std::initializer_list<int64_t> l) : values(l) {}   // NOLINT(google-explicit-constructor)
  InterpolateSize(std::vector<int64_t> v) : values(std::move(v)) {}  // NOLINT(google-explicit-constructor)
  std::vector<int64_t> values;
};
struct InterpolateScale {
  InterpolateScale() = default;
  InterpolateScale(double v) : values{v} {}                         // NOLINT(google-explicit-constructor)
  InterpolateScale(std::initializer_list<double> l) : values(l) {}  // NOLINT(google-explicit-constructor)
  InterpolateScale(std::vector<double> v) : values(std::move(v)) {} // NOLINT(google-explicit-constructor)
  std::vector<double> values;
};

// PyTorch's arguments after the input, in order. Exactly one of size and scale_factor.
struct InterpolateFuncOptions {
  InterpolateSize size = {};
  InterpolateScale scale_factor = {};
  std::string mode = "nearest";               // "nearest", "linear" (3-d), "bilinear" (4-d)
  std::optional<bool> align_corners = {};     // linear modes only; default false
  std::optional<bool> recompute_scale_factor = {};
};
using UpsampleOptions = InterpolateFuncOptions;

namespace functional {
// x [N, C, W] ("nearest", "linear") or [N, C, H, W] ("nearest", "bilinear"), any floating dtype and
// strides. Output size per dim: size, or floor(in * scale_factor). Source indices as PyTorch's CPU
// kernels: nearest floor(o * s) (float) with s = 1 / scale_factor when given (and not
// recompute_scale_factor), else in / out; linear src = s * (o + 0.5) - 0.5 (clamped at 0), or, with
// align_corners, o * (in - 1) / (out - 1). Equal sizes copy. Linear accumulates in float (double
// for float64).
Tensor interpolate(const Tensor& x, const InterpolateFuncOptions& options);
}  // namespace functional

// nn.Upsample: functional::interpolate with the options given at construction (no parameters).
class Upsample : public Module {
 public:
  explicit Upsample(UpsampleOptions options);
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Upsample"; }

  UpsampleOptions options;
};

}  // namespace tg::nn
