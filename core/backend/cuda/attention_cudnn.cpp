// Fused attention on CUDA through cuDNN's SDPA (cudnn-frontend graph API, `sdpa` and
// `sdpa_backward` nodes): float16 / bfloat16 in, float32 softmax and accumulation; causal
// (top-left), an additive bias, dropout from (seed, offset) device tensors, grouped-query heads.
// Graphs are cached by shapes, strides, dtype and options (cudnn_graph.h); a shape cuDNN has no
// engine for is reported as unsupported, and the front-end takes the math path.
#include <tapegrad/core/backend/backend.h>
#include <tapegrad/core/backend/cuda/kernels.cuh>

#if defined(TG_HAVE_CUDNN)
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include <tapegrad/core/backend/cuda/cudnn_graph.h>
#include <tapegrad/core/backend/cuda/runtime.h>
#include <tapegrad/core/ops.h>

namespace tg::cuda::kern {
namespace {

namespace fe = cudnn_frontend;
using cudnn::tensor_attrs;

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kBias, kSeed, kOffset, kDO, kDQ, kDK, kDV };

int device_of(const Tensor& t) { return t.device().index() < 0 ? 0 : t.device().index(); }

std::vector<int64_t> vec(const Shape& s) { return std::vector<int64_t>(s.begin(), s.end()); }

void append(std::string& k, const char* tag, const Shape& s) {
  k += tag;
  for (int64_t v : s) k += std::to_string(v) + ",";
}

uint32_t float_bits(double d) {
  const float f = static_cast<float>(d);
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// What both directions' graphs depend on.
std::string base_key(const char* op, const backend::SdpaArgs& a, const Tensor& out) {
  std::string k = op;
  k += "|" + std::to_string(static_cast<int>(a.q.dtype()));
  append(k, "|q", a.q.sizes());
  append(k, "/", a.q.strides());
  append(k, "|k", a.k.sizes());
  append(k, "/", a.k.strides());
  append(k, "|v", a.v.sizes());
  append(k, "/", a.v.strides());
  append(k, "|o", out.strides());
  if (a.bias.defined()) {
    append(k, "|b", a.bias.sizes());
    append(k, "/", a.bias.strides());
  }
  k += "|s" + std::to_string(float_bits(a.scale)) + (a.causal ? "|causal" : "");
  if (a.dropout_p > 0) k += "|p" + std::to_string(float_bits(a.dropout_p));
  return k;
}

std::shared_ptr<fe::graph::Graph> new_graph(DType dt) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(cudnn::data_type(dt))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

std::shared_ptr<fe::graph::Tensor_attributes> int64_scalar(fe::graph::Graph& g, const char* name, int64_t uid) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({1, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::INT64));
}

// The operands both graphs read; options set on `attrs` (SDPA_attributes or SDPA_backward_attributes).
struct Operands {
  std::shared_ptr<fe::graph::Tensor_attributes> q, k, v;
};
template <class Attr>
Operands declare_operands(fe::graph::Graph& g, const backend::SdpaArgs& a, Attr& attrs) {
  const DType dt = a.q.dtype();
  Operands o;
  o.q = g.tensor(tensor_attrs("q", kQ, vec(a.q.sizes()), vec(a.q.strides()), dt));
  o.k = g.tensor(tensor_attrs("k", kK, vec(a.k.sizes()), vec(a.k.strides()), dt));
  o.v = g.tensor(tensor_attrs("v", kV, vec(a.v.sizes()), vec(a.v.strides()), dt));
  attrs.set_attn_scale(static_cast<float>(a.scale));
  if (a.causal) attrs.set_causal_mask(true);  // top-left diagonal, right bound 0
  if (a.bias.defined())
    attrs.set_bias(g.tensor(tensor_attrs("bias", kBias, vec(a.bias.sizes()), vec(a.bias.strides()), dt)));
  if (a.dropout_p > 0)
    attrs.set_dropout(static_cast<float>(a.dropout_p), int64_scalar(g, "seed", kSeed), int64_scalar(g, "offset", kOffset));
  return o;
}

Shape stats_strides(const Tensor& q) { return {q.size(1) * q.size(2), q.size(2), 1, 1}; }
Shape stats_sizes(const Tensor& q) { return {q.size(0), q.size(1), q.size(2), 1}; }

std::shared_ptr<cudnn::BuiltGraph> forward_graph(int dev, const backend::SdpaArgs& a, const Tensor& out,
                                                 bool stats) {
  std::string key = base_key("sdpa_fwd", a, out);
  if (stats) key += "|stats";
  return cudnn::get_graph(dev, key, [&] {
    const DType dt = a.q.dtype();
    auto g = new_graph(dt);
    auto attrs = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(stats);
    Operands o = declare_operands(*g, a, attrs);
    auto [O, Stats] = g->sdpa(o.q, o.k, o.v, attrs);
    O->set_output(true).set_uid(kO).set_dim(vec(out.sizes())).set_stride(vec(out.strides())).set_data_type(
        cudnn::data_type(dt));
    if (stats)
      Stats->set_output(true)
          .set_uid(kStats)
          .set_dim(vec(stats_sizes(a.q)))
          .set_stride(vec(stats_strides(a.q)))
          .set_data_type(fe::DataType_t::FLOAT);
    return g;
  });
}

std::shared_ptr<cudnn::BuiltGraph> backward_graph(int dev, const backend::SdpaArgs& a, const Tensor& out) {
  const bool det = tg::are_deterministic_algorithms_enabled();
  std::string key = base_key("sdpa_bwd", a, out);
  append(key, "|dq", a.dq_strides);
  append(key, "|dk", a.dk_strides);
  append(key, "|dv", a.dv_strides);
  if (det) key += "|det";
  return cudnn::get_graph(dev, key, [&] {
    const DType dt = a.q.dtype();
    auto g = new_graph(dt);
    auto attrs = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward").set_deterministic_algorithm(det);
    Operands o = declare_operands(*g, a, attrs);
    auto O = g->tensor(tensor_attrs("o", kO, vec(out.sizes()), vec(out.strides()), dt));
    auto dO = g->tensor(tensor_attrs("do", kDO, vec(out.sizes()), vec(out.strides()), dt));
    auto Stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("stats")
                               .set_uid(kStats)
                               .set_dim(vec(stats_sizes(a.q)))
                               .set_stride(vec(stats_strides(a.q)))
                               .set_data_type(fe::DataType_t::FLOAT));
    auto [DQ, DK, DV] = g->sdpa_backward(o.q, o.k, o.v, O, dO, Stats, attrs);
    DQ->set_output(true).set_uid(kDQ).set_dim(vec(a.q.sizes())).set_stride(vec(a.dq_strides)).set_data_type(
        cudnn::data_type(dt));
    DK->set_output(true).set_uid(kDK).set_dim(vec(a.k.sizes())).set_stride(vec(a.dk_strides)).set_data_type(
        cudnn::data_type(dt));
    DV->set_output(true).set_uid(kDV).set_dim(vec(a.v.sizes())).set_stride(vec(a.dv_strides)).set_data_type(
        cudnn::data_type(dt));
    return g;
  });
}

void pack_operands(std::unordered_map<int64_t, void*>& pack, const backend::SdpaArgs& a) {
  pack[kQ] = a.q.data_ptr();
  pack[kK] = a.k.data_ptr();
  pack[kV] = a.v.data_ptr();
  if (a.bias.defined()) pack[kBias] = a.bias.data_ptr();
  if (a.dropout_p > 0) {
    pack[kSeed] = a.seed.data_ptr();
    pack[kOffset] = a.offset.data_ptr();
  }
}

}  // namespace

bool sdpa_fused_forward(const backend::SdpaArgs& a, const Tensor& out, const Tensor& stats, bool check_backward) {
  const int dev = device_of(a.q);
  detail::DeviceGuard guard(dev);
  auto fwd = forward_graph(dev, a, out, stats.defined());
  if (!fwd->supported) return false;
  if (check_backward && !backward_graph(dev, a, out)->supported) return false;
  std::unordered_map<int64_t, void*> pack{{kO, out.data_ptr()}};
  if (stats.defined()) pack[kStats] = stats.data_ptr();
  pack_operands(pack, a);
  cudnn::execute("scaled_dot_product_attention", dev, *fwd, pack);
  return true;
}

void sdpa_fused_backward(const backend::SdpaArgs& a, const Tensor& out, const Tensor& stats, const Tensor& grad_out,
                         const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const int dev = device_of(a.q);
  detail::DeviceGuard guard(dev);
  auto bwd = backward_graph(dev, a, out);
  TG_CHECK(bwd->supported, "scaled_dot_product_attention backward: cuDNN refused a graph it accepted at the forward: ",
           bwd->error);
  std::unordered_map<int64_t, void*> pack{{kO, out.data_ptr()},       {kDO, grad_out.data_ptr()},
                                          {kStats, stats.data_ptr()}, {kDQ, dq.data_ptr()},
                                          {kDK, dk.data_ptr()},       {kDV, dv.data_ptr()}};
  pack_operands(pack, a);
  cudnn::execute("scaled_dot_product_attention backward", dev, *bwd, pack);
}

}  // namespace tg::cuda::kern

#else

namespace tg::cuda::kern {
// Without cuDNN there is no fused path: the front-end takes the math path.
bool sdpa_fused_forward(const backend::SdpaArgs&, const Tensor&, const Tensor&, bool) { return false; }
void sdpa_fused_backward(const backend::SdpaArgs&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, const Tensor&) {
  TG_ERROR("scaled_dot_product_attention backward: tapegrad was built without cuDNN");
}
}  // namespace tg::cuda::kern

#endif
