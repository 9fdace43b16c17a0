// save_onnx: the file passes onnx.checker and ONNX Runtime reproduces run()
// within 1e-5 (CPU). Needs python3 with onnx, onnxruntime and numpy (CI installs
// them through scripts/lib.sh); skipped with one line otherwise.
#include <cstdlib>
#include <fstream>

#include "common.h"
#include "onnx_check.h"

using namespace tg_export_test;
namespace fs = std::filesystem;

TEST(ExportOnnx, Net) {
  if (!have_onnx_python()) GTEST_SKIP() << "python3 with onnx, onnxruntime and numpy not found";
  Net net;
  auto ep = tg::export_module(net, {tg::randn({4, 4})});
  check_with_onnxruntime(ep, {tg::randn({4, 4})}, {"x"});
}

TEST(ExportOnnx, MlpDynamicBatch) {
  if (!have_onnx_python()) GTEST_SKIP() << "python3 with onnx, onnxruntime and numpy not found";
  tg::manual_seed(11);
  auto mlp = make_mlp(8, 16, 3);
  auto ep = tg::export_module(mlp, {tg::randn({4, 8})}, {.dynamic_batch = true});
  check_with_onnxruntime(ep, {tg::randn({13, 8})}, {"x"});
}

TEST(ExportOnnx, ManyOps) {
  if (!have_onnx_python()) GTEST_SKIP() << "python3 with onnx, onnxruntime and numpy not found";
  tg::manual_seed(12);
  auto w = tg::randn({6, 3});
  auto idx = tg::tensor(std::vector<int64_t>{2, 0, 1}, tg::Shape{3});
  auto fn = [&](const std::vector<tg::Tensor>& in) {
    auto x = in[0], y = in[1];
    auto h = tg::matmul(x, w).gelu().tanh() + tg::sigmoid(y).pow(2) - x.abs().clamp(0.1, 2.0).log().sum(1, true);
    auto z = tg::maximum(h, y).permute({1, 0}).contiguous().index_select(0, idx).unsqueeze(0).squeeze(0);
    auto v = tg::minimum(z.t(), y.neg()).var(0, false) + z.select(1, 0).argmax().to(tg::kFloat32);
    auto r = x.reshape({2, 12}).slice(1, 2, 10).exp().sqrt().mean(1, true).expand({2, 3});
    auto c = tg::cat({z, y.t()}, 1).std({0, 1}, true).max() - (2.0 - y).min(0).sum();
    auto cmp = tg::where(y > 0.25, y, tg::sub(y, z.t(), 0.5)) * (y != x.slice(1, 0, 3)).to(tg::kFloat32);
    return std::vector<tg::Tensor>{z, v.expand({2, 3}).clone() + r, (y >= 0.0).to(tg::kFloat32) * 3 / (y * y + 1),
                                   c, cmp, 1.5 / (y.abs() + 1)};
  };
  auto x = tg::randn({4, 6}), y = tg::randn({4, 3});
  auto ep = tg::export_function(fn, {x, y}, {{"w", w}});
  check_with_onnxruntime(ep, {tg::randn({4, 6}), tg::randn({4, 3})}, {"x0", "x1"});
}

// linear (with and without a bias) and mse_loss (every reduction) are recorded as themselves
// and lowered to MatMul / Add and Sub / Mul / Reduce*; a float16 input widened by autocast's
// float32 ops inside their kernels (exp, log, sqrt, pow) is lowered with a Cast first.
TEST(ExportOnnx, LinearMseLossAndWideningOps) {
  if (!have_onnx_python()) GTEST_SKIP() << "python3 with onnx, onnxruntime and numpy not found";
  tg::manual_seed(13);
  auto w = tg::randn({5, 6}), b = tg::randn({5}), w2 = tg::randn({3, 5});
  auto fn = [&](const std::vector<tg::Tensor>& in) {
    auto h = tg::linear(in[0], w, b).tanh();
    auto o = tg::linear(h, w2);
    std::vector<tg::Tensor> out{o, tg::nn::functional::mse_loss(o, in[1]),
                                tg::nn::functional::mse_loss(o, in[1], "sum"),
                                tg::nn::functional::mse_loss(o, in[1].slice(0, 0, 1), "none")};
    // (No float16 arithmetic before the widening ops: ONNX Runtime's CPU float16 Add does not
    // round as IEEE float16 does.)
    tg::Tensor x16 = in[0].abs().to(tg::kFloat16), y16 = (in[0].abs() + 1).to(tg::kFloat16);
    tg::amp::autocast ac(tg::kCPU, tg::kFloat16);
    for (tg::Tensor t : {x16.exp(), y16.log(), x16.sqrt(), in[0].to(tg::kFloat16).pow(2.0)}) {
      EXPECT_EQ(t.dtype(), tg::kFloat32);
      out.push_back(t);
    }
    return out;
  };
  auto ep = tg::export_function(fn, {tg::randn({4, 6}), tg::randn({4, 3})}, {{"w", w}, {"b", b}, {"w2", w2}});
  const std::string g = ep.graph();
  for (const char* s : {"linear(", "mse_loss(", "exp(", "log(", "sqrt("}) EXPECT_NE(g.find(s), std::string::npos) << s << g;
  EXPECT_EQ(g.find("matmul("), std::string::npos) << g;
  const std::vector<tg::Tensor> in{tg::randn({4, 6}), tg::randn({4, 3})};
  const std::vector<tg::Tensor> got = ep.run(in), want = fn(in);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].dtype(), want[i].dtype()) << i;
    expect_close(to_f64(got[i]), to_f64(want[i]), 1e-6);
  }
  check_with_onnxruntime(ep, in, {"x0", "x1"});
}

TEST(ExportOnnx, UnsupportedOpIsAnError) {
  // A program that needs var over the symbolic batch dim cannot be expressed statically.
  auto fn = [](const std::vector<tg::Tensor>& in) { return std::vector<tg::Tensor>{in[0].var(0)}; };
  auto ep = tg::export_function(fn, {tg::randn({4, 3})}, {}, {.dynamic_batch = true});
  try {
    ep.save_onnx(scratch("bad.onnx"));
    FAIL() << "expected tg::Error";
  } catch (const tg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("var"), std::string::npos) << e.what();
  }
}

// ---- issue 15: softmax family and classification losses
// softmax / log_softmax / logsumexp are recorded as themselves and lowered to Softmax / LogSoftmax /
// ReduceLogSumExp; cross_entropy (class indices with weight and label smoothing, probability
// targets), nll_loss and binary_cross_entropy_with_logits run again from the program, survive a
// .tgx round trip, and lower to a composite ONNX Runtime reproduces.
TEST(ExportOnnx, SoftmaxFamilyAndClassificationLosses) {
  tg::manual_seed(15);
  auto cls_w = tg::tensor(std::vector<float>{0.5f, 1.0f, 2.0f, 1.5f});
  auto pos_w = tg::tensor(std::vector<float>{2.0f, 0.5f, 1.0f, 3.0f});
  auto fn = [&](const std::vector<tg::Tensor>& in) {
    const tg::Tensor& x = in[0];
    const tg::Tensor& t = in[1];
    tg::Tensor p = tg::softmax(in[2], 1);
    return std::vector<tg::Tensor>{
        tg::softmax(x, 1),
        tg::log_softmax(x, 0),
        tg::logsumexp(x, {1}),
        x.logsumexp({0, 1}, true),
        tg::nn::functional::cross_entropy(x, t),
        tg::nn::functional::cross_entropy(x, t, {.reduction = "none", .ignore_index = 1, .label_smoothing = 0.2,
                                                 .weight = cls_w}),
        tg::nn::functional::cross_entropy(x, t, {.reduction = "sum", .label_smoothing = 0.1, .weight = cls_w}),
        tg::nn::functional::cross_entropy(x, p, {.label_smoothing = 0.1}),
        tg::nn::functional::nll_loss(tg::log_softmax(x, 1), t, {.weight = cls_w}),
        tg::nn::functional::binary_cross_entropy_with_logits(x, p, {.pos_weight = pos_w}),
    };
  };
  auto make_inputs = [] {
    return std::vector<tg::Tensor>{tg::randn({5, 4}), tg::tensor(std::vector<int64_t>{3, 1, 0, 2, 1}),
                                   tg::randn({5, 4})};
  };
  auto ep = tg::export_function(fn, make_inputs());
  const std::string g = ep.graph();
  for (const char* s : {"softmax(", "log_softmax(", "logsumexp(", "cross_entropy(", "nll_loss(",
                        "binary_cross_entropy_with_logits("})
    EXPECT_NE(g.find(s), std::string::npos) << s << g;
  const auto in = make_inputs();
  const std::vector<tg::Tensor> want = fn(in);
  const auto path = scratch("classification.tgx");
  ep.save(path);
  for (const auto& prog : {ep, tg::ExportedProgram::load(path)}) {
    const std::vector<tg::Tensor> got = prog.run(in);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].sizes(), want[i].sizes()) << i;
      expect_close(to_f64(got[i]), to_f64(want[i]), 1e-6);
    }
  }
  if (!have_onnx_python()) GTEST_SKIP() << "python3 with onnx, onnxruntime and numpy not found";
  check_with_onnxruntime(ep, in, {"x0", "x1", "x2"});
}
// ---- issue 15: normalization, embedding, dropout
TEST(ExportOnnx, LayerNormRmsNormEmbedding) {
  if (!have_onnx_python()) GTEST_SKIP() << "python3 with onnx, onnxruntime and numpy not found";
  tg::manual_seed(21);
  auto w = tg::randn({6}), b = tg::randn({6}), w2 = tg::randn({3, 6}), table = tg::randn({10, 6});
  namespace F = tg::nn::functional;
  auto fn = [&](const std::vector<tg::Tensor>& in) {
    tg::Tensor e = F::embedding(in[1], table);  // [4, 2, 6]
    return std::vector<tg::Tensor>{F::layer_norm(in[0], {6}, w, b), F::layer_norm(in[0], {6}),
                                   F::layer_norm(in[0].view({4, 2, 3}), {2, 3}, tg::Tensor(), b.view({2, 3})),
                                   F::rms_norm(in[0], {6}, w, 1e-5), F::rms_norm(e, {2, 6}, w2.view({2, 9}).slice(1, 0, 6)),
                                   e + F::dropout(e, 0.5, false)};
  };
  const std::vector<tg::Tensor> in{tg::randn({4, 6}),
                                   tg::tensor<int64_t>({1, 9, 0, 0, 3, 7, 2, 9}, {4, 2}, tg::kInt64)};
  auto ep = tg::export_function(fn, in, {{"w", w}, {"b", b}, {"w2", w2}, {"table", table}});
  const std::string g = ep.graph();
  for (const char* s : {"layer_norm(", "rms_norm(", "embedding("}) EXPECT_NE(g.find(s), std::string::npos) << s << g;
  EXPECT_EQ(g.find("dropout("), std::string::npos) << g;  // eval mode: nothing traced
  const std::vector<tg::Tensor> in2{tg::randn({4, 6}),
                                    tg::tensor<int64_t>({0, 1, 2, 3, 4, 5, 6, 8}, {4, 2}, tg::kInt64)};
  const std::vector<tg::Tensor> got = ep.run(in2), want = fn(in2);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) expect_close(to_f64(got[i]), to_f64(want[i]), 1e-6);
  // The .tgx round trip keeps normalized_shape and eps.
  const auto tgx_dir = scratch("tgx");
  fs::create_directories(tgx_dir);
  const auto tgx = (fs::path(tgx_dir) / "norm.tgx").string();
  ep.save(tgx);
  const std::vector<tg::Tensor> loaded = tg::ExportedProgram::load(tgx).run(in2);
  ASSERT_EQ(loaded.size(), want.size());
  for (size_t i = 0; i < loaded.size(); ++i) expect_close(to_f64(loaded[i]), to_f64(want[i]), 1e-6);
  check_with_onnxruntime(ep, in2, {"x0", "x1"});
}

// A traced dropout (training mode) replays as dropout; ONNX gets a Dropout node in training mode.
TEST(ExportOnnx, DropoutInTrainingModeIsTraced) {
  auto fn = [](const std::vector<tg::Tensor>& in) {
    return std::vector<tg::Tensor>{tg::nn::functional::dropout(in[0], 0.25)};
  };
  auto ep = tg::export_function(fn, {tg::randn({8, 8})}, {});
  EXPECT_NE(ep.graph().find("dropout("), std::string::npos) << ep.graph();
  const tg::Tensor y = ep.run({tg::ones({8, 8})})[0];
  for (double v : to_f64(y)) EXPECT_TRUE(v == 0 || std::abs(v - 1 / 0.75) < 1e-6) << v;
  const auto dir = scratch("onnx");
  fs::create_directories(dir);
  ep.save_onnx((fs::path(dir) / "dropout.onnx").string());
}

// ---- issue 17: pooling: traced, replayed by run(), lowered to MaxPool / AveragePool /
// GlobalAveragePool; what ONNX cannot express is a tg::Error.
TEST(ExportOnnx, Pooling) {
  namespace F = tg::nn::functional;
  auto fn = [](const std::vector<tg::Tensor>& in) {
    tg::Tensor x = in[0];
    tg::Tensor a = F::max_pool2d(x, {.kernel_size = 3, .stride = 2, .padding = 1, .dilation = {1, 2}});
    tg::Tensor b = F::avg_pool2d(x, {.kernel_size = {3, 2}, .stride = 2, .padding = {1, 0}, .count_include_pad = false});
    tg::Tensor c = F::adaptive_avg_pool2d(x, 1);
    tg::Tensor d = F::adaptive_avg_pool2d(x, {4, 3});
    return std::vector<tg::Tensor>{a, b, c, d};
  };
  tg::manual_seed(17);
  const tg::Tensor x = tg::randn({2, 3, 8, 6});
  auto ep = tg::export_function(fn, {x}, {}, {.dynamic_batch = true});
  EXPECT_NE(ep.graph().find("max_pool2d("), std::string::npos) << ep.graph();
  const tg::Tensor x5 = tg::randn({5, 3, 8, 6});
  const auto got = ep.run({x5}), want = fn({x5});
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].sizes(), want[i].sizes()) << i;
    EXPECT_EQ(to_f64(got[i]), to_f64(want[i])) << i;
  }
  auto bad = [](const std::vector<tg::Tensor>& in) {
    return std::vector<tg::Tensor>{F::avg_pool2d(in[0], {.kernel_size = 2, .divisor_override = 3})};
  };
  const auto dir = scratch("onnx");
  fs::create_directories(dir);
  EXPECT_THROW(tg::export_function(bad, {x}, {}).save_onnx((fs::path(dir) / "bad_pool.onnx").string()), tg::Error);
  // The indices of max_pool2d_with_indices are a traced value, not a constant: run() recomputes them.
  auto with_idx = [](const std::vector<tg::Tensor>& in) {
    auto [v, i] = F::max_pool2d_with_indices(in[0], {.kernel_size = 2});
    return std::vector<tg::Tensor>{v, i};
  };
  auto epi = tg::export_function(with_idx, {x}, {});
  const tg::Tensor x2 = tg::randn({2, 3, 8, 6});
  const auto gi = epi.run({x2}), wi = with_idx({x2});
  EXPECT_EQ(to_f64(gi[0]), to_f64(wi[0]));
  EXPECT_EQ(gi[1].dtype(), tg::kInt64);
  EXPECT_EQ(to_f64(gi[1]), to_f64(wi[1]));
  EXPECT_THROW(epi.save_onnx((fs::path(dir) / "pool_indices.onnx").string()), tg::Error);
  if (!have_onnx_python()) GTEST_SKIP() << "python3 with onnx, onnxruntime and numpy not found";
  check_with_onnxruntime(ep, {x5}, {"x"});
}
