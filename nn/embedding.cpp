// embedding with its backward right below, and nn::Embedding.
#include <tapegrad/nn/embedding.h>

#include <vector>

#include <tapegrad/autograd/function.h>
#include <tapegrad/core/native.h>
#include <tapegrad/core/trace.h>
#include <tapegrad/nn/init.h>

namespace tg::nn {

namespace {
int64_t wrap_padding(std::optional<int64_t> p, int64_t num, const char* op) {
  if (!p) return -1;
  TG_CHECK(*p >= -num && *p < num, op, ": padding_idx ", *p, " out of range for ", num, " embeddings");
  return *p < 0 ? *p + num : *p;
}
// The weight's gradient, rows of g summed at index (none at the padding row): linear in g; under
// create_graph recorded with its adjoint, g's rows read back at index (0 where index is the padding).
Tensor embedding_grad(const Tensor& g, const Tensor& index, int64_t num, int64_t pad) {
  return autograd::bw::linear_map(
      "embedding_backward", g, [&](const Tensor& gs) { return native::embedding_backward(gs, index, num, pad); },
      [index, pad](const Tensor& gg) {
        Tensor rows = functional::embedding(index, gg);
        if (pad < 0) return rows;
        return where(index.ne(Scalar(pad)).unsqueeze(-1), rows, zeros({}, TensorOptions().dtype(rows.dtype()).device(rows.device())));
      });
}
}  // namespace

namespace functional {
Tensor embedding(const Tensor& index, const Tensor& weight, EmbeddingOptions options) {
  Tensor out = native::embedding(index, weight);
  const int64_t num = weight.sizes()[0];
  const int64_t pad = wrap_padding(options.padding_idx, num, "embedding");
  TG_TRACE(Embedding, out, {index, weight}, {});
  if (!autograd::should_record(weight)) return out;
  autograd::SavedTensor si(index, "embedding");
  return autograd::record("embedding", {index, weight}, std::move(out),
                          [si, num, pad](const Tensor& g, const autograd::FunctionNode& n) -> std::vector<Tensor> {
                            if (!n.needs_input_grad(1)) return {Tensor(), Tensor()};
                            return {Tensor(), embedding_grad(g, si.unpack(), num, pad)};
                          },
                          autograd::kDifferentiable);
}
}  // namespace functional

Embedding::Embedding(int64_t num, int64_t dim, EmbeddingOptions opts, TensorOptions tensor_options)
    : num_embeddings(num), embedding_dim(dim), options(opts) {
  TG_CHECK(num >= 0 && dim >= 0, "Embedding: num_embeddings and embedding_dim must be non-negative, got ", num, " and ",
           dim);
  TG_CHECK(is_floating(tensor_options.dtype()), "Embedding: the weight must be floating point, got ",
           tensor_options.dtype());
  if (options.padding_idx) options.padding_idx = wrap_padding(options.padding_idx, num, "Embedding");
  const TensorOptions to = TensorOptions().dtype(tensor_options.dtype()).device(tensor_options.device());
  weight = register_parameter("weight", empty({num, dim}, to));
  reset_parameters();
}

void Embedding::reset_parameters() {
  init::normal_(weight);
  if (options.padding_idx) {
    NoGradGuard no_grad;
    weight.select(0, *options.padding_idx).fill_(0);
  }
}

Tensor Embedding::forward(const Tensor& index) { return functional::embedding(index, weight, options); }

}  // namespace tg::nn
