// Workloads of the interop issue (#6), one JSON line each (see NOTES.md for the method):
//   ewk_mul_10M_f64         ElementwiseKernel "c = a * b" on 10M float64 CUDA tensors, in GB/s,
//                           against the built-in multiply (the record's "baseline"); event-timed.
//   vectorize_mul_10M_host  the seed's @vectorize multiply: 10M float64 host tensors to the GPU,
//                           multiplied, back on the host (copies included); host clock, ms.
//   rtc_disk_cache_ms       creating an already-compiled RawKernel in a new process (a disk
//                           cache hit; CUDA already initialised in that process), ms.
//
//   tg_bench_interop [--reps N] [--warmup N] [--only SUBSTRING]
//   tg_bench_interop --rtc-child     (internal: the new process of rtc_disk_cache_ms)
#include <tapegrad/tapegrad.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "benchmarks/bench_util.h"

namespace {

using tg::bench::emit;
using tg::bench::median;
using tg::bench::now_s;
using tg::bench::Options;

double event_ms(const Options& o, const std::function<void()>& fn) {
  for (int i = 0; i < o.warmup; ++i) fn();
  tg::cuda::synchronize();
  tg::cuda::Event start, end;
  std::vector<double> ms;
  for (int r = 0; r < o.reps; ++r) {
    start.record();
    fn();
    end.record();
    end.synchronize();
    ms.push_back(start.elapsed_ms(end));
  }
  return median(ms);
}

double wall_ms(const Options& o, const std::function<void()>& fn) {
  for (int i = 0; i < o.warmup; ++i) fn();
  tg::cuda::synchronize();
  std::vector<double> ms;
  for (int r = 0; r < o.reps; ++r) {
    double t0 = now_s();
    fn();
    tg::cuda::synchronize();
    ms.push_back((now_s() - t0) * 1e3);
  }
  return median(ms);
}

// The kernel whose disk-cache load is timed; fixed so that every run hits the same entry.
const char* kCachedSource = R"(
extern "C" __global__ void tg_bench_saxpy(float a, const float* x, float* y, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
)";

int rtc_child() {
  tg::cuda::synchronize();  // CUDA context up before the clock starts
  double t0 = now_s();
  tg::cuda::RawKernel k(kCachedSource, "tg_bench_saxpy");
  double ms = (now_s() - t0) * 1e3;
  std::printf("%.6f %lld\n", ms, static_cast<long long>(tg::cuda::detail::rtc_compile_count()));
  return 0;
}

void bench_ewk(const Options& o) {
  if (!o.wants("ewk_mul_10M_f64")) return;
  const int64_t n = 10'000'000;
  auto opt = tg::TensorOptions().dtype(tg::kFloat64).device(tg::kCUDA);
  tg::Tensor a = tg::rand({n}, opt), b = tg::rand({n}, opt);
  tg::cuda::ElementwiseKernel mul("double a, double b", "double c", "c = a * b", "gpu_mul");
  tg::Tensor c;
  const double bytes = 3.0 * 8 * n;
  double ms_k = event_ms(o, [&] { c = mul(a, b); });
  double ms_b = event_ms(o, [&] { c = a * b; });
  emit("ewk_mul_10M_f64", bytes / (ms_k * 1e-3) / 1e9, "GB/s", ms_k,
       tg::detail::str_cat("\"baseline\": ", bytes / (ms_b * 1e-3) / 1e9, ", \"baseline_name\": \"tg built-in\"",
                           ", \"baseline_ms\": ", ms_b));
}

void bench_vectorize(const Options& o) {
  if (!o.wants("vectorize_mul_10M_host")) return;
  const int64_t n = 10'000'000;
  tg::Tensor a = tg::rand({n}, tg::kFloat64), b = tg::rand({n}, tg::kFloat64);  // host tensors
  tg::cuda::ElementwiseKernel mul("double a, double b", "double c", "c = a * b", "gpu_mul");
  tg::Tensor c;
  double ms = wall_ms(o, [&] { c = mul(a, b); });
  emit("vectorize_mul_10M_host", ms, "ms", ms, "\"n\": 10000000");
}

void bench_disk_cache(const Options& o, const char* self) {
  if (!o.wants("rtc_disk_cache_ms")) return;
  { tg::cuda::RawKernel k(kCachedSource, "tg_bench_saxpy"); }  // make sure the entry is on disk
  if (tg::cuda::detail::rtc_cache_dir().empty()) {
    std::fprintf(stderr, "bench_interop: no disk cache directory (HOME / XDG_CACHE_HOME unset); skipped\n");
    return;
  }
  std::vector<double> ms;
  long long compiles = 0;
  const std::string cmd = std::string("'") + self + "' --rtc-child";
  for (int r = 0; r < o.reps; ++r) {
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) break;
    double v = 0;
    long long c = 0;
    if (std::fscanf(p, "%lf %lld", &v, &c) == 2) {
      ms.push_back(v);
      compiles += c;
    }
    pclose(p);
  }
  if (ms.empty()) {
    std::fprintf(stderr, "bench_interop: the --rtc-child runs printed nothing\n");
    return;
  }
  emit("rtc_disk_cache_ms", median(ms), "ms", median(ms),
       tg::detail::str_cat("\"child_compiles\": ", compiles, ", \"runs\": ", ms.size()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && !std::strcmp(argv[1], "--rtc-child")) return rtc_child();
  Options o = tg::bench::parse_options(argc, argv);
  if (!tg::cuda::is_available()) {
    std::fprintf(stderr, "bench_interop: no CUDA device; nothing to time\n");
    return 0;
  }
  try {
    bench_ewk(o);
    bench_vectorize(o);
    bench_disk_cache(o, std::filesystem::read_symlink("/proc/self/exe").c_str());
  } catch (const tg::Error& e) {
    std::fprintf(stderr, "bench_interop: %s\n", e.what());
    return 1;
  }
  return 0;
}
