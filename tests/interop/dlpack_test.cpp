// DLPack export and import: zero copy, strides and offsets, every dtype, the
// producer's deleter called exactly once, and refusals that still call it.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include <tapegrad/tapegrad.h>

namespace {

using tg::Tensor;

// Host row-major values as float64 (independent of the tensor's layout).
std::vector<double> host(const Tensor& t) { return t.to(tg::Device(tg::kCPU), tg::kFloat64).contiguous().to_vector<double>(); }

// A foreign producer: owns a buffer and counts its deleter calls.
struct Producer {
  std::vector<unsigned char> buffer;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  int deleted = 0;
};

template <typename Managed>
struct ForeignTensor {
  Managed managed{};
  Producer* producer = nullptr;
};

template <typename Managed>
void foreign_deleter(Managed* self) {
  auto* f = static_cast<ForeignTensor<Managed>*>(self->manager_ctx);
  ++f->producer->deleted;
}

// Fills a DLTensor over p's buffer (no strides when p.strides is empty).
template <typename Managed>
void describe(ForeignTensor<Managed>& f, Producer& p, DLDataType dtype, uint64_t byte_offset = 0,
              DLDevice device = DLDevice{kDLCPU, 0}) {
  f.producer = &p;
  f.managed.manager_ctx = &f;
  f.managed.deleter = &foreign_deleter<Managed>;
  DLTensor& dl = f.managed.dl_tensor;
  dl.data = p.buffer.data();
  dl.device = device;
  dl.ndim = static_cast<int32_t>(p.shape.size());
  dl.dtype = dtype;
  dl.shape = p.shape.data();
  dl.strides = p.strides.empty() ? nullptr : p.strides.data();
  dl.byte_offset = byte_offset;
}

TEST(DLPack, ExportKeepsMemoryAliveAndDescribesIt) {
  DLManagedTensorVersioned* dl = nullptr;
  const void* data = nullptr;
  {
    Tensor x = tg::arange(12, tg::kFloat32).reshape({3, 4});
    data = x.data_ptr();
    dl = tg::to_dlpack(x);
  }  // x is gone; the export still holds the storage
  ASSERT_NE(dl, nullptr);
  EXPECT_EQ(dl->version.major, 1u);
  EXPECT_EQ(dl->flags & DLPACK_FLAG_BITMASK_READ_ONLY, 0u);
  EXPECT_EQ(dl->flags & DLPACK_FLAG_BITMASK_IS_COPIED, 0u);
  const DLTensor& t = dl->dl_tensor;
  EXPECT_EQ(t.data, data);
  EXPECT_EQ(t.byte_offset, 0u);
  EXPECT_EQ(t.device.device_type, kDLCPU);
  EXPECT_EQ(t.ndim, 2);
  EXPECT_EQ(t.dtype.code, kDLFloat);
  EXPECT_EQ(t.dtype.bits, 32);
  EXPECT_EQ(t.dtype.lanes, 1);
  EXPECT_EQ(t.shape[0], 3);
  EXPECT_EQ(t.shape[1], 4);
  ASSERT_NE(t.strides, nullptr);
  EXPECT_EQ(t.strides[0], 4);
  EXPECT_EQ(t.strides[1], 1);
  const auto* f = static_cast<const float*>(t.data);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(f[i], static_cast<float>(i));
  dl->deleter(dl);
}

TEST(DLPack, StridedAndOffsetViewsKeepTheirLayout) {
  Tensor base = tg::arange(24, tg::kFloat64).reshape({4, 6});
  Tensor view = base.slice(1, 1, 5).t();  // shape [4, 4], strides [1, 6], offset 1
  DLManagedTensorVersioned* dl = tg::to_dlpack(view);
  const DLTensor& t = dl->dl_tensor;
  EXPECT_EQ(t.shape[0], 4);
  EXPECT_EQ(t.shape[1], 4);
  EXPECT_EQ(t.strides[0], 1);
  EXPECT_EQ(t.strides[1], 6);
  EXPECT_EQ(static_cast<const double*>(t.data), base.data_ptr<double>() + 1);
  // Element (i, j) of the view is base[j][i + 1].
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j)
      EXPECT_EQ(static_cast<const double*>(t.data)[i * t.strides[0] + j * t.strides[1]], j * 6.0 + i + 1);
  Tensor back = tg::from_dlpack(dl);
  EXPECT_EQ(back.sizes(), view.sizes());
  EXPECT_EQ(back.strides(), view.strides());
  EXPECT_EQ(back.data_ptr(), view.data_ptr());
  EXPECT_EQ(host(back), host(view));
}

TEST(DLPack, RoundTripSharesMemoryBothStructs) {
  Tensor x = tg::rand({5, 3});
  Tensor a = tg::from_dlpack(tg::to_dlpack(x));
  Tensor b = tg::from_dlpack(tg::to_dlpack_legacy(x));
  EXPECT_EQ(a.data_ptr(), x.data_ptr());
  EXPECT_EQ(b.data_ptr(), x.data_ptr());
  x.mul_(2.0);  // writes through the shared memory
  EXPECT_EQ(host(a), host(x));
  EXPECT_EQ(host(b), host(x));
  EXPECT_FALSE(a.requires_grad());
}

TEST(DLPack, ExportDropsAutogradHistory) {
  Tensor w = tg::rand({3}, tg::TensorOptions().requires_grad(true));
  Tensor y = w * 2;
  Tensor back = tg::from_dlpack(tg::to_dlpack(y));
  EXPECT_FALSE(back.requires_grad());
  EXPECT_EQ(host(back), host(y));
}

TEST(DLPack, EveryDTypeBothWays) {
  for (tg::DType dt : {tg::kFloat32, tg::kFloat16, tg::kBFloat16, tg::kFloat64, tg::kInt64, tg::kInt32, tg::kBool,
                       tg::kUInt8, tg::kInt8, tg::kInt16}) {
    SCOPED_TRACE(tg::dtype_name(dt));
    Tensor x = (tg::arange(6, tg::kFloat64).reshape({2, 3}) - 2.0).to(dt);
    for (bool legacy : {false, true}) {
      Tensor back = legacy ? tg::from_dlpack(tg::to_dlpack_legacy(x)) : tg::from_dlpack(tg::to_dlpack(x));
      EXPECT_EQ(back.dtype(), dt);
      EXPECT_EQ(back.data_ptr(), x.data_ptr());
      EXPECT_EQ(host(back), host(x));
    }
    DLManagedTensorVersioned* dl = tg::to_dlpack(x);
    const DLDataType d = dl->dl_tensor.dtype;
    EXPECT_EQ(d.lanes, 1);
    EXPECT_EQ(d.bits, tg::element_size(dt) * 8);
    const uint8_t want = dt == tg::kBFloat16 ? kDLBfloat
                         : dt == tg::kBool   ? kDLBool
                         : tg::is_floating(dt) ? kDLFloat
                         : dt == tg::kUInt8    ? kDLUInt
                                               : kDLInt;
    EXPECT_EQ(d.code, want);
    dl->deleter(dl);
  }
}

// Import from a foreign producer: every dtype, its deleter once when the last view dies.
TEST(DLPack, ForeignImportEveryDTypeDeleterOnce) {
  struct Case {
    DLDataType dl;
    tg::DType dt;
  };
  const Case cases[] = {{{kDLFloat, 32, 1}, tg::kFloat32},  {{kDLFloat, 16, 1}, tg::kFloat16},
                        {{kDLBfloat, 16, 1}, tg::kBFloat16}, {{kDLFloat, 64, 1}, tg::kFloat64},
                        {{kDLInt, 64, 1}, tg::kInt64},       {{kDLInt, 32, 1}, tg::kInt32},
                        {{kDLBool, 8, 1}, tg::kBool},        {{kDLUInt, 8, 1}, tg::kUInt8},
                        {{kDLInt, 8, 1}, tg::kInt8},         {{kDLInt, 16, 1}, tg::kInt16}};
  for (const Case& c : cases) {
    SCOPED_TRACE(tg::dtype_name(c.dt));
    // Values 0, 1, 0, 1, ... (bool-safe) written with the producer's own encoding.
    Tensor ref = tg::tensor(std::vector<double>{0, 1, 0, 1, 0, 1, 0, 1}).to(c.dt);
    Producer p;
    p.buffer.resize(8 * tg::element_size(c.dt));
    std::memcpy(p.buffer.data(), ref.data_ptr(), p.buffer.size());
    p.shape = {2, 4};
    ForeignTensor<DLManagedTensorVersioned> f;
    describe(f, p, c.dl);
    f.managed.version = DLPackVersion{1, 3};  // a newer minor is fine
    {
      Tensor t = tg::from_dlpack(&f.managed);
      EXPECT_EQ(t.dtype(), c.dt);
      EXPECT_EQ(t.data_ptr(), p.buffer.data());
      EXPECT_TRUE(t.is_contiguous());
      Tensor v = t.slice(1, 1, 3);
      t = Tensor();
      EXPECT_EQ(p.deleted, 0) << "a view still uses the memory";
      EXPECT_EQ(host(v), host(ref.reshape({2, 4}).slice(1, 1, 3)));
    }
    EXPECT_EQ(p.deleted, 1);
  }
}

TEST(DLPack, ForeignImportHonoursStridesAndByteOffset) {
  // A 3x2 column-major view starting 2 doubles into the buffer.
  Producer p;
  std::vector<double> values(10);
  for (int i = 0; i < 10; ++i) values[i] = i * 1.5;
  p.buffer.resize(values.size() * sizeof(double));
  std::memcpy(p.buffer.data(), values.data(), p.buffer.size());
  p.shape = {3, 2};
  p.strides = {1, 3};
  ForeignTensor<DLManagedTensor> f;
  describe(f, p, DLDataType{kDLFloat, 64, 1}, 2 * sizeof(double));
  {
    Tensor t = tg::from_dlpack(&f.managed);
    EXPECT_EQ(t.strides(), tg::Shape({1, 3}));
    EXPECT_EQ(t.data_ptr(), p.buffer.data() + 2 * sizeof(double));
    std::vector<double> want;
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 2; ++j) want.push_back(values[2 + i + 3 * j]);
    EXPECT_EQ(host(t), want);
    // Writes land in the producer's memory.
    t.fill_(7.0);
    double first = 0;
    std::memcpy(&first, p.buffer.data() + 2 * sizeof(double), sizeof(double));
    EXPECT_EQ(first, 7.0);
  }
  EXPECT_EQ(p.deleted, 1);
}

TEST(DLPack, ZeroDimAndEmpty) {
  Producer p;
  p.buffer.resize(sizeof(float));
  float v = 3.5f;
  std::memcpy(p.buffer.data(), &v, sizeof(v));
  ForeignTensor<DLManagedTensorVersioned> f;
  describe(f, p, DLDataType{kDLFloat, 32, 1});
  f.managed.version = DLPackVersion{1, 0};
  f.managed.dl_tensor.shape = nullptr;
  {
    Tensor t = tg::from_dlpack(&f.managed);
    EXPECT_EQ(t.dim(), 0);
    EXPECT_EQ(t.item<float>(), 3.5f);
  }
  EXPECT_EQ(p.deleted, 1);

  Tensor e = tg::empty({0, 3});
  Tensor back = tg::from_dlpack(tg::to_dlpack(e));
  EXPECT_EQ(back.sizes(), tg::Shape({0, 3}));
}

// Refusals: the deleter runs (the consumer owns the tensor once it has it), then tg::Error.
TEST(DLPack, UnsupportedInputCallsDeleterThenThrows) {
  auto expect_refused = [](auto setup, const char* needle) {
    Producer p;
    p.buffer.resize(64);
    p.shape = {4};
    ForeignTensor<DLManagedTensorVersioned> f;
    describe(f, p, DLDataType{kDLFloat, 32, 1});
    f.managed.version = DLPackVersion{1, 0};
    setup(f.managed);
    try {
      tg::from_dlpack(&f.managed);
      ADD_FAILURE() << "expected tg::Error mentioning " << needle;
    } catch (const tg::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(p.deleted, 1) << needle;
  };
  expect_refused([](DLManagedTensorVersioned& m) { m.version.major = 2; }, "version 2");
  expect_refused([](DLManagedTensorVersioned& m) { m.dl_tensor.device = DLDevice{kDLOpenCL, 0}; }, "device type 4");
  expect_refused([](DLManagedTensorVersioned& m) { m.dl_tensor.device = DLDevice{kDLROCM, 0}; }, "device type 10");
  expect_refused([](DLManagedTensorVersioned& m) { m.dl_tensor.dtype.lanes = 4; }, "lanes = 4");
  expect_refused([](DLManagedTensorVersioned& m) { m.dl_tensor.dtype = DLDataType{kDLUInt, 16, 1}; }, "code 1");
  expect_refused([](DLManagedTensorVersioned& m) { m.dl_tensor.dtype = DLDataType{kDLComplex, 64, 1}; }, "complex");
  expect_refused([](DLManagedTensorVersioned& m) { m.dl_tensor.dtype = DLDataType{kDLFloat, 8, 1}; }, "bits 8");
  expect_refused([](DLManagedTensorVersioned& m) { m.dl_tensor.ndim = -1; }, "ndim -1");
  // Sizes a producer cannot have (issue #19's finding 4): no overflow, no allocation, an error.
  static int64_t huge_shape[2] = {int64_t{1} << 62, 4};  // 2^64 elements: the count overflows int64
  expect_refused([](DLManagedTensorVersioned& m) { m.dl_tensor.ndim = 2, m.dl_tensor.shape = huge_shape; },
                 "too many elements");
  static int64_t big_shape[1] = {int64_t{1} << 61};  // fits int64, but 2^63 bytes of float32
  expect_refused([](DLManagedTensorVersioned& m) { m.dl_tensor.shape = big_shape; }, "2^62 bytes");
  static int64_t negative_stride[1] = {-1};
  expect_refused([](DLManagedTensorVersioned& m) { m.dl_tensor.strides = negative_stride; }, "negative stride");
  static int64_t far_stride[1] = {int64_t{1} << 61};
  expect_refused([](DLManagedTensorVersioned& m) { m.dl_tensor.strides = far_stride; }, "span more than");
  expect_refused([](DLManagedTensorVersioned& m) { m.dl_tensor.byte_offset = ~uint64_t{0} - 8; },
                 "overflows the data pointer");
  expect_refused([](DLManagedTensorVersioned& m) { m.dl_tensor.byte_offset = 3; }, "not aligned");

  // Legacy struct too.
  Producer p;
  p.buffer.resize(16);
  p.shape = {4};
  ForeignTensor<DLManagedTensor> f;
  describe(f, p, DLDataType{kDLFloat, 32, 2});
  EXPECT_THROW(tg::from_dlpack(&f.managed), tg::Error);
  EXPECT_EQ(p.deleted, 1);

  EXPECT_THROW(tg::from_dlpack(static_cast<DLManagedTensorVersioned*>(nullptr)), tg::Error);
}

TEST(DLPack, CudaHostMemoryBecomesACpuTensor) {
  Producer p;
  std::vector<int32_t> values = {4, 5, 6};
  p.buffer.resize(values.size() * 4);
  std::memcpy(p.buffer.data(), values.data(), p.buffer.size());
  p.shape = {3};
  ForeignTensor<DLManagedTensorVersioned> f;
  describe(f, p, DLDataType{kDLInt, 32, 1}, 0, DLDevice{kDLCUDAHost, 0});
  {
    Tensor t = tg::from_dlpack(&f.managed);
    EXPECT_TRUE(t.is_cpu());
    EXPECT_EQ(t.to_vector<int32_t>(), values);
  }
  EXPECT_EQ(p.deleted, 1);
}

TEST(DLPack, CudaRoundTrip) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Tensor x = tg::rand({64, 33}, tg::kCUDA).slice(1, 1, 33).t();  // strided, offset
  DLManagedTensorVersioned* dl = tg::to_dlpack(x);
  EXPECT_EQ(dl->dl_tensor.device.device_type, kDLCUDA);
  EXPECT_EQ(dl->dl_tensor.device.device_id, x.device().index());
  EXPECT_EQ(dl->dl_tensor.data, x.data_ptr());
  Tensor back = tg::from_dlpack(dl);
  EXPECT_TRUE(back.is_cuda());
  EXPECT_EQ(back.data_ptr(), x.data_ptr());
  EXPECT_EQ(back.strides(), x.strides());
  EXPECT_EQ(host(back), host(x));

  // A foreign CUDA producer: memory tapegrad allocated, wrapped as another library would.
  Tensor owner = tg::arange(10, tg::TensorOptions().dtype(tg::kFloat32).device(tg::kCUDA));
  struct Ctx {
    Tensor keep;
    int deleted = 0;
  } ctx{owner};
  DLManagedTensor m{};
  m.dl_tensor.data = owner.data_ptr();
  m.dl_tensor.device = DLDevice{kDLCUDA, owner.device().index()};
  m.dl_tensor.ndim = 1;
  m.dl_tensor.dtype = DLDataType{kDLFloat, 32, 1};
  int64_t shape[1] = {4};
  int64_t strides[1] = {2};
  m.dl_tensor.shape = shape;
  m.dl_tensor.strides = strides;
  m.dl_tensor.byte_offset = sizeof(float);  // starts at element 1
  m.manager_ctx = &ctx;
  m.deleter = [](DLManagedTensor* self) { ++static_cast<Ctx*>(self->manager_ctx)->deleted; };
  {
    Tensor t = tg::from_dlpack(&m);
    EXPECT_EQ(t.device(), owner.device());
    EXPECT_EQ(host(t), (std::vector<double>{1, 3, 5, 7}));
  }
  EXPECT_EQ(ctx.deleted, 1);
}

}  // namespace
