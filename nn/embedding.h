// Embeddings: functional::embedding (a row gather whose backward sums rows per index, in a fixed
// order by default: see tg::use_deterministic_algorithms) and the module nn::Embedding.
#pragma once
#include <optional>

#include <tapegrad/nn/module.h>

namespace tg::nn {

struct EmbeddingOptions {
  // Rows at this index get no gradient (negative counts from the end, as PyTorch).
  std::optional<int64_t> padding_idx = std::nullopt;
};

namespace functional {
// weight[index]: shape index.shape + [embedding_dim]. index int64 / int32 of any shape, every
// value in [0, num_embeddings) (else a tg::Error). Differentiable in weight.
Tensor embedding(const Tensor& index, const Tensor& weight, EmbeddingOptions options = {});
}  // namespace functional

// weight [num_embeddings, embedding_dim] drawn from N(0, 1), the padding row zeroed;
// state_dict name "weight".
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, EmbeddingOptions options = {},
            TensorOptions tensor_options = {});
  Tensor forward(const Tensor& index) override;
  std::string name() const override { return "Embedding"; }
  void reset_parameters();

  int64_t num_embeddings = 0;
  int64_t embedding_dim = 0;
  EmbeddingOptions options;  // padding_idx stored wrapped to [0, num_embeddings)
  Tensor weight;
};

}  // namespace tg::nn
