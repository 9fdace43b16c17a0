// Run-time compiled kernels (rtc_internal.h): ElementwiseKernel, a generated kernel run
// through RawKernel.
//
// Unlike the rest of the RTC code, this reaches up into the op layer: a call broadcasts,
// moves CPU tensors to the GPU and back, makes inputs dense and allocates outputs with
// native:: ops (core/native.h), as a user of the library would with the public ones.
// That dependency is kept to this file.
#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include <tapegrad/core/backend/cuda/rtc_internal.h>
#include <tapegrad/core/backend/rtc_host.h>
#include <tapegrad/core/cuda.h>
#include <tapegrad/core/native.h>

namespace tg::cuda {

using rtc::current_device_index;

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

// A uint8 / int8 / int16 scalar argument: an integer in the type's range.
template <typename T>
detail::KernelArg small_int_arg(const Scalar& v, const Param& p, const std::string& kernel) {
  const int64_t x = v.is_integral() ? v.to_int() : static_cast<int64_t>(v.to_double());
  TG_CHECK(x >= std::numeric_limits<T>::min() && x <= std::numeric_limits<T>::max(), "ElementwiseKernel '", kernel,
           "': scalar ", x, " for input '", p.name, "' does not fit in ", p.type);
  return detail::make_kernel_arg(static_cast<T>(x));
}

// A scalar argument converted to the declared type of `p`.
detail::KernelArg scalar_arg(const Scalar& v, const Param& p, const std::string& kernel) {
  const bool integral_target = is_integral(p.dtype, /*include_bool=*/true);
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
    case kUInt8: return small_int_arg<uint8_t>(v, p, kernel);
    case kInt8: return small_int_arg<int8_t>(v, p, kernel);
    case kInt16: return small_int_arg<int16_t>(v, p, kernel);
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
