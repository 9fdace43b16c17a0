// Run-time compiled kernels (core/cuda_rtc.h), the pieces shared by their files:
// NVRTC compiles CUDA C++ to a CUBIN for the current device (PTX when NVRTC does
// not know the architecture), the driver API loads it, and both results are
// cached: in memory for the process and on disk so that a new process skips NVRTC.
//   rtc_driver.cpp          the driver API functions (fetched from the loaded driver), context binding
//   rtc_cache.cpp           the in-memory cache and the on-disk kernel cache
//   rtc_compile.cpp         NVRTC: architecture choice, cache key, compilation
//   raw_kernel.cpp          RawKernel: module loading per device, argument checks, launch
//   elementwise_kernel.cpp  ElementwiseKernel: source generation and the call (uses native:: ops)
// The host-only disk-cache format and signature parser: core/backend/rtc_host.h.
// Internal; CUDA builds only.
#pragma once
#include <cuda.h>
#include <nvrtc.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <tapegrad/core/backend/cuda/runtime.h>
#include <tapegrad/core/cuda_rtc.h>

namespace tg::cuda {

namespace detail {

// What one compilation produced, and its module on each device it was loaded on.
struct CompiledKernel {
  std::string key;
  std::string name;
  std::string lowered_name;  // the symbol to look up (mangled for C++ names)
  std::string image;         // CUBIN, or PTX text
  bool is_cubin = true;

  struct Loaded {
    CUmodule module = nullptr;
    CUfunction function = nullptr;
    std::vector<size_t> param_sizes;
    bool params_known = false;
    int max_threads = 0;
    size_t shared_limit_set = 0;
  };
  std::mutex mu;
  std::map<int, Loaded> loaded;  // by device. Modules stay loaded for the process.
};

}  // namespace detail

namespace rtc {

using detail::CompiledKernel;

// ---- the driver API (rtc_driver.cpp)

// The driver API functions used here, fetched from the driver that the CUDA
// runtime loaded (same ABI as the cuda.h this file compiles against).
struct DriverApi {
  decltype(&::cuGetErrorName) get_error_name = nullptr;
  decltype(&::cuGetErrorString) get_error_string = nullptr;
  decltype(&::cuModuleLoadData) module_load_data = nullptr;
  decltype(&::cuModuleGetFunction) module_get_function = nullptr;
  decltype(&::cuModuleUnload) module_unload = nullptr;
  decltype(&::cuFuncGetParamInfo) func_get_param_info = nullptr;  // may stay null (driver < 12.4)
  decltype(&::cuFuncGetAttribute) func_get_attribute = nullptr;
  decltype(&::cuFuncSetAttribute) func_set_attribute = nullptr;
  decltype(&::cuCtxGetCurrent) ctx_get_current = nullptr;
  decltype(&::cuLaunchKernel) launch_kernel = nullptr;
};
// Fetched on first use; tg::Error when the driver lacks a required function.
const DriverApi& driver();

[[noreturn]] void throw_cu_error(CUresult r, const char* call, const char* file, int line);

int current_device_index();
// Makes the device's primary context current on this thread (the driver API
// calls use whatever context is current).
void bind_primary_context(int device);

// ---- the caches (rtc_cache.cpp)

// The in-memory cache by key, guarded by cache_mutex().
std::mutex& cache_mutex();
std::unordered_map<std::string, std::shared_ptr<CompiledKernel>>& memory_cache();

bool disk_cache_enabled();  // unless TG_RTC_NO_DISK_CACHE is set (and not "0")
std::string cache_dir();    // "" when neither XDG_CACHE_HOME nor HOME is set
std::string cache_path(const std::string& dir, const std::string& key);
// The cached kernel for `key`, or nothing when the file is missing, foreign or damaged.
std::shared_ptr<CompiledKernel> read_cache(const std::string& path, const std::string& key);
// Written to a temporary name and renamed, so readers never see half a file; failures only cost recompiles.
void write_cache(const std::string& dir, const std::string& path, const CompiledKernel& k);

// ---- NVRTC (rtc_compile.cpp)

// "sm_90" when NVRTC can emit a CUBIN for the device, else "compute_XY" (PTX,
// JIT-compiled by the driver) for the newest architecture NVRTC knows below it.
std::string arch_for(int device);
// Everything the compiled image depends on: the full key is stored and compared on disk.
std::string make_key(const std::string& source, const std::string& name, const std::vector<std::string>& options,
                     const std::string& arch);
std::shared_ptr<CompiledKernel> compile(const std::string& source, const std::string& name,
                                        const std::vector<std::string>& options, const std::string& arch,
                                        std::string key);

}  // namespace rtc

}  // namespace tg::cuda

#define TG_CU_CHECK(expr)                                                     \
  do {                                                                        \
    CUresult tg_r_ = (expr);                                                  \
    if (tg_r_ != CUDA_SUCCESS) [[unlikely]] ::tg::cuda::rtc::throw_cu_error(tg_r_, #expr, __FILE__, __LINE__); \
  } while (0)
#define TG_NVRTC_CHECK(expr)                                                                    \
  do {                                                                                          \
    nvrtcResult tg_n_ = (expr);                                                                 \
    if (tg_n_ != NVRTC_SUCCESS) [[unlikely]]                                                    \
      TG_ERROR(#expr, " failed: ", nvrtcGetErrorString(tg_n_));                                 \
  } while (0)
