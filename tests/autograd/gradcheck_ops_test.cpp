// gradcheck of every differentiable op against central differences in float64,
// on the CPU and on CUDA when present: contiguous and non-contiguous
// (transposed, sliced, expanded) operands, and broadcasting shapes.
#include <functional>
#include <string>
#include <vector>

#include "tests/autograd/common.h"

namespace tg::testing {
namespace {

using Inputs = std::vector<Tensor>;
using MakeFn = std::function<Tensor(Device)>;

struct OpCase {
  std::string name;
  std::vector<MakeFn> inputs;
  std::function<Tensor(const Inputs&)> fn;
};

MakeFn N(Shape s) {  // normal values
  return [s](Device d) { return tg::randn(s, TensorOptions().dtype(kFloat64).device(d)); };
}
MakeFn P(Shape s) {  // positive values in [0.5, 1.5)
  return [s](Device d) { return tg::rand(s, TensorOptions().dtype(kFloat64).device(d)) + 0.5; };
}
MakeFn I(std::vector<int64_t> v) {  // an int64 index (never differentiated)
  return [v](Device d) { return tg::tensor<int64_t>(v, TensorOptions(kInt64).device(d)); };
}
MakeFn B(std::vector<bool> v, Shape s) {  // a bool mask
  return [v, s](Device d) { return tg::tensor<bool>(v, s, TensorOptions(kBool).device(d)); };
}

std::vector<OpCase> cases() {
  std::vector<OpCase> c;
  auto add = [&](std::string name, std::vector<MakeFn> in, std::function<Tensor(const Inputs&)> fn) {
    c.push_back({std::move(name), std::move(in), std::move(fn)});
  };
  // ---- binary with broadcasting
  add("add", {N({3, 4}), N({4})}, [](const Inputs& v) { return v[0] + v[1]; });
  add("add_alpha", {N({2, 3, 4}), N({3, 1})}, [](const Inputs& v) { return tg::add(v[0], v[1], 2.5); });
  add("sub", {N({3, 1}), N({2, 3, 4})}, [](const Inputs& v) { return v[0] - v[1]; });
  add("sub_alpha", {N({3, 4}), N({3, 4})}, [](const Inputs& v) { return tg::sub(v[0], v[1], -1.5); });
  add("mul", {N({3, 4}), N({3, 1})}, [](const Inputs& v) { return v[0] * v[1]; });
  add("mul_same", {N({5})}, [](const Inputs& v) { return v[0] * v[0]; });
  add("div", {N({3, 4}), P({4})}, [](const Inputs& v) { return v[0] / v[1]; });
  add("pow_tensor", {P({3, 4}), N({4})}, [](const Inputs& v) { return v[0].pow(v[1]); });
  add("maximum", {N({3, 4}), N({4})}, [](const Inputs& v) { return tg::maximum(v[0], v[1]); });
  add("minimum", {N({2, 1, 3}), N({4, 3})}, [](const Inputs& v) { return tg::minimum(v[0], v[1]); });
  add("where",
      {B({true, false, true, true, false, false, true, false, true, false, false, true}, {3, 4}), N({3, 4}), N({4})},
      [](const Inputs& v) { return tg::where(v[0], v[1], v[2]); });
  // ---- scalar forms
  add("add_scalar", {N({3, 4})}, [](const Inputs& v) { return v[0] + 2; });
  add("sub_scalar", {N({3, 4})}, [](const Inputs& v) { return v[0] - 3.5; });
  add("rsub_scalar", {N({3, 4})}, [](const Inputs& v) { return 2.0 - v[0]; });
  add("mul_scalar", {N({3, 4})}, [](const Inputs& v) { return v[0] * 3; });
  add("div_scalar", {N({3, 4})}, [](const Inputs& v) { return v[0] / 4.0; });
  add("rdiv_scalar", {P({3, 4})}, [](const Inputs& v) { return 2.0 / v[0]; });
  // ---- unary
  add("neg", {N({3, 4})}, [](const Inputs& v) { return -v[0]; });
  add("exp", {N({3, 4})}, [](const Inputs& v) { return v[0].exp(); });
  add("log", {P({3, 4})}, [](const Inputs& v) { return v[0].log(); });
  add("sqrt", {P({3, 4})}, [](const Inputs& v) { return v[0].sqrt(); });
  add("abs", {N({3, 4})}, [](const Inputs& v) { return v[0].abs(); });
  add("relu", {N({3, 4})}, [](const Inputs& v) { return v[0].relu(); });
  add("gelu", {N({3, 4})}, [](const Inputs& v) { return v[0].gelu(); });
  add("sigmoid", {N({3, 4})}, [](const Inputs& v) { return v[0].sigmoid(); });
  add("tanh", {N({3, 4})}, [](const Inputs& v) { return v[0].tanh(); });
  add("pow_3", {N({3, 4})}, [](const Inputs& v) { return v[0].pow(3); });
  add("pow_half", {P({3, 4})}, [](const Inputs& v) { return v[0].pow(0.5); });
  add("pow_neg", {P({3, 4})}, [](const Inputs& v) { return v[0].pow(-1.5); });
  add("clamp", {N({4, 5})}, [](const Inputs& v) { return v[0].clamp(-0.5, 0.5); });
  // ---- non-contiguous operands
  add("exp_transposed", {N({4, 3})}, [](const Inputs& v) { return v[0].t().exp(); });
  add("mul_sliced", {N({4, 6}), N({4, 3})}, [](const Inputs& v) { return v[0].slice(1, 0, 6, 2) * v[1]; });
  add("add_expanded", {N({3, 1}), N({3, 4})}, [](const Inputs& v) { return v[0].expand({3, 4}) + v[1]; });
  add("tanh_permuted", {N({2, 3, 4})}, [](const Inputs& v) { return v[0].permute({2, 0, 1}).tanh(); });
  add("sum_transposed", {N({3, 4})}, [](const Inputs& v) { return v[0].t().sum(1); });
  add("matmul_transposed", {N({4, 3}), N({5, 4})}, [](const Inputs& v) { return tg::matmul(v[0].t(), v[1].t()); });
  // ---- reductions
  add("sum_all", {N({3, 4})}, [](const Inputs& v) { return v[0].sum(); });
  add("sum_dim", {N({3, 4})}, [](const Inputs& v) { return v[0].sum(1); });
  add("sum_dims_keepdim", {N({2, 3, 4})}, [](const Inputs& v) { return v[0].sum({0, 2}, true); });
  add("mean_all", {N({3, 4})}, [](const Inputs& v) { return v[0].mean(); });
  add("mean_dim", {N({2, 3, 4})}, [](const Inputs& v) { return v[0].mean(-1); });
  add("mean_keepdim", {N({2, 3, 4})}, [](const Inputs& v) { return v[0].mean({0, 1}, true); });
  add("var_all", {N({3, 4})}, [](const Inputs& v) { return v[0].var(); });
  add("var_dim", {N({3, 5})}, [](const Inputs& v) { return v[0].var(1); });
  add("var_correction0_keepdim", {N({3, 5})}, [](const Inputs& v) { return v[0].var(0, true, 0); });
  add("std_all", {N({3, 4})}, [](const Inputs& v) { return v[0].std(); });
  add("std_dim", {N({4, 5})}, [](const Inputs& v) { return v[0].std({1}); });
  add("std_correction0", {N({2, 3, 4})}, [](const Inputs& v) { return v[0].std({0, 2}, false, 0); });
  add("amax_dim", {N({3, 5})}, [](const Inputs& v) { return tg::amax(v[0], 1); });
  add("amax_all", {N({3, 5})}, [](const Inputs& v) { return v[0].max(); });
  add("amin_keepdim", {N({3, 5})}, [](const Inputs& v) { return tg::amin(v[0], 0, true); });
  // ---- views and copies
  add("transpose", {N({2, 3, 4})}, [](const Inputs& v) { return v[0].transpose(0, 2); });
  add("t", {N({3, 4})}, [](const Inputs& v) { return v[0].t(); });
  add("permute", {N({2, 3, 4})}, [](const Inputs& v) { return v[0].permute({1, 2, 0}); });
  add("slice", {N({5, 4})}, [](const Inputs& v) { return v[0].slice(0, 1, 5, 2); });
  add("slice_negative", {N({5, 4})}, [](const Inputs& v) { return v[0].slice(1, -3, -1); });
  add("select", {N({3, 4})}, [](const Inputs& v) { return v[0].select(1, -1); });
  add("view", {N({3, 4})}, [](const Inputs& v) { return v[0].view({2, 6}); });
  add("reshape_noncontig", {N({3, 4})}, [](const Inputs& v) { return v[0].t().reshape({12}); });
  add("unsqueeze", {N({3, 4})}, [](const Inputs& v) { return v[0].unsqueeze(1); });
  add("squeeze", {N({3, 1, 4})}, [](const Inputs& v) { return v[0].squeeze(); });
  add("squeeze_dim", {N({3, 1, 4})}, [](const Inputs& v) { return v[0].squeeze(1); });
  add("expand", {N({3, 1, 5})}, [](const Inputs& v) { return v[0].expand({2, 3, 4, 5}); });
  add("index_select", {N({5, 3}), I({4, 0, 2})}, [](const Inputs& v) { return v[0].index_select(0, v[1]); });
  add("index_select_dups", {N({3, 5}), I({1, 1, 4, 1, 0})}, [](const Inputs& v) { return v[0].index_select(1, v[1]); });
  add("cat", {N({2, 3}), N({2, 1}), N({2, 4})}, [](const Inputs& v) { return tg::cat({v[0], v[1], v[2]}, 1); });
  add("cat_dim0", {N({1, 3}), N({2, 3})}, [](const Inputs& v) { return tg::cat({v[0], v[1]}, 0); });
  add("contiguous", {N({3, 4})}, [](const Inputs& v) { return v[0].t().contiguous(); });
  add("clone", {N({3, 4})}, [](const Inputs& v) { return v[0].clone() * 2; });
  // ---- matmul: 1-D, 2-D, batched with broadcast batch dims
  add("matmul_dot", {N({4}), N({4})}, [](const Inputs& v) { return tg::matmul(v[0], v[1]); });
  add("matmul_2d", {N({3, 4}), N({4, 5})}, [](const Inputs& v) { return tg::matmul(v[0], v[1]); });
  add("matmul_vec_mat", {N({4}), N({4, 5})}, [](const Inputs& v) { return tg::matmul(v[0], v[1]); });
  add("matmul_mat_vec", {N({3, 4}), N({4})}, [](const Inputs& v) { return tg::matmul(v[0], v[1]); });
  add("matmul_vec_batched", {N({4}), N({2, 4, 3})}, [](const Inputs& v) { return tg::matmul(v[0], v[1]); });
  add("matmul_batched_vec", {N({2, 3, 4}), N({4})}, [](const Inputs& v) { return tg::matmul(v[0], v[1]); });
  add("matmul_batched", {N({2, 3, 4}), N({2, 4, 5})}, [](const Inputs& v) { return tg::matmul(v[0], v[1]); });
  add("matmul_broadcast_batch", {N({3, 1, 2, 4}), N({5, 4, 3})},
      [](const Inputs& v) { return tg::matmul(v[0], v[1]); });
  add("matmul_batched_2d", {N({2, 3, 4}), N({4, 5})}, [](const Inputs& v) { return tg::matmul(v[0], v[1]); });
  // ---- issue 15: softmax and classification losses
  add("softmax_last", {N({3, 5})}, [](const Inputs& v) { return tg::softmax(v[0], -1); });
  add("softmax_dim0", {N({3, 4, 2})}, [](const Inputs& v) { return tg::softmax(v[0], 0); });
  add("softmax_transposed", {N({4, 3})}, [](const Inputs& v) { return tg::softmax(v[0].t(), 1); });
  add("log_softmax_last", {N({3, 5})}, [](const Inputs& v) { return tg::log_softmax(v[0], 1); });
  add("log_softmax_dim1", {N({2, 3, 4})}, [](const Inputs& v) { return tg::log_softmax(v[0], 1); });
  add("logsumexp", {N({3, 4})}, [](const Inputs& v) { return tg::logsumexp(v[0], {1}); });
  add("logsumexp_keepdim", {N({2, 3, 4})}, [](const Inputs& v) { return tg::logsumexp(v[0], {0, 2}, true); });
  add("cross_entropy", {N({4, 5}), I({1, 0, 4, 2})},
      [](const Inputs& v) { return nn::functional::cross_entropy(v[0], v[1]); });
  // weights are constants (not differentiated, as in PyTorch)
  auto cw = [](const Tensor& like, std::vector<double> w) {
    return tg::tensor<double>(w, TensorOptions(kFloat64).device(like.device()));
  };
  add("cross_entropy_smooth_weight_ignore", {N({4, 5}), I({1, -100, 4, 2})}, [cw](const Inputs& v) {
    return nn::functional::cross_entropy(
        v[0], v[1], {.reduction = "sum", .label_smoothing = 0.2, .weight = cw(v[0], {0.5, 1.0, 2.0, 1.5, 0.25})});
  });
  add("cross_entropy_none_nd", {N({2, 3, 2}), I({0, 2, 1, 1})}, [](const Inputs& v) {
    return nn::functional::cross_entropy(v[0], v[1].reshape({2, 2}), {.reduction = "none"});
  });
  add("cross_entropy_prob", {N({3, 4}), P({3, 4})}, [](const Inputs& v) {
    return nn::functional::cross_entropy(v[0], v[1], {.label_smoothing = 0.1});
  });
  add("nll_loss", {N({4, 3}), I({2, 0, 1, 1})}, [cw](const Inputs& v) {
    return nn::functional::nll_loss(v[0], v[1], {.weight = cw(v[0], {0.5, 2.0, 1.5})});
  });
  add("bce_with_logits", {N({3, 4}), P({3, 4})}, [cw](const Inputs& v) {
    return nn::functional::binary_cross_entropy_with_logits(v[0], v[1] - 0.5,
                                                            {.pos_weight = cw(v[0], {0.5, 2.0, 1.0, 3.0})});
  });
  // ---- issue 15: normalization, embedding, dropout
  add("layer_norm", {N({4, 6}), N({6}), N({6})},
      [](const Inputs& v) { return tg::nn::functional::layer_norm(v[0], {6}, v[1], v[2]); });
  add("layer_norm_2d_shape_noncontig", {N({5, 3, 4}), N({5, 3})}, [](const Inputs& v) {
    return tg::nn::functional::layer_norm(v[0].transpose(0, 2), {3, 5}, v[1].t(), Tensor(), 1e-3);
  });
  add("layer_norm_no_affine", {N({3, 7})}, [](const Inputs& v) { return tg::nn::functional::layer_norm(v[0], {7}); });
  add("rms_norm", {N({4, 6}), N({6})}, [](const Inputs& v) { return tg::nn::functional::rms_norm(v[0], {6}, v[1]); });
  add("rms_norm_noncontig_no_weight", {N({6, 4})},
      [](const Inputs& v) { return tg::nn::functional::rms_norm(v[0].t(), {6}, Tensor(), 1e-4); });
  add("embedding", {I({3, 0, 3, 4, 1, 3}), N({5, 4})},
      [](const Inputs& v) { return tg::nn::functional::embedding(v[0].view({2, 3}), v[1]); });
  add("dropout_fixed_seed", {N({4, 5})}, [](const Inputs& v) {
    tg::manual_seed(7);  // the same mask for every evaluation
    return tg::nn::functional::dropout(v[0], 0.3);
  });
  // ---- issue 15: general ops
  add("sin", {N({3, 4})}, [](const Inputs& v) { return v[0].sin(); });
  add("cos_transposed", {N({4, 3})}, [](const Inputs& v) { return v[0].t().cos(); });
  add("rsqrt", {P({3, 4})}, [](const Inputs& v) { return v[0].rsqrt(); });
  add("silu", {N({3, 4})}, [](const Inputs& v) { return tg::silu(v[0]); });
  add("gelu_tanh", {N({3, 4})}, [](const Inputs& v) { return v[0].gelu("tanh"); });
  add("softplus", {N({3, 4})}, [](const Inputs& v) { return tg::softplus(v[0] * 3, 1.5, 2.0); });
  add("leaky_relu", {N({3, 4})}, [](const Inputs& v) { return tg::leaky_relu(v[0], 0.2); });
  add("elu", {N({3, 4})}, [](const Inputs& v) { return tg::elu(v[0], 1.3); });
  auto idx2 = [](const Tensor& like, std::vector<int64_t> vals, Shape s) {
    return tg::tensor<int64_t>(vals, s, TensorOptions(kInt64).device(like.device()));
  };
  add("masked_fill_broadcast", {N({4}), B({true, false, false, true, false, false, true, false}, {2, 4})},
      [](const Inputs& v) { return v[0].masked_fill(v[1], 2.5); });
  add("tril", {N({2, 3, 4})}, [](const Inputs& v) { return tg::tril(v[0], 1); });
  add("triu_transposed", {N({4, 3})}, [](const Inputs& v) { return v[0].t().triu(); });
  add("stack", {N({2, 3}), N({2, 3})}, [](const Inputs& v) { return tg::stack({v[0], v[1] * 2}, 1); });
  add("gather", {N({3, 4})}, [idx2](const Inputs& v) { return v[0].gather(1, idx2(v[0], {3, 0, 3, 1, 1, 2}, {2, 3})); });
  add("scatter", {N({3, 4}), N({2, 3})},
      [idx2](const Inputs& v) { return tg::scatter(v[0], 0, idx2(v[0], {2, 0, 1, 1, 2, 0}, {2, 3}), v[1]); });
  add("scatter_value", {N({3, 4})},
      [idx2](const Inputs& v) { return v[0].scatter(1, idx2(v[0], {1, 3}, {2, 1}), -1.0); });
  add("scatter_add", {N({3, 4}), N({2, 4})},
      [idx2](const Inputs& v) { return tg::scatter_add(v[0], 0, idx2(v[0], {2, 2, 0, 1, 2, 2, 2, 1}, {2, 4}), v[1]); });
  add("index_add", {N({4, 3}), N({3, 3}), I({3, 0, 3})},
      [](const Inputs& v) { return tg::index_add(v[0], 0, v[2], v[1], -2.0); });
  add("cumsum", {N({3, 4})}, [](const Inputs& v) { return v[0].cumsum(0); });
  add("cumsum_transposed", {N({3, 4})}, [](const Inputs& v) { return tg::cumsum(v[0].t(), 1); });
  add("sort_values", {N({3, 5})}, [](const Inputs& v) { return std::get<0>(tg::sort(v[0], 1, true)); });
  add("topk_values", {N({4, 3})}, [](const Inputs& v) { return std::get<0>(v[0].topk(2, 0)); });
  return c;
}

class GradcheckOps : public ::testing::TestWithParam<Dev> {};

TEST_P(GradcheckOps, EveryOp) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  int checked = 0;
  for (const OpCase& oc : cases()) {
    SCOPED_TRACE(oc.name);
    tg::manual_seed(1234);
    Inputs in;
    for (const auto& make : oc.inputs) in.push_back(make(dev));
    // The floating inputs are differentiated (none of them requires grad yet).
    autograd::GradcheckReport r = autograd::gradcheck(oc.fn, in);
    EXPECT_TRUE(r.ok) << oc.name << " on " << dev << ": " << r;
    ++checked;
  }
  EXPECT_GE(checked, 70);
}

TEST_P(GradcheckOps, CastsAndDeviceCopies) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  // A float64 -> float32 -> float64 round trip loses too much for finite differences;
  // check the gradient's dtype and values directly: d sum(3 * x.to(f32)) / dx = 3, in float64.
  auto x = tg::randn({3, 4}, TensorOptions().dtype(kFloat64).device(dev).requires_grad(true));
  (x.to(kFloat32) * 3).sum().backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().dtype(), kFloat64);
  EXPECT_EQ(x.grad().device(), x.device());
  expect_near_vec(host(x.grad()), std::vector<double>(12, 3.0), 0, 0, "cast grad");
  // Mixed-dtype broadcasting op: each input's gradient comes back in its own dtype and shape.
  auto h = tg::randn({4}, TensorOptions().dtype(kFloat32).device(dev).requires_grad(true));
  auto w = tg::randn({3, 4}, TensorOptions().dtype(kFloat64).device(dev).requires_grad(true));
  (h * w).sum().backward();
  EXPECT_EQ(h.grad().dtype(), kFloat32);
  EXPECT_EQ(h.grad().sizes(), Shape({4}));
  std::vector<double> hw = host(w), hg = host(h.grad()), want(4, 0.0);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) want[j] += hw[i * 4 + j];
  expect_near_vec(hg, want, 1e-5, 1e-5, "mixed dtype grad");
  if (tg::cuda::is_available()) {
    // Device copies: the gradient is copied back to where the input lives.
    auto r = autograd::gradcheck([](const Inputs& v) { return (v[0].to(kCUDA).exp() * 2).to(kCPU); },
                                 {tg::randn({3, 4}, kFloat64)});
    EXPECT_TRUE(r.ok) << r;
    auto c = tg::randn({5}, TensorOptions().dtype(kFloat32).requires_grad(true));
    c.to(kCUDA).sum().backward();
    EXPECT_TRUE(c.grad().is_cpu());
    expect_near_vec(host(c.grad()), std::vector<double>(5, 1.0), 0, 0, "device copy grad");
  }
}

TEST_P(GradcheckOps, AmaxSplitsTiesEvenly) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  auto x = tg::tensor<double>({1, 3, 3, 0, 2, 2, 2, -1}, {2, 4}, TensorOptions(kFloat64).device(dev));
  x.requires_grad_();
  tg::amax(x, 1).sum().backward();
  expect_near_vec(host(x.grad()), {0, 0.5, 0.5, 0, 1.0 / 3, 1.0 / 3, 1.0 / 3, 0}, 1e-12, 0, "amax ties");
  auto y = tg::tensor<double>({1, -1, 4, -1}, {4}, TensorOptions(kFloat64).device(dev));
  y.requires_grad_();
  (tg::amin(y) * 6).backward();
  expect_near_vec(host(y.grad()), {0, 3, 0, 3}, 1e-12, 0, "amin ties");
}

TEST_P(GradcheckOps, MatmulGradAgainstHostReference) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  tg::manual_seed(7);
  const int64_t m = 5, k = 7, n = 3;
  auto x = tg::randn({m, k}, TensorOptions().device(dev).requires_grad(true));
  auto y = tg::randn({k, n}, TensorOptions().device(dev).requires_grad(true));
  tg::matmul(x, y).sum().backward();
  // d/dx[i, p] = sum_j y[p, j]; d/dy[p, j] = sum_i x[i, p]
  std::vector<double> hx = host(x), hy = host(y), gx(m * k), gy(k * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j) {
        gx[i * k + p] += hy[p * n + j];
        gy[p * n + j] += hx[i * k + p];
      }
  expect_near_vec(host(x.grad()), gx, 1e-5, 1e-5, "x.grad");
  expect_near_vec(host(y.grad()), gy, 1e-5, 1e-5, "y.grad");
}

INSTANTIATE_TEST_SUITE_P(Devices, GradcheckOps, ::testing::Values(Dev::CPU, Dev::CUDA), dev_name);

}  // namespace
}  // namespace tg::testing
