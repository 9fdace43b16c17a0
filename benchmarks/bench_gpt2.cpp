// GPT-2 training steps (issue #18's table): examples/gpt2.h's model as a user trains it, on random
// tokens resident on the device; one step = zero_grad, forward and loss (bf16 autocast on CUDA),
// backward, clip_grad_norm_(1.0), AdamW (nanoGPT's groups; fused on CUDA). Host wall clock around
// a synchronised step, median of repeats. Rows: tokens/s (extra: ms, model FLOPs utilisation against
// the H200's 989 dense bf16 TFLOP/s, peak memory), the same figure again for the torch.compile
// comparison, peak GPU memory in GiB, and the time from building the model to the end of the first
// step. compare_torch.py times the nanoGPT-style PyTorch model (eager and torch.compile) alike.
// On CUDA, <row>_graph is the same step captured once into a tg::cuda::Graph and replayed.
// On CUDA at 124M, gpt2_phase_* rows (--only gpt2_phase) give the per-phase breakdown (see phases()).
//
//   tg_bench_gpt2                          # CUDA: 124M (12/12/768, context 1024, vocab 50304), B=32 T=1024 bf16
//   tg_bench_gpt2 --batch 8 --seq 256      # CPU default: 2 layers, 2 heads, width 64, vocab 256, B=4 T=64 fp32
//   tg_bench_gpt2 --layers 4 --heads 4 --width 256 --vocab 50304 --precision fp32 --reps 10
//   tg_bench_gpt2 --cudnn-benchmark        # cuDNN autotunes the SDPA graphs at their first call
//   tg_bench_gpt2 --cublas-benchmark       # cuBLASLt algorithms timed per GEMM problem (backends::cublas)
//   tg_bench_gpt2 --nondeterministic       # use_deterministic_algorithms(false): atomics in SDPA backward, embedding
//   tg_bench_gpt2 --unfused-bias-grad      # linear bias gradients as reductions, not cuBLASLt BGRAD epilogues
//   tg_bench_gpt2 --no-cast-twins          # norms write no bf16 twin beside their float32 output / input gradient
//   tg_bench_gpt2 --no-gemm-gelu           # c_fc's gemm does not take the GELU as its epilogue (blas.cpp)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <tapegrad/core/cast_copies.h>
#ifdef TG_WITH_CUDA
#include <tapegrad/core/backend/cuda/blas.h>
#endif
#include <tapegrad/core/native.h>
#include <tapegrad/tapegrad.h>
#include "benchmarks/bench_util.h"
#include "examples/gpt2.h"

namespace {

struct Flags {
  int64_t batch = 0, seq = 0, layers = 0, heads = 0, width = 0, vocab = 0;
  std::string precision, device;
  bool cudnn_benchmark = false;  // --cudnn-benchmark: cuDNN autotunes the attention graphs
  bool cublas_benchmark = false;  // --cublas-benchmark: cuBLASLt algorithms timed per GEMM problem
  bool nondeterministic = false;  // --nondeterministic: tg::use_deterministic_algorithms(false)
  bool unfused_bias_grad = false;  // --unfused-bias-grad: bias gradients as reductions, not GEMM epilogues
  bool no_cast_twins = false;  // --no-cast-twins: norms write no lowered twin (core/cast_copies.h)
  bool no_gemm_gelu = false;  // --no-gemm-gelu: no GELU in a linear's gemm epilogue (fuse_into_deferred_gemm)
};

// Takes this program's flags out of argv; the rest go to tg::bench::parse_options.
Flags take_flags(int& argc, char** argv) {
  Flags f;
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    auto num = [&](const char* name, int64_t& v) {
      if (std::strcmp(argv[i], name) != 0 || i + 1 >= argc) return false;
      v = std::atoll(argv[++i]);
      if (v <= 0) {
        std::fprintf(stderr, "tg_bench_gpt2: %s must be > 0\n", name);
        std::exit(2);
      }
      return true;
    };
    auto str = [&](const char* name, std::string& v) {
      if (std::strcmp(argv[i], name) != 0 || i + 1 >= argc) return false;
      v = argv[++i];
      return true;
    };
    auto flag = [&](const char* name, bool& v) {
      if (std::strcmp(argv[i], name) != 0) return false;
      v = true;
      return true;
    };
    if (flag("--cudnn-benchmark", f.cudnn_benchmark) || flag("--cublas-benchmark", f.cublas_benchmark) ||
        flag("--nondeterministic", f.nondeterministic) || flag("--unfused-bias-grad", f.unfused_bias_grad) ||
        flag("--no-cast-twins", f.no_cast_twins) || flag("--no-gemm-gelu", f.no_gemm_gelu))
      continue;
    if (num("--batch", f.batch) || num("--seq", f.seq) || num("--layers", f.layers) || num("--heads", f.heads) ||
        num("--width", f.width) || num("--vocab", f.vocab) || str("--precision", f.precision) ||
        str("--device", f.device))
      continue;
    argv[out++] = argv[i];
  }
  argc = out;
  return f;
}

// Device time (CUDA events) of one call of f: median of repeats after warm-up.
double event_ms(const tg::bench::Options& o, const std::function<void()>& f) {
  for (int i = 0; i < o.warmup; ++i) f();
  std::vector<double> ms;
  for (int r = 0; r < o.reps; ++r) {
    tg::cuda::Event e0, e1;
    e0.record();
    f();
    e1.record();
    e1.synchronize();
    ms.push_back(e0.elapsed_ms(e1));
  }
  return tg::bench::median(ms);
}

// The step's phases for benchmarks/NOTES.md's breakdown (gpt2_phase_* rows, ms per step): the
// step itself cut at forward+loss / backward / clip / optimizer (events between the parts), and the
// model's kernels timed alone at its shapes under bf16 autocast, forward + backward, times their
// count per step: attention (fused SDPA), the 4 GEMMs of each block, the layer norms, and the
// classifier (tied lm_head + cross_entropy). What the parts leave of the step is the elementwise
// glue (GELU, residual adds, casts, embedding) and launch gaps.
void phases(const tg::bench::Options& o, gpt2::GPT& model, tg::optim::AdamW& opt, const std::vector<tg::Tensor>& params,
            const tg::Tensor& x, const tg::Tensor& y, int64_t B, int64_t T) {
  namespace F = tg::nn::functional;
  const gpt2::Config& c = model.config;
  const int64_t C = c.n_embd, H = c.n_head, D = C / H, L = c.n_layer, N = B * T;
  auto row = [&](const std::string& name, double ms) {
    tg::bench::emit("gpt2_phase_" + name, ms, "ms", ms);
  };
  {  // the step cut in four
    std::vector<double> f_ms, b_ms, c_ms, o_ms;
    for (int r = 0; r < o.warmup + o.reps; ++r) {
      tg::cuda::Event e0, e1, e2, e3, e4;
      e0.record();
      opt.zero_grad();
      tg::Tensor loss;
      {
        tg::amp::autocast guard(tg::kCUDA, tg::kBFloat16, true);
        loss = gpt2::loss_fn(model(x), y);
      }
      e1.record();
      loss.backward();
      e2.record();
      tg::nn::utils::clip_grad_norm_(params, 1.0);
      e3.record();
      opt.step();
      e4.record();
      e4.synchronize();
      if (r < o.warmup) continue;
      f_ms.push_back(e0.elapsed_ms(e1));
      b_ms.push_back(e1.elapsed_ms(e2));
      c_ms.push_back(e2.elapsed_ms(e3));
      o_ms.push_back(e3.elapsed_ms(e4));
    }
    row("step_forward_loss", tg::bench::median(f_ms));
    row("step_backward", tg::bench::median(b_ms));
    row("step_clip", tg::bench::median(c_ms));
    row("step_optimizer", tg::bench::median(o_ms));
  }
  const auto bf = tg::TensorOptions().dtype(tg::kBFloat16).device(tg::kCUDA);
  auto leaf = [](tg::Tensor t) { return t.requires_grad_(true); };
  {  // attention: L fused SDPA calls, forward + backward
    tg::Tensor q = leaf(tg::randn({B, H, T, D}, bf)), k = leaf(tg::randn({B, H, T, D}, bf)),
               v = leaf(tg::randn({B, H, T, D}, bf)), g = tg::randn({B, H, T, D}, bf);
    row("attention", L * event_ms(o, [&] {
          F::scaled_dot_product_attention(q, k, v, {.is_causal = true}).backward(g);
        }));
  }
  {  // the GEMMs of a block (c_attn, attn c_proj, c_fc, mlp c_proj), fp32 weights under bf16 autocast
    const auto f32 = tg::TensorOptions().device(tg::kCUDA);
    double sum = 0;
    for (auto [in, out] : {std::pair<int64_t, int64_t>{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}}) {
      tg::Tensor a = leaf(tg::randn({B, T, in}, bf)), w = leaf(tg::randn({out, in}, f32) * 0.02),
                 b = leaf(tg::zeros({out}, f32)), g = tg::randn({B, T, out}, bf);
      sum += event_ms(o, [&] {
        tg::amp::autocast guard(tg::kCUDA, tg::kBFloat16, true);
        tg::linear(a, w, b).backward(g);
      });
    }
    row("gemms", L * sum);
  }
  {  // the MLP's first half forward: gelu(c_fc(x)) (one gemm with the GELU epilogue, or a gemm and a GELU kernel)
    const auto f32 = tg::TensorOptions().device(tg::kCUDA);
    tg::Tensor a = tg::randn({B, T, C}, bf), w = tg::randn({4 * C, C}, f32) * 0.02, b = tg::zeros({4 * C}, f32);
    row("c_fc_gelu_forward", L * event_ms(o, [&] {
          tg::NoGradGuard ng;
          tg::amp::autocast guard(tg::kCUDA, tg::kBFloat16, true);
          tg::Tensor y = tg::gelu(tg::linear(a, w, b), "tanh");
        }));
  }
  {  // 2 layer norms per block and ln_f, in float32 as the residual stream
    tg::Tensor h = leaf(tg::randn({B, T, C}, tg::kCUDA)), w = leaf(tg::ones({C}, tg::kCUDA)),
               b = leaf(tg::zeros({C}, tg::kCUDA)), g = tg::randn({B, T, C}, tg::kCUDA);
    row("layer_norms", (2 * L + 1) * event_ms(o, [&] {
                         tg::amp::autocast guard(tg::kCUDA, tg::kBFloat16, true);
                         F::layer_norm(h, {C}, w, b).backward(g);
                       }));
  }
  {  // the classifier: logits = h wte^T in bf16, cross_entropy over the vocabulary
    tg::Tensor h = leaf(tg::randn({N, C}, tg::kCUDA)),
               w = leaf(tg::randn({c.vocab_size, C}, tg::kCUDA) * 0.02);
    const tg::Tensor t = y.reshape({N});
    row("classifier", event_ms(o, [&] {
          tg::Tensor loss;
          {
            tg::amp::autocast guard(tg::kCUDA, tg::kBFloat16, true);
            loss = F::cross_entropy(tg::linear(h, w), t);
          }
          loss.backward();
        }));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Flags f = take_flags(argc, argv);
  const auto o = tg::bench::parse_options(argc, argv);
  if (f.device.empty()) f.device = tg::cuda::is_available() ? "cuda" : "cpu";
  if (f.device != "cpu" && f.device != "cuda") {
    std::fprintf(stderr, "tg_bench_gpt2: --device cpu|cuda\n");
    return 2;
  }
  if (f.device == "cuda" && !tg::cuda::is_available()) {
    std::fprintf(stderr, "tg_bench_gpt2: no CUDA device\n");
    return 0;
  }
  const bool cuda = f.device == "cuda";
  if (cuda && f.cudnn_benchmark) tg::backends::cudnn::set_benchmark(true);
  if (cuda && f.cublas_benchmark) tg::backends::cublas::set_benchmark(true);
  if (f.nondeterministic) tg::use_deterministic_algorithms(false);
  if (f.unfused_bias_grad) tg::native::set_fuse_bias_grad(false);
  if (f.no_cast_twins) tg::detail::set_cast_twins_enabled(false);
#ifdef TG_WITH_CUDA
  if (f.no_gemm_gelu) tg::cuda::detail::set_gemm_activation_fusion(false);
#endif
  gpt2::Config c = cuda ? gpt2::Config{.vocab_size = 50304}
                        : gpt2::Config{.n_layer = 2, .n_head = 2, .n_embd = 64, .block_size = 64, .vocab_size = 256};
  if (f.layers) c.n_layer = f.layers;
  if (f.heads) c.n_head = f.heads;
  if (f.width) c.n_embd = f.width;
  if (f.vocab) c.vocab_size = f.vocab;
  const int64_t B = f.batch ? f.batch : cuda ? 32 : 4;
  const int64_t T = f.seq ? f.seq : cuda ? 1024 : 64;
  c.block_size = std::max(c.block_size, T);
  if (f.precision.empty()) f.precision = cuda ? "bf16" : "fp32";
  const bool bf16 = f.precision == "bf16";
  const bool is_124m = c.n_layer == 12 && c.n_head == 12 && c.n_embd == 768 && c.block_size == 1024;
  const std::string model_name =
      is_124m ? "124m" : "l" + std::to_string(c.n_layer) + "h" + std::to_string(c.n_head) + "c" + std::to_string(c.n_embd);
  const std::string name = "gpt2_" + model_name + "_train_step_b" + std::to_string(B) + "_t" + std::to_string(T) +
                           "_" + f.precision + (cuda ? "" : "_cpu");
  if (!o.wants(name) && !o.wants(name + "_graph") && !o.wants("gpt2_" + model_name + "_first_step") &&
      !o.wants("gpt2_phase"))
    return 0;

  const tg::Device dev = cuda ? tg::Device(tg::kCUDA) : tg::Device(tg::kCPU);
  auto sync = [&] {
    if (cuda) tg::cuda::synchronize();
  };
  if (cuda) tg::cuda::reset_peak_memory_stats();
  const double t_build = tg::bench::now_s();
  tg::manual_seed(0);
  gpt2::GPT model(c);
  model.to(dev);
  tg::optim::AdamW opt = gpt2::make_optimizer(model, 6e-4, 0.1);
  const std::vector<tg::Tensor> params = model.parameters();
  const tg::Tensor rows =
      (tg::rand({B, T + 1}, dev) * static_cast<double>(c.vocab_size)).to(tg::kInt64).clamp(0, c.vocab_size - 1);
  const tg::Tensor x = rows.slice(1, 0, T).contiguous(), y = rows.slice(1, 1, T + 1).contiguous();
  auto step = [&] {
    opt.zero_grad();
    tg::Tensor loss;
    {
      tg::amp::autocast guard(dev.type(), tg::kBFloat16, bf16);
      loss = gpt2::loss_fn(model(x), y);
    }
    loss.backward();
    tg::nn::utils::clip_grad_norm_(params, 1.0);
    opt.step();
  };
  step();
  sync();
  const double first_step_s = tg::bench::now_s() - t_build;
  std::vector<double> ms;
  for (int r = 0; r < o.warmup + o.reps; ++r) {
    sync();
    const double t0 = tg::bench::now_s();
    step();
    sync();
    if (r >= o.warmup) ms.push_back((tg::bench::now_s() - t0) * 1e3);
  }
  const double med = tg::bench::median(ms);
  const double tok_s = static_cast<double>(B * T) / (med * 1e-3);
  const double mfu = tok_s * gpt2::flops_per_token(model, T) / 989e12;
  const double peak_gib = cuda ? static_cast<double>(tg::cuda::max_memory_allocated()) / (1 << 30) : 0.0;
  char extra[320];
  std::snprintf(extra, sizeof extra,
                "\"step_ms\": %.4g, \"mfu_h200\": %.4g, \"peak_gib\": %.4g, \"params\": %lld, \"batch\": %lld, "
                "\"seq\": %lld, \"vocab\": %lld",
                med, mfu, peak_gib, static_cast<long long>(model.num_params()), static_cast<long long>(B),
                static_cast<long long>(T), static_cast<long long>(c.vocab_size));
  if (o.wants(name)) {
    tg::bench::emit(name, tok_s, "tok/s", med, extra);
    if (cuda) {
      tg::bench::emit(name + "_vs_compile", tok_s, "tok/s", med, extra);
      tg::bench::emit(name + "_peak_gib", peak_gib, "GiB", med);
    }
  }
  if (cuda && o.wants(name + "_graph")) {
    // The same step captured once into a tg::cuda::Graph and replayed (the issue's "one CUDA graph
    // per step"): no host work between the ~600 kernels of a step.
    try {
      tg::cuda::Stream side;  // capture needs a stream other than the legacy default
      tg::cuda::StreamGuard guard(side);
      for (int i = 0; i < 2; ++i) step();  // eager warm-up on the capture stream
      tg::cuda::Graph graph;
      const double c0 = tg::bench::now_s();
      graph.capture(step);
      const double capture_ms = (tg::bench::now_s() - c0) * 1e3;
      std::vector<double> gms;
      for (int r = 0; r < o.warmup + o.reps; ++r) {
        tg::cuda::synchronize();
        const double t0 = tg::bench::now_s();
        graph.replay();
        tg::cuda::synchronize();
        if (r >= o.warmup) gms.push_back((tg::bench::now_s() - t0) * 1e3);
      }
      const double gmed = tg::bench::median(gms);
      const double gtok = static_cast<double>(B * T) / (gmed * 1e-3);
      char gextra[200];
      std::snprintf(gextra, sizeof gextra, "\"step_ms\": %.4g, \"mfu_h200\": %.4g, \"graph_nodes\": %zu, \"capture_ms\": %.4g",
                    gmed, gtok * gpt2::flops_per_token(model, T) / 989e12, graph.num_nodes(), capture_ms);
      tg::bench::emit(name + "_graph", gtok, "tok/s", gmed, gextra);
    } catch (const tg::Error& e) {
      std::fprintf(stderr, "tg_bench_gpt2: the captured step failed: %s\n", e.what());
    }
  }
  if (cuda && is_124m && o.wants("gpt2_phase")) phases(o, model, opt, params, x, y, B, T);
  if (o.wants("gpt2_" + model_name + "_first_step"))
    tg::bench::emit("gpt2_" + model_name + "_first_step" + (cuda ? "" : "_cpu"), first_step_s, "s",
                    first_step_s * 1e3);
  return 0;
}
