// GPT-2 as ordinary tg::nn modules, and what examples/gpt2.cpp needs around it: token data
// (nanoGPT / llm.c shards, or any text file through a byte-level tokenizer), Hugging Face
// weights (GPT2LMHeadModel's model.safetensors), nanoGPT's optimizer groups and learning-rate
// schedule, a training loop, and sampling. Header-only so that the example stays one program a
// user can copy; tests/nn/gpt2_test.cpp and benchmarks/bench_gpt2.cpp include it.
//
// state_dict names are GPT2LMHeadModel's (and nanoGPT's): transformer.wte.weight,
// transformer.wpe.weight, transformer.h.<i>.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc,
// mlp.c_proj}.{weight, bias}, transformer.ln_f.{weight, bias}, lm_head.weight (the same tensor as
// transformer.wte.weight). Linear weights are [out, in] here; Hugging Face's Conv1D stores them
// [in, out], so load_hf_weights transposes.
#pragma once
#include <tapegrad/tapegrad.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <numbers>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace gpt2 {

// ---------------------------------------------------------------------------------------------
// The model

struct Config {
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  int64_t block_size = 1024;  // the context: longest sequence, rows of wpe
  int64_t vocab_size = 50257;
  double dropout = 0.0;  // attention, residual and embedding dropout (GPT-2's pdrop; 0 as nanoGPT trains)

  void check() const {
    TG_CHECK(n_layer > 0 && n_head > 0 && n_embd > 0 && block_size > 0 && vocab_size > 0,
             "gpt2: layers, heads, width, context and vocab must be > 0, got ", n_layer, ", ", n_head, ", ", n_embd,
             ", ", block_size, ", ", vocab_size);
    TG_CHECK(n_embd % n_head == 0, "gpt2: the width ", n_embd, " is not a multiple of the heads ", n_head);
    TG_CHECK(dropout >= 0 && dropout < 1, "gpt2: dropout must be in [0, 1), got ", dropout);
  }
};

// Multi-head causal self-attention: one Linear for q, k, v (c_attn), one for the output (c_proj).
class CausalSelfAttention : public tg::nn::Module {
 public:
  explicit CausalSelfAttention(const Config& c) : n_head(c.n_head), dropout(c.dropout) {
    c_attn = register_module("c_attn", std::make_shared<tg::nn::Linear>(c.n_embd, 3 * c.n_embd));
    c_proj = register_module("c_proj", std::make_shared<tg::nn::Linear>(c.n_embd, c.n_embd));
  }
  tg::Tensor forward(const tg::Tensor& x) override {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), D = C / n_head;
    // q, k, v as views of c_attn's [B, T, 3C] output (split's backward writes their gradients into
    // one [B, T, 3C] tensor)
    const std::vector<tg::Tensor> qkv = (*c_attn)(x).split(C, 2);
    auto heads = [&](size_t i) { return qkv[i].reshape({B, T, n_head, D}).transpose(1, 2); };
    // [B, H, T, D]: cuDNN's fused flash attention on CUDA in bf16 / fp16, the math path otherwise.
    const tg::Tensor y = tg::nn::functional::scaled_dot_product_attention(
        heads(0), heads(1), heads(2), {.dropout_p = is_training() ? dropout : 0.0, .is_causal = true});
    const tg::Tensor out = (*c_proj)(y.transpose(1, 2).reshape({B, T, C}));
    return tg::nn::functional::dropout(out, dropout, is_training() && dropout > 0);
  }
  std::string name() const override { return "CausalSelfAttention"; }

  int64_t n_head;
  double dropout;
  std::shared_ptr<tg::nn::Linear> c_attn, c_proj;
};

// Linear(C, 4C) - GELU (tanh form, GPT-2's "gelu_new") - Linear(4C, C).
class MLP : public tg::nn::Module {
 public:
  explicit MLP(const Config& c) : dropout(c.dropout) {
    c_fc = register_module("c_fc", std::make_shared<tg::nn::Linear>(c.n_embd, 4 * c.n_embd));
    c_proj = register_module("c_proj", std::make_shared<tg::nn::Linear>(4 * c.n_embd, c.n_embd));
  }
  tg::Tensor forward(const tg::Tensor& x) override {
    const tg::Tensor y = (*c_proj)(tg::gelu((*c_fc)(x), "tanh"));
    return tg::nn::functional::dropout(y, dropout, is_training() && dropout > 0);
  }
  std::string name() const override { return "MLP"; }

  double dropout;
  std::shared_ptr<tg::nn::Linear> c_fc, c_proj;
};

// A pre-norm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(x)).
class Block : public tg::nn::Module {
 public:
  explicit Block(const Config& c) {
    ln_1 = register_module("ln_1", std::make_shared<tg::nn::LayerNorm>(c.n_embd));
    attn = register_module("attn", std::make_shared<CausalSelfAttention>(c));
    ln_2 = register_module("ln_2", std::make_shared<tg::nn::LayerNorm>(c.n_embd));
    mlp = register_module("mlp", std::make_shared<MLP>(c));
  }
  tg::Tensor forward(const tg::Tensor& x) override {
    const tg::Tensor h = x + (*attn)((*ln_1)(x));
    return h + (*mlp)((*ln_2)(h));
  }
  std::string name() const override { return "Block"; }

  std::shared_ptr<tg::nn::LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<MLP> mlp;
};

// Token ids [B, T] -> the final hidden states [B, T, C] (after ln_f).
class Transformer : public tg::nn::Module {
 public:
  explicit Transformer(const Config& c) : config(c) {
    wte = register_module("wte", std::make_shared<tg::nn::Embedding>(c.vocab_size, c.n_embd));
    wpe = register_module("wpe", std::make_shared<tg::nn::Embedding>(c.block_size, c.n_embd));
    h = register_module("h", std::make_shared<tg::nn::ModuleList>());
    for (int64_t i = 0; i < c.n_layer; ++i) h->push_back(std::make_shared<Block>(c));
    ln_f = register_module("ln_f", std::make_shared<tg::nn::LayerNorm>(c.n_embd));
  }
  tg::Tensor forward(const tg::Tensor& idx) override {
    TG_CHECK(idx.dim() == 2 && (idx.dtype() == tg::kInt64 || idx.dtype() == tg::kInt32),
             "GPT: token ids must be int64 or int32 [batch, sequence], got ", idx.dtype(), " ", idx.sizes());
    const int64_t T = idx.size(1);
    TG_CHECK(T >= 1 && T <= config.block_size, "GPT: a sequence of ", T, " tokens does not fit the context of ",
             config.block_size, " (--context)");
    const tg::Tensor pos = tg::arange(T, tg::TensorOptions().dtype(tg::kInt64).device(idx.device()));
    tg::Tensor x = (*wte)(idx) + (*wpe)(pos);
    x = tg::nn::functional::dropout(x, config.dropout, is_training() && config.dropout > 0);
    for (const auto& block : *h) x = (*block)(x);
    return (*ln_f)(x);
  }
  std::string name() const override { return "Transformer"; }

  Config config;
  std::shared_ptr<tg::nn::Embedding> wte, wpe;
  std::shared_ptr<tg::nn::ModuleList> h;
  std::shared_ptr<tg::nn::LayerNorm> ln_f;
};

// The output projection, its weight being the token embedding's (GPT-2 ties them). Registered
// under both names, as in PyTorch: state_dict() lists both, parameters() the tensor once.
class TiedHead : public tg::nn::Module {
 public:
  explicit TiedHead(const tg::Tensor& embedding) { weight = register_parameter("weight", embedding); }
  tg::Tensor forward(const tg::Tensor& x) override { return tg::linear(x, weight); }
  std::string name() const override { return "TiedHead"; }

  tg::Tensor weight;
};

// GPT2LMHeadModel: token ids [B, T] -> logits [B, T, vocab].
class GPT : public tg::nn::Module {
 public:
  explicit GPT(const Config& c) : config((c.check(), c)) {
    transformer = register_module("transformer", std::make_shared<Transformer>(c));
    lm_head = register_module("lm_head", std::make_shared<TiedHead>(transformer->wte->weight));
    init_weights();
  }
  tg::Tensor forward(const tg::Tensor& idx) override { return (*lm_head)((*transformer)(idx)); }
  std::string name() const override { return "GPT"; }

  // GPT-2's initialisation (as nanoGPT): weights N(0, 0.02), the residual projections (c_proj)
  // N(0, 0.02 / √(2 n_layer)), biases 0, LayerNorms 1 and 0.
  void init_weights() {
    namespace init = tg::nn::init;
    for (const auto& [name, p] : named_parameters()) {
      const bool residual = name.ends_with("c_proj.weight");
      if (name.ends_with("ln_1.weight") || name.ends_with("ln_2.weight") || name.ends_with("ln_f.weight"))
        init::ones_(p);
      else if (name.ends_with(".bias"))
        init::zeros_(p);
      else
        init::normal_(p, 0.0, residual ? 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer)) : 0.02);
    }
  }

  // Parameters without the position embedding (nanoGPT's count; wte counts once, as the head).
  int64_t num_params(bool non_embedding = true) const {
    int64_t n = 0;
    for (const auto& p : parameters()) n += p.numel();
    return non_embedding ? n - transformer->wpe->weight.numel() : n;
  }

  Config config;
  std::shared_ptr<Transformer> transformer;
  std::shared_ptr<TiedHead> lm_head;
};

// Mean cross-entropy of logits [B, T, V] against next-token ids [B, T].
inline tg::Tensor loss_fn(const tg::Tensor& logits, const tg::Tensor& targets) {
  const int64_t V = logits.size(-1);
  return tg::nn::functional::cross_entropy(logits.reshape({-1, V}), targets.reshape({-1}));
}

// Model FLOPs per token of a training step (nanoGPT's estimate: 6N + 12 L H Q T).
inline double flops_per_token(const GPT& m, int64_t T) {
  const Config& c = m.config;
  return 6.0 * static_cast<double>(m.num_params()) +
         12.0 * static_cast<double>(c.n_layer * c.n_head * (c.n_embd / c.n_head) * T);
}

// ---------------------------------------------------------------------------------------------
// Hugging Face weights

// The names GPT2LMHeadModel stores, in its order, with their shapes as stored (Conv1D weights
// [in, out]); `transposed` marks those.
struct HfTensor {
  std::string name;  // without the "transformer." prefix for the transformer's tensors
  tg::Shape shape;
  bool transposed = false;
};
inline std::vector<HfTensor> hf_tensors(const Config& c) {
  const int64_t C = c.n_embd;
  std::vector<HfTensor> v{{"wte.weight", {c.vocab_size, C}}, {"wpe.weight", {c.block_size, C}}};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    v.push_back({p + "ln_1.weight", {C}});
    v.push_back({p + "ln_1.bias", {C}});
    v.push_back({p + "attn.c_attn.weight", {C, 3 * C}, true});
    v.push_back({p + "attn.c_attn.bias", {3 * C}});
    v.push_back({p + "attn.c_proj.weight", {C, C}, true});
    v.push_back({p + "attn.c_proj.bias", {C}});
    v.push_back({p + "ln_2.weight", {C}});
    v.push_back({p + "ln_2.bias", {C}});
    v.push_back({p + "mlp.c_fc.weight", {C, 4 * C}, true});
    v.push_back({p + "mlp.c_fc.bias", {4 * C}});
    v.push_back({p + "mlp.c_proj.weight", {4 * C, C}, true});
    v.push_back({p + "mlp.c_proj.bias", {C}});
  }
  v.push_back({"ln_f.weight", {C}});
  v.push_back({"ln_f.bias", {C}});
  return v;
}

// Loads a GPT2LMHeadModel's model.safetensors (names with or without "transformer.", any float
// dtype) into `model`: every expected tensor must be there with its shape; the causal-mask
// buffers some files hold (h.<i>.attn.bias, h.<i>.attn.masked_bias) are skipped; lm_head.weight,
// when present, must equal wte.weight (an untied head is not GPT-2's architecture); any other
// tensor is unexpected. Every problem is listed in one tg::Error before anything is copied.
inline void load_hf_weights(GPT& model, const std::string& path) {
  const tg::StateDict file = tg::load(path);
  const Config& c = model.config;
  auto find = [&](const std::string& n) -> const tg::Tensor* {
    if (const tg::Tensor* t = file.find("transformer." + n)) return t;
    return file.find(n);
  };
  std::vector<std::string> problems;
  tg::StateDict ours;
  for (const HfTensor& e : hf_tensors(c)) {
    const tg::Tensor* t = find(e.name);
    if (t == nullptr) {
      problems.push_back("missing '" + e.name + "'");
      continue;
    }
    if (t->sizes() != e.shape || !tg::is_floating(t->dtype())) {
      std::ostringstream s;
      s << "'" << e.name << "' is " << t->dtype() << " " << t->sizes() << ", the model expects " << e.shape;
      problems.push_back(s.str());
      continue;
    }
    ours.insert("transformer." + e.name, e.transposed ? t->t().contiguous() : *t);
  }
  const int64_t n_expected = static_cast<int64_t>(hf_tensors(c).size());
  for (const auto& [name, t] : file) {
    std::string n = name.starts_with("transformer.") ? name.substr(12) : name;
    if (n == "lm_head.weight") {
      const tg::Tensor* wte = find("wte.weight");
      if (wte != nullptr && t.sizes() == wte->sizes() && t.dtype() == wte->dtype() &&
          (t != *wte).sum().item<int64_t>() == 0)
        continue;
      problems.push_back("'lm_head.weight' differs from 'wte.weight' (an untied output layer)");
      continue;
    }
    if (n.starts_with("h.") && (n.ends_with(".attn.bias") || n.ends_with(".attn.masked_bias"))) continue;
    bool known = false;
    for (const HfTensor& e : hf_tensors(c)) known = known || e.name == n;
    if (!known) problems.push_back("unexpected '" + name + "'");
    if (problems.size() > 12) break;
  }
  if (!problems.empty()) {
    std::ostringstream msg;
    msg << "gpt2: '" << path << "' is not a GPT-2 of this shape (--layers " << c.n_layer << " --width " << c.n_embd
        << " --context " << c.block_size << " --vocab " << c.vocab_size << ", " << n_expected << " tensors): ";
    for (size_t i = 0; i < problems.size() && i < 12; ++i) msg << (i ? "; " : "") << problems[i];
    if (problems.size() > 12) msg << "; ...";
    TG_ERROR(msg.str());
  }
  ours.insert("lm_head.weight", ours.at("transformer.wte.weight"));
  model.load_state_dict(ours);
}

// The model's weights in GPT2LMHeadModel's layout (Conv1D weights [in, out], "transformer."
// names, no lm_head.weight: tied), for tg::save -> transformers' from_pretrained.
inline tg::StateDict hf_state_dict(const GPT& model) {
  const tg::StateDict sd = model.state_dict();
  tg::StateDict out;
  for (const HfTensor& e : hf_tensors(model.config)) {
    const tg::Tensor& t = sd.at("transformer." + e.name);
    out.insert("transformer." + e.name, e.transposed ? t.t().contiguous() : t);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Token data

// The byte-level tokenizer: a token per byte (vocab 256).
inline std::vector<int64_t> encode_bytes(const std::string& text) {
  std::vector<int64_t> v;
  v.reserve(text.size());
  for (unsigned char ch : text) v.push_back(ch);
  return v;
}
inline std::string decode_bytes(const std::vector<int64_t>& tokens) {
  std::string s;
  s.reserve(tokens.size());
  for (int64_t t : tokens) {
    TG_CHECK(t >= 0 && t < 256, "gpt2: token ", t, " is not a byte (the byte tokenizer's vocab is 256)");
    s.push_back(static_cast<char>(static_cast<unsigned char>(t)));
  }
  return s;
}

inline constexpr int32_t kShardMagic = 20240520;  // llm.c / nanoGPT's fineweb shards: 256 int32 header
inline constexpr int64_t kShardHeaderBytes = 256 * 4;

// A read-only run of tokens: a memory-mapped shard (flat little-endian uint16, or llm.c's header
// then uint16 / uint32 tokens), or a text file's bytes. Copies share the mapping; slice() views.
class TokenData {
 public:
  enum class Format { Auto, Tokens, Text };

  // Opens `path`. Auto: ".bin" is a token shard, anything else text (a token per byte). A shard's
  // size is checked against its header (or for evenness) before anything is mapped, and every
  // token against `vocab_size`: tg::Error naming the file, the byte offset and the value.
  static TokenData open(const std::string& path, int64_t vocab_size, Format format = Format::Auto) {
    TokenData d;
    d.path_ = path;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    TG_CHECK(fd >= 0, "gpt2: cannot open '", path, "': ", std::strerror(errno));
    std::shared_ptr<void> close_fd(nullptr, [fd](void*) { ::close(fd); });
    struct stat st {};
    TG_CHECK(::fstat(fd, &st) == 0 && S_ISREG(st.st_mode), "gpt2: '", path, "' is not a regular file");
    const auto bytes = static_cast<int64_t>(st.st_size);
    if (format == Format::Auto) format = path.ends_with(".bin") ? Format::Tokens : Format::Text;
    int64_t offset = 0;
    if (format == Format::Text) {
      d.width_ = 1;
      d.count_ = bytes;
    } else {
      int32_t header[3] = {0, 0, 0};
      if (bytes >= kShardHeaderBytes) {
        TG_CHECK(::pread(fd, header, sizeof header, 0) == static_cast<ssize_t>(sizeof header), "gpt2: cannot read '",
                 path, "'");
      }
      if (bytes >= kShardHeaderBytes && header[0] == kShardMagic) {
        TG_CHECK(header[1] == 1 || header[1] == 2, "gpt2: '", path, "': shard version ", header[1],
                 " (1: uint16 tokens, 2: uint32 tokens are known)");
        d.width_ = header[1] == 1 ? 2 : 4;
        d.count_ = header[2];
        offset = kShardHeaderBytes;
        TG_CHECK(header[2] >= 0 && bytes == kShardHeaderBytes + d.count_ * d.width_, "gpt2: '", path,
                 "': the header says ", header[2], " tokens of ", d.width_, " bytes (", kShardHeaderBytes +
                 static_cast<int64_t>(header[2]) * d.width_, " bytes with the header), the file has ", bytes, " bytes");
      } else {
        TG_CHECK(bytes % 2 == 0, "gpt2: '", path, "' has ", bytes,
                 " bytes, not a whole number of uint16 tokens (a nanoGPT shard is flat little-endian uint16)");
        d.width_ = 2;
        d.count_ = bytes / 2;
      }
    }
    TG_CHECK(d.count_ > 0, "gpt2: '", path, "' holds no tokens");
    void* p = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_PRIVATE, fd, 0);
    TG_CHECK(p != MAP_FAILED, "gpt2: cannot map '", path, "': ", std::strerror(errno));
    d.map_ = std::shared_ptr<const uint8_t>(static_cast<const uint8_t*>(p),
                                            [bytes](const uint8_t* q) { ::munmap(const_cast<uint8_t*>(q), bytes); });
    d.base_ = d.map_.get() + offset;
    d.header_bytes_ = offset;
    d.check_vocab(vocab_size);
    return d;
  }

  // Tokens [start, end) of this run (no copy).
  TokenData slice(int64_t start, int64_t end) const {
    TG_CHECK(0 <= start && start <= end && end <= count_, "gpt2: slice [", start, ", ", end, ") of ", count_,
             " tokens");
    TokenData d = *this;
    d.base_ = base_ + start * width_;
    d.first_ += start;
    d.count_ = end - start;
    return d;
  }

  int64_t size() const { return count_; }
  const std::string& path() const { return path_; }
  int64_t operator[](int64_t i) const {
    const uint8_t* q = base_ + i * width_;
    if (width_ == 1) return q[0];
    if (width_ == 2) return static_cast<int64_t>(q[0]) | static_cast<int64_t>(q[1]) << 8;
    return static_cast<int64_t>(static_cast<uint32_t>(q[0]) | static_cast<uint32_t>(q[1]) << 8 |
                                static_cast<uint32_t>(q[2]) << 16 | static_cast<uint32_t>(q[3]) << 24);
  }

 private:
  // Every token below vocab_size, scanned on the CPU backend's threads; the error names the first.
  void check_vocab(int64_t vocab_size) const {
    std::atomic<int64_t> first_bad{count_};
    tg::parallel_for(0, count_, 1 << 20, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i)
        if ((*this)[i] >= vocab_size) {
          int64_t cur = first_bad.load();
          while (i < cur && !first_bad.compare_exchange_weak(cur, i)) {
          }
          return;
        }
    });
    const int64_t i = first_bad.load();
    if (i < count_)
      TG_ERROR("gpt2: '", path_, "': token ", (*this)[i], " at byte offset ", header_bytes_ + i * width_, " (token ",
               i, ") is not below the vocab size ", vocab_size, " (--vocab)");
  }

  std::string path_;
  std::shared_ptr<const uint8_t> map_;
  const uint8_t* base_ = nullptr;
  int64_t width_ = 2, count_ = 0, first_ = 0, header_bytes_ = 0;
};

// B rows of T + 1 consecutive tokens at random offsets (int64 [B, T + 1] on the CPU), drawn from
// (seed, stream, index) alone, so a resumed run draws the same batches.
inline tg::Tensor get_batch(const TokenData& d, int64_t B, int64_t T, uint64_t seed, uint64_t stream,
                            uint64_t index) {
  TG_CHECK(d.size() >= T + 1, "gpt2: '", d.path(), "' has ", d.size(), " tokens, a row of the batch needs ", T + 1,
           " (--seq + 1)");
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(stream),
                    static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32)};
  std::mt19937_64 rng(seq);
  std::uniform_int_distribution<int64_t> pick(0, d.size() - (T + 1));
  std::vector<int64_t> rows(static_cast<size_t>(B * (T + 1)));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t o = pick(rng);
    for (int64_t t = 0; t <= T; ++t) rows[static_cast<size_t>(b * (T + 1) + t)] = d[o + t];
  }
  return tg::tensor(rows, tg::Shape{B, T + 1});
}

// ---------------------------------------------------------------------------------------------
// Optimizer and schedule

// AdamW with weight decay on the 2-d (and larger) tensors only, as nanoGPT: the embeddings and the
// Linear weights decay; biases and LayerNorm weights do not. Fused multi-tensor steps on CUDA.
inline tg::optim::AdamW make_optimizer(const GPT& model, double lr, double weight_decay,
                                       std::pair<double, double> betas = {0.9, 0.95}, double eps = 1e-8) {
  std::vector<tg::Tensor> decay, no_decay;
  for (const auto& p : model.parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  const tg::optim::AdamWOptions o{.lr = lr, .betas = betas, .eps = eps, .weight_decay = weight_decay};
  tg::optim::AdamWOptions o0 = o;
  o0.weight_decay = 0.0;
  return tg::optim::AdamW({{decay, o}, {no_decay, o0}}, o);
}

// nanoGPT's get_lr: linear warmup over `warmup` steps, then cosine decay to min_lr at step
// `decay_steps`, min_lr after.
inline double lr_at(int64_t it, double lr, double min_lr, int64_t warmup, int64_t decay_steps) {
  if (it < warmup) return lr * static_cast<double>(it + 1) / static_cast<double>(warmup + 1);
  if (it > decay_steps) return min_lr;
  if (decay_steps <= warmup) return min_lr;
  const double ratio = static_cast<double>(it - warmup) / static_cast<double>(decay_steps - warmup);
  return min_lr + 0.5 * (1.0 + std::cos(std::numbers::pi * ratio)) * (lr - min_lr);
}

// ---------------------------------------------------------------------------------------------
// Sampling

// Continues `prompt` by `n` tokens: each from softmax(logits / temperature) over the top_k most
// likely tokens (top_k <= 0: all; temperature 0: the most likely), drawn with tg::rand (so
// tg::manual_seed fixes the text). No gradient; the model in eval mode for the call.
inline std::vector<int64_t> generate(GPT& model, std::vector<int64_t> prompt, int64_t n, double temperature,
                                     int64_t top_k, tg::Device device) {
  TG_CHECK(!prompt.empty(), "gpt2: generate needs at least one prompt token");
  TG_CHECK(temperature >= 0, "gpt2: temperature must be >= 0, got ", temperature);
  tg::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  const int64_t V = model.config.vocab_size;
  for (int64_t s = 0; s < n; ++s) {
    const int64_t len = std::min<int64_t>(static_cast<int64_t>(prompt.size()), model.config.block_size);
    const std::vector<int64_t> ctx(prompt.end() - len, prompt.end());
    const tg::Tensor idx = tg::tensor(ctx, tg::Shape{1, len}).to(device);
    std::vector<float> logits = model(idx).select(1, len - 1).reshape({V}).to(tg::kFloat32).to_vector<float>();
    int64_t next = 0;
    if (temperature == 0) {
      next = std::max_element(logits.begin(), logits.end()) - logits.begin();
    } else {
      float cut = -std::numeric_limits<float>::infinity();
      if (top_k > 0 && top_k < V) {
        std::vector<float> sorted = logits;
        std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<float>());
        cut = sorted[static_cast<size_t>(top_k - 1)];
      }
      const float mx = *std::max_element(logits.begin(), logits.end());
      std::vector<double> p(logits.size());
      double total = 0;
      for (size_t i = 0; i < logits.size(); ++i) {
        p[i] = logits[i] < cut ? 0.0 : std::exp((logits[i] - mx) / temperature);
        total += p[i];
      }
      double u = tg::rand({1}).item<double>() * total;
      next = V - 1;
      for (int64_t i = 0; i < V; ++i) {
        u -= p[static_cast<size_t>(i)];
        if (u < 0 && p[static_cast<size_t>(i)] > 0) {
          next = i;
          break;
        }
      }
    }
    prompt.push_back(next);
  }
  model.train(was_training);
  return prompt;
}

// ---------------------------------------------------------------------------------------------
// Training (examples/gpt2.cpp's flags map one to one onto these fields)

struct Options {
  Config model;
  std::string data;             // training tokens: a shard (.bin) or a text file (bytes)
  std::string val_data;         // validation tokens; empty: the last val_fraction of `data`
  std::string data_format = "auto";  // auto (.bin: tokens, else text), tokens, text
  double val_fraction = 0.1;
  int64_t batch = 8;            // rows per micro-batch
  int64_t seq = 256;            // tokens per row (<= model.block_size)
  int64_t accum = 1;            // micro-batches per optimizer step (gradient accumulation)
  int64_t steps = 100;          // optimizer steps (in total, counting those of a resumed run)
  double lr = 6e-4, min_lr = 6e-5;
  int64_t warmup = 10;          // linear warmup steps
  int64_t decay_steps = 0;      // cosine decay ends here (0: at `steps`)
  double weight_decay = 0.1;    // on 2-d tensors only
  std::pair<double, double> betas = {0.9, 0.95};
  double grad_clip = 1.0;       // clip_grad_norm_ (0: none)
  int64_t eval_interval = 50;   // validation loss every this many steps (0: at the end only)
  int64_t eval_iters = 10;      // batches per validation
  std::string precision = "auto";  // bf16 (autocast), fp32; auto: bf16 on CUDA, fp32 on the CPU
  std::string device = "cpu";
  uint64_t seed = 1337;
  std::string init_hf;          // start from a GPT2LMHeadModel model.safetensors
  std::string out;              // checkpoint written at each validation and at the end (empty: none)
  std::string resume;           // continue from a checkpoint written by `out`
  std::string metrics;          // tg::data::MetricsLog: a record per step and per validation
  int64_t sample_tokens = 200;  // text sampled at the end (0: none)
  double temperature = 0.8;
  int64_t top_k = 200;
  std::string prompt = "\n";    // the byte tokenizer's prompt (shards: <|endoftext|>)
  bool progress = true, quiet = false;
  // Parity mode (tests/parity/gpt2_parity.py): the batches (safetensors "tokens", int64 [steps, B, T + 1])
  // replace `data`, one optimizer step each; logits_out receives the logits and the loss of
  // batch 0 before the first step ("logits", "loss").
  std::string batches;
  std::string logits_out;
};

struct Result {
  std::vector<double> step_losses;                    // every step's training loss
  std::vector<std::pair<int64_t, double>> val_losses;  // (step, validation loss)
  double tokens_per_s = 0;
  std::string sample;                                 // the sampled text (shards: token ids)
  int64_t final_step = 0;
};

inline bool use_bf16(const Options& o) {
  return o.precision == "bf16" || (o.precision == "auto" && o.device == "cuda");
}

// The checkpoint's record of the architecture, checked on resume.
inline std::vector<std::pair<std::string, int64_t>> config_entries(const Config& c) {
  return {{"n_layer", c.n_layer}, {"n_head", c.n_head}, {"n_embd", c.n_embd}, {"block_size", c.block_size},
          {"vocab_size", c.vocab_size}};
}

// Trains as `o` says; `log` receives the report lines (stdout in the example).
inline Result train(Options o, const std::function<void(const std::string&)>& log = {}) {
  o.model.check();
  TG_CHECK(o.device == "cpu" || o.device == "cuda", "gpt2: --device must be cpu or cuda, got '", o.device, "'");
  TG_CHECK(o.device == "cpu" || tg::cuda::is_available(), "gpt2: --device cuda but no CUDA device is available");
  TG_CHECK(o.precision == "auto" || o.precision == "bf16" || o.precision == "fp32",
           "gpt2: --precision must be bf16, fp32 or auto, got '", o.precision, "'");
  TG_CHECK(o.batch > 0 && o.seq > 0 && o.accum > 0 && o.steps >= 0 && o.lr > 0 && o.min_lr >= 0 && o.warmup >= 0,
           "gpt2: batch, seq, accum and lr must be > 0, steps, warmup and min_lr >= 0");
  TG_CHECK(!o.data.empty() != !o.batches.empty(), "gpt2: give training data or parity batches (one of them)");
  const tg::Device dev = o.device == "cuda" ? tg::Device(tg::kCUDA) : tg::Device(tg::kCPU);
  const bool bf16 = use_bf16(o);
  auto say = [&](const std::string& s) {
    if (log && !o.quiet) log(s);
  };
  char buf[512];
  Result r;

  // ---- data
  std::optional<TokenData> train_data, val_data;
  tg::Tensor parity_batches;
  const TokenData::Format fmt = o.data_format == "tokens" ? TokenData::Format::Tokens
                                : o.data_format == "text" ? TokenData::Format::Text
                                                          : TokenData::Format::Auto;
  TG_CHECK(o.data_format == "auto" || o.data_format == "tokens" || o.data_format == "text",
           "gpt2: --data-format must be auto, tokens or text, got '", o.data_format, "'");
  const bool bytes = !o.data.empty() && (fmt == TokenData::Format::Text ||
                                          (fmt == TokenData::Format::Auto && !o.data.ends_with(".bin")));
  if (!o.data.empty()) {
    TokenData all = TokenData::open(o.data, o.model.vocab_size, fmt);
    if (!o.val_data.empty()) {
      train_data = all;
      val_data = TokenData::open(o.val_data, o.model.vocab_size, fmt);
    } else {
      TG_CHECK(o.val_fraction > 0 && o.val_fraction < 1, "gpt2: --val-fraction must be in (0, 1), got ",
               o.val_fraction);
      const auto n_val = static_cast<int64_t>(static_cast<double>(all.size()) * o.val_fraction);
      train_data = all.slice(0, all.size() - n_val);
      val_data = all.slice(all.size() - n_val, all.size());
    }
    TG_CHECK(o.seq <= o.model.block_size, "gpt2: --seq ", o.seq, " is longer than the context ", o.model.block_size,
             " (--context)");
    for (const TokenData* d : {&*train_data, &*val_data})
      TG_CHECK(d->size() >= o.seq + 1, "gpt2: '", d->path(), "' leaves ", d->size(), " ",
               d == &*train_data ? "training" : "validation", " tokens, fewer than a row of --seq ", o.seq, " + 1");
  } else {
    parity_batches = tg::load(o.batches).at("tokens");
    TG_CHECK(parity_batches.dim() == 3 && parity_batches.dtype() == tg::kInt64 && parity_batches.size(2) >= 2,
             "gpt2: '", o.batches, "': 'tokens' must be int64 [steps, batch, T + 1], got ", parity_batches.dtype(), " ",
             parity_batches.sizes());
    TG_CHECK(parity_batches.min().item<int64_t>() >= 0 && parity_batches.max().item<int64_t>() < o.model.vocab_size,
             "gpt2: '", o.batches, "': token ids outside [0, ", o.model.vocab_size, ")");
    o.steps = parity_batches.size(0);
    o.batch = parity_batches.size(1);
    o.seq = parity_batches.size(2) - 1;
    o.accum = 1;
  }
  if (o.decay_steps <= 0) o.decay_steps = o.steps;

  // ---- model, optimizer, schedule
  tg::manual_seed(o.seed);
  GPT model(o.model);
  if (!o.init_hf.empty()) load_hf_weights(model, o.init_hf);
  model.to(dev);
  tg::optim::AdamW opt = make_optimizer(model, o.lr, o.weight_decay, o.betas);
  const double lr0 = o.lr, min_lr = o.min_lr;
  const int64_t warmup = o.warmup, decay = o.decay_steps;
  tg::optim::lr_scheduler::LambdaLR sched(
      opt, [=](int64_t it) { return lr_at(it, lr0, min_lr, warmup, decay) / lr0; });
  int64_t step = 0;
  if (!o.resume.empty()) {
    const tg::Checkpoint ck = tg::load_checkpoint(o.resume);
    for (const auto& [k, v] : config_entries(o.model)) {
      TG_CHECK(ck.contains(k), "gpt2: '", o.resume, "' is not a gpt2 checkpoint (no '", k, "')");
      TG_CHECK(ck.item<int64_t>(k) == v, "gpt2: '", o.resume, "' holds a model with ", k, " = ",
               ck.item<int64_t>(k), ", this run's is ", v);
    }
    ck.load_into("model", model);
    ck.load_into("optimizer", opt);
    ck.load_into("scheduler", sched);
    tg::load_rng_state_dict(ck.at("rng"));
    step = ck.item<int64_t>("step");
    std::snprintf(buf, sizeof buf, "resumed from %s at step %lld", o.resume.c_str(), static_cast<long long>(step));
    say(buf);
  }
  std::snprintf(buf, sizeof buf,
                "gpt2: %lld layers, %lld heads, width %lld, context %lld, vocab %lld: %.2fM parameters; "
                "%lld x %lld tokens x %lld accum per step, %s, %s",
                static_cast<long long>(o.model.n_layer), static_cast<long long>(o.model.n_head),
                static_cast<long long>(o.model.n_embd), static_cast<long long>(o.model.block_size),
                static_cast<long long>(o.model.vocab_size), static_cast<double>(model.num_params()) / 1e6,
                static_cast<long long>(o.batch), static_cast<long long>(o.seq), static_cast<long long>(o.accum),
                bf16 ? "bf16 autocast" : "fp32", dev.str().c_str());
  say(buf);

  auto to_xy = [&](const tg::Tensor& rows) {
    const int64_t T = rows.size(1) - 1;
    return std::pair{rows.slice(1, 0, T).contiguous().to(dev), rows.slice(1, 1, T + 1).contiguous().to(dev)};
  };
  auto forward_loss = [&](const tg::Tensor& x, const tg::Tensor& y) {
    tg::amp::autocast guard(dev.type(), tg::kBFloat16, bf16);
    tg::Tensor logits = model(x);
    return std::pair{logits, loss_fn(logits, y)};
  };
  auto evaluate = [&] {
    tg::NoGradGuard no_grad;
    model.eval();
    tg::Tensor total = tg::zeros({}, dev);
    for (int64_t i = 0; i < o.eval_iters; ++i) {
      auto [x, y] = to_xy(get_batch(*val_data, o.batch, o.seq, o.seed, 1, static_cast<uint64_t>(i)));
      total.add_(forward_loss(x, y).second.to(tg::kFloat32));
    }
    model.train();
    return total.item<double>() / static_cast<double>(o.eval_iters);
  };
  std::optional<tg::data::MetricsLog> metrics;
  if (!o.metrics.empty()) metrics.emplace(o.metrics);
  auto checkpoint = [&] {
    if (o.out.empty()) return;
    std::vector<tg::CheckpointEntry> e{{"model", model}, {"optimizer", opt}, {"scheduler", sched},
                                       {"rng", tg::rng_state_dict()}, {"step", step}};
    for (const auto& [k, v] : config_entries(o.model)) e.emplace_back(k, v);
    tg::save_checkpoint(o.out, e);
  };
  auto validate = [&] {
    if (!val_data) return;
    const double v = evaluate();
    r.val_losses.emplace_back(step, v);
    if (metrics) metrics->log(step, 0, {{"val_loss", v}});
    std::snprintf(buf, sizeof buf, "step %lld val_loss %.4f", static_cast<long long>(step), v);
    say(buf);
    checkpoint();
  };

  if (!o.logits_out.empty()) {
    TG_CHECK(parity_batches.defined(), "gpt2: --logits-out needs --batches");
    tg::NoGradGuard no_grad;
    model.eval();
    auto [x, y] = to_xy(parity_batches.select(0, 0));
    auto [logits, loss] = forward_loss(x, y);
    tg::StateDict out;
    out.insert("logits", logits.to(tg::kFloat32).cpu());
    out.insert("loss", loss.to(tg::kFloat32).cpu());
    tg::save(out, o.logits_out);
    model.train();
  }

  // ---- training
  const std::vector<tg::Tensor> params = model.parameters();
  const int64_t tokens_per_step = o.batch * o.seq * o.accum;
  const bool show = o.progress && !o.quiet && !parity_batches.defined();
  std::ostringstream sink;
  tg::data::ProgressBar bar(std::max<int64_t>(o.steps - step, 0),
                            {.out = show ? nullptr : &sink, .batch_size = tokens_per_step, .sample_unit = "tok"});
  bar.start_epoch(0);
  while (step < o.steps) {
    opt.zero_grad();
    tg::Tensor total;
    for (int64_t m = 0; m < o.accum; ++m) {
      const tg::Tensor rows =
          parity_batches.defined()
              ? parity_batches.select(0, step)
              : get_batch(*train_data, o.batch, o.seq, o.seed, 0, static_cast<uint64_t>(step * o.accum + m));
      auto [x, y] = to_xy(rows);
      tg::Tensor loss = forward_loss(x, y).second;
      if (o.accum > 1) loss = loss / static_cast<double>(o.accum);
      loss.backward();
      total = total.defined() ? total + loss.detach() : loss.detach();
    }
    tg::Tensor norm;
    if (o.grad_clip > 0) norm = tg::nn::utils::clip_grad_norm_(params, o.grad_clip);
    const double lr = opt.lr(0);
    opt.step();
    sched.step();
    const double l = total.item<double>();
    r.step_losses.push_back(l);
    bar.update(l, 1, tokens_per_step);
    if (metrics) {
      std::vector<std::pair<std::string, double>> rec{{"train_loss", l}, {"lr", lr}, {"tokens_per_s", bar.samples_rate()}};
      if (norm.defined()) rec.emplace_back("grad_norm", norm.item<double>());
      metrics->log(step + 1, 0, rec);
    }
    if (parity_batches.defined()) {
      std::snprintf(buf, sizeof buf, "step %lld loss %.9g", static_cast<long long>(step), l);
      say(buf);
    }
    ++step;
    if (o.eval_interval > 0 && step % o.eval_interval == 0 && step < o.steps) validate();
  }
  r.tokens_per_s = bar.samples_rate();
  if (show) bar.finish();
  r.final_step = step;
  if (!r.step_losses.empty()) {
    std::snprintf(buf, sizeof buf, "trained %lld steps, last loss %.4f, %.0f tokens/s",
                  static_cast<long long>(r.step_losses.size()), r.step_losses.back(), r.tokens_per_s);
    say(buf);
  }
  validate();
  if (val_data == std::nullopt) checkpoint();

  // ---- sampling
  if (o.sample_tokens > 0 && train_data) {
    tg::manual_seed(o.seed + 1);
    std::vector<int64_t> prompt = bytes ? encode_bytes(o.prompt)
                                        : std::vector<int64_t>{o.model.vocab_size > 50256 ? 50256 : 0};
    TG_CHECK(!prompt.empty(), "gpt2: the prompt is empty");
    for (int64_t t : prompt)
      TG_CHECK(t < o.model.vocab_size, "gpt2: prompt token ", t, " is not below the vocab ", o.model.vocab_size);
    const std::vector<int64_t> out = generate(model, prompt, o.sample_tokens, o.temperature, o.top_k, dev);
    const std::vector<int64_t> fresh(out.begin() + static_cast<std::ptrdiff_t>(prompt.size()), out.end());
    if (bytes) {
      std::vector<int64_t> printable;
      for (int64_t t : out) printable.push_back(t < 256 ? t : '?');
      r.sample = decode_bytes(printable);
    } else {
      std::ostringstream s;
      for (size_t i = 0; i < fresh.size(); ++i) s << (i ? " " : "") << fresh[i];
      r.sample = s.str();
    }
    say("---- sample (" + std::to_string(o.sample_tokens) + " tokens, temperature " + std::to_string(o.temperature) +
        ", top-k " + std::to_string(o.top_k) + ")\n" + r.sample);
  }
  return r;
}

}  // namespace gpt2
