// tg::InferenceMode: no graph recording inside; tensors made inside are inference tensors (their
// in-place ops inside the mode bump no version; they cannot require grad outside it nor be saved
// for backward); in-place ops inside the mode on normal tensors still bump their version.
#include <string>
#include <vector>

#include "tests/autograd/common.h"
#include "tests/common/error_of.h"

namespace tg::testing {
namespace {

TensorOptions f64() { return TensorOptions().dtype(kFloat64); }

TEST(InferenceMode, RecordsNoGraphAndRestoresTheModes) {
  auto w = tg::tensor<double>({2, 3}, f64());
  w.requires_grad_();
  auto x = tg::tensor<double>({5, 7}, f64());
  EXPECT_FALSE(tg::InferenceMode::is_enabled());
  {
    tg::InferenceMode guard;
    EXPECT_TRUE(tg::InferenceMode::is_enabled());
    EXPECT_FALSE(tg::autograd::GradMode::is_enabled());
    auto y = x * w + 1;
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(y.grad_fn(), nullptr);
    expect_near_vec(host(y), {11, 22}, 0, 0, "values");
    {
      tg::InferenceMode off(false);  // nests; as c10::InferenceMode(false), recording is back on
      EXPECT_FALSE(tg::InferenceMode::is_enabled());
      EXPECT_TRUE(tg::autograd::GradMode::is_enabled());
      EXPECT_TRUE((x * w).requires_grad());
    }
    EXPECT_TRUE(tg::InferenceMode::is_enabled());
    EXPECT_FALSE(tg::autograd::GradMode::is_enabled());
  }
  EXPECT_FALSE(tg::InferenceMode::is_enabled());
  EXPECT_TRUE(tg::autograd::GradMode::is_enabled());
  {
    NoGradGuard no_grad;
    { tg::InferenceMode guard; }
    EXPECT_FALSE(tg::autograd::GradMode::is_enabled());  // the previous (off) state comes back
  }
}

TEST(InferenceMode, VersionCountersOfInferenceAndNormalTensors) {
  auto normal = tg::tensor<double>({1, 2}, f64());
  const uint32_t v0 = normal.version();
  Tensor inf;
  {
    tg::InferenceMode guard;
    inf = tg::zeros({2}, f64());
    EXPECT_TRUE(inf.impl().storage->is_inference());
    inf.add_(1);
    inf.mul_(3);
    EXPECT_EQ(inf.version(), 0u);  // no version counter bumps
    auto view = inf.slice(0, 0, 1);
    view.add_(1);
    EXPECT_EQ(inf.version(), 0u);
    normal.add_(1);  // a normal tensor still bumps, so autograd's saved-tensor check stays sound
    EXPECT_EQ(normal.version(), v0 + 1);
  }
  expect_near_vec(host(inf), {4, 3}, 0, 0, "in-place results");
  expect_near_vec(host(normal), {2, 3}, 0, 0, "normal tensor");
  EXPECT_FALSE(normal.impl().storage->is_inference());
  EXPECT_FALSE(tg::zeros({1}).impl().storage->is_inference());
}

TEST(InferenceMode, InferenceTensorsCannotBeSavedOrRequireGradOutside) {
  Tensor a;
  {
    tg::InferenceMode guard;
    a = tg::tensor<double>({1, 2}, f64());
  }
  auto w = tg::tensor<double>({3, 4}, f64());
  w.requires_grad_();
  std::string e = error_of([&] { (a * w).sum().backward(); });  // mul saves a for w's gradient
  EXPECT_NE(e.find("inference tensor"), std::string::npos) << e;
  e = error_of([&] { a.requires_grad_(); });
  EXPECT_NE(e.find("inference tensor"), std::string::npos) << e;
  // A clone made outside is a normal tensor.
  auto b = a.clone();
  (b * w).sum().backward();
  expect_near_vec(host(w.grad()), {1, 2}, 0, 0, "w.grad from the clone");
  // Used where nothing is saved, an inference tensor is fine: add saves neither operand.
  auto y = (w + a).sum();
  y.backward();
  expect_near_vec(host(w.grad()), {2, 3}, 0, 0, "w.grad accumulated");
}

struct SaveInput : tg::autograd::Function<SaveInput> {
  static Tensor forward(tg::autograd::AutogradContext* ctx, const Tensor& x, const Tensor& w) {
    ctx->save_for_backward({x});
    return x * w;
  }
  static std::vector<Tensor> backward(tg::autograd::AutogradContext* ctx, std::vector<Tensor> g) {
    return {Tensor(), g[0] * ctx->saved_tensors()[0]};
  }
};

TEST(InferenceMode, CustomFunctionsCannotSaveInferenceTensors) {
  Tensor a;
  {
    tg::InferenceMode guard;
    a = tg::ones({2}, f64());
  }
  auto w = tg::ones({2}, f64());
  w.requires_grad_();
  const std::string e = error_of([&] { SaveInput::apply(a, w); });
  EXPECT_NE(e.find("inference tensor"), std::string::npos) << e;
}

}  // namespace
}  // namespace tg::testing
