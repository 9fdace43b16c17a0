// Run-time compiled kernels (rtc_internal.h): RawKernel. The kernel comes from the
// in-memory cache, the disk cache or NVRTC, in that order, and its module is loaded
// on each device it is used on; launches check their arguments when the driver
// reports the kernel's parameters.
#include <cstring>

#include <tapegrad/core/backend/cuda/rtc_internal.h>
#include <tapegrad/core/cuda.h>

namespace tg::cuda {

using rtc::bind_primary_context;
using rtc::CompiledKernel;
using rtc::current_device_index;
using rtc::driver;
using rtc::throw_cu_error;

namespace {

// The kernel's function on `device`, loading the module there on first use.
CompiledKernel::Loaded& load_on(CompiledKernel& k, int device) {
  std::lock_guard<std::mutex> lock(k.mu);
  auto it = k.loaded.find(device);
  if (it != k.loaded.end()) return it->second;
  bind_primary_context(device);
  CompiledKernel::Loaded l;
  TG_CU_CHECK(driver().module_load_data(&l.module, k.image.data()));
  CUresult r = driver().module_get_function(&l.function, l.module, k.lowered_name.c_str());
  if (r != CUDA_SUCCESS) {
    driver().module_unload(l.module);
    throw_cu_error(r, tg::detail::str_cat("cuModuleGetFunction(\"", k.lowered_name, "\")").c_str(), __FILE__,
                   __LINE__);
  }
  // The parameter layout, when the driver can tell (12.4+), lets launch() check arguments.
  for (size_t i = 0; driver().func_get_param_info; ++i) {
    size_t offset = 0, size = 0;
    CUresult pr = driver().func_get_param_info(l.function, i, &offset, &size);
    if (pr == CUDA_SUCCESS) {
      l.param_sizes.push_back(size);
      continue;
    }
    l.params_known = pr == CUDA_ERROR_INVALID_VALUE;
    break;
  }
  TG_CU_CHECK(driver().func_get_attribute(&l.max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, l.function));
  return k.loaded.emplace(device, std::move(l)).first->second;
}

}  // namespace

detail::KernelArg detail::make_kernel_arg(const Tensor& t) {
  TG_CHECK(t.defined(), "RawKernel::launch: an argument is an undefined tensor");
  TG_CHECK(t.is_cuda(), "RawKernel::launch: a tensor argument of shape ", t.sizes(), " is on ", t.device(),
           "; kernels take CUDA tensors (use .cuda())");
  KernelArg a;
  void* p = t.numel() == 0 ? nullptr : t.data_ptr();
  std::memcpy(a.bytes, &p, sizeof(p));
  a.size = sizeof(p);
  a.device = t.device().has_index() ? t.device().index() : current_device_index();
  a.what = "tensor";
  return a;
}

// ---- RawKernel

RawKernel::RawKernel(std::string source, std::string name, std::vector<std::string> options) : name_(std::move(name)) {
  TG_CHECK(is_available(), "RawKernel '", name_, "': no CUDA device is available");
  TG_CHECK(!name_.empty(), "RawKernel: the kernel name is empty");
  const int dev = current_device_index();
  const std::string arch = rtc::arch_for(dev);
  std::string key = rtc::make_key(source, name_, options, arch);
  {
    std::lock_guard<std::mutex> lock(rtc::cache_mutex());
    auto it = rtc::memory_cache().find(key);
    if (it != rtc::memory_cache().end()) kernel_ = it->second;
  }
  if (!kernel_) {
    const std::string dir = rtc::disk_cache_enabled() ? rtc::cache_dir() : "";
    const std::string path = dir.empty() ? "" : rtc::cache_path(dir, key);
    std::shared_ptr<CompiledKernel> k = path.empty() ? nullptr : rtc::read_cache(path, key);
    if (k) {
      k->name = name_;
      try {
        load_on(*k, dev);
      } catch (const Error&) {
        k = nullptr;  // a stale image the driver refuses: compile afresh below
      }
    }
    if (!k) {
      k = rtc::compile(source, name_, options, arch, key);
      load_on(*k, dev);
      if (!path.empty()) rtc::write_cache(dir, path, *k);
    }
    std::lock_guard<std::mutex> lock(rtc::cache_mutex());
    kernel_ = rtc::memory_cache().emplace(key, std::move(k)).first->second;
  }
  load_on(*kernel_, dev);
}

int RawKernel::num_params() const {
  auto& l = load_on(*kernel_, current_device_index());
  return l.params_known ? static_cast<int>(l.param_sizes.size()) : -1;
}

int RawKernel::max_threads_per_block() const { return load_on(*kernel_, current_device_index()).max_threads; }

void RawKernel::launch_args(Dim3 grid, Dim3 block, size_t shared_mem, const std::vector<detail::KernelArg>& args) const {
  const int dev = current_device_index();
  for (size_t i = 0; i < args.size(); ++i) {
    TG_CHECK(args[i].device == -2 || args[i].device == dev, "RawKernel '", name_, "': argument ", i,
             " is a tensor on cuda:", args[i].device, " but the current device is cuda:", dev);
  }
  auto& l = load_on(*kernel_, dev);
  if (l.params_known) {
    TG_CHECK(args.size() == l.param_sizes.size(), "RawKernel '", name_, "': the kernel takes ", l.param_sizes.size(),
             " argument(s), launch got ", args.size(),
             " (an integer right after the block size is taken as the shared memory size)");
    for (size_t i = 0; i < args.size(); ++i) {
      TG_CHECK(args[i].size == l.param_sizes[i], "RawKernel '", name_, "': argument ", i, " (", args[i].what, ") is ",
               args[i].size, " bytes but the kernel's parameter ", i, " is ", l.param_sizes[i],
               " bytes; pass a scalar of the parameter's C++ type (e.g. 1.0f for float, int64_t{n} for long long)");
    }
  }
  const unsigned threads = block.x * block.y * block.z;
  TG_CHECK(static_cast<int>(threads) <= l.max_threads && block.x * 1ULL * block.y * block.z <= 0x7fffffffULL,
           "RawKernel '", name_, "': block {", block.x, ", ", block.y, ", ", block.z, "} has ", threads,
           " threads; this kernel allows at most ", l.max_threads);
  if (shared_mem > 48 * 1024) {
    // Beyond 48 KiB of dynamic shared memory a kernel must opt in.
    std::lock_guard<std::mutex> lock(kernel_->mu);
    if (l.shared_limit_set < shared_mem) {
      TG_CU_CHECK(driver().func_set_attribute(l.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                     static_cast<int>(shared_mem)));
      l.shared_limit_set = shared_mem;
    }
  }
  std::vector<void*> ptrs(args.size());
  for (size_t i = 0; i < args.size(); ++i) ptrs[i] = const_cast<unsigned char*>(args[i].bytes);
  CUcontext ctx = nullptr;
  if (driver().ctx_get_current(&ctx) != CUDA_SUCCESS || ctx == nullptr) bind_primary_context(dev);
  auto stream = reinterpret_cast<CUstream>(detail::current_stream_handle(dev));
  CUresult r = driver().launch_kernel(l.function, grid.x, grid.y, grid.z, block.x, block.y, block.z,
                              static_cast<unsigned>(shared_mem), stream, ptrs.empty() ? nullptr : ptrs.data(), nullptr);
  if (r != CUDA_SUCCESS) {
    throw_cu_error(r,
                   tg::detail::str_cat("cuLaunchKernel('", name_, "', grid {", grid.x, ", ", grid.y, ", ", grid.z,
                                       "}, block {", block.x, ", ", block.y, ", ", block.z, "}, shared ", shared_mem,
                                       ")")
                       .c_str(),
                   __FILE__, __LINE__);
  }
}

}  // namespace tg::cuda
