// gradcheck itself: it passes correct gradients, catches a wrong backward (with
// the failing input and element named), and leaves the caller's tensors alone.
#include <sstream>
#include <vector>

#include <tapegrad/autograd/function.h>
#include "tests/autograd/common.h"

namespace tg::testing {
namespace {

using Inputs = std::vector<Tensor>;

// forward 2 * x, backward deliberately 3 * g for elements past the first.
Tensor wrong_double(const Tensor& x) {
  Tensor out = native::mul(x, Scalar(2.0));
  if (!autograd::should_record(x)) return out;
  return autograd::record("wrong_double", {x}, out, [](const Tensor& g, const autograd::FunctionNode&) {
    Tensor r = native::mul(g, Scalar(3.0));
    native::copy_(native::slice(r, 0, 0, 1, 1), native::mul(native::slice(g, 0, 0, 1, 1), Scalar(2.0)));
    return std::vector<Tensor>{r};
  });
}

class Gradcheck : public ::testing::TestWithParam<Dev> {
 protected:
  void SetUp() override { TG_SKIP_WITHOUT_CUDA(GetParam()); }
  Device dev() const { return to_device(GetParam()); }
};

TEST_P(Gradcheck, CatchesAWrongBackward) {
  auto x = tg::randn({4}, TensorOptions().dtype(kFloat64).device(dev()));
  auto r = autograd::gradcheck([](const Inputs& v) { return wrong_double(v[0]); }, {x});
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.input_index, 0);
  EXPECT_EQ(r.element, 1);  // element 0 is right, element 1 is the first wrong one
  EXPECT_GT(r.max_abs_err, 0.1);
  std::ostringstream os;
  os << r;
  EXPECT_NE(os.str().find("element 1"), std::string::npos) << os.str();
}

TEST_P(Gradcheck, OnlyInputsThatRequireGradAndCallerUntouched) {
  auto a = tg::randn({3}, TensorOptions().dtype(kFloat32).device(dev()).requires_grad(true));
  auto b = tg::randn({3}, TensorOptions().dtype(kFloat32).device(dev()));
  std::vector<double> before = host(a);
  // b does not require grad: wrong_double on b would fail, but b is not differentiated.
  auto r = autograd::gradcheck([](const Inputs& v) { return v[0] * wrong_double(v[1]); }, {a, b});
  EXPECT_TRUE(r.ok) << r;
  EXPECT_EQ(a.dtype(), kFloat32);
  expect_near_vec(host(a), before, 0, 0, "caller's input");
  EXPECT_FALSE(a.grad().defined());
}

INSTANTIATE_TEST_SUITE_P(Devices, Gradcheck, ::testing::Values(Dev::CPU, Dev::CUDA), dev_name);

}  // namespace
}  // namespace tg::testing
