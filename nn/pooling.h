// 2-d pooling (PyTorch's max_pool2d, avg_pool2d, adaptive_avg_pool2d) on [C, H, W] or [N, C, H, W]
// inputs of any strides and floating dtype, on the CPU and CUDA, differentiable; the modules
// MaxPool2d, AvgPool2d, AdaptiveAvgPool2d and Flatten (no parameters). Backward gathers each
// input element's gradient over the windows that contain it: deterministic, no atomics.
#pragma once
#include <optional>
#include <tuple>

#include <tapegrad/nn/module.h>

namespace tg::nn {

// One value per spatial dim (h, w); a single value stands for both (libtorch's ExpandingArray<2>).
struct PoolSize {
  PoolSize(int64_t v) : h(v), w(v) {}  // NOLINT(google-explicit-constructor): `.stride = 2`
  PoolSize(int64_t h_, int64_t w_) : h(h_), w(w_) {}
  int64_t h, w;
};

struct MaxPool2dOptions {
  PoolSize kernel_size;
  std::optional<PoolSize> stride = std::nullopt;  // default: kernel_size
  PoolSize padding = 0;
  PoolSize dilation = 1;
  bool ceil_mode = false;
};

struct AvgPool2dOptions {
  PoolSize kernel_size;
  std::optional<PoolSize> stride = std::nullopt;  // default: kernel_size
  PoolSize padding = 0;
  bool ceil_mode = false;
  bool count_include_pad = true;
  std::optional<int64_t> divisor_override = std::nullopt;  // nonzero
};

namespace functional {
// Maximum over each window (implicit -inf padding); NaN propagates. Output [..., OH, OW] with
// OH = floor_or_ceil((H + 2 * padding - dilation * (kernel_size - 1) - 1) / stride) + 1 (ceil_mode:
// a last window must start inside the input or left padding). Ties: the first maximum in
// window order gets the gradient. Errors (tg::Error): rank not 3 / 4, empty C / H / W, sizes <= 0,
// padding > kernel_size / 2, an output size < 1.
Tensor max_pool2d(const Tensor& x, const MaxPool2dOptions& options);
// max_pool2d and the int64 indices of the maxima (h * W + w within each plane), as PyTorch's
// return_indices = true.
std::tuple<Tensor, Tensor> max_pool2d_with_indices(const Tensor& x, const MaxPool2dOptions& options);
// Mean over each window; the divisor is divisor_override if given, else the window size counting
// the zero padding (count_include_pad) or only the cells inside the input. Same checks as max_pool2d.
Tensor avg_pool2d(const Tensor& x, const AvgPool2dOptions& options);
// Mean over the windows rows [floor(i * H / OH), ceil((i + 1) * H / OH)) (likewise columns): output
// [..., OH, OW]; output_size positive.
Tensor adaptive_avg_pool2d(const Tensor& x, PoolSize output_size);
}  // namespace functional

class MaxPool2d : public Module {
 public:
  MaxPool2d(PoolSize kernel_size, std::optional<PoolSize> stride = std::nullopt, PoolSize padding = 0,
            PoolSize dilation = 1, bool ceil_mode = false);
  explicit MaxPool2d(const MaxPool2dOptions& options);
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "MaxPool2d"; }
  MaxPool2dOptions options;
};

class AvgPool2d : public Module {
 public:
  AvgPool2d(PoolSize kernel_size, std::optional<PoolSize> stride = std::nullopt, PoolSize padding = 0,
            bool ceil_mode = false, bool count_include_pad = true, std::optional<int64_t> divisor_override = std::nullopt);
  explicit AvgPool2d(const AvgPool2dOptions& options);
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "AvgPool2d"; }
  AvgPool2dOptions options;
};

class AdaptiveAvgPool2d : public Module {
 public:
  AdaptiveAvgPool2d(PoolSize output_size);  // NOLINT(google-explicit-constructor)
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "AdaptiveAvgPool2d"; }
  PoolSize output_size;
};

// Merges dims start_dim..end_dim (negative: from the end) into one, as x.flatten(start, end).
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1);
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Flatten"; }
  int64_t start_dim, end_dim;
};

}  // namespace tg::nn
