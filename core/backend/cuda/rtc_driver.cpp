// Run-time compiled kernels (rtc_internal.h): the driver API functions, fetched from the
// driver that the CUDA runtime loaded (not by linking libcuda, so that the library still loads,
// and its tests skip, on a machine without a driver), their error text, and context binding.
#include <tapegrad/core/backend/cuda/rtc_internal.h>

namespace tg::cuda::rtc {

namespace {

template <typename Fn>
bool load_symbol(const char* symbol, Fn* fn, bool required) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status{};
  cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &p, CUDA_VERSION, cudaEnableDefault, &status);
  if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || p == nullptr) {
    cudaGetLastError();  // not sticky; leave no error behind for the next check
    TG_CHECK(!required, "RawKernel: the CUDA driver does not provide ", symbol, " (",
             err != cudaSuccess ? cudaGetErrorString(err) : "symbol not found", ")");
    return false;
  }
  *fn = reinterpret_cast<Fn>(p);
  return true;
}

}  // namespace

const DriverApi& driver() {
  static const DriverApi api = [] {
    DriverApi d;
    load_symbol("cuGetErrorName", &d.get_error_name, true);
    load_symbol("cuGetErrorString", &d.get_error_string, true);
    load_symbol("cuModuleLoadData", &d.module_load_data, true);
    load_symbol("cuModuleGetFunction", &d.module_get_function, true);
    load_symbol("cuModuleUnload", &d.module_unload, true);
    load_symbol("cuFuncGetParamInfo", &d.func_get_param_info, false);
    load_symbol("cuFuncGetAttribute", &d.func_get_attribute, true);
    load_symbol("cuFuncSetAttribute", &d.func_set_attribute, true);
    load_symbol("cuCtxGetCurrent", &d.ctx_get_current, true);
    load_symbol("cuLaunchKernel", &d.launch_kernel, true);
    return d;
  }();
  return api;
}

[[noreturn]] void throw_cu_error(CUresult r, const char* call, const char* file, int line) {
  const char* name = nullptr;
  const char* msg = nullptr;
  if (driver().get_error_name) driver().get_error_name(r, &name);
  if (driver().get_error_string) driver().get_error_string(r, &msg);
  tg::detail::throw_error(file, line,
                          tg::detail::str_cat(call, " failed: ", name ? name : "?", " (", msg ? msg : "unknown", ")"));
}

int current_device_index() {
  int dev = 0;
  TG_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

void bind_primary_context(int device) {
  TG_CUDA_CHECK(cudaSetDevice(device));
  TG_CUDA_CHECK(cudaFree(nullptr));
}

}  // namespace tg::cuda::rtc
