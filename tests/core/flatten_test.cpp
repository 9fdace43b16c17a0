// tg::flatten / Tensor::flatten(start_dim, end_dim) (issue 17): torch.flatten's shapes, values kept
// in row-major order, a view when the dims are contiguous, gradients, errors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <tapegrad/tapegrad.h>

namespace {

TEST(Flatten, ShapesAndValues) {
  auto x = tg::arange(24).to(tg::kFloat64).reshape({2, 3, 4});
  EXPECT_EQ(tg::flatten(x).sizes(), tg::Shape({24}));
  EXPECT_EQ(x.flatten().sizes(), tg::Shape({24}));
  EXPECT_EQ(tg::flatten(x, 1).sizes(), tg::Shape({2, 12}));
  EXPECT_EQ(tg::flatten(x, 0, 1).sizes(), tg::Shape({6, 4}));
  EXPECT_EQ(tg::flatten(x, -2, -1).sizes(), tg::Shape({2, 12}));
  EXPECT_EQ(tg::flatten(x, 1, 1).sizes(), tg::Shape({2, 3, 4}));
  EXPECT_EQ(tg::flatten(tg::full({}, 5.0)).sizes(), tg::Shape({1}));
  // a transposed input: values in the logical (row-major) order of the view
  auto t = x.transpose(1, 2);  // [2, 4, 3]
  const auto v = tg::flatten(t, 1).contiguous().to_vector<double>();
  EXPECT_EQ(v[0], 0);
  EXPECT_EQ(v[1], 4);   // t[0, 0, 1] = x[0, 1, 0]
  EXPECT_EQ(v[3], 1);   // t[0, 1, 0] = x[0, 0, 1]
  EXPECT_EQ(v[12], 12); // t[1, 0, 0]
  // contiguous dims: a view of the same storage
  EXPECT_EQ(tg::flatten(x, 1).data_ptr(), x.data_ptr());
}

TEST(Flatten, GradientAndErrors) {
  auto x = tg::randn({2, 3, 4}, tg::kFloat64).requires_grad_();
  (tg::flatten(x, 1) * tg::arange(12).to(tg::kFloat64)).sum().backward();
  const auto g = x.grad().to_vector<double>();
  for (int i = 0; i < 24; ++i) EXPECT_EQ(g[static_cast<size_t>(i)], i % 12);
  for (auto [s, e] : std::vector<std::pair<int64_t, int64_t>>{{2, 1}, {3, 3}, {0, -4}}) {
    try {
      tg::flatten(x, s, e);
      ADD_FAILURE() << "no error for " << s << ", " << e;
    } catch (const tg::Error& err) {
      const std::string m = err.what();
      EXPECT_NE(m.find("flatten"), std::string::npos) << m;
      EXPECT_NE(m.find("[2, 3, 4]"), std::string::npos) << m;
    }
  }
  EXPECT_THROW(tg::nn::Flatten(4).forward(x), tg::Error);
}

}  // namespace
