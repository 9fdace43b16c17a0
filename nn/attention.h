// Attention: functional::scaled_dot_product_attention (PyTorch's semantics; a math path composed of
// differentiable ops, and on CUDA for float16 / bfloat16 cuDNN's fused flash attention when the
// library is built with cuDNN) and the module nn::MultiheadAttention.
#pragma once
#include <optional>
#include <tuple>

#include <tapegrad/nn/linear.h>
#include <tapegrad/nn/module.h>

namespace tg::nn {

struct ScaledDotProductAttentionOptions {
  // Bool (true = take part in attention) or floating (added to the scores; float32 or the query's
  // dtype), broadcastable to [..., Tq, Tk]. Undefined: none.
  Tensor attn_mask = {};
  double dropout_p = 0.0;  // applied to the attention probabilities whenever > 0 (no training flag)
  bool is_causal = false;  // top-left aligned: query i sees keys 0..i (tril of ones [Tq, Tk])
  std::optional<double> scale = std::nullopt;  // default 1 / sqrt(E)
  bool enable_gqa = false;                     // key / value may have Hq / g heads (dim -3)
};

namespace functional {
// torch.nn.functional.scaled_dot_product_attention: query [..., Tq, E], key [..., Tk, E],
// value [..., Tk, Ev] -> [..., Tq, Ev]; the leading dims broadcast (as matmul), with enable_gqa
// key / value heads (dim -3) repeat_interleave'd to the query's. attn_mask together with is_causal,
// dropout_p outside [0, 1], mismatched dtypes / devices / sizes or a mask that does not broadcast are
// tg::Errors naming "scaled_dot_product_attention" and the shapes. float16 / bfloat16 inputs are
// computed in float32 on the math path and returned in their dtype. Under autocast the op is in the
// lower-precision list (query, key, value and a floating mask cast to the autocast dtype).
Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const ScaledDotProductAttentionOptions& options = {});
}  // namespace functional

struct MultiheadAttentionOptions {
  double dropout = 0.0;  // on the attention weights, in train() only
  bool bias = true;      // in_proj_bias and out_proj.bias
  bool batch_first = false;  // inputs and output [N, L, E] instead of [L, N, E]
  std::optional<int64_t> kdim = std::nullopt;  // key features (default embed_dim)
  std::optional<int64_t> vdim = std::nullopt;  // value features (default embed_dim)
};

struct MultiheadAttentionForwardOptions {
  // [N, S] (or [S] unbatched): bool (true = ignore that key) or floating (added).
  Tensor key_padding_mask = {};
  bool need_weights = true;  // also return the attention weights (the math path; else SDPA)
  // [L, S] or [N * num_heads, L, S]: bool (true = NOT allowed, PyTorch's MHA convention) or floating.
  Tensor attn_mask = {};
  bool average_attn_weights = true;  // weights averaged over the heads: [N, L, S], else [N, H, L, S]
  bool is_causal = false;            // a hint that attn_mask is the causal mask (needs attn_mask)
};

// torch.nn.MultiheadAttention. Parameters as PyTorch names them: in_proj_weight [3E, E] (when kdim
// and vdim are embed_dim; else q_proj_weight [E, E], k_proj_weight [E, kdim], v_proj_weight
// [E, vdim]), in_proj_bias [3E], out_proj.weight / out_proj.bias (a Linear(E, E)). Init as PyTorch:
// xavier_uniform_ in-projection, zero biases, out_proj.weight Linear's default.
class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, MultiheadAttentionOptions options = {},
                     TensorOptions tensor_options = {});
  // (output, weights): output [L, N, E] ([N, L, E] batch_first; [L, E] unbatched); weights as
  // average_attn_weights says, undefined when need_weights is false.
  std::tuple<Tensor, Tensor> forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                     const MultiheadAttentionForwardOptions& options = {});
  // Self-attention, output only (need_weights = false): forward(x, x, x).
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "MultiheadAttention"; }
  void reset_parameters();

  int64_t embed_dim = 0;
  int64_t num_heads = 0;
  int64_t head_dim = 0;
  int64_t kdim = 0;
  int64_t vdim = 0;
  double dropout = 0.0;
  bool batch_first = false;
  Tensor in_proj_weight;  // undefined when kdim or vdim differs from embed_dim
  Tensor q_proj_weight, k_proj_weight, v_proj_weight;  // defined only then
  Tensor in_proj_bias;    // undefined without bias
  std::shared_ptr<Linear> out_proj;
};

}  // namespace tg::nn
