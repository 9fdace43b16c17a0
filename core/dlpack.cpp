// DLPack export and import (see core/dlpack.h): zero copy both ways, the
// producer's deleter called exactly once.
#include <tapegrad/core/dlpack.h>

#include <memory>
#include <string>
#include <utility>

#include <tapegrad/core/native.h>

namespace tg {

namespace {

// ---- dtype and device mapping

DLDataType to_dl_dtype(DType t) {
  auto bits = static_cast<uint8_t>(element_size(t) * 8);
  switch (t) {
    case DType::Float32:
    case DType::Float16:
    case DType::Float64: return DLDataType{kDLFloat, bits, 1};
    case DType::BFloat16: return DLDataType{kDLBfloat, bits, 1};
    case DType::Int64:
    case DType::Int32:
    case DType::Int16:
    case DType::Int8: return DLDataType{kDLInt, bits, 1};
    case DType::UInt8: return DLDataType{kDLUInt, 8, 1};
    case DType::Bool: return DLDataType{kDLBool, 8, 1};
  }
  TG_ERROR("to_dlpack: unknown dtype");
}

// Empty string when supported, else why not.
std::string from_dl_dtype(DLDataType d, DType* out) {
  auto ok = [out](DType t) {
    *out = t;
    return std::string();
  };
  if (d.lanes != 1)
    return detail::str_cat("vector dtypes (lanes = ", d.lanes, ") are not supported; tapegrad needs lanes = 1");
  switch (d.code) {
    case kDLFloat:
      if (d.bits == 16) return ok(kFloat16);
      if (d.bits == 32) return ok(kFloat32);
      if (d.bits == 64) return ok(kFloat64);
      break;
    case kDLBfloat:
      if (d.bits == 16) return ok(kBFloat16);
      break;
    case kDLInt:
      if (d.bits == 8) return ok(kInt8);
      if (d.bits == 16) return ok(kInt16);
      if (d.bits == 32) return ok(kInt32);
      if (d.bits == 64) return ok(kInt64);
      break;
    case kDLUInt:
      if (d.bits == 8) return ok(kUInt8);
      break;
    case kDLBool:
      if (d.bits == 8) return ok(kBool);
      break;
    default: break;
  }
  static const char* const kCodeNames[] = {"int", "uint", "float", "opaque handle", "bfloat", "complex", "bool"};
  const char* name = d.code < 7 ? kCodeNames[d.code] : "unknown code";
  return detail::str_cat("dtype (code ", int{d.code}, " = ", name, ", bits ", int{d.bits},
                         ") has no tapegrad equivalent (float16/32/64, bfloat16, int8/16/32/64, uint8, bool)");
}

std::string from_dl_device(DLDevice d, Device* out) {
  switch (d.device_type) {
    case kDLCPU:
    case kDLCUDAHost: *out = Device(kCPU); return "";
    case kDLCUDA:
      if (d.device_id < 0) return detail::str_cat("CUDA device id ", d.device_id, " is negative");
      *out = Device(kCUDA, d.device_id);
      return "";
    default: break;
  }
  return detail::str_cat("device type ", static_cast<int>(d.device_type),
                         " is not supported (kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3)");
}

// ---- export

// Owns everything the managed tensor points into: the tensor (so its storage
// stays alive), the shape and strides arrays, and the managed struct itself.
template <typename Managed>
struct ExportCtx {
  Tensor tensor;
  Shape shape;
  Shape strides;
  Managed managed{};
};

template <typename Managed>
void export_deleter(Managed* self) {
  if (self == nullptr) return;
  std::unique_ptr<ExportCtx<Managed>> owner(static_cast<ExportCtx<Managed>*>(self->manager_ctx));
}

void fill_dl_tensor(DLTensor& dl, const Tensor& t, Shape& shape, Shape& strides) {
  shape = t.sizes();
  strides = t.strides();
  dl.data = t.numel() == 0 ? nullptr : t.data_ptr();
  if (t.is_cuda()) {
    dl.device = DLDevice{kDLCUDA, t.device().has_index() ? t.device().index() : 0};
  } else {
    dl.device = DLDevice{kDLCPU, 0};
  }
  dl.ndim = static_cast<int32_t>(t.dim());
  dl.dtype = to_dl_dtype(t.dtype());
  dl.shape = shape.empty() ? nullptr : shape.data();
  dl.strides = strides.empty() ? nullptr : strides.data();
  dl.byte_offset = 0;
}

template <typename Managed>
std::unique_ptr<ExportCtx<Managed>> make_export(const Tensor& t, const char* op) {
  TG_CHECK(t.defined(), op, ": the tensor is undefined");
  auto ctx = std::make_unique<ExportCtx<Managed>>();
  // A detached alias: the consumer gets memory, not autograd history.
  ctx->tensor = t.detach();
  fill_dl_tensor(ctx->managed.dl_tensor, ctx->tensor, ctx->shape, ctx->strides);
  ctx->managed.manager_ctx = ctx.get();
  ctx->managed.deleter = &export_deleter<Managed>;
  return ctx;
}

// ---- import

template <typename Managed>
Tensor* exported_tensor(Managed* m) {
  if (m->deleter != &export_deleter<Managed>) return nullptr;
  return &static_cast<ExportCtx<Managed>*>(m->manager_ctx)->tensor;
}

// The from_blob deleter context: calls the producer's deleter once. While the
// tensor is being built, `fired` points at the builder's flag so that a failure
// half-way can tell whether the deleter already ran.
template <typename Managed>
struct ImportCtx {
  Managed* managed = nullptr;
  bool* fired = nullptr;
};

template <typename Managed>
void import_deleter(void* p) {
  auto* ctx = static_cast<ImportCtx<Managed>*>(p);
  if (ctx->managed->deleter) ctx->managed->deleter(ctx->managed);
  if (ctx->fired) {
    *ctx->fired = true;  // the builder still owns ctx
  } else {
    std::unique_ptr<ImportCtx<Managed>> owner(ctx);
  }
}

template <typename Managed>
[[noreturn]] void reject(Managed* m, const char* op, const std::string& why) {
  if (m->deleter) m->deleter(m);  // the spec: the consumer owns it now, even when refusing it
  TG_ERROR(op, ": ", why);
}

template <typename Managed>
Tensor import_impl(Managed* m, const char* op) {
  TG_CHECK(m != nullptr, op, ": got a null managed tensor");
  // Our own export coming back: share the storage itself (in-place updates and
  // version counters stay common), then drop the export's reference.
  if (Tensor* own = exported_tensor(m)) {
    Tensor t = native::make_view(*own, own->sizes(), own->strides(), own->storage_offset());
    t.impl().autograd.reset();
    m->deleter(m);
    return t;
  }
  const DLTensor& dl = m->dl_tensor;
  DType dtype{};
  Device device;
  if (std::string why = from_dl_dtype(dl.dtype, &dtype); !why.empty()) reject(m, op, why);
  if (std::string why = from_dl_device(dl.device, &device); !why.empty()) reject(m, op, why);
  if (dl.ndim < 0) reject(m, op, detail::str_cat("ndim ", dl.ndim, " is negative"));
  if (dl.ndim > 0 && dl.shape == nullptr) reject(m, op, detail::str_cat("ndim ", dl.ndim, " with a null shape"));
  Shape sizes(dl.shape, dl.shape + dl.ndim);
  for (int64_t s : sizes)
    if (s < 0) reject(m, op, detail::str_cat("negative size in shape ", sizes));
  Shape strides = dl.strides ? Shape(dl.strides, dl.strides + dl.ndim) : detail::contiguous_strides(sizes);
  if (dl.data == nullptr && sizes.numel() != 0) reject(m, op, detail::str_cat("null data for shape ", sizes));
  // In integers: a pointer moved past its object is undefined behaviour, and byte_offset is the producer's word.
  uintptr_t address = 0;
  if (dl.data && __builtin_add_overflow(reinterpret_cast<uintptr_t>(dl.data), dl.byte_offset, &address))
    reject(m, op, detail::str_cat("byte_offset ", dl.byte_offset, " overflows the data pointer"));
  if (dl.data && address % element_size(dtype) != 0)
    reject(m, op, detail::str_cat("data + byte_offset (", dl.byte_offset, ") is not aligned to the ",
                                  element_size(dtype), "-byte ", dtype, " elements"));
  void* data = dl.data ? reinterpret_cast<void*>(address) : nullptr;

  auto ctx = std::make_unique<ImportCtx<Managed>>();
  ctx->managed = m;
  bool fired = false;
  ctx->fired = &fired;
  try {
    Tensor t = from_blob(data, std::move(sizes), std::move(strides), &import_deleter<Managed>, ctx.get(),
                         TensorOptions().dtype(dtype).device(device));
    ctx->fired = nullptr;
    (void)ctx.release();  // the storage's deleter owns it now
    return t;
  } catch (...) {
    if (!fired && m->deleter) m->deleter(m);
    throw;
  }
}

}  // namespace

DLManagedTensorVersioned* to_dlpack(const Tensor& t) {
  auto ctx = make_export<DLManagedTensorVersioned>(t, "to_dlpack");
  ctx->managed.version = DLPackVersion{kDLPackMajorVersion, kDLPackMinorVersion};
  ctx->managed.flags = 0;  // writable, not a copy
  return &ctx.release()->managed;
}

DLManagedTensor* to_dlpack_legacy(const Tensor& t) {
  auto ctx = make_export<DLManagedTensor>(t, "to_dlpack_legacy");
  return &ctx.release()->managed;
}

Tensor from_dlpack(DLManagedTensorVersioned* managed) {
  TG_CHECK(managed != nullptr, "from_dlpack: got a null DLManagedTensorVersioned");
  if (managed->version.major > kDLPackMajorVersion) {
    reject(managed, "from_dlpack",
           detail::str_cat("DLPack version ", managed->version.major, ".", managed->version.minor,
                           " is newer than the ", kDLPackMajorVersion, ".x tapegrad reads"));
  }
  return import_impl(managed, "from_dlpack");
}

Tensor from_dlpack(DLManagedTensor* managed) { return import_impl(managed, "from_dlpack (legacy DLManagedTensor)"); }

}  // namespace tg
