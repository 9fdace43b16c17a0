// conv1d / conv2d through export (issue 17): traced as themselves, replayed by run() and by the
// saved/loaded program to the eager values, and lowered to ONNX Conv (checked with ONNX Runtime
// when python3 has onnx, onnxruntime and numpy; skipped with one line otherwise).
#include "common.h"
#include "onnx_check.h"

using namespace tg_export_test;
namespace fs = std::filesystem;
namespace F = tg::nn::functional;

TEST(ExportConv, Conv2dAndConv1d) {
  tg::manual_seed(31);
  auto w2 = tg::randn({6, 2, 3, 2}), b2 = tg::randn({6});
  auto ws = tg::randn({4, 4, 2, 4});
  auto w1 = tg::randn({4, 2, 3}), b1 = tg::randn({4});
  auto wd = tg::randn({4, 1, 4});
  auto fn = [&](const std::vector<tg::Tensor>& in) {
    auto x = in[0], s = in[1];
    return std::vector<tg::Tensor>{
        F::conv2d(x, w2, b2, {.stride = {2, 1}, .padding = {1, 2}, .dilation = {1, 2}, .groups = 2}),
        F::conv2d(x, ws, tg::Tensor(), {.padding = "same"}),  // even kernel: extra padding at the end
        F::conv1d(s, w1, b1, {.stride = 2, .padding = 1, .dilation = 2, .groups = 2}),
        F::conv1d(s, wd, tg::Tensor(), {.padding = "same", .groups = 4})};  // depthwise
  };
  check_export(fn, {tg::randn({2, 4, 7, 6}), tg::randn({2, 4, 9})}, {"x0", "x1"}, {"conv2d", "conv1d"});
}
