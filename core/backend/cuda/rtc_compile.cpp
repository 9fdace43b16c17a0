// Run-time compiled kernels (rtc_internal.h): NVRTC compiles CUDA C++ to a CUBIN for the
// current device (PTX when NVRTC does not know the architecture).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include <tapegrad/core/backend/cuda/rtc_internal.h>

#ifndef TG_CUDA_INCLUDE_DIRS
#define TG_CUDA_INCLUDE_DIRS ""
#endif

namespace tg::cuda {

namespace rtc {

namespace {

std::atomic<int64_t> g_compile_count{0};

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

}  // namespace

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

namespace {

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

}  // namespace

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

}  // namespace rtc

// ---- test hook

int64_t detail::rtc_compile_count() { return rtc::g_compile_count.load(); }

}  // namespace tg::cuda
