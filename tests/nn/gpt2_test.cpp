// The GPT-2 example's model and data code (examples/gpt2.h): the forward pass against a float64
// reference written here from the state_dict, GPT2LMHeadModel's names and weight tying, the loss
// at initialisation (ln vocab), training on a repeated batch, the byte tokenizer, shard reading and
// validation (flat uint16, llm.c's header), Hugging Face weights (names, Conv1D layout, errors),
// the schedule and optimizer groups, and checkpoint resume giving the same losses as a straight run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "../../examples/gpt2.h"
#include "../autograd/common.h"
#include "../common/error_of.h"

namespace {

using tg::Tensor;
using tg::testing::Dev;
using tg::testing::error_of;
using tg::testing::host;
namespace fs = std::filesystem;

gpt2::Config tiny(int64_t vocab = 61) {
  return {.n_layer = 2, .n_head = 2, .n_embd = 16, .block_size = 12, .vocab_size = vocab};
}

class Gpt2Test : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tg_gpt2_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& n) const { return (dir_ / n).string(); }
  void write(const std::string& p, const void* data, size_t n) const {
    std::ofstream f(p, std::ios::binary);
    f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  }
  fs::path dir_;
};

class Gpt2DevTest : public ::testing::TestWithParam<Dev> {};

// ---- a float64 reference of GPT-2's forward, from the state_dict alone
std::vector<double> reference_logits(const gpt2::GPT& m, const std::vector<int64_t>& idx, int64_t B, int64_t T) {
  const gpt2::Config& c = m.config;
  const int64_t C = c.n_embd, H = c.n_head, D = C / H, V = c.vocab_size;
  const tg::StateDict sd = m.state_dict();
  auto w = [&](const std::string& n) { return host(sd.at(n)); };
  auto layer_norm = [&](const std::vector<double>& x, const std::vector<double>& g, const std::vector<double>& b) {
    std::vector<double> y(x.size());
    for (int64_t t = 0; t < T; ++t) {
      double mu = 0, var = 0;
      for (int64_t i = 0; i < C; ++i) mu += x[t * C + i];
      mu /= C;
      for (int64_t i = 0; i < C; ++i) var += (x[t * C + i] - mu) * (x[t * C + i] - mu);
      var /= C;
      for (int64_t i = 0; i < C; ++i) y[t * C + i] = (x[t * C + i] - mu) / std::sqrt(var + 1e-5) * g[i] + b[i];
    }
    return y;
  };
  // y[t, o] = sum_i x[t, i] W[o, i] + b[o]
  auto linear = [&](const std::vector<double>& x, int64_t in, const std::vector<double>& W,
                    const std::vector<double>& b, int64_t out) {
    std::vector<double> y(static_cast<size_t>(T * out));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < out; ++o) {
        double s = b.empty() ? 0.0 : b[o];
        for (int64_t i = 0; i < in; ++i) s += x[t * in + i] * W[o * in + i];
        y[t * out + o] = s;
      }
    return y;
  };
  const std::vector<double> wte = w("transformer.wte.weight"), wpe = w("transformer.wpe.weight");
  std::vector<double> logits;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<double> x(static_cast<size_t>(T * C));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < C; ++i) x[t * C + i] = wte[idx[b * T + t] * C + i] + wpe[t * C + i];
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const std::string p = "transformer.h." + std::to_string(l) + ".";
      const auto h1 = layer_norm(x, w(p + "ln_1.weight"), w(p + "ln_1.bias"));
      const auto qkv = linear(h1, C, w(p + "attn.c_attn.weight"), w(p + "attn.c_attn.bias"), 3 * C);
      std::vector<double> y(static_cast<size_t>(T * C), 0.0);
      for (int64_t hd = 0; hd < H; ++hd)
        for (int64_t t = 0; t < T; ++t) {
          std::vector<double> a(static_cast<size_t>(t + 1));
          double mx = -1e300, z = 0;
          for (int64_t s = 0; s <= t; ++s) {
            double dot = 0;
            for (int64_t d = 0; d < D; ++d) dot += qkv[t * 3 * C + hd * D + d] * qkv[s * 3 * C + C + hd * D + d];
            a[s] = dot / std::sqrt(static_cast<double>(D));
            mx = std::max(mx, a[s]);
          }
          for (int64_t s = 0; s <= t; ++s) z += a[s] = std::exp(a[s] - mx);
          for (int64_t s = 0; s <= t; ++s)
            for (int64_t d = 0; d < D; ++d) y[t * C + hd * D + d] += a[s] / z * qkv[s * 3 * C + 2 * C + hd * D + d];
        }
      const auto o = linear(y, C, w(p + "attn.c_proj.weight"), w(p + "attn.c_proj.bias"), C);
      for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
      const auto h2 = layer_norm(x, w(p + "ln_2.weight"), w(p + "ln_2.bias"));
      auto f = linear(h2, C, w(p + "mlp.c_fc.weight"), w(p + "mlp.c_fc.bias"), 4 * C);
      for (double& v : f)
        v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (v + 0.044715 * v * v * v)));
      const auto o2 = linear(f, 4 * C, w(p + "mlp.c_proj.weight"), w(p + "mlp.c_proj.bias"), C);
      for (size_t i = 0; i < x.size(); ++i) x[i] += o2[i];
    }
    const auto xf = layer_norm(x, w("transformer.ln_f.weight"), w("transformer.ln_f.bias"));
    const auto lg = linear(xf, C, wte, {}, V);
    logits.insert(logits.end(), lg.begin(), lg.end());
  }
  return logits;
}

std::vector<int64_t> random_ids(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
  return v;
}

TEST_P(Gpt2DevTest, ForwardMatchesFloat64Reference) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  tg::manual_seed(3);
  gpt2::GPT m(tiny());
  // Larger weights than GPT-2's init, so attention is far from uniform and the test has teeth.
  for (const auto& [n, p] : m.named_parameters())
    if (!n.ends_with("ln_1.weight") && !n.ends_with("ln_2.weight") && !n.ends_with("ln_f.weight"))
      tg::nn::init::normal_(p, 0.0, 0.3);
  const int64_t B = 2, T = 9;
  const auto ids = random_ids(B * T, 61, 5);
  const auto want = reference_logits(m, ids, B, T);
  m.to(tg::testing::to_device(GetParam()));
  const Tensor logits = m(tg::tensor(ids, tg::Shape{B, T}).to(tg::testing::to_device(GetParam())));
  ASSERT_EQ(logits.sizes(), (tg::Shape{B, T, 61}));
  // float32 against float64: ~2e-6 seen (logits up to ~4.5).
  tg::testing::expect_near_vec(host(logits), want, 2e-5, 1e-5, "logits");
}

TEST_P(Gpt2DevTest, LossAtInitIsNearLnVocabAndTrainingOnABatchLowersIt) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const tg::Device dev = tg::testing::to_device(GetParam());
  tg::manual_seed(0);
  gpt2::GPT m(tiny(97));
  m.to(dev);
  const auto ids = random_ids(4 * 11, 97, 9);
  const Tensor rows = tg::tensor(ids, tg::Shape{4, 11}).to(dev);
  const Tensor x = rows.slice(1, 0, 10).contiguous(), y = rows.slice(1, 1, 11).contiguous();
  auto opt = gpt2::make_optimizer(m, 1e-2, 0.1);
  std::vector<double> losses;
  for (int s = 0; s < 15; ++s) {
    opt.zero_grad();
    Tensor loss = gpt2::loss_fn(m(x), y);
    loss.backward();
    tg::nn::utils::clip_grad_norm_(m.parameters(), 1.0);
    opt.step();
    losses.push_back(loss.item<double>());
  }
  // N(0, 0.02) weights give logits of ~1e-2: the loss is ln(97) to within a few hundredths.
  EXPECT_NEAR(losses.front(), std::log(97.0), 0.03);
  EXPECT_LT(losses.back(), 0.6 * losses.front());
  for (size_t i = 1; i < losses.size(); ++i) EXPECT_LT(losses[i], losses[0]) << "step " << i;
}

INSTANTIATE_TEST_SUITE_P(Dev, Gpt2DevTest, ::testing::Values(Dev::CPU, Dev::CUDA), tg::testing::dev_name);

TEST_F(Gpt2Test, NamesAreGpt2LMHeadModelsAndTheHeadIsTied) {
  gpt2::GPT m(tiny());
  const tg::StateDict sd = m.state_dict();
  const std::vector<std::string> expected = {
      "transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight",
      "transformer.h.0.ln_1.bias", "transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias",
      "transformer.h.0.attn.c_proj.weight", "transformer.h.0.attn.c_proj.bias", "transformer.h.0.ln_2.weight",
      "transformer.h.0.ln_2.bias", "transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_fc.bias",
      "transformer.h.0.mlp.c_proj.weight", "transformer.h.0.mlp.c_proj.bias"};
  std::vector<std::string> got;
  for (const auto& [n, t] : sd) got.push_back(n);
  ASSERT_EQ(got.size(), 2u + 2 * 12 + 2 + 1);
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(got[i], expected[i]);
  EXPECT_EQ(got[got.size() - 3], "transformer.ln_f.weight");
  EXPECT_EQ(got.back(), "lm_head.weight");
  EXPECT_EQ(sd.at("transformer.h.1.attn.c_attn.weight").sizes(), (tg::Shape{48, 16}));
  EXPECT_EQ(sd.at("transformer.h.1.mlp.c_proj.weight").sizes(), (tg::Shape{16, 64}));
  // Tied: one tensor, counted once among the parameters.
  EXPECT_EQ(m.lm_head->weight.impl_ptr().get(), m.transformer->wte->weight.impl_ptr().get());
  const int64_t C = 16, V = 61, L = 2;
  const int64_t per_block = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) + (4 * C * C + C);
  EXPECT_EQ(m.num_params(false), V * C + 12 * C + L * per_block + 2 * C);
  EXPECT_EQ(m.parameters().size(), static_cast<size_t>(2 + 12 * L + 2));
  // nanoGPT's init: c_proj weights N(0, 0.02 / sqrt(2 L)), others N(0, 0.02), biases 0, norms 1.
  tg::manual_seed(1);
  gpt2::GPT big({.n_layer = 8, .n_head = 4, .n_embd = 128, .block_size = 64, .vocab_size = 512});
  EXPECT_NEAR(big.transformer->wte->weight.std().item<double>(), 0.02, 0.001);
  EXPECT_NEAR(big.transformer->h->get<gpt2::Block>(0)->mlp->c_proj->weight.std().item<double>(), 0.02 / 4, 0.0003);
  EXPECT_EQ(big.transformer->h->get<gpt2::Block>(3)->attn->c_attn->bias.abs().max().item<double>(), 0.0);
  EXPECT_EQ(big.transformer->ln_f->weight.min().item<double>(), 1.0);
}

TEST_F(Gpt2Test, SequenceLongerThanTheContextIsAnError) {
  gpt2::GPT m(tiny());
  const std::string e = error_of([&] { m(tg::zeros({1, 13}, tg::kInt64)); });
  EXPECT_NE(e.find("13 tokens does not fit the context of 12"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { m(tg::zeros({2, 3}, tg::kFloat32)); }).find("int64 or int32"), std::string::npos);
  EXPECT_NE(error_of([] { gpt2::GPT({.n_head = 5, .n_embd = 16}); }).find("not a multiple of the heads 5"),
            std::string::npos);
}

TEST_F(Gpt2Test, ByteTokenizerRoundTrip) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  const auto ids = gpt2::encode_bytes(all + "héllo");
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[255], 255);
  EXPECT_EQ(ids[257], 0xC3);  // UTF-8 bytes, one token each
  EXPECT_EQ(ids.size(), 256u + 6u);
  EXPECT_EQ(gpt2::decode_bytes(ids), all + "héllo");
  EXPECT_NE(error_of([] { gpt2::decode_bytes({65, 256}); }).find("token 256 is not a byte"), std::string::npos);
}

TEST_F(Gpt2Test, FlatShardIsReadAndValidated) {
  std::vector<uint16_t> toks(1000);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>((i * 7) % 300);
  write(path("ok.bin"), toks.data(), toks.size() * 2);
  const auto d = gpt2::TokenData::open(path("ok.bin"), 300);
  ASSERT_EQ(d.size(), 1000);
  EXPECT_EQ(d[999], (999 * 7) % 300);
  // A batch: B rows of T + 1 consecutive tokens of the file.
  const Tensor b = gpt2::get_batch(d, 3, 20, 42, 0, 5);
  ASSERT_EQ(b.sizes(), (tg::Shape{3, 21}));
  const auto v = b.to_vector<int64_t>();
  for (int r = 0; r < 3; ++r) {
    int64_t start = -1;
    for (int64_t o = 0; o < 1000 - 20; ++o) {
      bool match = true;
      for (int t = 0; t < 21 && match; ++t) match = d[o + t] == v[r * 21 + t];
      if (match) start = o;
    }
    EXPECT_GE(start, 0) << "row " << r << " is not a run of the file";
  }
  EXPECT_EQ(gpt2::get_batch(d, 3, 20, 42, 0, 5).to_vector<int64_t>(), v);  // same (seed, stream, index)
  EXPECT_NE(gpt2::get_batch(d, 3, 20, 42, 0, 6).to_vector<int64_t>(), v);
  // A token >= vocab: the file, its byte offset and the value.
  toks[123] = 300;
  write(path("bad.bin"), toks.data(), toks.size() * 2);
  std::string e = error_of([&] { gpt2::TokenData::open(path("bad.bin"), 300); });
  EXPECT_NE(e.find("bad.bin"), std::string::npos) << e;
  EXPECT_NE(e.find("token 300 at byte offset 246"), std::string::npos) << e;
  // Several bad tokens across the threads' chunks: the first is named.
  std::vector<uint16_t> big(3'000'000, 5);
  big[2'500'000] = 400;
  big[1'200'000] = 301;
  big[2'900'000] = 999;
  write(path("big.bin"), big.data(), big.size() * 2);
  e = error_of([&] { gpt2::TokenData::open(path("big.bin"), 300); });
  EXPECT_NE(e.find("token 301 at byte offset 2400000 (token 1200000)"), std::string::npos) << e;
  // An odd size, an empty file, a missing file.
  write(path("odd.bin"), toks.data(), 7);
  e = error_of([&] { gpt2::TokenData::open(path("odd.bin"), 50257); });
  EXPECT_NE(e.find("7 bytes, not a whole number of uint16 tokens"), std::string::npos) << e;
  write(path("empty.bin"), toks.data(), 0);
  EXPECT_NE(error_of([&] { gpt2::TokenData::open(path("empty.bin"), 50257); }).find("holds no tokens"),
            std::string::npos);
  EXPECT_NE(error_of([&] { gpt2::TokenData::open(path("none.bin"), 50257); }).find("cannot open"), std::string::npos);
  // Too short for a row.
  EXPECT_NE(error_of([&] { gpt2::get_batch(d, 1, 1000, 0, 0, 0); }).find("a row of the batch needs 1001"),
            std::string::npos);
}

TEST_F(Gpt2Test, LlmcHeaderShardIsReadAndValidated) {
  std::vector<int32_t> header(256, 0);
  header[0] = gpt2::kShardMagic;
  header[1] = 1;
  header[2] = 50;
  std::vector<uint16_t> toks(50);
  for (int i = 0; i < 50; ++i) toks[i] = static_cast<uint16_t>(50000 + i);
  std::string bytes(reinterpret_cast<const char*>(header.data()), 1024);
  bytes.append(reinterpret_cast<const char*>(toks.data()), 100);
  write(path("h.bin"), bytes.data(), bytes.size());
  const auto d = gpt2::TokenData::open(path("h.bin"), 50257);
  ASSERT_EQ(d.size(), 50);
  EXPECT_EQ(d[0], 50000);
  EXPECT_EQ(d[49], 50049);
  // The header's count against the size.
  write(path("short.bin"), bytes.data(), bytes.size() - 2);
  std::string e = error_of([&] { gpt2::TokenData::open(path("short.bin"), 50257); });
  EXPECT_NE(e.find("the header says 50 tokens of 2 bytes (1124 bytes with the header), the file has 1122"),
            std::string::npos)
      << e;
  // Token 50049 >= vocab 50040: offset counts the header.
  e = error_of([&] { gpt2::TokenData::open(path("h.bin"), 50040); });
  EXPECT_NE(e.find("token 50040 at byte offset 1104"), std::string::npos) << e;
  // Version 2: uint32 tokens.
  header[1] = 2;
  header[2] = 3;
  std::vector<uint32_t> t32{7, 70000, 3};
  std::string b2(reinterpret_cast<const char*>(header.data()), 1024);
  b2.append(reinterpret_cast<const char*>(t32.data()), 12);
  write(path("v2.bin"), b2.data(), b2.size());
  const auto d2 = gpt2::TokenData::open(path("v2.bin"), 100000);
  EXPECT_EQ(d2[1], 70000);
  header[1] = 9;
  std::string b9(reinterpret_cast<const char*>(header.data()), 1024);
  write(path("v9.bin"), b9.data(), b9.size());
  EXPECT_NE(error_of([&] { gpt2::TokenData::open(path("v9.bin"), 100); }).find("shard version 9"), std::string::npos);
}

TEST_F(Gpt2Test, TextFileIsBytes) {
  const std::string text = "To be, or not to be";
  write(path("a.txt"), text.data(), text.size());
  const auto d = gpt2::TokenData::open(path("a.txt"), 256);
  ASSERT_EQ(d.size(), static_cast<int64_t>(text.size()));
  EXPECT_EQ(d[3], 'b');
  EXPECT_EQ(d.slice(6, 8)[1], 'o');
  EXPECT_NE(error_of([&] { gpt2::TokenData::open(path("a.txt"), 100); }).find("token 111 at byte offset 1"),
            std::string::npos);
}

// Writes `m`'s weights the way GPT2LMHeadModel's model.safetensors holds them (built here from the
// names, not through gpt2::hf_state_dict): Conv1D weights [in, out]; with or without the
// "transformer." prefix; plus the causal-mask buffers and lm_head.weight some files carry.
tg::StateDict hf_file(const gpt2::GPT& m, bool prefix, bool extras) {
  tg::StateDict out;
  for (const auto& [n, t] : m.state_dict()) {
    if (n == "lm_head.weight") continue;
    std::string name = prefix ? n : n.substr(std::string("transformer.").size());
    const bool conv1d = n.find(".attn.c_") != std::string::npos || n.find(".mlp.c_") != std::string::npos;
    out.insert(name, conv1d && t.dim() == 2 ? t.t().contiguous() : t.clone());
    if (extras && n.ends_with("ln_1.weight")) {
      const int64_t ctx = m.config.block_size;
      out.insert(name.substr(0, name.size() - std::string("ln_1.weight").size()) + "attn.bias",
                 tg::ones({ctx, ctx}).tril().reshape({1, 1, ctx, ctx}));
    }
  }
  if (extras) out.insert("lm_head.weight", m.state_dict().at("transformer.wte.weight").clone());
  return out;
}

TEST_F(Gpt2Test, HuggingFaceWeightsLoadTransposed) {
  tg::manual_seed(11);
  gpt2::GPT src(tiny());
  for (const auto& [n, p] : src.named_parameters()) tg::nn::init::normal_(p, 0.0, 0.5);
  for (bool prefix : {true, false}) {
    for (bool extras : {false, true}) {
      const std::string f = path("model.safetensors");
      tg::save(hf_file(src, prefix, extras), f);
      tg::manual_seed(99);
      gpt2::GPT dst(tiny());
      gpt2::load_hf_weights(dst, f);
      const tg::StateDict a = src.state_dict(), b = dst.state_dict();
      for (const auto& [n, t] : a)
        EXPECT_EQ(host(b.at(n)), host(t)) << n << " prefix " << prefix << " extras " << extras;
      EXPECT_EQ(dst.lm_head->weight.impl_ptr().get(), dst.transformer->wte->weight.impl_ptr().get());
    }
  }
  // And back: hf_state_dict writes the same layout.
  const tg::StateDict back = gpt2::hf_state_dict(src), want = hf_file(src, true, false);
  ASSERT_EQ(back.size(), want.size());
  for (const auto& [n, t] : want) EXPECT_EQ(host(back.at(n)), host(t)) << n;
}

TEST_F(Gpt2Test, HuggingFaceWeightsOfAnotherArchitectureAreAnError) {
  gpt2::GPT src(tiny());
  const std::string f = path("model.safetensors");
  // Another vocab: wte named with both shapes.
  tg::save(hf_file(gpt2::GPT(tiny(70)), true, false), f);
  gpt2::GPT dst(tiny());
  std::string e = error_of([&] { gpt2::load_hf_weights(dst, f); });
  EXPECT_NE(e.find("'wte.weight' is float32 [70, 16], the model expects [61, 16]"), std::string::npos) << e;
  // More layers: unexpected h.2.*; fewer: missing h.1.*.
  gpt2::Config three = tiny();
  three.n_layer = 3;
  tg::save(hf_file(gpt2::GPT(three), true, false), f);
  e = error_of([&] { gpt2::load_hf_weights(dst, f); });
  EXPECT_NE(e.find("unexpected 'transformer.h.2.ln_1.weight'"), std::string::npos) << e;
  gpt2::Config one = tiny();
  one.n_layer = 1;
  tg::save(hf_file(gpt2::GPT(one), false, false), f);
  e = error_of([&] { gpt2::load_hf_weights(dst, f); });
  EXPECT_NE(e.find("missing 'h.1.ln_1.weight'"), std::string::npos) << e;
  // Not transposed (a tapegrad state_dict saved as is): c_attn [48, 16] instead of [16, 48].
  tg::StateDict raw = src.state_dict();
  tg::save(raw, f);
  e = error_of([&] { gpt2::load_hf_weights(dst, f); });
  EXPECT_NE(e.find("'h.0.attn.c_attn.weight' is float32 [48, 16], the model expects [16, 48]"), std::string::npos)
      << e;
  // An untied head.
  tg::StateDict untied = hf_file(src, true, false);
  untied.insert("lm_head.weight", tg::randn({61, 16}));
  tg::save(untied, f);
  e = error_of([&] { gpt2::load_hf_weights(dst, f); });
  EXPECT_NE(e.find("'lm_head.weight' differs from 'wte.weight'"), std::string::npos) << e;
}

TEST_F(Gpt2Test, ScheduleAndOptimizerGroupsAreNanoGpts) {
  // Warmup (it + 1) / (warmup + 1), then cosine from lr to min_lr at decay_steps, min_lr after.
  EXPECT_DOUBLE_EQ(gpt2::lr_at(0, 1.0, 0.1, 4, 14), 0.2);
  EXPECT_DOUBLE_EQ(gpt2::lr_at(3, 1.0, 0.1, 4, 14), 0.8);
  EXPECT_DOUBLE_EQ(gpt2::lr_at(4, 1.0, 0.1, 4, 14), 1.0);
  EXPECT_NEAR(gpt2::lr_at(9, 1.0, 0.1, 4, 14), 0.55, 1e-15);
  EXPECT_NEAR(gpt2::lr_at(14, 1.0, 0.1, 4, 14), 0.1, 1e-15);
  EXPECT_DOUBLE_EQ(gpt2::lr_at(20, 1.0, 0.1, 4, 14), 0.1);
  gpt2::GPT m(tiny());
  auto opt = gpt2::make_optimizer(m, 3e-4, 0.1);
  ASSERT_EQ(opt.num_param_groups(), 2u);
  const auto& g = opt.param_groups();
  EXPECT_EQ(g[0].options.weight_decay, 0.1);
  EXPECT_EQ(g[1].options.weight_decay, 0.0);
  EXPECT_EQ(g[0].options.betas, (std::pair<double, double>{0.9, 0.95}));
  EXPECT_EQ(g[0].params.size(), 2u + 4 * 2);  // wte (= lm_head), wpe, 4 Linear weights per block
  EXPECT_EQ(g[1].params.size(), 2u + 2 * 8);  // ln_f, and per block 2 norms x 2 + 4 biases
  for (const auto& p : g[0].params) EXPECT_EQ(p.dim(), 2);
  for (const auto& p : g[1].params) EXPECT_EQ(p.dim(), 1);
}

TEST_F(Gpt2Test, GreedySamplingFollowsTheArgmax) {
  tg::manual_seed(4);
  gpt2::GPT m(tiny());
  for (const auto& [n, p] : m.named_parameters()) tg::nn::init::normal_(p, 0.0, 0.5);
  const auto out = gpt2::generate(m, {1, 2, 3}, 4, 0.0, 0, tg::kCPU);
  ASSERT_EQ(out.size(), 7u);
  for (size_t i = 3; i < out.size(); ++i) {
    const std::vector<int64_t> ctx(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(i));
    tg::NoGradGuard g;
    const Tensor last = m(tg::tensor(ctx, tg::Shape{1, static_cast<int64_t>(i)})).select(1, i - 1);
    EXPECT_EQ(out[i], tg::argmax(last.reshape({61})).item<int64_t>()) << i;
  }
  // top_k = 1 at any temperature is greedy too.
  EXPECT_EQ(gpt2::generate(m, {1, 2, 3}, 4, 1.5, 1, tg::kCPU), out);
}

TEST_F(Gpt2Test, ResumeGivesTheLossesOfAStraightRun) {
  std::string text;
  for (int i = 0; i < 200; ++i) text += "the quick brown fox " + std::to_string(i % 13) + "\n";
  write(path("t.txt"), text.data(), text.size());
  gpt2::Options o;
  o.model = {.n_layer = 1, .n_head = 2, .n_embd = 16, .block_size = 16, .vocab_size = 256};
  o.data = path("t.txt");
  o.batch = 2;
  o.seq = 16;
  o.accum = 2;
  o.steps = 6;
  o.warmup = 2;
  o.lr = 3e-3;
  o.eval_interval = 3;
  o.eval_iters = 2;
  o.sample_tokens = 0;
  o.quiet = true;
  const gpt2::Result straight = gpt2::train(o);
  ASSERT_EQ(straight.step_losses.size(), 6u);
  ASSERT_EQ(straight.val_losses.size(), 2u);
  o.steps = 3;
  o.decay_steps = 6;  // the straight run's schedule
  o.out = path("ck.safetensors");
  gpt2::train(o);
  o.steps = 6;
  o.resume = o.out;
  o.out = "";
  const gpt2::Result resumed = gpt2::train(o);
  ASSERT_EQ(resumed.step_losses.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(resumed.step_losses[i], straight.step_losses[3 + i]) << i;
  EXPECT_EQ(resumed.val_losses.back(), straight.val_losses.back());
  // A checkpoint of another architecture.
  o.model.n_embd = 32;
  const std::string e = error_of([&] { gpt2::train(o); });
  EXPECT_NE(e.find("holds a model with n_embd = 16, this run's is 32"), std::string::npos) << e;
}

// tg_bench_gpt2's _graph order: eager steps on the legacy default stream, two on a side stream,
// then one capture of the step (bf16 autocast, clip, AdamW) replayed. It must replay as eager
// steps run, bit for bit and finite. (A branch's 124M replays went NaN on an H100 in that order,
// 2026-12-07, while a capture after side-stream steps only replayed correctly.)
TEST(Gpt2Cuda, CapturedStepAfterDefaultStreamStepsReplaysLikeEagerSteps) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const gpt2::Config c{.n_layer = 2, .n_head = 12, .n_embd = 768, .block_size = 256, .vocab_size = 50304};
  const int64_t B = 8, T = 256;
  const tg::Device dev(tg::kCUDA);
  auto make = [&] {
    tg::manual_seed(7);
    auto m = std::make_shared<gpt2::GPT>(c);
    m->to(dev);
    return m;
  };
  auto eager = make(), graphed = make();
  tg::optim::AdamW opt_e = gpt2::make_optimizer(*eager, 6e-4, 0.1), opt_g = gpt2::make_optimizer(*graphed, 6e-4, 0.1);
  const std::vector<Tensor> pe = eager->parameters(), pg = graphed->parameters();
  tg::manual_seed(8);
  const Tensor rows = (tg::rand({B, T + 1}, dev) * 50304.0).to(tg::kInt64).clamp(0, 50303);
  const Tensor x = rows.slice(1, 0, T).contiguous(), y = rows.slice(1, 1, T + 1).contiguous();
  Tensor loss_e, loss_g;
  auto step = [&](gpt2::GPT& m, tg::optim::AdamW& opt, const std::vector<Tensor>& ps, Tensor& out) {
    opt.zero_grad();
    Tensor loss;
    {
      tg::amp::autocast guard(tg::kCUDA, tg::kBFloat16, true);
      loss = gpt2::loss_fn(m(x), y);
    }
    loss.backward();
    tg::nn::utils::clip_grad_norm_(ps, 1.0);
    opt.step();
    out = loss.detach();
  };
  constexpr int kDefault = 6, kSide = 2, kReplays = 10;
  for (int i = 0; i < kDefault; ++i) step(*graphed, opt_g, pg, loss_g);
  tg::cuda::synchronize();
  {
    tg::cuda::Stream side;
    tg::cuda::StreamGuard guard(side);
    for (int i = 0; i < kSide; ++i) step(*graphed, opt_g, pg, loss_g);
    tg::cuda::Graph graph;
    ASSERT_NO_THROW(graph.capture([&] { step(*graphed, opt_g, pg, loss_g); }));
    for (int i = 0; i < kReplays; ++i) graph.replay();
    side.synchronize();
  }
  for (int i = 0; i < kDefault + kSide + kReplays; ++i) step(*eager, opt_e, pe, loss_e);
  tg::cuda::synchronize();
  const float le = loss_e.item<float>(), lg = loss_g.item<float>();
  ASSERT_TRUE(std::isfinite(le)) << "the eager steps diverged";
  EXPECT_TRUE(std::isfinite(lg)) << "the replayed step went non-finite";
  EXPECT_EQ(lg, le);
  ASSERT_EQ(pe.size(), pg.size());
  for (size_t i = 0; i < pe.size(); ++i) {
    const float d = (pg[i] - pe[i]).abs().max().item<float>();
    EXPECT_EQ(d, 0.0f) << "parameter " << i;
  }
}

}  // namespace
