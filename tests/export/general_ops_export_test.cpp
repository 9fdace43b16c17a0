// Issue 15's general ops through export: traced as themselves, replayed by run() to the eager
// values, saved and loaded, and lowered to ONNX (checked with ONNX Runtime when python3 has onnx,
// onnxruntime and numpy; that part is skipped with one line otherwise).
#include <cstdlib>
#include <fstream>

#include "common.h"
#include "onnx_check.h"

using namespace tg_export_test;
namespace fs = std::filesystem;

TEST(ExportGeneralOps, UnaryAndActivations) {
  tg::manual_seed(21);
  auto fn = [](const std::vector<tg::Tensor>& in) {
    auto x = in[0];
    return std::vector<tg::Tensor>{x.sin(),
                                   x.cos(),
                                   (x.abs() + 0.5).rsqrt(),
                                   tg::silu(x),
                                   x.gelu("tanh"),
                                   tg::softplus(x * 8, 2.0, 3.0),
                                   tg::leaky_relu(x, 0.2),
                                   tg::elu(x, 1.5)};
  };
  check_export(fn, {tg::randn({4, 5})}, {"x"},
               {"sin", "cos", "rsqrt", "silu", "gelu_tanh", "softplus", "leaky_relu", "elu"});
}

TEST(ExportGeneralOps, MaskingStackAndOneHot) {
  tg::manual_seed(22);
  auto fn = [](const std::vector<tg::Tensor>& in) {
    auto x = in[0], y = in[1];
    auto mask = x > 0.3;
    auto idx = (y.abs() * 2).clamp(0, 2.9).to(tg::kInt64);  // int64 in [0, 2]
    return std::vector<tg::Tensor>{x.masked_fill(mask, -1.5), tg::tril(x, -1), x.triu(1), tg::stack({x, y, x * y}, 1),
                                   tg::one_hot(idx, 3).to(tg::kFloat32)};
  };
  check_export(fn, {tg::randn({4, 4}), tg::randn({4, 4})}, {"x0", "x1"},
               {"masked_fill", "tril", "triu", "stack", "one_hot"});
}

TEST(ExportGeneralOps, GatherScatterIndexAdd) {
  tg::manual_seed(23);
  auto gi = tg::tensor<int64_t>({2, 0, 1, 1, 0, 2}, {2, 3});
  auto si = tg::tensor<int64_t>({2, 0, 1, 3}, {2, 2});  // no repeated target: the set form is then exact
  auto ii = tg::tensor<int64_t>({3, 0}, {2});
  auto fn = [&](const std::vector<tg::Tensor>& in) {
    auto x = in[0], y = in[1];  // [4, 3], [2, 3]
    return std::vector<tg::Tensor>{tg::gather(x, 0, gi), tg::scatter(x, 0, si, y), x.scatter(1, gi.slice(0, 0, 1), 7.0),
                                   tg::scatter_add(x, 0, gi, y), tg::index_add(x, 0, ii, y, 0.5)};
  };
  check_export(fn, {tg::randn({4, 3}), tg::randn({2, 3})}, {"x0", "x1"},
               {"gather", "scatter", "scatter_value", "scatter_add", "index_add"});
}

TEST(ExportGeneralOps, CumsumSortTopk) {
  tg::manual_seed(24);
  auto fn = [](const std::vector<tg::Tensor>& in) {
    auto x = in[0];
    auto [v, i] = tg::sort(x, 1);
    auto [tv, ti] = tg::topk(x, 2, 0, false);
    return std::vector<tg::Tensor>{x.cumsum(1), tg::cumsum(x, 0), v, i, tg::argsort(x, 0, true), tv, ti};
  };
  check_export(fn, {tg::randn({4, 5})}, {"x"}, {"cumsum", "sort", "argsort", "topk", "topk_indices"});
}
