// Zero-copy exchange of tensors with other libraries (PyTorch, CuPy, JAX, ...)
// through DLPack. Exports hand out DLPack 1.x DLManagedTensorVersioned (or the
// legacy DLManagedTensor); imports accept both and wrap the memory without a copy.
//
// The DLPack ABI structs are declared here, written from the DLPack 1.x
// specification, unless the official <dlpack/dlpack.h> (include guard
// DLPACK_DLPACK_H_) was included before this header: the layouts are the same,
// so either definition works with tg::to_dlpack / tg::from_dlpack. Include the
// official header first when a translation unit needs both.
//
// Streams: DLPack's C interface carries no stream. An export is ordered on
// tg::cuda::current_stream() of the tensor's device: a consumer on another
// stream must wait for that stream (e.g. tg::cuda::Event::record + wait, or
// tg::cuda::synchronize()) before reading. An import is used on tapegrad's
// current stream; the producer's pending work must be finished or ordered before.
#pragma once
#include <cstdint>

#include <tapegrad/core/tensor.h>

#ifndef DLPACK_DLPACK_H_
#define TG_DLPACK_OWN_STRUCTS 1
extern "C" {

// Device kinds (subset tapegrad reads or names; values are the spec's).
typedef enum {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,  // pinned host memory (cudaMallocHost)
  kDLOpenCL = 4,
  kDLVulkan = 7,
  kDLMetal = 8,
  kDLVPI = 9,
  kDLROCM = 10,
  kDLROCMHost = 11,
  kDLExtDev = 12,
  kDLCUDAManaged = 13,
  kDLOneAPI = 14,
  kDLWebGPU = 15,
  kDLHexagon = 16,
  kDLMAIA = 17,
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;

typedef enum {
  kDLInt = 0U,
  kDLUInt = 1U,
  kDLFloat = 2U,
  kDLOpaqueHandle = 3U,
  kDLBfloat = 4U,
  kDLComplex = 5U,
  kDLBool = 6U,
} DLDataTypeCode;

// code: a DLDataTypeCode; bits per lane; lanes (1 for scalars).
typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

// A strided view of memory. shape/strides have ndim entries; strides are in
// elements and may be NULL (compact row-major). The first element lives at
// (char*)data + byte_offset.
typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} DLTensor;

// The pre-1.0 managed tensor, still what many libraries (and at::toDLPack) use.
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensor* self);
} DLManagedTensor;

typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;

// The 1.x managed tensor: a version first, so that a consumer can refuse an ABI
// it does not know before touching anything else, and flags.
typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;

}  // extern "C"

#ifndef DLPACK_FLAG_BITMASK_READ_ONLY
#define DLPACK_FLAG_BITMASK_READ_ONLY (UINT64_C(1) << 0)
#define DLPACK_FLAG_BITMASK_IS_COPIED (UINT64_C(1) << 1)
#define DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED (UINT64_C(1) << 2)
#endif
#endif  // DLPACK_DLPACK_H_

namespace tg {

// The DLPack version tapegrad produces; imports accept any 1.x.
inline constexpr uint32_t kDLPackMajorVersion = 1;
inline constexpr uint32_t kDLPackMinorVersion = 0;

// Exports t without copying: the managed tensor keeps t's storage alive until
// its deleter is called (exactly once, by the consumer). data points at the
// first element and byte_offset is 0, as PyTorch and CuPy do; strides are
// always filled in. The caller owns the result (pass it to a consumer or call
// its deleter). CPU tensors export as kDLCPU, CUDA tensors as kDLCUDA.
DLManagedTensorVersioned* to_dlpack(const Tensor& t);
DLManagedTensor* to_dlpack_legacy(const Tensor& t);

// Takes ownership of a producer's tensor and wraps its memory without copying.
// The producer's deleter runs exactly once, when the last tapegrad tensor
// viewing the memory dies (or immediately, before the tg::Error, when the
// input is unsupported: another device type, lanes != 1, a dtype tapegrad has
// no equivalent for, or a newer major version). kDLCUDAHost (pinned) memory
// becomes a CPU tensor. The READ_ONLY flag is accepted but not enforced.
// A null pointer is an error.
Tensor from_dlpack(DLManagedTensorVersioned* managed);
Tensor from_dlpack(DLManagedTensor* managed);

}  // namespace tg
