// GPT-2 trained from C++: the model is ordinary tg::nn modules (examples/gpt2.h, which holds the
// logic, so tests call it). Trains on nanoGPT / llm.c token shards (.bin: flat uint16, or the
// 256-int32 header with magic 20240520) or on any text file through a byte-level tokenizer, so it
// runs with no download; bf16 autocast on CUDA, AdamW (no decay on biases and norms), cosine
// schedule with warmup, clip_grad_norm_(1.0), gradient accumulation, validation loss, checkpoint
// save / resume, a progress bar with tokens/s, a metrics log, and sampled text at the end.
//
//   gpt2 --data input.txt --layers 4 --heads 4 --width 256 --context 256 --seq 256 --steps 2000
//   gpt2 --data fineweb_train_000001.bin --val-data fineweb_val_000000.bin --vocab 50304 --batch 16 --accum 32
//   gpt2 --init-hf model.safetensors --data shard.bin --lr 3e-5 --steps 200     # fine-tune GPT-2
//   gpt2 --data input.txt --out ck.safetensors ... ; gpt2 --data input.txt --resume ck.safetensors --steps 4000
//
// Parity mode (tests/parity/gpt2_parity.py): --batches FILE (safetensors "tokens", int64
// [steps, B, T + 1]) replaces --data, one step per batch, a "step i loss L" line each; --logits-out
// FILE writes the logits and loss of batch 0 before training.
#include "gpt2.h"

#include <cstdio>
#include <filesystem>
#include <string>

#include "cli.h"

int main(int argc, char** argv) {
  gpt2::Options o;
  examples::App app{"GPT-2 trained on token shards or a text file (byte tokenizer)", "gpt2"};
  int64_t vocab = 0;
  std::string device;
  bool no_progress = false;
  auto* data_opt = app.add_option("--data", o.data, "training tokens: a shard (.bin) or a text file");
  app.add_option("--val-data", o.val_data, "validation tokens (default: the last --val-fraction of --data)")
      ->needs(data_opt);
  app.add_option("--data-format", o.data_format, "auto (.bin: tokens, else text), tokens or text")
      ->check(CLI::IsMember({"auto", "tokens", "text"}));
  app.add_option("--val-fraction", o.val_fraction, "validation share of --data without --val-data")
      ->check(examples::kPositive);
  app.add_option("--layers", o.model.n_layer, "transformer blocks")->check(examples::kPositive);
  app.add_option("--heads", o.model.n_head, "attention heads")->check(examples::kPositive);
  app.add_option("--width", o.model.n_embd, "embedding width (a multiple of --heads)")->check(examples::kPositive);
  app.add_option("--context", o.model.block_size, "context length (position embeddings)")->check(examples::kPositive);
  auto* vocab_opt = app.add_option("--vocab", vocab, "vocab size (default 50257; 256 for text; 50304 pads GPT-2's)")
                        ->check(examples::kPositive)
                        ->default_str("");
  app.add_option("--dropout", o.model.dropout, "dropout")->check(CLI::Range(0.0, 0.99));
  app.add_option("--batch", o.batch, "rows per micro-batch")->check(examples::kPositive);
  app.add_option("--seq", o.seq, "tokens per row (<= --context)")->check(examples::kPositive);
  app.add_option("--accum", o.accum, "micro-batches per step (gradient accumulation)")->check(examples::kPositive);
  app.add_option("--steps", o.steps, "optimizer steps")->check(examples::kNonNegative);
  app.add_option("--lr", o.lr, "peak learning rate")->check(examples::kPositive);
  app.add_option("--min-lr", o.min_lr, "learning rate at the end of the cosine decay")->check(examples::kNonNegative);
  app.add_option("--warmup", o.warmup, "linear warmup steps")->check(examples::kNonNegative);
  app.add_option("--decay-steps", o.decay_steps, "end of the cosine decay (0: --steps)")->check(examples::kNonNegative);
  app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay of the 2-d weights")
      ->check(examples::kNonNegative);
  app.add_option("--grad-clip", o.grad_clip, "clip_grad_norm_ max norm (0: none)")->check(examples::kNonNegative);
  app.add_option("--eval-interval", o.eval_interval, "validation every N steps (0: at the end)")
      ->check(examples::kNonNegative);
  app.add_option("--eval-iters", o.eval_iters, "batches per validation")->check(examples::kPositive);
  app.add_option("--precision", o.precision, "bf16 (autocast), fp32, or auto (bf16 on CUDA)")
      ->check(CLI::IsMember({"auto", "bf16", "fp32"}));
  examples::add_device_option(app, device);
  app.add_option("--seed", o.seed, "seed (weights, batches, sampling)");
  app.add_option("--init-hf", o.init_hf, "start from a GPT2LMHeadModel model.safetensors");
  app.add_option("--out", o.out, "checkpoint, written at each validation and at the end");
  app.add_option("--resume", o.resume, "continue from a checkpoint written by --out");
  app.add_option("--metrics", o.metrics, "metrics log (.jsonl or .csv; must not exist)");
  app.add_option("--sample", o.sample_tokens, "tokens sampled at the end (0: none)")->check(examples::kNonNegative);
  app.add_option("--temperature", o.temperature, "sampling temperature (0: greedy)")->check(examples::kNonNegative);
  app.add_option("--top-k", o.top_k, "sample from the k most likely tokens (0: all)")->check(examples::kNonNegative);
  app.add_option("--prompt", o.prompt, "prompt of the byte tokenizer")->default_str("\"\\n\"");
  auto* batches_opt = app.add_option("--batches", o.batches, "parity mode: the batches (safetensors 'tokens')")
                          ->excludes(data_opt);
  app.add_option("--logits-out", o.logits_out, "parity mode: write batch 0's logits and loss here")
      ->needs(batches_opt);
  app.add_flag("--no-progress", no_progress, "no progress bar");
  app.add_flag("--quiet", o.quiet, "no output but errors");
  if (int rc = examples::parse(app, argc, argv); rc >= 0) return rc;
  if (o.data.empty() && o.batches.empty()) return examples::usage_error(app, "--data FILE is required");
  const bool text = !o.data.empty() && (o.data_format == "text" || (o.data_format == "auto" && !o.data.ends_with(".bin")));
  o.model.vocab_size = vocab_opt->count() > 0 ? vocab : text ? 256 : 50257;
  if (o.model.n_embd % o.model.n_head != 0)
    return examples::usage_error(app, "--width " + std::to_string(o.model.n_embd) + " is not a multiple of --heads " +
                                          std::to_string(o.model.n_head));
  if (o.batches.empty() && o.seq > o.model.block_size)
    return examples::usage_error(app, "--seq " + std::to_string(o.seq) + " is longer than the context " +
                                          std::to_string(o.model.block_size) + " (--context)");
  if (o.val_fraction >= 1) return examples::usage_error(app, "--val-fraction must be below 1");
  if (!o.metrics.empty() && std::filesystem::exists(o.metrics))
    return examples::usage_error(app, "--metrics " + o.metrics + " exists (remove it or name another file)");
  o.progress = !no_progress;
  const auto dev = examples::pick_device(app, device);
  if (!dev) return 2;
  o.device = dev->is_cuda() ? "cuda" : "cpu";
  try {
    gpt2::train(o, [](const std::string& line) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    });
  } catch (const tg::Error& e) {
    const std::string msg = e.what();
    std::fprintf(stderr, "%s%s\n", msg.starts_with("gpt2: ") ? "" : "gpt2: ", msg.c_str());
    return 1;
  }
  return 0;
}
