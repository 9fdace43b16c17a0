// Kernels written by users and compiled at run time with NVRTC, the C++ answer
// to cupy.RawKernel / cupy.ElementwiseKernel and numba's @vectorize(target='cuda').
//
//   tg::cuda::RawKernel k(R"(extern "C" __global__ void scale(float* x, float a, long long n) {...})", "scale");
//   k.launch(blocks, threads, x, 2.0f, x.numel());          // on tg::cuda::current_stream()
//   tg::cuda::ElementwiseKernel mul("double a, double b", "double c", "c = a * b", "gpu_mul");
//   tg::Tensor c = mul(a, b);                                // broadcasting; CPU tensors go to the GPU and back
//
// Compiled code is cached in memory and on disk under $XDG_CACHE_HOME/tapegrad
// (default ~/.cache/tapegrad), keyed by source, options, kernel name, NVRTC
// version and GPU architecture (TG_RTC_NO_DISK_CACHE=1 turns the disk cache
// off; $CUDA_PATH/include is searched first for the headers kernels include).
// Built without CUDA, constructing either kernel throws tg::Error.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <concepts>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <tapegrad/core/half.h>
#include <tapegrad/core/tensor.h>

namespace tg::cuda {

// Grid or block dimensions; an integer converts to {n, 1, 1}.
struct Dim3 {
  Dim3(int64_t x_ = 1, int64_t y_ = 1, int64_t z_ = 1)  // NOLINT: implicit on purpose
      : x(static_cast<unsigned>(x_)), y(static_cast<unsigned>(y_)), z(static_cast<unsigned>(z_)) {
    TG_CHECK(x_ > 0 && y_ > 0 && z_ > 0 && x_ <= 0xFFFFFFFFLL && y_ <= 0xFFFFFFFFLL && z_ <= 0xFFFFFFFFLL,
             "Dim3: dimensions must be in [1, 2^32), got {", x_, ", ", y_, ", ", z_, "}");
  }
  unsigned x, y, z;
};

namespace detail {

// One kernel argument, held by value until the launch copies it.
struct KernelArg {
  alignas(16) unsigned char bytes[16] = {};
  size_t size = 0;
  int device = -2;  // the CUDA device of a tensor argument; -2 for scalars and raw pointers
  const char* what = "scalar";
};

// A tensor goes in as its device pointer (data_ptr()); CPU tensors are an error at launch.
KernelArg make_kernel_arg(const Tensor& t);

template <typename T>
KernelArg make_kernel_arg(const T& v) {
  using U = std::decay_t<T>;
  static_assert(std::is_arithmetic_v<U> || std::is_pointer_v<U> || std::is_same_v<U, Half> ||
                    std::is_same_v<U, BFloat16> || std::is_null_pointer_v<U>,
                "RawKernel::launch: arguments are tg::Tensor (passed as a device pointer), arithmetic "
                "scalars (passed by value with their C++ type), tg::Half / tg::BFloat16 or raw device pointers");
  KernelArg a;
  if constexpr (std::is_null_pointer_v<U>) {
    a.size = sizeof(void*);
    a.what = "nullptr";
  } else {
    static_assert(sizeof(U) <= sizeof(a.bytes));
    std::memcpy(a.bytes, &v, sizeof(U));
    a.size = sizeof(U);
    a.what = std::is_pointer_v<U> ? "pointer" : "scalar";
  }
  return a;
}

struct CompiledKernel;

// Test hooks: NVRTC compilations done by this process, and dropping the
// in-memory cache (the disk cache stays) so a test can observe a disk hit.
int64_t rtc_compile_count();
void rtc_clear_memory_cache();
// The disk cache directory in use now ("" when neither XDG_CACHE_HOME nor HOME is set).
std::string rtc_cache_dir();

}  // namespace detail

// A kernel compiled from CUDA C++ source with NVRTC for the current device's
// architecture (-std=c++17, cuda_fp16.h / cuda_bf16.h includable). `name` is
// the kernel's name: an extern "C" function's name, or a C++ name expression
// such as "axpy<float>" for a template. Compile errors throw tg::Error with
// NVRTC's log. Copies share the compiled module.
class RawKernel {
 public:
  RawKernel(std::string source, std::string name, std::vector<std::string> options = {});

  // Launches on tg::cuda::current_stream() of the current device. Arguments:
  // tensors (their device pointer; they must be on the current device) and
  // scalars (by value with their C++ type: pass 1.0f for a float parameter,
  // int64_t{n} for a long long). The argument count and sizes are checked
  // against the kernel's parameters when the driver can report them.
  // An integer right after `block` is the dynamic shared memory in bytes.
  template <std::integral SharedMem, typename... Args>
  void launch(Dim3 grid, Dim3 block, SharedMem shared_mem, const Args&... args) const {
    if constexpr (std::is_signed_v<SharedMem>)
      TG_CHECK(shared_mem >= 0, "RawKernel::launch: negative shared memory size ", shared_mem);
    std::vector<detail::KernelArg> packed;
    packed.reserve(sizeof...(Args));
    (packed.push_back(detail::make_kernel_arg(args)), ...);
    launch_args(grid, block, static_cast<size_t>(shared_mem), packed);
  }
  // Without dynamic shared memory. When the kernel's first argument is an
  // integer, pass shared_mem (0) explicitly, or it would be read as one.
  template <typename First, typename... Rest>
    requires(!std::integral<std::decay_t<First>>)
  void launch(Dim3 grid, Dim3 block, const First& first, const Rest&... rest) const {
    launch(grid, block, size_t{0}, first, rest...);
  }
  void launch(Dim3 grid, Dim3 block) const { launch_args(grid, block, 0, {}); }
  void launch_args(Dim3 grid, Dim3 block, size_t shared_mem, const std::vector<detail::KernelArg>& args) const;

  const std::string& name() const { return name_; }
  // Parameter count reported by the driver (-1 when it cannot say).
  int num_params() const;
  // The largest block this kernel can be launched with on the current device.
  int max_threads_per_block() const;

 private:
  std::string name_;
  std::shared_ptr<detail::CompiledKernel> kernel_;
};

// One input of an ElementwiseKernel call: a tensor, or a scalar for a non-raw
// input (passed to the kernel by value, converted to the declared type, like a
// Python scalar given to a cupy.ElementwiseKernel).
struct KernelInput {
  KernelInput(const Tensor& t) : tensor(t) {}  // NOLINT: implicit on purpose
  template <typename T>
    requires std::is_arithmetic_v<T>
  KernelInput(T v)  // NOLINT: implicit on purpose
      : is_scalar(true) {
    if constexpr (std::is_same_v<T, bool>) scalar = Scalar(v);
    else if constexpr (std::is_floating_point_v<T>) scalar = Scalar(static_cast<double>(v));
    else scalar = Scalar(static_cast<long long>(v));
  }
  Tensor tensor;
  Scalar scalar;
  bool is_scalar = false;
};

// An elementwise kernel generated from parameter lists and a body, like
// cupy.ElementwiseKernel: in_params "double a, double b", out_params
// "double c", body "c = a * b" (run once per element; `i` is the flat index
// and `n` the element count). Types: float, double, int, long long / int64,
// bool, half / __half, bfloat16.
// - Inputs broadcast against each other and must have the declared dtypes;
//   outputs take the broadcast shape and are allocated when not given.
// - A non-raw input may be given a scalar instead of a tensor (k(x, 2.5f)):
//   it is passed by value, converted to the declared type (a non-integral
//   value for an integer parameter is an error).
// - "raw T name" declares an array the body indexes itself (name[j], name.size()),
//   as in CuPy: it takes no part in broadcasting, is passed whole (made dense),
//   and a raw output must be given. The loop runs over the broadcast shape of
//   the non-raw tensors, so at least one non-raw tensor input or output is needed.
// When every tensor is on the CPU, they are copied to the current GPU and the
// outputs copied back (numba's @vectorize(target='cuda')). Kernels compile on
// first use, once per pattern of scalar and tensor inputs.
class ElementwiseKernel {
 public:
  ElementwiseKernel(std::string in_params, std::string out_params, std::string body,
                    std::string name = "elementwise_kernel", std::vector<std::string> options = {});

  // One output: returns it.
  template <typename... Ts>
    requires((std::is_convertible_v<const Ts&, const Tensor&> || std::is_arithmetic_v<Ts>) && ...)
  Tensor operator()(const Ts&... inputs) const {
    return single(call(std::vector<KernelInput>{KernelInput(inputs)...}));
  }
  // Any number of outputs; pass some or all (in order) to write into them.
  std::vector<Tensor> call(const std::vector<KernelInput>& inputs, std::vector<Tensor> outputs = {}) const;
  std::vector<Tensor> call(std::initializer_list<KernelInput> inputs, std::vector<Tensor> outputs = {}) const {
    return call(std::vector<KernelInput>(inputs), std::move(outputs));
  }
  std::vector<Tensor> call(const std::vector<Tensor>& inputs, std::vector<Tensor> outputs = {}) const {
    return call(std::vector<KernelInput>(inputs.begin(), inputs.end()), std::move(outputs));
  }

  const std::string& name() const { return name_; }
  // The generated CUDA source for tensor inputs (for reading and debugging).
  const std::string& source() const;

 private:
  struct State;
  Tensor single(std::vector<Tensor> outs) const;
  std::string name_;
  std::shared_ptr<State> state_;
};

}  // namespace tg::cuda
