// Convolution on CUDA through cuDNN's graph API (cudnn-frontend): conv2d forward (with the
// bias add and, when asked, the ReLU fused: cuDNN's conv + bias + ReLU graph; where no engine
// runs that graph, the plain one and then a ReLU pass), its input gradient (dgrad) and weight
// gradient (wgrad). Graphs are cached by
// shapes, strides, dtype and options (cudnn_graph.h), so layouts are whatever the tensors'
// strides say: NCHW or NHWC (channels-last) reach cuDNN without a transpose. float16 and
// bfloat16 accumulate in float32; float32 uses TF32 only when tg::backends::cudnn::allow_tf32().
#include <algorithm>
#include <vector>

#include <tapegrad/core/backend/backend.h>
#include <tapegrad/core/backend/cuda/kernels.cuh>

#if defined(TG_HAVE_CUDNN)
#include <tapegrad/core/backend/cuda/cudnn_graph.h>
#include <tapegrad/core/backend/cuda/runtime.h>
#include <tapegrad/core/cuda.h>

namespace tg::cuda::kern {
namespace {

namespace fe = cudnn_frontend;
using cudnn::tensor_attrs;

enum Uid : int64_t { kX = 1, kW, kY, kB, kDY, kDX, kDW };

int device_of(const Tensor& t) { return t.device().index() < 0 ? 0 : t.device().index(); }

std::vector<int64_t> vec(const Shape& s) { return std::vector<int64_t>(s.begin(), s.end()); }

void append(std::string& k, const char* tag, const Shape& s) {
  k += tag;
  for (int64_t v : s) k += std::to_string(v) + ",";
}

// The parts of the key and the graph every conv graph shares.
std::string base_key(const char* op, const backend::ConvArgs& a, bool tf32) {
  std::string k = op;
  k += "|" + std::to_string(static_cast<int>(a.x.dtype())) + (tf32 ? "|tf32" : "|ieee");
  append(k, "|x", a.x.sizes());
  append(k, "/", a.x.strides());
  append(k, "|w", a.weight.sizes());
  append(k, "/", a.weight.strides());
  for (int d = 0; d < 2; ++d)
    k += "|" + std::to_string(a.stride[d]) + "," + std::to_string(a.pad[d]) + "," + std::to_string(a.dilation[d]);
  return k;
}

bool use_tf32(DType dt) { return dt == DType::Float32 && tg::backends::cudnn::allow_tf32(); }
// float32 without TF32: only engines that compute in full float32 (as PyTorch with allow_tf32 off).
cudnn::GraphOptions graph_options(DType dt) { return {.exact_float32 = dt == DType::Float32 && !use_tf32(dt)}; }

std::shared_ptr<fe::graph::Graph> new_graph(DType dt) {
  auto g = std::make_shared<fe::graph::Graph>();
  const fe::DataType_t compute = dt == DType::Float64 ? fe::DataType_t::DOUBLE : fe::DataType_t::FLOAT;
  g->set_io_data_type(cudnn::data_type(dt)).set_intermediate_data_type(compute).set_compute_data_type(compute);
  return g;
}

// The input extent a convolution with output `out` reads: rows past the last window's reach
// (a transposed conv's output_padding of a stride or more, which only a dilation allows) are
// not part of cuDNN's problem, which requires the output size to follow from the input's. The
// backward passes them over (their input gradient is zero).
Shape covered_input(const backend::ConvArgs& a, const Shape& out) {
  Shape x = a.x.sizes();
  for (int d = 0; d < 2; ++d) {
    const int64_t span = a.dilation[d] * (a.weight.size(2 + d) - 1) + 1;
    const int64_t reach = (out[2 + d] - 1) * a.stride[d] + span - a.pad[d];  // one past the last row read
    if (x[2 + d] >= reach + a.stride[d]) x[2 + d] = reach;  // else the floor-rounded size is `out` already
  }
  return x;
}

// The padding after the input is implied by the output size (ConvArgs): "same" with an even
// kernel pads one more at the end; a floor-rounded stride needs none beyond what the rows use.
template <class Attr>
Attr conv_attrs(const backend::ConvArgs& a, const Shape& out, const char* name) {
  const Shape x = covered_input(a, out);
  std::vector<int64_t> post(2);
  for (int d = 0; d < 2; ++d) {
    const int64_t in = x[2 + d], o = out[2 + d];
    const int64_t span = a.dilation[d] * (a.weight.size(2 + d) - 1) + 1;
    post[d] = std::max<int64_t>(0, (o - 1) * a.stride[d] + span - in - a.pad[d]);
  }
  return Attr()
      .set_name(name)
      .set_pre_padding({a.pad[0], a.pad[1]})
      .set_post_padding(post)
      .set_stride({a.stride[0], a.stride[1]})
      .set_dilation({a.dilation[0], a.dilation[1]});
}

}  // namespace

namespace {
// The forward graph of a, with the ReLU node when relu.
std::shared_ptr<cudnn::BuiltGraph> conv2d_graph(const backend::ConvArgs& a, int dev, bool relu) {
  const DType dt = a.x.dtype();
  const bool bias = a.bias.defined();
  std::string key = base_key("conv2d", a, use_tf32(dt));
  if (bias) key += "|bias";
  append(key, relu ? "|relu|y" : "|y", a.out.sizes());
  append(key, "/", a.out.strides());
  return cudnn::get_graph(
      dev, key,
      [&] {
        auto g = new_graph(dt);
        auto X = g->tensor(tensor_attrs("x", kX, vec(covered_input(a, a.out.sizes())), vec(a.x.strides()), dt));
        auto W = g->tensor(tensor_attrs("w", kW, vec(a.weight.sizes()), vec(a.weight.strides()), dt));
        auto Y = g->conv_fprop(X, W, conv_attrs<fe::graph::Conv_fprop_attributes>(a, a.out.sizes(), "conv"));
        if (bias) {
          const int64_t co = a.weight.size(0);
          auto B = g->tensor(tensor_attrs("b", kB, {1, co, 1, 1}, {co, 1, 1, 1}, dt));
          Y = g->pointwise(Y, B, fe::graph::Pointwise_attributes().set_name("bias").set_mode(fe::PointwiseMode_t::ADD));
        }
        if (relu)
          Y = g->pointwise(Y, fe::graph::Pointwise_attributes().set_name("relu").set_mode(fe::PointwiseMode_t::RELU_FWD));
        Y->set_output(true)
            .set_uid(kY)
            .set_dim(vec(a.out.sizes()))
            .set_stride(vec(a.out.strides()))
            .set_data_type(cudnn::data_type(dt));
        return g;
      },
      graph_options(dt));
}

// max(out, 0) in place (NaN kept), out dense in any layout.
void relu_in_place(const Tensor& out) {
  backend::ElementwiseIter it;
  it.ndim = 1;
  it.noperands = 2;
  it.numel = out.numel();
  it.shape[0] = out.numel();
  for (int k = 0; k < 2; ++k) {
    it.strides[k][0] = 1;
    it.data[k] = static_cast<char*>(out.data_ptr());
    it.dtypes[k] = out.dtype();
  }
  it.contiguous = true;
  it.device = out.device();
  elementwise(backend::ElemOp::Relu, it);
}
}  // namespace

void conv2d(const backend::ConvArgs& a) {
  const int dev = device_of(a.x);
  detail::DeviceGuard guard(dev);
  auto built = conv2d_graph(a, dev, a.relu);
  const bool relu_after = a.relu && !built->supported;  // no engine for the fused graph: two steps
  if (relu_after) built = conv2d_graph(a, dev, false);
  std::unordered_map<int64_t, void*> pack{{kX, a.x.data_ptr()}, {kW, a.weight.data_ptr()}, {kY, a.out.data_ptr()}};
  if (a.bias.defined()) pack[kB] = a.bias.data_ptr();
  cudnn::execute("conv2d", dev, *built, pack);
  if (relu_after) relu_in_place(a.out);
}

void conv2d_backward(const backend::ConvBackwardArgs& b) {
  const backend::ConvArgs& a = b.conv;
  const int dev = device_of(a.x);
  detail::DeviceGuard guard(dev);
  const DType dt = a.x.dtype();
  const bool tf32 = use_tf32(dt);
  if (b.grad_x.defined()) {
    const Shape dx_dims = covered_input(a, b.grad_out.sizes());
    if (dx_dims != b.grad_x.sizes())  // rows no window reaches: zero, the rest written by cuDNN
      TG_CUDA_CHECK(cudaMemsetAsync(b.grad_x.data_ptr(), 0, b.grad_x.nbytes(), detail::current_stream_handle(dev)));
    std::string key = base_key("conv2d_dgrad", a, tf32);
    append(key, "|dy", b.grad_out.sizes());
    append(key, "/", b.grad_out.strides());
    append(key, "|dx", b.grad_x.strides());
    auto built = cudnn::get_graph(
        dev, key,
        [&] {
          auto g = new_graph(dt);
          auto DY = g->tensor(tensor_attrs("dy", kDY, vec(b.grad_out.sizes()), vec(b.grad_out.strides()), dt));
          auto W = g->tensor(tensor_attrs("w", kW, vec(a.weight.sizes()), vec(a.weight.strides()), dt));
          auto DX = g->conv_dgrad(DY, W, conv_attrs<fe::graph::Conv_dgrad_attributes>(a, b.grad_out.sizes(), "dgrad"));
          DX->set_output(true)
              .set_uid(kDX)
              .set_dim(vec(dx_dims))
              .set_stride(vec(b.grad_x.strides()))
              .set_data_type(cudnn::data_type(dt));
          return g;
        },
        graph_options(dt));
    std::unordered_map<int64_t, void*> pack{
        {kDY, b.grad_out.data_ptr()}, {kW, a.weight.data_ptr()}, {kDX, b.grad_x.data_ptr()}};
    cudnn::execute("conv2d backward (input)", dev, *built, pack);
  }
  if (b.grad_weight.defined()) {
    std::string key = base_key("conv2d_wgrad", a, tf32);
    append(key, "|dy", b.grad_out.sizes());
    append(key, "/", b.grad_out.strides());
    append(key, "|dw", b.grad_weight.strides());
    auto built = cudnn::get_graph(
        dev, key,
        [&] {
          auto g = new_graph(dt);
          auto DY = g->tensor(tensor_attrs("dy", kDY, vec(b.grad_out.sizes()), vec(b.grad_out.strides()), dt));
          auto X = g->tensor(tensor_attrs("x", kX, vec(covered_input(a, b.grad_out.sizes())), vec(a.x.strides()), dt));
          auto DW = g->conv_wgrad(DY, X, conv_attrs<fe::graph::Conv_wgrad_attributes>(a, b.grad_out.sizes(), "wgrad"));
          DW->set_output(true)
              .set_uid(kDW)
              .set_dim(vec(b.grad_weight.sizes()))
              .set_stride(vec(b.grad_weight.strides()))
              .set_data_type(cudnn::data_type(dt));
          return g;
        },
        graph_options(dt));
    std::unordered_map<int64_t, void*> pack{
        {kDY, b.grad_out.data_ptr()}, {kX, a.x.data_ptr()}, {kDW, b.grad_weight.data_ptr()}};
    cudnn::execute("conv2d backward (weight)", dev, *built, pack);
  }
}

}  // namespace tg::cuda::kern

#else

namespace tg::cuda::kern {
void conv2d(const backend::ConvArgs&) {
  TG_ERROR(
      "conv2d: tapegrad was built without cuDNN (or without cudnn-frontend's headers), so CUDA "
      "convolution is unavailable; see the README's build notes");
}
void conv2d_backward(const backend::ConvBackwardArgs&) {
  TG_ERROR("conv2d backward: tapegrad was built without cuDNN (or without cudnn-frontend's headers)");
}
}  // namespace tg::cuda::kern

#endif
