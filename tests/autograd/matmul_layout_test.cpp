// matmul against a transposed (column-major) operand, as in Linear's x @ weight.t():
// the gradient is produced in the operand's own layout, so the leaf's .grad() is the
// dense [out, in] tensor with no transposing copy, and its values match float64.
#include <gtest/gtest.h>

#include <tapegrad/tapegrad.h>

namespace {

std::vector<tg::Device> test_devices() {
  std::vector<tg::Device> d{tg::kCPU};
  if (tg::cuda::is_available()) d.emplace_back(tg::kCUDA, 0);
  return d;
}

TEST(MatmulLayout, TransposedOperandsGetGradientsInTheirLayout) {
  for (tg::Device dev : test_devices()) {
    SCOPED_TRACE(dev.str());
    auto x = tg::randn({5, 3}, tg::TensorOptions().dtype(tg::kFloat64).device(dev).requires_grad(true));
    auto w = tg::randn({4, 3}, tg::TensorOptions().dtype(tg::kFloat64).device(dev).requires_grad(true));
    auto xt = tg::randn({3, 5}, tg::TensorOptions().dtype(tg::kFloat64).device(dev).requires_grad(true));
    // y = x @ w^T + xt^T @ w^T : both a column-major right and a column-major left operand.
    auto y = tg::matmul(x, w.t()) + tg::matmul(xt.t(), w.t());
    auto g = tg::randn({5, 4}, tg::TensorOptions().dtype(tg::kFloat64).device(dev));
    y.backward(g);
    // References on the host: dW = g^T (x + xt^T), dx = g W, dxt = (g W)^T.
    auto gv = g.cpu().to_vector<double>(), xv = x.detach().cpu().to_vector<double>();
    auto xtv = xt.detach().cpu().to_vector<double>(), wv = w.detach().cpu().to_vector<double>();
    auto dw = w.grad().cpu().to_vector<double>(), dx = x.grad().cpu().to_vector<double>();
    auto dxt = xt.grad().cpu().to_vector<double>();
    EXPECT_TRUE(w.grad().is_contiguous());
    EXPECT_TRUE(xt.grad().is_contiguous());
    for (int o = 0; o < 4; ++o)
      for (int i = 0; i < 3; ++i) {
        double r = 0;
        for (int b = 0; b < 5; ++b) r += gv[b * 4 + o] * (xv[b * 3 + i] + xtv[i * 5 + b]);
        EXPECT_NEAR(dw[o * 3 + i], r, 1e-12);
      }
    for (int b = 0; b < 5; ++b)
      for (int i = 0; i < 3; ++i) {
        double r = 0;
        for (int o = 0; o < 4; ++o) r += gv[b * 4 + o] * wv[o * 3 + i];
        EXPECT_NEAR(dx[b * 3 + i], r, 1e-12);
        EXPECT_NEAR(dxt[i * 5 + b], r, 1e-12);
      }
  }
}

}  // namespace
