// TensorOptions: dtype, device and requires_grad for factories. A factory's
// options argument also accepts a bare DType or Device: tg::rand({n}, tg::kCUDA).
#pragma once
#include <optional>

#include <tapegrad/core/device.h>
#include <tapegrad/core/dtype.h>

namespace tg {

// How a 4-d image tensor [N, C, H, W] is laid out in memory: Contiguous is row-major (NCHW);
// ChannelsLast keeps the logical NCHW shape with NHWC strides (C innermost), the layout
// cuDNN's tensor-core convolutions prefer; Preserve (for module.to) keeps what is there.
enum class MemoryFormat : uint8_t { Contiguous, ChannelsLast, Preserve };

class TensorOptions {
 public:
  TensorOptions() = default;
  TensorOptions(DType t) : dtype_(t) {}          // NOLINT
  TensorOptions(Device d) : device_(d) {}        // NOLINT
  TensorOptions(DeviceType d) : device_(d) {}    // NOLINT
  TensorOptions dtype(DType t) const {
    auto o = *this;
    o.dtype_ = t;
    return o;
  }
  TensorOptions device(Device d) const {
    auto o = *this;
    o.device_ = d;
    return o;
  }
  TensorOptions requires_grad(bool r) const {
    auto o = *this;
    o.requires_grad_ = r;
    return o;
  }
  DType dtype() const { return dtype_.value_or(kFloat32); }
  std::optional<DType> dtype_opt() const { return dtype_; }
  Device device() const { return device_; }
  bool requires_grad() const { return requires_grad_; }

 private:
  std::optional<DType> dtype_;
  Device device_;
  bool requires_grad_ = false;
};

}  // namespace tg
