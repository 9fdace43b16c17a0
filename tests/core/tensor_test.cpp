// Tensor facts and metadata: sizes, strides, contiguity of views, storage
// sharing, the version counter, DType / Device / TensorOptions construction and
// printing of sizes.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.h>

#include "tests/core/reference.h"

namespace {

using tg::Shape;
using tg::Tensor;
using namespace tg::testing;

TEST(TensorFacts, ContiguousTensor) {
  Tensor x = tg::zeros({2, 3, 4});
  EXPECT_TRUE(x.defined());
  EXPECT_EQ(x.sizes(), Shape({2, 3, 4}));
  EXPECT_EQ(x.strides(), Shape({12, 4, 1}));
  EXPECT_EQ(x.dim(), 3);
  EXPECT_EQ(x.numel(), 24);
  EXPECT_EQ(x.size(1), 3);
  EXPECT_EQ(x.size(-1), 4);
  EXPECT_EQ(x.stride(0), 12);
  EXPECT_EQ(x.stride(-2), 4);
  EXPECT_EQ(x.dtype(), tg::kFloat32);
  EXPECT_EQ(x.device(), tg::Device(tg::kCPU));
  EXPECT_TRUE(x.is_cpu());
  EXPECT_FALSE(x.is_cuda());
  EXPECT_TRUE(x.is_contiguous());
  EXPECT_EQ(x.storage_offset(), 0);
  EXPECT_EQ(x.element_size(), 4u);
  EXPECT_EQ(x.nbytes(), 96u);
  EXPECT_FALSE(Tensor().defined());
}

TEST(TensorFacts, ZeroDimAndEmpty) {
  Tensor s = tg::full({}, 2.0);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_TRUE(s.sizes().empty());
  EXPECT_TRUE(s.strides().empty());
  EXPECT_TRUE(s.is_contiguous());
  Tensor e = tg::zeros({3, 0, 2});
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(e.dim(), 3);
  EXPECT_EQ(e.nbytes(), 0u);
}

TEST(TensorFacts, ContiguityOfViews) {
  Tensor x = tg::zeros({4, 6});
  Tensor t = x.t();
  EXPECT_EQ(t.sizes(), Shape({6, 4}));
  EXPECT_EQ(t.strides(), Shape({1, 6}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_TRUE(t.t().is_contiguous());
  EXPECT_TRUE(t.contiguous().is_contiguous());

  Tensor s = x.slice(1, 0, 6, 2);
  EXPECT_EQ(s.sizes(), Shape({4, 3}));
  EXPECT_EQ(s.strides(), Shape({6, 2}));
  EXPECT_FALSE(s.is_contiguous());

  Tensor rows = x.slice(0, 1, 3);  // a block of whole rows stays contiguous
  EXPECT_TRUE(rows.is_contiguous());
  EXPECT_EQ(rows.storage_offset(), 6);

  Tensor e = tg::zeros({1, 6}).expand({5, 6});
  EXPECT_EQ(e.sizes(), Shape({5, 6}));
  EXPECT_EQ(e.strides(), Shape({0, 1}));
  EXPECT_FALSE(e.is_contiguous());

  Tensor sel = x.select(1, 2);
  EXPECT_EQ(sel.sizes(), Shape({4}));
  EXPECT_EQ(sel.strides(), Shape({6}));
  EXPECT_EQ(sel.storage_offset(), 2);
  EXPECT_FALSE(sel.is_contiguous());

  Tensor p = tg::zeros({2, 3, 4}).permute({2, 0, 1});
  EXPECT_EQ(p.sizes(), Shape({4, 2, 3}));
  EXPECT_EQ(p.strides(), Shape({1, 12, 4}));
  EXPECT_FALSE(p.is_contiguous());

  // Size-1 dims do not break contiguity whatever their stride (PyTorch's rule).
  Tensor u = x.unsqueeze(1);
  EXPECT_EQ(u.sizes(), Shape({4, 1, 6}));
  EXPECT_TRUE(u.is_contiguous());
  EXPECT_TRUE(x.select(0, 1).unsqueeze(0).is_contiguous());
}

TEST(TensorFacts, ViewsShareStorage) {
  Tensor x = tg::zeros({3, 4});
  Tensor v = x.view({12});
  v.fill_(2);
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(12, 2.f));
  x.t().select(0, 1).fill_(5);  // column 1
  auto got = v.to_vector<float>();
  for (int i = 0; i < 12; ++i) EXPECT_EQ(got[i], i % 4 == 1 ? 5.f : 2.f) << i;
  Tensor d = x.detach();
  d.select(0, 0).zero_();
  EXPECT_EQ(x.to_vector<float>()[1], 0.f);
  Tensor c = x.clone();
  c.fill_(-1);
  EXPECT_EQ(x.to_vector<float>()[11], 2.f) << "clone must not share storage";
}

TEST(TensorFacts, VersionCounter) {
  Tensor x = tg::zeros({4});
  Tensor v = x.view({2, 2});
  uint32_t v0 = x.version();
  x.add_(1);
  uint32_t v1 = x.version();
  EXPECT_GT(v1, v0);
  EXPECT_EQ(v.version(), v1) << "a view shares its base's version counter";
  v.mul_(2);
  EXPECT_GT(x.version(), v1);
  uint32_t v2 = x.version();
  x.zero_();
  x.fill_(3);
  x.copy_(tg::ones({4}));
  x.sub_(tg::ones({4}));
  x.div_(2.0);
  EXPECT_GE(x.version(), v2 + 5) << "each in-place op bumps the version";
  uint32_t v3 = x.version();
  Tensor y = x + 1;  // out of place: no bump
  (void)y.sum();
  Tensor z = x.t().contiguous();
  EXPECT_EQ(x.version(), v3);
  EXPECT_EQ(x.clone().version(), 0u) << "a clone has its own, fresh counter";
}

TEST(TensorFacts, DTypeNamesAndSizes) {
  EXPECT_STREQ(tg::dtype_name(tg::kFloat32), "float32");
  EXPECT_STREQ(tg::dtype_name(tg::kBFloat16), "bfloat16");
  EXPECT_EQ(tg::element_size(tg::kFloat16), 2u);
  EXPECT_EQ(tg::element_size(tg::kInt64), 8u);
  EXPECT_EQ(tg::element_size(tg::kBool), 1u);
  EXPECT_TRUE(tg::is_floating(tg::kBFloat16));
  EXPECT_FALSE(tg::is_floating(tg::kInt32));
  EXPECT_EQ(tg::kFloat, tg::kFloat32);
  EXPECT_EQ(tg::kLong, tg::kInt64);
  std::ostringstream os;
  os << tg::kFloat16;
  EXPECT_EQ(os.str(), "float16");
  // torch.promote_types
  EXPECT_EQ(tg::promote_types(tg::kInt32, tg::kInt64), tg::kInt64);
  EXPECT_EQ(tg::promote_types(tg::kFloat16, tg::kFloat32), tg::kFloat32);
  EXPECT_EQ(tg::promote_types(tg::kBFloat16, tg::kFloat16), tg::kFloat32);
  EXPECT_EQ(tg::promote_types(tg::kInt64, tg::kFloat16), tg::kFloat16);
  EXPECT_EQ(tg::promote_types(tg::kBool, tg::kInt32), tg::kInt32);
  EXPECT_EQ(tg::promote_types(tg::kBool, tg::kBool), tg::kBool);
  EXPECT_EQ(tg::promote_types(tg::kFloat64, tg::kFloat32), tg::kFloat64);
}

TEST(TensorFacts, DeviceConstruction) {
  tg::Device cpu;
  EXPECT_TRUE(cpu.is_cpu());
  EXPECT_EQ(cpu.str(), "cpu");
  tg::Device cuda(tg::kCUDA);
  EXPECT_TRUE(cuda.is_cuda());
  EXPECT_FALSE(cuda.has_index());
  EXPECT_EQ(cuda.str(), "cuda");
  tg::Device cuda1(tg::kCUDA, 1);
  EXPECT_EQ(cuda1.index(), 1);
  EXPECT_EQ(cuda1.str(), "cuda:1");
  EXPECT_NE(cuda, cuda1);
  EXPECT_EQ(tg::Device(tg::kCPU, 3), tg::Device(tg::kCPU)) << "a CPU device has no index";
  std::ostringstream os;
  os << cuda1;
  EXPECT_EQ(os.str(), "cuda:1");
}

TEST(TensorFacts, TensorOptionsFromBareDTypeOrDevice) {
  tg::TensorOptions d = tg::kFloat64;
  EXPECT_EQ(d.dtype(), tg::kFloat64);
  EXPECT_TRUE(d.device().is_cpu());
  tg::TensorOptions c = tg::kCUDA;
  EXPECT_TRUE(c.device().is_cuda());
  EXPECT_EQ(c.dtype(), tg::kFloat32);
  tg::TensorOptions o = tg::TensorOptions().dtype(tg::kInt32).device(tg::kCPU).requires_grad(false);
  EXPECT_EQ(o.dtype(), tg::kInt32);
  EXPECT_FALSE(o.requires_grad());
  EXPECT_FALSE(tg::TensorOptions().dtype_opt().has_value());

  EXPECT_EQ(tg::zeros({2}, tg::kFloat64).dtype(), tg::kFloat64);
  EXPECT_EQ(tg::ones({2}, tg::kInt32).dtype(), tg::kInt32);
  EXPECT_EQ(tg::rand({2}, tg::kCPU).device(), tg::Device(tg::kCPU));
  EXPECT_EQ(tg::full({2}, 1, tg::kBool).dtype(), tg::kBool);
  Tensor x = tg::zeros({2}, tg::kFloat16);
  EXPECT_EQ(x.options().dtype(), tg::kFloat16);
  EXPECT_EQ(tg::zeros({1}, x.options()).dtype(), tg::kFloat16);
  EXPECT_EQ(tg::zeros_like(x).dtype(), tg::kFloat16);
  EXPECT_EQ(tg::ones_like(x).sizes(), Shape({2}));
  EXPECT_EQ(tg::empty_like(x, tg::kInt64).dtype(), tg::kInt64);
}

TEST(TensorFacts, CudaFactoriesFromBareDevice) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Tensor x = tg::rand({16}, tg::kCUDA);
  EXPECT_TRUE(x.is_cuda());
  EXPECT_EQ(x.dtype(), tg::kFloat32);
  EXPECT_TRUE(x.device().has_index()) << "factories resolve the current device index";
  EXPECT_EQ(x.device().index(), tg::cuda::current_device());
  Tensor y = tg::zeros({2, 2}, tg::TensorOptions().dtype(tg::kFloat64).device(tg::kCUDA));
  EXPECT_EQ(y.dtype(), tg::kFloat64);
  EXPECT_TRUE(y.is_cuda());
  EXPECT_TRUE(x.cpu().is_cpu());
  EXPECT_TRUE(x.cpu().cuda().is_cuda());
  EXPECT_EQ(x.t().device(), x.device()) << "views keep the device";
}

TEST(TensorFacts, PrintSizes) {
  std::ostringstream os;
  os << tg::zeros({8000, 8000}, tg::kInt32).sizes() << " " << Shape{} << " " << Shape{5};
  EXPECT_EQ(os.str(), "[8000, 8000] [] [5]");
  EXPECT_EQ(Shape({2, 3}).str(), "[2, 3]");
  EXPECT_EQ(Shape({2, 3}).numel(), 6);
  EXPECT_EQ(Shape{}.numel(), 1);
  std::ostringstream st;
  st << tg::zeros({2, 3}).t().strides();
  EXPECT_EQ(st.str(), "[1, 3]");
}

TEST(TensorFacts, ReshapeViewOrCopy) {
  Tensor x = tg::arange(12, tg::kFloat32);
  Tensor v = x.reshape({3, 4});
  EXPECT_EQ(v.data_ptr(), x.data_ptr()) << "reshape of a contiguous tensor is a view";
  Tensor t = v.t();
  Tensor r = t.reshape({12});
  EXPECT_NE(r.data_ptr(), x.data_ptr()) << "reshape of a transposed tensor copies";
  EXPECT_TRUE(r.is_contiguous());
  Tensor f = v.flatten();
  EXPECT_EQ(f.sizes(), Shape({12}));
  // view on a slice of whole rows is allowed without a copy
  Tensor rows = v.slice(0, 1, 3).view({8});
  EXPECT_EQ(rows.storage_offset(), 4);
  EXPECT_EQ(rows.to_vector<float>(), (std::vector<float>{4, 5, 6, 7, 8, 9, 10, 11}));
  // view that splits a dim of a transposed tensor is stride-compatible
  Tensor tt = tg::arange(24, tg::kFloat32).view({4, 6}).t();  // [6, 4] strides [1, 6]
  Tensor sp = tt.view({2, 3, 4});
  EXPECT_EQ(sp.strides(), Shape({3, 1, 6}));
  EXPECT_EQ(sp.data_ptr(), tt.data_ptr());
}

TEST(TensorFacts, Version) { EXPECT_NE(std::string(tg::version()), ""); }

}  // namespace
