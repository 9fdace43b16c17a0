// conv_transpose1d / 2d, interpolate, batch_norm (training mode) and group_norm through export
// (issue 17): traced as themselves (one node each, none of their inner ops), replayed by run() and
// by the saved/loaded program to the eager values, and lowered to ONNX (ConvTranspose; Gather
// tables for interpolate; ReduceMean / LayerNormalization compositions for the norms), checked
// with ONNX Runtime when python3 has onnx, onnxruntime and numpy.
#include "common.h"
#include "onnx_check.h"

using namespace tg_export_test;
namespace F = tg::nn::functional;

namespace {
// How many graph lines apply `op` (e.g. "group_norm(").
size_t count_op(const std::string& graph, const std::string& op) {
  size_t n = 0;
  for (size_t at = graph.find(op); at != std::string::npos; at = graph.find(op, at + 1)) ++n;
  return n;
}
}  // namespace

TEST(ExportUpsampleNorm, ConvTranspose) {
  tg::manual_seed(51);
  auto w2 = tg::randn({4, 3, 3, 2}), b2 = tg::randn({6});
  auto w1 = tg::randn({4, 2, 3}), b1 = tg::randn({2});
  auto w3 = tg::randn({4, 2, 2, 2});
  auto fn = [&](const std::vector<tg::Tensor>& in) {
    return std::vector<tg::Tensor>{
        F::conv_transpose2d(in[0], w2, b2,
                            {.stride = {2, 1}, .padding = {1, 0}, .output_padding = {1, 0}, .groups = 2,
                             .dilation = {1, 2}}),
        F::conv_transpose1d(in[1], w1, b1, {.stride = 3, .padding = 1, .output_padding = 2}),
        F::conv_transpose2d(in[0], w3, tg::Tensor(), {.stride = 2})};
  };
  check_export(fn, {tg::randn({2, 4, 5, 4}), tg::randn({2, 4, 6})}, {"x0", "x1"},
               {"conv_transpose2d", "conv_transpose1d"});
}

TEST(ExportUpsampleNorm, Interpolate) {
  auto fn = [](const std::vector<tg::Tensor>& in) {
    const auto& x = in[0];
    return std::vector<tg::Tensor>{
        F::interpolate(x, {.size = {9, 5}}),
        F::interpolate(x, {.scale_factor = {1.7, 2.0}}),  // indices from 1 / scale_factor
        F::interpolate(x, {.size = {7, 13}, .mode = "bilinear"}),
        F::interpolate(x, {.scale_factor = 1.5, .mode = "bilinear", .align_corners = true}),
        F::interpolate(x, {.size = {2, 3}, .mode = "bilinear"}),  // downsampling
        F::interpolate(in[1], {.size = 11, .mode = "linear"}), F::interpolate(in[1], {.scale_factor = 0.5})};
  };
  check_export(fn, {tg::randn({2, 3, 4, 6}), tg::randn({2, 3, 7})}, {"x0", "x1"}, {"interpolate"});
}

TEST(ExportUpsampleNorm, BatchNormTrainingAndGroupNorm) {
  tg::manual_seed(52);
  auto w = tg::randn({6}), b = tg::randn({6});
  auto fn = [&](const std::vector<tg::Tensor>& in) {
    const auto& x = in[0];
    return std::vector<tg::Tensor>{
        F::batch_norm(x, tg::Tensor(), tg::Tensor(), w, b, true, 0.1, 1e-5),
        F::batch_norm(x, tg::Tensor(), tg::Tensor(), tg::Tensor(), tg::Tensor(), true, 0.1, 1e-3),
        F::group_norm(x, 3, w, b, 1e-5),
        F::group_norm(x, 2, tg::Tensor(), b, 1e-4),  // a bias alone: traced with a weight of ones
        F::group_norm(in[1], 2, tg::Tensor(), tg::Tensor(), 1e-5)};
  };
  const std::vector<tg::Tensor> in{tg::randn({4, 6, 3, 5}), tg::randn({3, 4})};
  check_export(fn, in, {"x0", "x1"}, {"batch_norm", "group_norm"});
  // one node per call: no layer_norm, mean or mul from inside them
  const std::string g = tg::export_function(fn, in).graph();
  EXPECT_EQ(count_op(g, "batch_norm("), 2u) << g;
  EXPECT_EQ(count_op(g, "group_norm("), 3u) << g;
  EXPECT_EQ(count_op(g, "layer_norm("), 0u) << g;
  EXPECT_EQ(count_op(g, "mul("), 0u) << g;
}

TEST(ExportUpsampleNorm, BatchNorm2dModuleTrainAndEval) {
  tg::manual_seed(53);
  tg::nn::BatchNorm2d bn(3);
  {
    tg::NoGradGuard ng;
    bn.running_mean.copy_(tg::randn({3}));
    bn.running_var.copy_(tg::rand({3}) + 0.5);
  }
  auto x = tg::randn({4, 3, 5, 5});
  bn.train();
  auto ep_train = tg::export_module(bn, {x});
  EXPECT_EQ(count_op(ep_train.graph(), "batch_norm("), 1u) << ep_train.graph();
  const auto before = to_f64(bn.running_mean);
  const auto got = ep_train.run({x})[0];
  EXPECT_EQ(to_f64(bn.running_mean), before);  // replay does not touch the module's running stats
  bn.eval();
  const auto want_eval = bn(x);
  bn.train();
  const auto want_train = [&] {
    tg::NoGradGuard ng;
    return F::batch_norm(x, tg::Tensor(), tg::Tensor(), bn.weight, bn.bias, true, 0.1, 1e-5);
  }();
  expect_close(to_f64(got), to_f64(want_train), 1e-6);
  bn.eval();
  auto ep_eval = tg::export_module(bn, {x});  // eval: broadcast ops with the running stats
  EXPECT_EQ(count_op(ep_eval.graph(), "batch_norm("), 0u) << ep_eval.graph();
  expect_close(to_f64(ep_eval.run({x})[0]), to_f64(want_eval), 1e-6);
}
