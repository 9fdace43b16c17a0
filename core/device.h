// Where a tensor lives: the CPU or a CUDA device with an index.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>

namespace tg {

enum class DeviceType : int8_t { CPU, CUDA };
inline constexpr DeviceType kCPU = DeviceType::CPU;
inline constexpr DeviceType kCUDA = DeviceType::CUDA;

class Device {
 public:
  // index -1 on CUDA means "the current device"; factories resolve it.
  Device(DeviceType type = kCPU, int index = -1) : type_(type), index_(type == kCPU ? -1 : index) {}  // NOLINT
  DeviceType type() const { return type_; }
  int index() const { return index_; }
  bool is_cpu() const { return type_ == kCPU; }
  bool is_cuda() const { return type_ == kCUDA; }
  bool has_index() const { return index_ >= 0; }
  bool operator==(const Device& o) const { return type_ == o.type_ && index_ == o.index_; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const {
    if (type_ == kCPU) return "cpu";
    return index_ >= 0 ? "cuda:" + std::to_string(index_) : "cuda";
  }

 private:
  DeviceType type_;
  int index_;
};

inline std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }
inline std::ostream& operator<<(std::ostream& os, DeviceType t) { return os << (t == kCPU ? "cpu" : "cuda"); }

}  // namespace tg
