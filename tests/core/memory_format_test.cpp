// MemoryFormat::ChannelsLast (issue 17): the layout check, the differentiable copy into it,
// elementwise results that keep it (and coalesce to dense loops), and Module::to(format).
// References: the row-major tensor's values, and strides written out by hand.
#include <gtest/gtest.h>

#include <vector>

#include "tests/autograd/common.h"

namespace tg::testing {
namespace {

class MemoryFormatTest : public ::testing::TestWithParam<Dev> {};

TEST_P(MemoryFormatTest, ContiguousChannelsLastStridesAndValues) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  tg::manual_seed(1);
  auto x = tg::randn({2, 3, 4, 5}, TensorOptions(kFloat64).device(dev));
  EXPECT_TRUE(x.is_contiguous(MemoryFormat::Contiguous));
  EXPECT_FALSE(x.is_contiguous(MemoryFormat::ChannelsLast));
  auto cl = x.contiguous(MemoryFormat::ChannelsLast);
  EXPECT_EQ(cl.sizes(), x.sizes());
  EXPECT_EQ(cl.strides(), (Shape{60, 1, 15, 3}));  // N: H*W*C, C: 1, H: W*C, W: C
  EXPECT_TRUE(cl.is_contiguous(MemoryFormat::ChannelsLast));
  EXPECT_FALSE(cl.is_contiguous());
  EXPECT_EQ(host(cl), host(x));
  EXPECT_TRUE(cl.contiguous(MemoryFormat::ChannelsLast).is_same(cl));  // no copy when already laid out
  auto back = cl.contiguous();
  EXPECT_TRUE(back.is_contiguous());
  EXPECT_EQ(host(back), host(x));
  // [N, C, 1, 1] and [N, 1, H, W]: size-1 dims' strides do not matter, both layouts hold
  auto flat = tg::randn({4, 8, 1, 1}, TensorOptions().device(dev));
  EXPECT_TRUE(flat.is_contiguous(MemoryFormat::ChannelsLast));
  EXPECT_FALSE(tg::randn({2, 3}, TensorOptions().device(dev)).is_contiguous(MemoryFormat::ChannelsLast));
}

TEST_P(MemoryFormatTest, CopyIsDifferentiable) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  tg::manual_seed(2);
  auto x = tg::randn({2, 3, 4, 5}, TensorOptions(kFloat64).device(dev)).requires_grad_();
  auto w = tg::randn({2, 3, 4, 5}, TensorOptions(kFloat64).device(dev));
  (x.contiguous(MemoryFormat::ChannelsLast) * w).sum().backward();
  EXPECT_EQ(host(x.grad()), host(w));
}

TEST_P(MemoryFormatTest, ElementwiseResultsKeepChannelsLast) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  tg::manual_seed(3);
  auto x = tg::randn({2, 6, 5, 7}, TensorOptions().device(dev));
  auto y = tg::randn({2, 6, 5, 7}, TensorOptions().device(dev));
  auto bias = tg::randn({1, 6, 1, 1}, TensorOptions().device(dev));
  auto xc = x.contiguous(MemoryFormat::ChannelsLast), yc = y.contiguous(MemoryFormat::ChannelsLast);
  auto check = [](const Tensor& got, const Tensor& want, const char* what) {
    SCOPED_TRACE(what);
    EXPECT_TRUE(got.is_contiguous(MemoryFormat::ChannelsLast)) << got.strides();
    EXPECT_EQ(host(got), host(want));
  };
  check(tg::relu(xc), tg::relu(x), "relu");
  check(xc + yc, x + y, "add, both channels-last");
  check(xc + y, x + y, "add, one channels-last");
  check(xc * bias, x * bias, "broadcast bias");
  check(xc * 2.0, x * 2.0, "scalar");
  check(xc.to(kFloat16).to(kFloat32), x.to(kFloat16).to(kFloat32), "casts");
  // in place on a channels-last tensor, and a row-major op stays row-major
  auto z = xc.clone();
  z.add_(yc);
  EXPECT_EQ(host(z), host(x + y));
  EXPECT_TRUE((x + y).is_contiguous());
}

TEST_P(MemoryFormatTest, ModuleToChannelsLast) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Device dev = to_device(GetParam());
  nn::Conv2d conv(3, 8, 3);
  conv.to(dev);
  auto before = host(conv.weight);
  Tensor handle = conv.weight;
  conv.to(MemoryFormat::ChannelsLast);
  EXPECT_TRUE(handle.is_contiguous(MemoryFormat::ChannelsLast));  // in place: handles see it
  EXPECT_FALSE(handle.is_contiguous());
  EXPECT_TRUE(handle.requires_grad());
  EXPECT_EQ(host(handle), before);
  EXPECT_TRUE(conv.bias.is_contiguous());  // 1-d: untouched
  auto x = tg::randn({2, 3, 6, 6}, TensorOptions().device(dev)).contiguous(MemoryFormat::ChannelsLast);
  auto y = conv(x);
  EXPECT_TRUE(y.is_contiguous(MemoryFormat::ChannelsLast));
  y.sum().backward();
  EXPECT_EQ(conv.weight.grad().sizes(), conv.weight.sizes());
  EXPECT_THROW(conv.to(MemoryFormat::Preserve), tg::Error);
  EXPECT_THROW(tg::randn({2, 3}).contiguous(MemoryFormat::ChannelsLast), tg::Error);
}

INSTANTIATE_TEST_SUITE_P(Devices, MemoryFormatTest, ::testing::Values(Dev::CPU, Dev::CUDA), dev_name);

}  // namespace
}  // namespace tg::testing
