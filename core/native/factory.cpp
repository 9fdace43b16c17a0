// Factories, the per-device Philox generators and their state (core/rng.h).
#include <charconv>
#include <cmath>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <tapegrad/core/cuda.h>
#include <tapegrad/core/native.h>
#include <tapegrad/core/ops.h>
#include <tapegrad/core/philox.h>
#include <tapegrad/core/rng.h>

namespace tg::native {

namespace {
struct Generator {
  uint64_t seed = 67280421310721ull;
  uint64_t offset = 0;
};
std::mutex g_gen_mutex;
Generator g_cpu_gen;
std::vector<Generator> g_cuda_gens;

Generator& generator(Device d) {
  if (d.is_cpu()) return g_cpu_gen;
  if (static_cast<int>(g_cuda_gens.size()) <= d.index()) g_cuda_gens.resize(d.index() + 1, Generator{g_cpu_gen.seed, 0});
  return g_cuda_gens[d.index()];
}
}  // namespace

std::pair<uint64_t, uint64_t> philox_reserve(Device device, uint64_t count) {
  std::lock_guard<std::mutex> lock(g_gen_mutex);
  Generator& g = generator(device);
  uint64_t off = g.offset;
  g.offset += (count + 3) / 4 * 4;
  return {g.seed, off};
}

RngState get_rng_state() {
  std::lock_guard<std::mutex> lock(g_gen_mutex);
  RngState s{{g_cpu_gen.seed, g_cpu_gen.offset}};
  for (const Generator& g : g_cuda_gens) s.emplace_back(g.seed, g.offset);
  return s;
}

void set_rng_state(const RngState& state) {
  TG_CHECK(!state.empty(), "set_rng_state: empty state");
  std::lock_guard<std::mutex> lock(g_gen_mutex);
  g_cpu_gen = {state[0].first, state[0].second};
  for (size_t i = 0; i < g_cuda_gens.size(); ++i)
    g_cuda_gens[i] = i + 1 < state.size() ? Generator{state[i + 1].first, state[i + 1].second}
                                          : Generator{state[0].first, 0};
  for (size_t i = g_cuda_gens.size() + 1; i < state.size(); ++i)
    g_cuda_gens.push_back({state[i].first, state[i].second});
}

Tensor full(const Shape& sizes, Scalar v, DType dtype, Device device) {
  Tensor t = empty(sizes, dtype, device);
  fill_(t, v);
  return t;
}

Tensor rand(const Shape& sizes, DType dtype, Device device) {
  TG_CHECK(is_floating(dtype), "rand: dtype must be floating point, got ", dtype);
  Tensor t = empty(sizes, dtype, device);
  if (t.numel() == 0) return t;
  auto [seed, off] = philox_reserve(t.device(), philox::counters_for(t.numel(), static_cast<int>(element_size(dtype))));
  backend::get(t.device().type()).uniform(t, seed, off, 0.0, 1.0);
  return t;
}

Tensor randn(const Shape& sizes, DType dtype, Device device) {
  TG_CHECK(is_floating(dtype), "randn: dtype must be floating point, got ", dtype);
  Tensor t = empty(sizes, dtype, device);
  if (t.numel() == 0) return t;
  auto [seed, off] = philox_reserve(t.device(), philox::counters_for(t.numel(), static_cast<int>(element_size(dtype))));
  backend::get(t.device().type()).normal(t, seed, off, 0.0, 1.0);
  return t;
}

namespace {
// Fills self from the generator as rand / randn of its shape would: dense selves directly,
// others through a dense temporary in their logical order.
template <class Fill>
void random_fill_(const Tensor& self, const char* op, Fill&& fill) {
  TG_CHECK(is_floating(self.dtype()), op, ": dtype must be floating point, got ", self.dtype(), " (shape ",
           self.sizes(), ")");
  if (self.numel() == 0) return;
  Tensor dst = self.is_contiguous() ? self : empty(self.sizes(), self.dtype(), self.device());
  auto [seed, off] =
      philox_reserve(dst.device(), philox::counters_for(dst.numel(), static_cast<int>(element_size(dst.dtype()))));
  fill(backend::get(dst.device().type()), dst, seed, off);
  if (!self.is_contiguous()) copy_(self, dst);
}
}  // namespace

void uniform_(const Tensor& self, double from, double to) {
  TG_CHECK(std::isfinite(from) && std::isfinite(to) && from <= to, "uniform_: expected finite from <= to, got from = ",
           from, ", to = ", to);
  random_fill_(self, "uniform_", [&](backend::Backend& b, const Tensor& t, uint64_t seed, uint64_t off) {
    b.uniform(t, seed, off, from, to);
  });
}

void normal_(const Tensor& self, double mean, double std) {
  TG_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0,
           "normal_: expected a finite mean and a finite std >= 0, got mean = ", mean, ", std = ", std);
  random_fill_(self, "normal_", [&](backend::Backend& b, const Tensor& t, uint64_t seed, uint64_t off) {
    b.normal(t, seed, off, mean, std);
  });
}

Tensor randperm(int64_t n, DType dtype, Device device) {
  TG_CHECK(n >= 0, "randperm: n must be non-negative, got ", n);
  TG_CHECK(dtype == kInt64 || dtype == kInt32, "randperm: dtype must be int64 or int32, got ", dtype);
  TG_CHECK(dtype == kInt64 || n <= INT32_MAX, "randperm: n = ", n, " does not fit in int32");
  Tensor t = empty({n}, dtype, device);
  if (n == 0) return t;
  auto [seed, off] = philox_reserve(t.device(), 2 * static_cast<uint64_t>(n));
  backend::get(t.device().type()).randperm(t, seed, off);
  return t;
}

Tensor randperm(int64_t n, DType dtype, Device device, uint64_t seed, uint64_t offset) {
  TG_CHECK(n >= 0, "randperm: n must be non-negative, got ", n);
  TG_CHECK(dtype == kInt64 || dtype == kInt32, "randperm: dtype must be int64 or int32, got ", dtype);
  TG_CHECK(dtype == kInt64 || n <= INT32_MAX, "randperm: n = ", n, " does not fit in int32");
  TG_CHECK(offset % 4 == 0, "randperm: the Philox offset must be a multiple of 4, got ", offset);
  Tensor t = empty({n}, dtype, device);
  if (n > 0) backend::get(t.device().type()).randperm(t, seed, offset);
  return t;
}

Tensor arange(double start, double end, double step, DType dtype, Device device) {
  TG_CHECK(step != 0, "arange: step must be nonzero");
  TG_CHECK(std::isfinite(start) && std::isfinite(end), "arange: start and end must be finite, got ", start, " and ",
           end);
  TG_CHECK((step > 0 && end >= start) || (step < 0 && end <= start), "arange: upper bound and step are inconsistent: ",
           start, " to ", end, " by ", step);
  int64_t n = static_cast<int64_t>(std::ceil((end - start) / step));
  Tensor t = empty({n}, dtype, device);
  if (n > 0) backend::get(t.device().type()).arange(t, start, step);
  return t;
}

}  // namespace tg::native

namespace tg {
void manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(native::g_gen_mutex);
  native::g_cpu_gen = {seed, 0};
  for (auto& g : native::g_cuda_gens) g = {seed, 0};
}
}  // namespace tg

// ---- generator state (core/rng.h)
namespace tg {
namespace {
constexpr int64_t kRngStateBytes = 16;

Device rng_device(Device d, const char* op) {
  if (d.is_cpu()) return d;
  const int n = cuda::device_count();
  TG_CHECK(n > 0, op, ": no CUDA device is available for ", d);
  if (!d.has_index()) return Device(kCUDA, cuda::current_device());
  TG_CHECK(d.index() < n, op, ": device ", d, " does not exist (", n, " CUDA device(s))");
  return d;
}

// (seed, offset) from a state tensor, validated.
std::pair<uint64_t, uint64_t> decode_rng_state(const Tensor& state, const std::string& what, const char* op) {
  TG_CHECK(state.defined(), op, ": ", what, " is undefined");
  TG_CHECK(state.dtype() == kUInt8 && state.numel() == kRngStateBytes, op, ": ", what, " must be a uint8 tensor of ",
           kRngStateBytes, " bytes (seed, Philox offset), got ", state.dtype(), " ", state.sizes());
  const std::vector<uint8_t> b = state.to(kCPU).contiguous().to_vector<uint8_t>();
  uint64_t seed = 0, offset = 0;
  for (int i = 7; i >= 0; --i) {
    seed = seed << 8 | b[i];
    offset = offset << 8 | b[8 + i];
  }
  TG_CHECK(offset % 4 == 0, op, ": ", what, " holds the Philox offset ", offset, ", which is not a multiple of 4");
  return {seed, offset};
}
}  // namespace

Tensor get_rng_state(Device device) {
  device = rng_device(device, "get_rng_state");
  native::Generator g;
  {
    std::lock_guard<std::mutex> lock(native::g_gen_mutex);
    g = native::generator(device);
  }
  std::vector<uint8_t> b(kRngStateBytes);
  for (int i = 0; i < 8; ++i) {
    b[i] = static_cast<uint8_t>(g.seed >> (8 * i));
    b[8 + i] = static_cast<uint8_t>(g.offset >> (8 * i));
  }
  return tg::tensor(b, {kRngStateBytes});
}

void set_rng_state(const Tensor& state, Device device) {
  device = rng_device(device, "set_rng_state");
  auto [seed, offset] = decode_rng_state(state, "the state", "set_rng_state");
  std::lock_guard<std::mutex> lock(native::g_gen_mutex);
  native::generator(device) = {seed, offset};
}

StateDict rng_state_dict() {
  StateDict out;
  out.insert("cpu", get_rng_state(Device(kCPU)));
  for (int i = 0; i < cuda::device_count(); ++i) out.insert("cuda." + std::to_string(i), get_rng_state(Device(kCUDA, i)));
  return out;
}

void load_rng_state_dict(const StateDict& state, bool strict) {
  const char* op = "load_rng_state_dict";
  const int n = cuda::device_count();
  std::vector<std::pair<Device, std::pair<uint64_t, uint64_t>>> todo;
  for (const auto& [key, t] : state) {
    std::optional<Device> d;
    if (key == "cpu") {
      d = Device(kCPU);
    } else if (key.rfind("cuda.", 0) == 0) {
      int index = -1;
      const char* b = key.data() + 5;
      const char* e = key.data() + key.size();
      auto [ptr, ec] = std::from_chars(b, e, index);
      TG_CHECK(ec == std::errc() && ptr == e && b != e && index >= 0, op, ": malformed entry '", key,
               "' (expected \"cpu\" or \"cuda.<index>\")");
      if (index < n)
        d = Device(kCUDA, index);
      else
        TG_CHECK(!strict, op, ": entry '", key, "' is for a CUDA device that is not present (", n,
                 " CUDA device(s)); load non-strictly to skip it");
    } else {
      TG_ERROR(op, ": unexpected entry '", key, "' (expected \"cpu\" or \"cuda.<index>\")");
    }
    auto so = decode_rng_state(t, "entry '" + key + "'", op);
    if (d) todo.emplace_back(*d, so);
  }
  if (strict) {
    TG_CHECK(state.contains("cpu"), op, ": missing entry 'cpu'");
    for (int i = 0; i < n; ++i)
      TG_CHECK(state.contains("cuda." + std::to_string(i)), op, ": missing entry 'cuda.", i, "'");
  }
  std::lock_guard<std::mutex> lock(native::g_gen_mutex);
  for (const auto& [d, so] : todo) native::generator(d) = {so.first, so.second};
}
}  // namespace tg
