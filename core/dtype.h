// Element types, their sizes and names, and PyTorch's type-promotion rules.
#pragma once
#include <cstddef>
#include <cstdint>
#include <ostream>

#include <tapegrad/core/half.h>

namespace tg {

// The X-macro list of dtypes: (C++ type, enum name, safetensors name).
#define TG_FORALL_DTYPES(_)      \
  _(float, Float32, "F32")      \
  _(::tg::Half, Float16, "F16") \
  _(::tg::BFloat16, BFloat16, "BF16") \
  _(double, Float64, "F64")     \
  _(int64_t, Int64, "I64")      \
  _(int32_t, Int32, "I32")      \
  _(bool, Bool, "BOOL")          \
  _(uint8_t, UInt8, "U8")         \
  _(int8_t, Int8, "I8")           \
  _(int16_t, Int16, "I16")

enum class DType : int8_t {
#define TG_DTYPE_ENUM(T, name, st) name,
  TG_FORALL_DTYPES(TG_DTYPE_ENUM)
#undef TG_DTYPE_ENUM
};
inline constexpr int kNumDTypes = 10;

inline constexpr DType kFloat32 = DType::Float32;
inline constexpr DType kFloat = DType::Float32;
inline constexpr DType kFloat16 = DType::Float16;
inline constexpr DType kHalf = DType::Float16;
inline constexpr DType kBFloat16 = DType::BFloat16;
inline constexpr DType kFloat64 = DType::Float64;
inline constexpr DType kDouble = DType::Float64;
inline constexpr DType kInt64 = DType::Int64;
inline constexpr DType kLong = DType::Int64;
inline constexpr DType kInt32 = DType::Int32;
inline constexpr DType kInt = DType::Int32;
inline constexpr DType kBool = DType::Bool;
inline constexpr DType kUInt8 = DType::UInt8;
inline constexpr DType kByte = DType::UInt8;
inline constexpr DType kInt8 = DType::Int8;
inline constexpr DType kChar = DType::Int8;
inline constexpr DType kInt16 = DType::Int16;
inline constexpr DType kShort = DType::Int16;

constexpr size_t element_size(DType t) {
  switch (t) {
    case DType::Float32: return 4;
    case DType::Float16: return 2;
    case DType::BFloat16: return 2;
    case DType::Float64: return 8;
    case DType::Int64: return 8;
    case DType::Int32: return 4;
    case DType::Bool: return 1;
    case DType::UInt8: return 1;
    case DType::Int8: return 1;
    case DType::Int16: return 2;
  }
  return 0;
}

constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Float64: return "float64";
    case DType::Int64: return "int64";
    case DType::Int32: return "int32";
    case DType::Bool: return "bool";
    case DType::UInt8: return "uint8";
    case DType::Int8: return "int8";
    case DType::Int16: return "int16";
  }
  return "?";
}

constexpr bool is_floating(DType t) {
  return t == DType::Float32 || t == DType::Float16 || t == DType::BFloat16 || t == DType::Float64;
}
constexpr bool is_integral(DType t, bool include_bool = false) {
  return t == DType::Int64 || t == DType::Int32 || t == DType::Int16 || t == DType::Int8 || t == DType::UInt8 ||
         (include_bool && t == DType::Bool);
}
constexpr bool is_reduced_float(DType t) { return t == DType::Float16 || t == DType::BFloat16; }

// PyTorch's promotion of two tensor dtypes (torch.promote_types).
DType promote_types(DType a, DType b);

inline std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

template <typename T>
struct DTypeOf;
#define TG_DTYPE_OF(T, name, st)                           \
  template <>                                               \
  struct DTypeOf<T> {                                       \
    static constexpr DType value = DType::name;             \
  };
TG_FORALL_DTYPES(TG_DTYPE_OF)
#undef TG_DTYPE_OF
template <typename T>
inline constexpr DType dtype_of = DTypeOf<T>::value;

// Calls f(T{}) with the C++ type of a runtime dtype: TG_DISPATCH-like helper.
template <typename F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::Float32: return f(float{});
    case DType::Float16: return f(Half{});
    case DType::BFloat16: return f(BFloat16{});
    case DType::Float64: return f(double{});
    case DType::Int64: return f(int64_t{});
    case DType::Int32: return f(int32_t{});
    case DType::Bool: return f(bool{});
    case DType::UInt8: return f(uint8_t{});
    case DType::Int8: return f(int8_t{});
    case DType::Int16: return f(int16_t{});
  }
  return f(float{});
}

}  // namespace tg
