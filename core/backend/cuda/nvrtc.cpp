// Run-time compiled kernels (core/cuda_rtc.h): NVRTC compiles CUDA C++ to a
// CUBIN for the current device (PTX when NVRTC does not know the architecture),
// the driver API loads it, and both results are cached: in memory for the
// process and on disk so that a new process skips NVRTC.
//
// Disk cache file: magic, key, lowered kernel name, image kind, image, then an
// FNV-1a checksum of all of it. The full key is stored and compared, so a hash
// collision or a truncated / corrupt file only costs a recompile. Files are
// written to a temporary name and renamed, so readers never see half a file.
#include <cuda.h>
#include <nvrtc.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>

#include <tapegrad/core/backend/cuda/runtime.h>
#include <tapegrad/core/backend/rtc_host.h>
#include <tapegrad/core/cuda.h>
#include <tapegrad/core/cuda_rtc.h>
#include <tapegrad/core/native.h>

#ifndef TG_CUDA_INCLUDE_DIRS
#define TG_CUDA_INCLUDE_DIRS ""
#endif

namespace tg::cuda {

namespace {

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

}  // namespace

#define TG_CU_CHECK(expr)                                                     \
  do {                                                                        \
    CUresult tg_r_ = (expr);                                                  \
    if (tg_r_ != CUDA_SUCCESS) [[unlikely]] throw_cu_error(tg_r_, #expr, __FILE__, __LINE__); \
  } while (0)
#define TG_NVRTC_CHECK(expr)                                                                    \
  do {                                                                                          \
    nvrtcResult tg_n_ = (expr);                                                                 \
    if (tg_n_ != NVRTC_SUCCESS) [[unlikely]]                                                    \
      TG_ERROR(#expr, " failed: ", nvrtcGetErrorString(tg_n_));                                 \
  } while (0)

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

namespace {

using detail::CompiledKernel;
using rtc_host::fnv1a;

std::atomic<int64_t> g_compile_count{0};

std::mutex& cache_mutex() {
  static std::mutex mu;
  return mu;
}
std::unordered_map<std::string, std::shared_ptr<CompiledKernel>>& memory_cache() {
  static std::unordered_map<std::string, std::shared_ptr<CompiledKernel>> cache;
  return cache;
}

// ---- small helpers

std::string hex64(uint64_t v) {
  static const char* const kDigits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[i] = kDigits[v & 15];
  return s;
}

int current_device_index() {
  int dev = 0;
  TG_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

// Makes the device's primary context current on this thread (the driver API
// calls below use whatever context is current).
void bind_primary_context(int device) {
  TG_CUDA_CHECK(cudaSetDevice(device));
  TG_CUDA_CHECK(cudaFree(nullptr));
}

// "sm_90" when NVRTC can emit a CUBIN for the device, else "compute_XY" (PTX,
// JIT-compiled by the driver) for the newest architecture NVRTC knows below it.
std::string arch_for(int device) {
  static std::mutex mu;
  static std::map<int, std::string> archs;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = archs.find(device); it != archs.end()) return it->second;
  int major = 0, minor = 0;
  TG_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  TG_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  const int cc = major * 10 + minor;
  int n = 0;
  TG_NVRTC_CHECK(nvrtcGetNumSupportedArchs(&n));
  std::vector<int> supported(static_cast<size_t>(n));
  if (n > 0) TG_NVRTC_CHECK(nvrtcGetSupportedArchs(supported.data()));
  std::string arch;
  if (std::find(supported.begin(), supported.end(), cc) != supported.end()) {
    arch = "sm_" + std::to_string(cc);
  } else {
    int best = -1;
    for (int a : supported)
      if (a <= cc) best = std::max(best, a);
    TG_CHECK(best > 0, "RawKernel: NVRTC supports no architecture at or below the device's compute capability ",
             major, ".", minor);
    arch = "compute_" + std::to_string(best);
  }
  archs[device] = arch;
  return arch;
}

// Where NVRTC finds cuda_fp16.h, cuda_bf16.h and the CCCL headers they use:
// $CUDA_PATH first, then the toolkit tapegrad was built against, then the usual place.
std::vector<std::string> include_dirs() {
  std::vector<std::string> candidates;
  if (const char* cp = std::getenv("CUDA_PATH"); cp && *cp) candidates.push_back(std::string(cp) + "/include");
  std::stringstream baked(TG_CUDA_INCLUDE_DIRS);
  for (std::string d; std::getline(baked, d, '|');)
    if (!d.empty()) candidates.push_back(d);
  candidates.push_back("/usr/local/cuda/include");
  std::vector<std::string> out;
  for (const auto& d : candidates) {
    std::error_code ec;
    for (const std::string& dir : {d, d + "/cccl"}) {
      if (std::filesystem::is_directory(dir, ec) && std::find(out.begin(), out.end(), dir) == out.end())
        out.push_back(dir);
    }
  }
  return out;
}

bool disk_cache_enabled() {
  const char* off = std::getenv("TG_RTC_NO_DISK_CACHE");
  return !(off && *off && std::string(off) != "0");
}

std::string cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/tapegrad";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/tapegrad";
  return "";
}

std::string make_key(const std::string& source, const std::string& name, const std::vector<std::string>& options,
                     const std::string& arch) {
  int major = 0, minor = 0;
  nvrtcVersion(&major, &minor);
  std::string key = tg::detail::str_cat("tapegrad-rtc 1\nnvrtc ", major, ".", minor, "\narch ", arch, "\nname ", name,
                                        "\noptions");
  for (const auto& o : options) {
    key += '\0';
    key += o;
  }
  key += "\nsource\n";
  key += source;
  return key;
}

std::string cache_path(const std::string& dir, const std::string& key) {
  return dir + "/rtc-" + hex64(fnv1a(key.data(), key.size())) +
         hex64(fnv1a(key.data(), key.size(), 0x84222325cbf29ce4ULL)) + ".bin";
}

// ---- disk cache (the format: core/backend/rtc_host.h)

// The cached kernel for `key`, or nothing when the file is missing, foreign or damaged.
std::shared_ptr<CompiledKernel> read_cache(const std::string& path, const std::string& key) {
  std::optional<rtc_host::CacheEntry> e = rtc_host::read_cache_file(path, key);
  if (!e) return nullptr;
  auto k = std::make_shared<CompiledKernel>();
  k->key = std::move(e->key);
  k->lowered_name = std::move(e->lowered_name);
  k->image = std::move(e->image);
  k->is_cubin = e->is_cubin;
  return k;
}

void write_cache(const std::string& dir, const std::string& path, const CompiledKernel& k) {
  const std::string buf = rtc_host::encode_cache_entry({k.key, k.lowered_name, k.image, k.is_cubin});
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = tg::detail::str_cat(path, ".tmp.", ::getpid(), ".", counter++);
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return;  // a read-only or missing cache directory only costs recompiles
    f.write(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (!f.good()) {
      f.close();
      std::filesystem::remove(tmp, ec);
      return;
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

// ---- NVRTC

class Program {
 public:
  Program(const std::string& source, const std::string& name) {
    TG_NVRTC_CHECK(nvrtcCreateProgram(&prog_, source.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr));
  }
  ~Program() {
    if (prog_) nvrtcDestroyProgram(&prog_);
  }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;
  nvrtcProgram get() const { return prog_; }
  std::string log() const {
    size_t n = 0;
    if (nvrtcGetProgramLogSize(prog_, &n) != NVRTC_SUCCESS || n == 0) return "";
    std::string s(n, '\0');
    if (nvrtcGetProgramLog(prog_, s.data()) != NVRTC_SUCCESS) return "";
    while (!s.empty() && (s.back() == '\0' || s.back() == '\n')) s.pop_back();
    return s;
  }

 private:
  nvrtcProgram prog_ = nullptr;
};

std::shared_ptr<CompiledKernel> compile(const std::string& source, const std::string& name,
                                        const std::vector<std::string>& options, const std::string& arch,
                                        std::string key) {
  Program prog(source, name);
  TG_NVRTC_CHECK(nvrtcAddNameExpression(prog.get(), name.c_str()));
  std::vector<std::string> opts = {"--gpu-architecture=" + arch, "-std=c++17"};
  for (const auto& d : include_dirs()) opts.push_back("-I" + d);
  opts.insert(opts.end(), options.begin(), options.end());
  std::vector<const char*> copts;
  for (const auto& o : opts) copts.push_back(o.c_str());
  ++g_compile_count;
  nvrtcResult r = nvrtcCompileProgram(prog.get(), static_cast<int>(copts.size()), copts.data());
  if (r != NVRTC_SUCCESS) {
    std::string opt_list;
    for (const auto& o : opts) opt_list += " " + o;
    TG_ERROR("RawKernel '", name, "': NVRTC compilation failed (", nvrtcGetErrorString(r), ") with options", opt_list,
             "\n", prog.log());
  }
  auto k = std::make_shared<CompiledKernel>();
  k->key = std::move(key);
  k->name = name;
  const char* lowered = nullptr;
  TG_NVRTC_CHECK(nvrtcGetLoweredName(prog.get(), name.c_str(), &lowered));
  k->lowered_name = lowered;
  size_t n = 0;
  if (arch.rfind("sm_", 0) == 0 && nvrtcGetCUBINSize(prog.get(), &n) == NVRTC_SUCCESS && n > 0) {
    k->image.resize(n);
    TG_NVRTC_CHECK(nvrtcGetCUBIN(prog.get(), k->image.data()));
    k->is_cubin = true;
  } else {
    TG_NVRTC_CHECK(nvrtcGetPTXSize(prog.get(), &n));
    k->image.resize(n);  // includes the terminating NUL cuModuleLoadData needs
    TG_NVRTC_CHECK(nvrtcGetPTX(prog.get(), k->image.data()));
    k->is_cubin = false;
  }
  return k;
}

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

// ---- test hooks

int64_t detail::rtc_compile_count() { return g_compile_count.load(); }
void detail::rtc_clear_memory_cache() {
  std::lock_guard<std::mutex> lock(cache_mutex());
  memory_cache().clear();
}
std::string detail::rtc_cache_dir() { return disk_cache_enabled() ? cache_dir() : ""; }

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
  const std::string arch = arch_for(dev);
  std::string key = make_key(source, name_, options, arch);
  {
    std::lock_guard<std::mutex> lock(cache_mutex());
    auto it = memory_cache().find(key);
    if (it != memory_cache().end()) kernel_ = it->second;
  }
  if (!kernel_) {
    const std::string dir = disk_cache_enabled() ? cache_dir() : "";
    const std::string path = dir.empty() ? "" : cache_path(dir, key);
    std::shared_ptr<CompiledKernel> k = path.empty() ? nullptr : read_cache(path, key);
    if (k) {
      k->name = name_;
      try {
        load_on(*k, dev);
      } catch (const Error&) {
        k = nullptr;  // a stale image the driver refuses: compile afresh below
      }
    }
    if (!k) {
      k = compile(source, name_, options, arch, key);
      load_on(*k, dev);
      if (!path.empty()) write_cache(dir, path, *k);
    }
    std::lock_guard<std::mutex> lock(cache_mutex());
    kernel_ = memory_cache().emplace(key, std::move(k)).first->second;
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

// ---- ElementwiseKernel

namespace {

using rtc_host::Param;

// The generated elementwise kernels' launch shape (the built-in loops use the same).
constexpr int64_t kEwBlock = 128;
constexpr int64_t kEwUnroll = 4;

// `scalar[k]`: input k is passed by value instead of as an array.
std::string generate(const std::string& name, const std::vector<Param>& ins, const std::vector<Param>& outs,
                     const std::string& body, const std::vector<bool>& scalar) {
  bool half = false, bf16 = false, raw = false;
  for (const auto* list : {&ins, &outs})
    for (const auto& p : *list) {
      half |= p.dtype == kFloat16;
      bf16 |= p.dtype == kBFloat16;
      raw |= p.raw;
    }
  std::ostringstream s;
  if (half) s << "#include <cuda_fp16.h>\n";
  if (bf16) s << "#include <cuda_bf16.h>\n";
  if (raw) {
    s << "template <typename T> struct _tg_raw {\n"
      << "  T* _p; long long _n;\n"
      << "  __device__ T& operator[](long long j) const { return _p[j]; }\n"
      << "  __device__ long long size() const { return _n; }\n"
      << "};\n";
  }
  auto is_array = [&](size_t k) { return !ins[k].raw && !scalar[k]; };
  // Each thread handles kUnroll elements a block apart: all loads first, then the
  // bodies, so that a thread has several loads in flight (as the built-in loops do).
  s << "extern \"C\" __global__ void __launch_bounds__(" << kEwBlock << ") " << name << "(";
  for (size_t k = 0; k < ins.size(); ++k) {
    const Param& p = ins[k];
    if (p.raw) s << "const " << p.type << "* _tg_in_" << p.name << ", long long _tg_len_" << p.name << ", ";
    else if (scalar[k]) s << "const " << p.type << " " << p.name << ", ";
    else s << "const " << p.type << "* _tg_in_" << p.name << ", ";
  }
  for (const auto& p : outs) {
    s << p.type << "* _tg_out_" << p.name << ", ";
    if (p.raw) s << "long long _tg_len_" << p.name << ", ";
  }
  s << "long long n) {\n";
  for (const auto& p : ins)
    if (p.raw) s << "  const _tg_raw<const " << p.type << "> " << p.name << "{_tg_in_" << p.name << ", _tg_len_" << p.name << "};\n";
  for (const auto& p : outs)
    if (p.raw) s << "  const _tg_raw<" << p.type << "> " << p.name << "{_tg_out_" << p.name << ", _tg_len_" << p.name << "};\n";
  s << "  const long long _tg_base = (long long)blockIdx.x * (" << kEwBlock * kEwUnroll << ") + threadIdx.x;\n";
  for (size_t k = 0; k < ins.size(); ++k)
    if (is_array(k)) s << "  " << ins[k].type << " _tg_v_" << ins[k].name << "[" << kEwUnroll << "];\n";
  s << "#pragma unroll\n"
    << "  for (int _tg_u = 0; _tg_u < " << kEwUnroll << "; ++_tg_u) {\n"
    << "    const long long i = _tg_base + _tg_u * " << kEwBlock << ";\n"
    << "    if (i < n) {\n";
  for (size_t k = 0; k < ins.size(); ++k)
    if (is_array(k)) s << "      _tg_v_" << ins[k].name << "[_tg_u] = _tg_in_" << ins[k].name << "[i];\n";
  s << "    }\n  }\n"
    << "#pragma unroll\n"
    << "  for (int _tg_u = 0; _tg_u < " << kEwUnroll << "; ++_tg_u) {\n"
    << "    const long long i = _tg_base + _tg_u * " << kEwBlock << ";\n"
    << "    if (i < n) {\n";
  for (size_t k = 0; k < ins.size(); ++k)
    if (is_array(k)) s << "      const " << ins[k].type << " " << ins[k].name << " = _tg_v_" << ins[k].name << "[_tg_u];\n";
  for (const auto& p : outs)
    if (!p.raw) s << "      " << p.type << "& " << p.name << " = _tg_out_" << p.name << "[i];\n";
  s << "      " << body << ";\n    }\n  }\n}\n";
  return s.str();
}

// A scalar argument converted to the declared type of `p`.
detail::KernelArg scalar_arg(const Scalar& v, const Param& p, const std::string& kernel) {
  const bool integral_target = p.dtype == kInt32 || p.dtype == kInt64 || p.dtype == kBool;
  if (integral_target && !v.is_integral()) {
    const double d = v.to_double();
    TG_CHECK(std::isfinite(d) && d == std::trunc(d), "ElementwiseKernel '", kernel, "': scalar ", d,
             " for input '", p.name, "' (declared ", p.type, ") is not an integer");
  }
  switch (p.dtype) {
    case kFloat32: return detail::make_kernel_arg(static_cast<float>(v.to_double()));
    case kFloat64: return detail::make_kernel_arg(v.to_double());
    case kInt32: {
      const int64_t x = v.is_integral() ? v.to_int() : static_cast<int64_t>(v.to_double());
      TG_CHECK(x >= INT32_MIN && x <= INT32_MAX, "ElementwiseKernel '", kernel, "': scalar ", x, " for input '",
               p.name, "' does not fit in int");
      return detail::make_kernel_arg(static_cast<int32_t>(x));
    }
    case kInt64:
      return detail::make_kernel_arg(
          static_cast<long long>(v.is_integral() ? v.to_int() : static_cast<int64_t>(v.to_double())));
    case kBool: return detail::make_kernel_arg(v.is_integral() ? v.to_int() != 0 : v.to_double() != 0);
    case kFloat16: return detail::make_kernel_arg(Half(static_cast<float>(v.to_double())));
    case kBFloat16: return detail::make_kernel_arg(BFloat16(static_cast<float>(v.to_double())));
  }
  TG_ERROR("ElementwiseKernel '", kernel, "': unsupported scalar type for input '", p.name, "'");
}

}  // namespace

struct ElementwiseKernel::State {
  std::vector<Param> ins, outs;
  std::string body;
  std::string source;  // every non-raw input an array
  std::vector<std::string> options;
  std::mutex mu;
  std::map<std::vector<bool>, RawKernel> kernels;  // by which inputs are scalars; compiled on first call
};

ElementwiseKernel::ElementwiseKernel(std::string in_params, std::string out_params, std::string body, std::string name,
                                     std::vector<std::string> options)
    : name_(std::move(name)), state_(std::make_shared<State>()) {
  rtc_host::Signature sig = rtc_host::parse_signature(in_params, out_params, name_);
  state_->ins = std::move(sig.ins);
  state_->outs = std::move(sig.outs);
  state_->body = std::move(body);
  state_->source = generate(name_, state_->ins, state_->outs, state_->body, std::vector<bool>(state_->ins.size()));
  state_->options = std::move(options);
}

const std::string& ElementwiseKernel::source() const { return state_->source; }

Tensor ElementwiseKernel::single(std::vector<Tensor> outs) const {
  TG_CHECK(outs.size() == 1, "ElementwiseKernel '", name_, "': has ", outs.size(),
           " outputs; use call(inputs) to get them all");
  return std::move(outs[0]);
}

std::vector<Tensor> ElementwiseKernel::call(const std::vector<KernelInput>& inputs, std::vector<Tensor> outputs) const {
  const auto& ins = state_->ins;
  const auto& outs = state_->outs;
  TG_CHECK(inputs.size() == ins.size(), "ElementwiseKernel '", name_, "': takes ", ins.size(), " input(s), got ",
           inputs.size());
  TG_CHECK(outputs.size() <= outs.size(), "ElementwiseKernel '", name_, "': has ", outs.size(), " output(s), got ",
           outputs.size());
  for (size_t i = outputs.size(); i < outs.size(); ++i)
    TG_CHECK(!outs[i].raw, "ElementwiseKernel '", name_, "': raw output '", outs[i].name,
             "' must be given (it is not allocated)");
  std::vector<bool> scalar(ins.size());
  bool all_cpu = true;
  std::optional<Device> cuda_dev;
  auto note_device = [&](const Tensor& t, const std::string& what) {
    if (!t.is_cuda()) return;
    all_cpu = false;
    TG_CHECK(!cuda_dev || *cuda_dev == t.device(), "ElementwiseKernel '", name_, "': ", what, " is on ", t.device(),
             " while others are on ", *cuda_dev);
    cuda_dev = t.device();
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].is_scalar) {
      TG_CHECK(!ins[i].raw, "ElementwiseKernel '", name_, "': raw input '", ins[i].name, "' needs a tensor, got a scalar");
      scalar[i] = true;
      continue;
    }
    const Tensor& t = inputs[i].tensor;
    TG_CHECK(t.defined(), "ElementwiseKernel '", name_, "': input '", ins[i].name, "' is undefined");
    TG_CHECK(t.dtype() == ins[i].dtype, "ElementwiseKernel '", name_, "': input '", ins[i].name, "' has dtype ",
             t.dtype(), " but is declared ", ins[i].type, " (", ins[i].dtype, "); convert it with .to(", ins[i].dtype,
             ")");
    note_device(t, "input '" + ins[i].name + "'");
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (scalar[i]) continue;
    TG_CHECK(all_cpu || inputs[i].tensor.is_cuda(), "ElementwiseKernel '", name_, "': input '", ins[i].name,
             "' is on ", inputs[i].tensor.device(), " while others are on ", *cuda_dev,
             "; pass all inputs on the GPU, or all on the CPU to have them copied");
  }
  TG_CHECK(is_available(), "ElementwiseKernel '", name_, "': no CUDA device is available");
  for (const Tensor& o : outputs)  // only scalars and CPU inputs: a given GPU output picks the device
    if (!cuda_dev && o.defined() && o.is_cuda()) cuda_dev = o.device();
  const Device dev = cuda_dev ? *cuda_dev : Device(kCUDA, current_device_index());
  detail::DeviceGuard guard(dev.index());

  // The loop shape: the broadcast of the non-raw tensor inputs and given non-raw outputs.
  std::optional<Shape> shape;
  auto join = [&](const Shape& s) { shape = shape ? tg::detail::broadcast_shapes(*shape, s, name_.c_str()) : s; };
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!scalar[i] && !ins[i].raw) join(inputs[i].tensor.sizes());
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& o = outputs[i];
    TG_CHECK(o.defined(), "ElementwiseKernel '", name_, "': output '", outs[i].name, "' is undefined");
    TG_CHECK(o.dtype() == outs[i].dtype, "ElementwiseKernel '", name_, "': output '", outs[i].name, "' has dtype ",
             o.dtype(), " but is declared ", outs[i].type, " (", outs[i].dtype, ")");
    TG_CHECK(o.is_cpu() || o.device() == dev, "ElementwiseKernel '", name_, "': output '", outs[i].name, "' is on ",
             o.device(), " but the inputs are on ", dev);
    if (!outs[i].raw) join(o.sizes());
  }
  TG_CHECK(shape.has_value(), "ElementwiseKernel '", name_,
           "': cannot tell the loop size: every input is a scalar or raw; pass a non-raw output");
  for (size_t i = 0; i < outputs.size(); ++i)
    TG_CHECK(outs[i].raw || outputs[i].sizes() == *shape, "ElementwiseKernel '", name_, "': output '", outs[i].name,
             "' has shape ", outputs[i].sizes(), " but the broadcast shape is ", *shape);

  // Dense GPU inputs: of the broadcast shape, or whole for raw ones.
  std::vector<Tensor> dense(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (scalar[i]) continue;
    Tensor t = inputs[i].tensor;
    if (t.is_cpu()) t = native::to(t, dev, t.dtype());
    if (!ins[i].raw && t.sizes() != *shape) t = native::expand(t, *shape);
    dense[i] = t.is_contiguous() ? t : native::contiguous(t);
  }
  // Outputs written in place when they are dense on the GPU, else through a temporary.
  std::vector<Tensor> targets(outs.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    if (i < outputs.size() && outputs[i].is_cuda() && outputs[i].is_contiguous()) {
      targets[i] = outputs[i];
    } else {
      targets[i] = native::empty(i < outputs.size() ? outputs[i].sizes() : *shape, outs[i].dtype, dev);
      if (i < outputs.size()) native::copy_(targets[i], outputs[i]);  // the body may read its outputs
    }
  }

  const int64_t n = shape->numel();
  if (n > 0) {
    RawKernel* k = nullptr;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      auto it = state_->kernels.find(scalar);
      if (it == state_->kernels.end()) {
        const bool plain = std::none_of(scalar.begin(), scalar.end(), [](bool b) { return b; });
        const std::string src = plain ? state_->source : generate(name_, ins, outs, state_->body, scalar);
        it = state_->kernels.emplace(scalar, RawKernel(src, name_, state_->options)).first;
      }
      k = &it->second;
    }
    std::vector<detail::KernelArg> args;
    args.reserve(2 * (dense.size() + targets.size()) + 1);
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (scalar[i]) {
        args.push_back(scalar_arg(inputs[i].scalar, ins[i], name_));
        continue;
      }
      args.push_back(detail::make_kernel_arg(dense[i]));
      if (ins[i].raw) args.push_back(detail::make_kernel_arg(static_cast<long long>(dense[i].numel())));
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      args.push_back(detail::make_kernel_arg(targets[i]));
      if (outs[i].raw) args.push_back(detail::make_kernel_arg(static_cast<long long>(targets[i].numel())));
    }
    args.push_back(detail::make_kernel_arg(static_cast<long long>(n)));
    const int64_t per_block = kEwBlock * kEwUnroll;
    k->launch_args(Dim3((n + per_block - 1) / per_block), Dim3(kEwBlock), 0, args);
  }

  std::vector<Tensor> result(outs.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    if (i < outputs.size()) {
      if (!targets[i].is_same(outputs[i])) native::copy_(outputs[i], targets[i]);
      result[i] = outputs[i];
    } else {
      result[i] = all_cpu ? native::to(targets[i], Device(kCPU), targets[i].dtype()) : targets[i];
    }
  }
  return result;
}

}  // namespace tg::cuda
