// The one list of public ops that can appear in a traced graph (export/) and
// their autocast category (amp/). Everything that enumerates ops (tg::OpKind,
// op names, the exporter's schemas and ONNX lowering, the autocast policy) is
// generated from or checked against TG_FORALL_OPS, so the lists cannot drift.
#pragma once
#include <cstdint>
#include <string_view>

namespace tg {

// How autocast treats an op: `Lower` runs in the autocast dtype (matmul-like),
// `Fp32` runs in float32 (numerically sensitive), `Promote` casts its inputs to
// their widest floating dtype (multi-input ops), `None` leaves it alone.
enum class AutocastCategory : uint8_t { None, Lower, Fp32, Promote };

// _(Enum name, "serialized name", autocast category)
#define TG_FORALL_OPS(_)                    \
  /* elementwise, tensor operands */        \
  _(Add, "add", Promote)                    \
  _(Sub, "sub", Promote)                    \
  _(Mul, "mul", Promote)                    \
  _(Div, "div", Promote)                    \
  _(Pow, "pow", Fp32)                       \
  _(Maximum, "maximum", Promote)            \
  _(Minimum, "minimum", Promote)            \
  _(Where, "where", Promote)                \
  _(Eq, "eq", Promote)                      \
  _(Ne, "ne", Promote)                      \
  _(Lt, "lt", Promote)                      \
  _(Le, "le", Promote)                      \
  _(Gt, "gt", Promote)                      \
  _(Ge, "ge", Promote)                      \
  /* elementwise, one tensor and a scalar */ \
  _(AddScalar, "add_scalar", None)          \
  _(SubScalar, "sub_scalar", None)          \
  _(RSubScalar, "rsub_scalar", None)        \
  _(MulScalar, "mul_scalar", None)          \
  _(DivScalar, "div_scalar", None)          \
  _(RDivScalar, "rdiv_scalar", None)        \
  _(PowScalar, "pow_scalar", Fp32)          \
  _(EqScalar, "eq_scalar", None)            \
  _(NeScalar, "ne_scalar", None)            \
  _(LtScalar, "lt_scalar", None)            \
  _(LeScalar, "le_scalar", None)            \
  _(GtScalar, "gt_scalar", None)            \
  _(GeScalar, "ge_scalar", None)            \
  _(Clamp, "clamp", None)                   \
  /* elementwise, unary */                  \
  _(Neg, "neg", None)                       \
  _(Exp, "exp", Fp32)                       \
  _(Log, "log", Fp32)                       \
  _(Sqrt, "sqrt", Fp32)                     \
  _(Abs, "abs", None)                       \
  _(Relu, "relu", None)                     \
  _(Sigmoid, "sigmoid", None)               \
  _(Tanh, "tanh", None)                     \
  _(Gelu, "gelu", None)                     \
  /* reductions */                          \
  _(Sum, "sum", Fp32)                       \
  _(Mean, "mean", Fp32)                     \
  _(Var, "var", Fp32)                       \
  _(Std, "std", Fp32)                       \
  _(Amax, "amax", None)                     \
  _(Amin, "amin", None)                     \
  _(Argmax, "argmax", None)                 \
  /* linear algebra */                      \
  _(Matmul, "matmul", Lower)                \
  _(Linear, "linear", Lower)                \
  /* losses */                              \
  _(MseLoss, "mse_loss", Fp32) /* reduction: 0 none, 1 mean, 2 sum */ \
  /* views, gathers, copies */              \
  _(Transpose, "transpose", None)           \
  _(Permute, "permute", None)               \
  _(View, "view", None)                     \
  _(Reshape, "reshape", None)               \
  _(Expand, "expand", None)                 \
  _(Unsqueeze, "unsqueeze", None)           \
  _(Squeeze, "squeeze", None)               \
  _(Slice, "slice", None)                   \
  _(Select, "select", None)                 \
  _(IndexSelect, "index_select", None)      \
  _(Cat, "cat", Promote)                    \
  _(To, "to", None)                         \
  _(Contiguous, "contiguous", None)         \
  _(Clone, "clone", None)                   \
  _(Alias, "alias", None) /* detach(), t() of a vector: same values */ \
  /* ---- issue 15: softmax and classification losses */ \
  _(Softmax, "softmax", Fp32)            /* dim */ \
  _(LogSoftmax, "log_softmax", Fp32)     /* dim */ \
  _(LogSumExp, "logsumexp", Fp32)        /* dims, keepdim */ \
  _(CrossEntropy, "cross_entropy", Fp32) /* reduction, ignore_index, label_smoothing; inputs: logits, target[, weight] */ \
  _(NllLoss, "nll_loss", Fp32)           /* reduction, ignore_index; inputs: log_probs, target[, weight] */ \
  _(BceWithLogits, "binary_cross_entropy_with_logits", Fp32) /* reduction, has_weight, has_pos_weight */ \
  /* ---- issue 15: normalization, embedding, dropout */ \
  _(LayerNorm, "layer_norm", Fp32) /* x, [weight, [bias]]; normalized_shape, eps */ \
  _(RmsNorm, "rms_norm", Fp32)     /* x, [weight]; normalized_shape, eps */ \
  _(Embedding, "embedding", None)  /* index, weight */ \
  _(Dropout, "dropout", None)      /* x; p (traced only in training mode) */ \
  /* ---- issue 15: general ops */         \
  _(Sin, "sin", None)                       \
  _(Cos, "cos", None)                       \
  _(Rsqrt, "rsqrt", Fp32)                   \
  _(Silu, "silu", None)                     \
  _(GeluTanh, "gelu_tanh", None)           \
  _(Softplus, "softplus", Fp32)             \
  _(LeakyRelu, "leaky_relu", None)          \
  _(Elu, "elu", None)                       \
  _(MaskedFill, "masked_fill", None)        \
  _(Tril, "tril", None)                     \
  _(Triu, "triu", None)                     \
  _(OneHot, "one_hot", None)                \
  _(Stack, "stack", Promote)                \
  _(Gather, "gather", None)                 \
  _(Scatter, "scatter", Promote)            \
  _(ScatterValue, "scatter_value", None)    \
  _(ScatterAdd, "scatter_add", Promote)     \
  _(IndexAdd, "index_add", Promote)         \
  _(Cumsum, "cumsum", Fp32)                 \
  _(Sort, "sort", None) /* the values */    \
  _(Argsort, "argsort", None) /* sort's indices */ \
  _(Topk, "topk", None) /* the values */    \
  _(TopkIndices, "topk_indices", None) \
  /* ---- issue 17: pooling */ \
  _(MaxPool2d, "max_pool2d", None) /* x; kernel_size, stride, padding, dilation, ceil_mode */ \
  _(MaxPool2dIndices, "max_pool2d_indices", None) /* max_pool2d_with_indices' indices: as max_pool2d */ \
  _(AvgPool2d, "avg_pool2d", None) /* x; kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override (0: none) */ \
  _(AdaptiveAvgPool2d, "adaptive_avg_pool2d", None) /* x; output_size */ \
  /* ---- issue 17: convolution; x, weight[, bias]; stride, padding, dilation (one per spatial dim), groups, same */ \
  _(Conv1d, "conv1d", Lower)                \
  _(Conv2d, "conv2d", Lower)                \
  /* ---- issue 17: conv_transpose (as conv, plus output_padding), interpolate, batch_norm, group_norm */ \
  _(ConvTranspose1d, "conv_transpose1d", Lower) /* x, weight[, bias]; stride, padding, output_padding, dilation, groups */ \
  _(ConvTranspose2d, "conv_transpose2d", Lower) \
  _(Interpolate, "interpolate", None) /* x; size, mode (0 nearest, 1 linear), align_corners, scale_h, scale_w (0: none) */ \
  _(BatchNorm, "batch_norm", None)    /* training mode (batch statistics); x[, weight[, bias]]; eps. Input dtype out, float32 statistics */ \
  _(GroupNorm, "group_norm", Fp32)    /* x[, weight[, bias]]; num_groups, eps */

enum class OpKind : uint16_t {
#define TG_OP_ENUM(name, str, cat) name,
  TG_FORALL_OPS(TG_OP_ENUM)
#undef TG_OP_ENUM
};

inline constexpr int kNumOps = 0
#define TG_OP_COUNT(name, str, cat) +1
    TG_FORALL_OPS(TG_OP_COUNT)
#undef TG_OP_COUNT
    ;

constexpr const char* op_name(OpKind op) {
  switch (op) {
#define TG_OP_NAME(name, str, cat) \
  case OpKind::name: return str;
    TG_FORALL_OPS(TG_OP_NAME)
#undef TG_OP_NAME
  }
  return "?";
}

constexpr AutocastCategory autocast_category(OpKind op) {
  switch (op) {
#define TG_OP_CAT(name, str, cat) \
  case OpKind::name: return AutocastCategory::cat;
    TG_FORALL_OPS(TG_OP_CAT)
#undef TG_OP_CAT
  }
  return AutocastCategory::None;
}

// The op with serialized name `name`; false when there is none (e.g. a file from a newer version).
constexpr bool op_from_name(std::string_view name, OpKind& out) {
#define TG_OP_LOOKUP(n, str, cat) \
  if (name == str) {              \
    out = OpKind::n;              \
    return true;                  \
  }
  TG_FORALL_OPS(TG_OP_LOOKUP)
#undef TG_OP_LOOKUP
  return false;
}

}  // namespace tg
