// scaled_dot_product_attention (validation, the fused CUDA path when it applies, else PyTorch's math
// path composed of differentiable ops) and nn::MultiheadAttention (F.multi_head_attention_forward).
#include <tapegrad/nn/attention.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <limits>
#include <string>
#include <vector>

#include <tapegrad/autograd/autograd.h>
#include <tapegrad/autograd/function.h>
#include <tapegrad/core/autocast_hook.h>
#include <tapegrad/core/native.h>
#include <tapegrad/core/trace.h>
#include <tapegrad/nn/dropout.h>
#include <tapegrad/nn/init.h>

namespace tg::nn {

namespace {

constexpr const char* kSdpa = "scaled_dot_product_attention";
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

std::string operand_shapes(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  std::string s = detail::str_cat("query ", q.sizes(), ", key ", k.sizes(), ", value ", v.sizes());
  if (mask.defined()) s += detail::str_cat(", attn_mask ", mask.sizes(), " (", mask.dtype(), ")");
  return s;
}

// Inside the op its parts run without autocast (as PyTorch's math kernel below the autocast key).
class AutocastOff {
 public:
  AutocastOff() : prev_(amp::detail::tls_autocast.enabled_mask) { amp::detail::tls_autocast.enabled_mask = 0; }
  ~AutocastOff() { amp::detail::tls_autocast.enabled_mask = prev_; }
  AutocastOff(const AutocastOff&) = delete;
  AutocastOff& operator=(const AutocastOff&) = delete;

 private:
  uint8_t prev_;
};

Shape leading(const Tensor& t) { return Shape(t.sizes().begin(), t.sizes().end() - 2); }

// PyTorch's checks, plus the shapes the math path would otherwise reject with a less direct message.
void check_sdpa(const Tensor& q, const Tensor& k, const Tensor& v, const ScaledDotProductAttentionOptions& o) {
  TG_CHECK(q.defined() && k.defined() && v.defined(), kSdpa, ": query, key and value must be defined");
  const Tensor& m = o.attn_mask;
  const std::string shapes = operand_shapes(q, k, v, m);
  TG_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), kSdpa,
           ": expected query, key and value to have the same dtype, got ", q.dtype(), ", ", k.dtype(), " and ",
           v.dtype(), " (", shapes, ")");
  TG_CHECK(is_floating(q.dtype()), kSdpa, ": expected floating query, key and value, got ", q.dtype(), " (", shapes,
           ")");
  TG_CHECK(q.device() == k.device() && q.device() == v.device(), kSdpa,
           ": expected query, key and value on the same device, got ", q.device(), ", ", k.device(), " and ",
           v.device(), " (", shapes, ")");
  TG_CHECK(q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2, kSdpa,
           ": expected query, key and value of at least 2 dims, got ", shapes);
  TG_CHECK(q.size(-1) == k.size(-1), kSdpa, ": query and key must have the same last (embedding) dim, got ", shapes);
  TG_CHECK(k.size(-2) == v.size(-2), kSdpa, ": key and value must have the same sequence length (dim -2), got ",
           shapes);
  TG_CHECK(o.dropout_p >= 0 && o.dropout_p <= 1, kSdpa, ": dropout_p has to be between 0 and 1, got ", o.dropout_p);
  TG_CHECK(!(m.defined() && o.is_causal), kSdpa, ": attn_mask must not be set when is_causal=true (", shapes, ")");
  if (o.scale) TG_CHECK(std::isfinite(*o.scale), kSdpa, ": scale must be finite, got ", *o.scale);
  Shape qb = leading(q), kb = leading(k), vb = leading(v);
  if (o.enable_gqa) {
    TG_CHECK(q.dim() >= 3 && k.dim() >= 3 && v.dim() >= 3, kSdpa,
             ": enable_gqa needs a heads dim (-3) on query, key and value, got ", shapes);
    const int64_t hq = q.size(-3), hk = k.size(-3), hv = v.size(-3);
    TG_CHECK(hk > 0 && hv > 0 && hq % hk == 0 && hq % hv == 0, kSdpa,
             ": the number of heads in key (", hk, ") and value (", hv, ") must divide the number of query heads (",
             hq, "), got ", shapes);
    kb.back() = hq;
    vb.back() = hq;
  }
  Shape batch;
  try {
    batch = detail::broadcast_shapes(detail::broadcast_shapes(qb, kb, kSdpa), vb, kSdpa);
  } catch (const Error&) {
    TG_ERROR(kSdpa, ": the leading (batch, heads) dims of query, key and value do not match or broadcast",
             o.enable_gqa ? "" : " (key / value with fewer heads need enable_gqa)", ": ", shapes);
  }
  if (m.defined()) {
    TG_CHECK(m.dtype() == kBool || m.dtype() == kFloat32 || m.dtype() == q.dtype(), kSdpa,
             ": expected attn_mask of dtype bool, float32 or the query's dtype (", q.dtype(), "), got ", m.dtype(),
             " (", shapes, ")");
    TG_CHECK(m.device() == q.device(), kSdpa, ": attn_mask is on ", m.device(), ", query on ", q.device());
    Shape full = batch;
    full.push_back(q.size(-2));
    full.push_back(k.size(-2));
    bool ok = m.dim() <= static_cast<int64_t>(full.size());
    for (int64_t i = 1; ok && i <= m.dim(); ++i) {
      const int64_t ms = m.size(-i), fs = full[full.size() - static_cast<size_t>(i)];
      ok = ms == fs || ms == 1;
    }
    TG_CHECK(ok, kSdpa, ": attn_mask of shape ", m.sizes(), " does not broadcast to the attention shape ", full,
             " (", shapes, ")");
  }
}

// key / value heads repeated (repeat_interleave on dim -3) up to the query's.
Tensor repeat_heads(const Tensor& t, int64_t hq) {
  const int64_t h = t.size(-3);
  if (h == hq) return t;
  Shape s = t.sizes();
  Shape e = s;
  e.insert(e.end() - 2, hq / h);  // [..., h, g, T, E]
  Shape r = s;
  r[r.size() - 3] = hq;
  return t.unsqueeze(-3).expand(e).reshape(r);
}

// PyTorch's _scaled_dot_product_attention_math: q and k each scaled by sqrt(scale), the mask applied
// to the scores, a softmax whose all -inf rows are 0 (_safe_softmax), dropout, the product with v.
Tensor sdpa_math(const Tensor& query, const Tensor& key, const Tensor& value,
                 const ScaledDotProductAttentionOptions& o) {
  AutocastOff no_autocast;
  const DType out_dtype = query.dtype();
  const bool widen = is_reduced_float(out_dtype);
  Tensor q = widen ? query.to(kFloat32) : query;
  Tensor k = widen ? key.to(kFloat32) : key;
  Tensor v = widen ? value.to(kFloat32) : value;
  if (o.enable_gqa) {
    k = repeat_heads(k, q.size(-3));
    v = repeat_heads(v, q.size(-3));
  }
  const double s = o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  const double sf = std::sqrt(std::abs(s));
  Tensor scores = tg::matmul(q * (s < 0 ? -sf : sf), k.transpose(-2, -1) * sf);
  const Tensor& m = o.attn_mask;
  if (o.is_causal) {
    const int64_t tq = q.size(-2), tk = k.size(-2);
    Tensor above = tg::ones({tq, tk}, TensorOptions().dtype(kBool).device(q.device())).triu(1);
    scores = scores.masked_fill(above, kNegInf);
  } else if (m.defined()) {
    scores = m.dtype() == kBool ? scores.masked_fill(m.eq(false), kNegInf) : scores + m;
  }
  Tensor probs;
  if (m.defined()) {
    // _safe_softmax: a row that is all -inf gives zeros (and a zero gradient), not NaN.
    Tensor dead;
    {
      NoGradGuard no_grad;
      dead = scores.detach().max({-1}, true).eq(kNegInf);
    }
    probs = tg::softmax(scores.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0);
  } else {
    probs = tg::softmax(scores, -1);
  }
  if (o.dropout_p > 0) probs = functional::dropout(probs, o.dropout_p, true);
  Tensor out = tg::matmul(probs, v);
  return widen ? out.to(out_dtype) : out;
}

// The fused CUDA path (cuDNN) for float16 / bfloat16 [B, H, T, D] operands (3-d: B = 1), as one
// node whose backward is cuDNN's; nullopt where it does not apply or cuDNN has no engine for the
// shapes. A mask goes in as a finite additive bias (-inf and false as the dtype's lowest value); rows
// it masks entirely are zeroed afterwards, with a zero gradient, as the math path's _safe_softmax.
std::optional<Tensor> sdpa_fused(const Tensor& query, const Tensor& key, const Tensor& value,
                                 const ScaledDotProductAttentionOptions& o) {
  if (query.device().type() != DeviceType::CUDA || !is_reduced_float(query.dtype())) return std::nullopt;
  // Export records public ops: while tracing, the composition (whose parts are traced) runs instead.
  if (detail::tls_tracer != nullptr || o.dropout_p >= 1) return std::nullopt;
  const int64_t nd = query.dim();
  if (nd < 3 || nd > 4 || key.dim() != nd || value.dim() != nd) return std::nullopt;
  const Tensor& m = o.attn_mask;
  if (m.defined() && m.requires_grad() && autograd::GradMode::is_enabled()) return std::nullopt;
  Tensor q = nd == 3 ? query.unsqueeze(0) : query, k = nd == 3 ? key.unsqueeze(0) : key,
         v = nd == 3 ? value.unsqueeze(0) : value;
  const int64_t B = q.size(0), Hq = q.size(1), Hk = k.size(1), Tq = q.size(2), Tk = k.size(2);
  if (k.size(0) != B || v.size(0) != B || v.size(1) != Hk) return std::nullopt;
  if (Hq != Hk && !(o.enable_gqa && Hq % Hk == 0)) return std::nullopt;
  AutocastOff no_autocast;
  Tensor bias, dead;
  {
    NoGradGuard no_grad;
    if (m.defined()) {
      Tensor m4 = m;
      while (m4.dim() < 4) m4 = m4.unsqueeze(0);
      const Shape bshape{m4.size(0), m4.size(1), Tq, Tk};
      const double lowest = query.dtype() == kFloat16 ? -65504.0 : -3.3895313892515355e38;
      if (m4.dtype() == kBool) {
        bias = tg::full(bshape, lowest, TensorOptions().dtype(query.dtype()).device(query.device())).masked_fill(m4, 0.0);
        dead = m4.to(kFloat32).max({-1}, true).eq(0.0);
      } else {
        bias = m4.to(query.dtype()).clamp(lowest, -lowest).expand(bshape).contiguous();
        dead = m4.max({-1}, true).eq(kNegInf);
      }
    }
  }
  // cuDNN reads the head dim contiguous and 16-byte aligned rows.
  auto aligned = [](const Tensor& t) {
    if (t.stride(-1) != 1 || reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
    for (int64_t d = 0; d + 1 < t.dim(); ++d)
      if (t.size(d) > 1 && t.stride(d) % 8 != 0) return false;
    return true;
  };
  Tensor qc = q.detach(), kc = k.detach(), vc = v.detach();
  if (!aligned(qc)) qc = qc.contiguous();
  if (!aligned(kc)) kc = kc.contiguous();
  if (!aligned(vc)) vc = vc.contiguous();
  const double s = o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  const bool with_grad = autograd::should_record(q, k, v);
  std::optional<native::SdpaFused> f =
      native::sdpa_fused_forward(qc, kc, vc, bias, s, o.is_causal, o.dropout_p, with_grad);
  if (!f) return std::nullopt;
  Tensor out = f->out;
  if (with_grad) {
    auto fs = std::make_shared<native::SdpaFused>(std::move(*f));
    fs->out = out.detach();  // the node's own output, held without its grad_fn
    autograd::SavedTensor sq(q, kSdpa), sk(k, kSdpa), sv(v, kSdpa);
    out = autograd::record(kSdpa, {q, k, v}, std::move(out),
                           [fs, sq, sk, sv](const Tensor& g, const autograd::FunctionNode&) -> std::vector<Tensor> {
                             sq.unpack();  // refuses inputs modified in place since the forward
                             sk.unpack();
                             sv.unpack();
                             return native::sdpa_fused_backward(*fs, g);
                           });
  }
  if (dead.defined()) out = out.masked_fill(dead, 0.0);
  return nd == 3 ? out.squeeze(0) : out;
}

}  // namespace

namespace functional {

Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const ScaledDotProductAttentionOptions& options) {
  // Autocast: the lower-precision list, as PyTorch (a floating mask is cast with the operands).
  if (amp::detail::tls_autocast.enabled_mask) [[unlikely]] {
    std::vector<Tensor> ins{query, key, value};
    const bool float_mask = options.attn_mask.defined() && is_floating(options.attn_mask.dtype());
    if (float_mask) ins.push_back(options.attn_mask);
    auto cast = amp::detail::autocast_call_list(
        AutocastCategory::Lower,
        [&](const std::vector<Tensor>& c) -> Tensor {
          ScaledDotProductAttentionOptions o = options;
          if (float_mask) o.attn_mask = c[3];
          AutocastOff off;
          return scaled_dot_product_attention(c[0], c[1], c[2], o);
        },
        ins);
    if (cast) return std::move(*cast);
  }
  check_sdpa(query, key, value, options);
  if (std::optional<Tensor> fused = sdpa_fused(query, key, value, options)) return std::move(*fused);
  return sdpa_math(query, key, value, options);
}

}  // namespace functional

// ---- MultiheadAttention

MultiheadAttention::MultiheadAttention(int64_t embed_dim_, int64_t num_heads_, MultiheadAttentionOptions o,
                                       TensorOptions tensor_options)
    : embed_dim(embed_dim_), num_heads(num_heads_), dropout(o.dropout), batch_first(o.batch_first) {
  TG_CHECK(embed_dim > 0 && num_heads > 0, "MultiheadAttention: embed_dim and num_heads must be positive, got ",
           embed_dim, " and ", num_heads);
  TG_CHECK(embed_dim % num_heads == 0, "MultiheadAttention: embed_dim (", embed_dim,
           ") must be divisible by num_heads (", num_heads, ")");
  TG_CHECK(dropout >= 0 && dropout <= 1, "MultiheadAttention: dropout has to be between 0 and 1, got ", dropout);
  kdim = o.kdim.value_or(embed_dim);
  vdim = o.vdim.value_or(embed_dim);
  TG_CHECK(kdim > 0 && vdim > 0, "MultiheadAttention: kdim and vdim must be positive, got ", kdim, " and ", vdim);
  TG_CHECK(is_floating(tensor_options.dtype()), "MultiheadAttention: parameters must be floating point, got ",
           tensor_options.dtype());
  head_dim = embed_dim / num_heads;
  const TensorOptions opts = TensorOptions().dtype(tensor_options.dtype()).device(tensor_options.device());
  if (kdim == embed_dim && vdim == embed_dim) {
    in_proj_weight = register_parameter("in_proj_weight", empty({3 * embed_dim, embed_dim}, opts));
  } else {
    q_proj_weight = register_parameter("q_proj_weight", empty({embed_dim, embed_dim}, opts));
    k_proj_weight = register_parameter("k_proj_weight", empty({embed_dim, kdim}, opts));
    v_proj_weight = register_parameter("v_proj_weight", empty({embed_dim, vdim}, opts));
  }
  if (o.bias) in_proj_bias = register_parameter("in_proj_bias", empty({3 * embed_dim}, opts));
  out_proj = register_module("out_proj", std::make_shared<Linear>(embed_dim, embed_dim, o.bias, opts));
  reset_parameters();
}

void MultiheadAttention::reset_parameters() {
  if (in_proj_weight.defined()) {
    init::xavier_uniform_(in_proj_weight);
  } else {
    init::xavier_uniform_(q_proj_weight);
    init::xavier_uniform_(k_proj_weight);
    init::xavier_uniform_(v_proj_weight);
  }
  if (in_proj_bias.defined()) init::zeros_(in_proj_bias);
  if (out_proj->bias.defined()) init::zeros_(out_proj->bias);
}

Tensor MultiheadAttention::forward(const Tensor& x) {
  return std::get<0>(forward(x, x, x, {.need_weights = false}));
}

std::tuple<Tensor, Tensor> MultiheadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                                       const MultiheadAttentionForwardOptions& o) {
  constexpr const char* who = "MultiheadAttention";
  TG_CHECK(query.defined() && key.defined() && value.defined(), who, ": query, key and value must be defined");
  const std::string shapes =
      detail::str_cat("query ", query.sizes(), ", key ", key.sizes(), ", value ", value.sizes());
  TG_CHECK(query.dim() == 3 || query.dim() == 2, who, ": expected 3-D (batched) or 2-D (unbatched) query, got ",
           shapes);
  TG_CHECK(key.dim() == query.dim() && value.dim() == query.dim(), who,
           ": query, key and value must have the same number of dims, got ", shapes);
  const bool batched = query.dim() == 3;
  Tensor q = query, k = key, v = value, kpm = o.key_padding_mask, mask = o.attn_mask;
  if (batched && batch_first) {
    q = q.transpose(0, 1);
    k = k.transpose(0, 1);
    v = v.transpose(0, 1);
  }
  if (!batched) {
    q = q.unsqueeze(1);
    k = k.unsqueeze(1);
    v = v.unsqueeze(1);
    if (kpm.defined()) {
      TG_CHECK(kpm.dim() == 1, who, ": expected a 1-D key_padding_mask for unbatched input, got ", kpm.sizes());
      kpm = kpm.unsqueeze(0);
    }
  }
  const int64_t L = q.size(0), N = q.size(1), S = k.size(0), E = embed_dim, H = num_heads;
  TG_CHECK(q.size(2) == E, who, ": expected query with ", E, " features (embed_dim), got ", shapes);
  TG_CHECK(k.size(2) == kdim && v.size(2) == vdim, who, ": expected key with ", kdim, " and value with ", vdim,
           " features, got ", shapes);
  TG_CHECK(k.size(0) == v.size(0) && k.size(1) == N && v.size(1) == N, who,
           ": key and value must have the same sequence length and batch as query, got ", shapes,
           batch_first ? " (batch_first)" : "");

  // In-projection.
  Tensor wq, wk, wv, bq, bk, bv;
  if (in_proj_weight.defined()) {
    wq = in_proj_weight.slice(0, 0, E);
    wk = in_proj_weight.slice(0, E, 2 * E);
    wv = in_proj_weight.slice(0, 2 * E, 3 * E);
  } else {
    wq = q_proj_weight;
    wk = k_proj_weight;
    wv = v_proj_weight;
  }
  if (in_proj_bias.defined()) {
    bq = in_proj_bias.slice(0, 0, E);
    bk = in_proj_bias.slice(0, E, 2 * E);
    bv = in_proj_bias.slice(0, 2 * E, 3 * E);
  }
  Tensor qp = tg::linear(q, wq, bq), kp = tg::linear(k, wk, bk), vp = tg::linear(v, wv, bv);

  // Masks as additive floats (bool: true = not allowed), attn_mask as [1 or N*H, L, S].
  auto canonical = [&](const Tensor& m, const char* name) -> Tensor {
    if (!m.defined()) return m;
    TG_CHECK(m.device() == qp.device(), who, ": ", name, " is on ", m.device(), ", query on ", qp.device());
    if (m.dtype() == kBool) return tg::zeros(m.sizes(), TensorOptions().dtype(qp.dtype()).device(m.device())).masked_fill(m, kNegInf);
    TG_CHECK(is_floating(m.dtype()), who, ": only bool and floating ", name, " are supported, got ", m.dtype());
    return m;
  };
  mask = canonical(mask, "attn_mask");
  kpm = canonical(kpm, "key_padding_mask");
  bool is_causal = o.is_causal;
  TG_CHECK(!(is_causal && !mask.defined()), who,
           ": is_causal is a hint that attn_mask is the causal mask; it needs attn_mask (as PyTorch)");
  if (mask.defined()) {
    if (mask.dim() == 2) {
      TG_CHECK(mask.size(0) == L && mask.size(1) == S, who, ": the 2-D attn_mask should be [", L, ", ", S, "], got ",
               mask.sizes());
      mask = mask.unsqueeze(0);
    } else {
      TG_CHECK(mask.dim() == 3 && mask.size(0) == N * H && mask.size(1) == L && mask.size(2) == S, who,
               ": the 3-D attn_mask should be [", N * H, ", ", L, ", ", S, "], got ", mask.sizes());
    }
  }
  if (kpm.defined()) {
    TG_CHECK(kpm.dim() == 2 && kpm.size(0) == N && kpm.size(1) == S, who, ": expected key_padding_mask of shape [",
             N, ", ", S, "], got ", kpm.sizes());
    kpm = kpm.view({N, 1, 1, S}).expand({N, H, 1, S}).reshape({N * H, 1, S});
    mask = mask.defined() ? mask + kpm : kpm;
  }
  // The is_causal hint is used only where the mask would be dropped anyway (PyTorch's rule).
  if (is_causal && !kpm.defined() && !o.need_weights) {
    mask = Tensor();
  } else {
    is_causal = false;
  }
  const double p = is_training() ? dropout : 0.0;

  Tensor out, weights;
  if (o.need_weights) {
    Tensor qh = qp.reshape({L, N * H, head_dim}).transpose(0, 1);  // [N*H, L, hd]
    Tensor kh = kp.reshape({S, N * H, head_dim}).transpose(0, 1);
    Tensor vh = vp.reshape({S, N * H, head_dim}).transpose(0, 1);
    Tensor w = tg::matmul(qh * std::sqrt(1.0 / static_cast<double>(head_dim)), kh.transpose(-2, -1));
    if (mask.defined()) w = mask + w;
    w = tg::softmax(w, -1);
    if (p > 0) w = functional::dropout(w, p, true);
    out = tg::matmul(w, vh).transpose(0, 1).contiguous().view({L * N, E});  // [L*N, E]
    out = out_proj->forward(out).view({L, N, E});
    weights = w.view({N, H, L, S});
    if (o.average_attn_weights) weights = weights.mean(1);
    if (!batched) weights = weights.squeeze(0);
  } else {
    if (mask.defined()) mask = mask.size(0) == 1 ? mask.unsqueeze(0) : mask.reshape({N, H, -1, S});
    Tensor qh = qp.reshape({L, N, H, head_dim}).permute({1, 2, 0, 3});  // [N, H, L, hd]
    Tensor kh = kp.reshape({S, N, H, head_dim}).permute({1, 2, 0, 3});
    Tensor vh = vp.reshape({S, N, H, head_dim}).permute({1, 2, 0, 3});
    Tensor a = functional::scaled_dot_product_attention(qh, kh, vh,
                                                        {.attn_mask = mask, .dropout_p = p, .is_causal = is_causal});
    out = a.permute({2, 0, 1, 3}).contiguous().view({L * N, E});
    out = out_proj->forward(out).view({L, N, E});
  }
  if (!batched) out = out.squeeze(1);
  else if (batch_first) out = out.transpose(0, 1);
  return {out, weights};
}

}  // namespace tg::nn
