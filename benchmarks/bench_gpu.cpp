// GPU workloads of the core issue, timed the way compare_torch.py times PyTorch: warm-up
// runs discarded, then the median of >= 10 repeats. Device work is timed with CUDA events;
// workloads that end on the host (cpu(), to_vector, the dependent-add chain) with the host
// clock around the call plus a final synchronize. One JSON line per workload on stdout.
//
//   tg_bench_gpu [--reps N] [--warmup N] [--only SUBSTRING]
#include <tapegrad/tapegrad.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "benchmarks/bench_util.h"

namespace {

using tg::bench::emit;
using tg::bench::median;
using tg::bench::now_s;
using tg::bench::Options;

// Median milliseconds of fn(rep) between two events on the current stream.
double event_ms(const Options& o, const std::function<void(int)>& fn) {
  for (int i = 0; i < o.warmup; ++i) fn(i);
  tg::cuda::synchronize();
  tg::cuda::Event start, end;
  std::vector<double> ms;
  for (int r = 0; r < o.reps; ++r) {
    start.record();
    fn(r);
    end.record();
    end.synchronize();
    ms.push_back(start.elapsed_ms(end));
  }
  return median(ms);
}

// Median milliseconds of fn(rep) on the host clock, device idle before and after.
double wall_ms(const Options& o, const std::function<void(int)>& fn) {
  for (int i = 0; i < o.warmup; ++i) fn(i);
  tg::cuda::synchronize();
  std::vector<double> ms;
  for (int r = 0; r < o.reps; ++r) {
    double t0 = now_s();
    fn(r);
    tg::cuda::synchronize();
    ms.push_back((now_s() - t0) * 1e3);
  }
  return median(ms);
}

void bench_matmul(const Options& o) {
  const int64_t n = 8000;
  const double flops = 2.0 * n * n * n;
  struct Case {
    const char* name;
    tg::DType dtype;
    bool tf32;
  };
  for (Case c : {Case{"matmul_fp32", tg::kFloat32, false}, Case{"matmul_tf32", tg::kFloat32, true},
                 Case{"matmul_fp16", tg::kFloat16, false}, Case{"matmul_bf16", tg::kBFloat16, false}}) {
    if (!o.wants(c.name)) continue;
    // Three input sets in rotation so no repeat reads operands still hot in L2 from the last.
    std::vector<tg::Tensor> a, b;
    for (int i = 0; i < 3; ++i) {
      a.push_back(tg::rand({n, n}, tg::kCUDA).to(c.dtype));
      b.push_back(tg::rand({n, n}, tg::kCUDA).to(c.dtype));
    }
    tg::set_allow_tf32(c.tf32);
    tg::Tensor out;
    double ms = event_ms(o, [&](int r) { out = tg::matmul(a[r % 3], b[r % 3]); });
    tg::set_allow_tf32(false);
    emit(c.name, flops / (ms * 1e-3) / 1e12, "TFLOP/s", ms, "\"n\": 8000");
  }
}

void bench_add(const Options& o) {
  if (!o.wants("add_2^28")) return;
  const int64_t n = int64_t{1} << 28;
  auto a = tg::rand({n}, tg::kCUDA);
  auto b = tg::rand({n}, tg::kCUDA);
  tg::Tensor c;
  double ms = event_ms(o, [&](int) { c = a + b; });
  emit("add_2^28", 3.0 * 4.0 * static_cast<double>(n) / (ms * 1e-3) / 1e9, "GB/s", ms);
}

void bench_standardize(const Options& o) {
  if (!o.wants("standardize")) return;
  auto x = tg::rand({1'000'000, 64}, tg::kCUDA);
  tg::Tensor y;
  double ms = event_ms(o, [&](int) { y = (x - x.mean(0)) / x.std(0); });
  emit("standardize_1Mx64", ms, "ms", ms);
}

void bench_to_host(const Options& o) {
  const int64_t n = 8000;
  auto x = tg::rand({n, n}, tg::kCUDA);
  const std::string bytes = "\"bytes\": " + std::to_string(n * n * 4);
  if (o.wants("cpu_8000")) {
    tg::Tensor h;
    double ms = wall_ms(o, [&](int) { h = x.cpu(); });
    emit("cpu_8000x8000", ms, "ms", ms, bytes);
  }
  if (o.wants("pageable_reused_8000")) {  // into host memory touched before (staged, chunked)
    std::vector<float> buf(static_cast<size_t>(n * n), 0.f);
    double ms = wall_ms(o, [&](int) { x.copy_to_host(buf.data()); });
    emit("pageable_reused_8000x8000", n * n * 4 / (ms * 1e-3) / 1e9, "GB/s", ms, bytes);
  }
  if (o.wants("to_vector_8000")) {
    std::vector<float> v;
    double ms = wall_ms(o, [&](int) { v = x.to_vector<float>(); });
    emit("to_vector_8000x8000", ms, "ms", ms, bytes);
  }
}

void bench_dependent_adds(const Options& o) {
  if (!o.wants("dependent_adds")) return;
  const int kOps = 1000;
  auto x = tg::rand({16}, tg::kCUDA);
  double ms = wall_ms(o, [&](int) {
    tg::Tensor y = x;
    for (int i = 0; i < kOps; ++i) y = y + x;
  });
  emit("dependent_adds_16", ms * 1e3 / kOps, "us/op", ms, "\"ops\": 1000");
}

}  // namespace

int main(int argc, char** argv) try {
  Options o = tg::bench::parse_options(argc, argv);
  if (!tg::cuda::is_available()) {
    std::fprintf(stderr, "tg_bench_gpu: no CUDA device; nothing to measure\n");
    return 0;
  }
  tg::manual_seed(0);
  bench_matmul(o);
  bench_add(o);
  bench_standardize(o);
  bench_to_host(o);
  bench_dependent_adds(o);
  return 0;
} catch (const tg::Error& e) {
  std::fprintf(stderr, "tg_bench_gpu: %s\n", e.what());
  return 1;
}
