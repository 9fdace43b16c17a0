// Run-time compiled kernels in a build without CUDA: constructing one throws.
#include <tapegrad/core/cuda_rtc.h>

namespace tg::cuda {

namespace {
[[noreturn]] void no_rtc(const char* what) {
  TG_ERROR(what, ": tapegrad was built without CUDA (TG_CUDA=OFF); run-time compiled kernels need it");
}
}  // namespace

struct detail::CompiledKernel {};
struct ElementwiseKernel::State {
  std::string source;
};

int64_t detail::rtc_compile_count() { return 0; }
void detail::rtc_clear_memory_cache() {}
std::string detail::rtc_cache_dir() { return ""; }
detail::KernelArg detail::make_kernel_arg(const Tensor&) { no_rtc("RawKernel::launch"); }

RawKernel::RawKernel(std::string, std::string name, std::vector<std::string>) : name_(std::move(name)) {
  no_rtc("RawKernel");
}
int RawKernel::num_params() const { no_rtc("RawKernel::num_params"); }
int RawKernel::max_threads_per_block() const { no_rtc("RawKernel::max_threads_per_block"); }
void RawKernel::launch_args(Dim3, Dim3, size_t, const std::vector<detail::KernelArg>&) const {
  no_rtc("RawKernel::launch");
}

ElementwiseKernel::ElementwiseKernel(std::string, std::string, std::string, std::string name, std::vector<std::string>)
    : name_(std::move(name)) {
  no_rtc("ElementwiseKernel");
}
const std::string& ElementwiseKernel::source() const { return state_->source; }
Tensor ElementwiseKernel::single(std::vector<Tensor>) const { no_rtc("ElementwiseKernel"); }
std::vector<Tensor> ElementwiseKernel::call(const std::vector<KernelInput>&, std::vector<Tensor>) const {
  no_rtc("ElementwiseKernel");
}

}  // namespace tg::cuda
