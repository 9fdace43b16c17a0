#!/usr/bin/env python3
"""examples/gpt2 against Hugging Face's GPT2LMHeadModel (issue #18).

A small randomly initialised GPT2LMHeadModel (seeded; no download) is saved with save_pretrained
(model.safetensors: Conv1D weights [in, out], lm_head tied to wte) together with a batch file
(safetensors "tokens", int64 [steps, B, T + 1]). examples/gpt2 loads it (--init-hf) in parity mode
(--batches, --logits-out) and the same steps run in PyTorch:

1. fp32, TF32 off on both sides: the logits of batch 0 within --rtol-logits (1e-4) of PyTorch's
   (max |diff| / max |logit|), the loss within --rtol-loss (1e-6) relative ("equal");
2. fp32: --steps (20) AdamW steps as nanoGPT takes them (weight decay 0.1 on the 2-d tensors only,
   betas (0.9, 0.95), linear warmup then cosine decay, clip_grad_norm_(1.0)) from the same weights on
   the same batches: every step's loss within --rtol-steps (1e-5) relative;
3. CUDA only: the same steps in bf16 autocast on both sides: within --rtol-bf16 (1e-2).

    python3 tests/parity/gpt2_parity.py --exe build/<dir>/examples/gpt2 [--device cuda|cpu]

Needs torch, transformers and safetensors. PASS / FAIL lines; exits 1 on a failed check, 2 when
something is missing.
"""
import argparse
import math
import os
import re
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", required=True, help="path to the gpt2 example")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rtol-logits", type=float, default=1e-4)
    ap.add_argument("--rtol-loss", type=float, default=1e-6)
    ap.add_argument("--rtol-steps", type=float, default=1e-5)
    ap.add_argument("--rtol-bf16", type=float, default=1e-2)
    ap.add_argument("--workdir", default="", help="keep the files here (default: a temporary directory)")
    args = ap.parse_args()

    try:
        import torch
        import torch.nn.functional as F
        from safetensors.torch import load_file, save_file
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        print(f"gpt2_parity: missing module: {e}", file=sys.stderr)
        return 2
    if not os.path.exists(args.exe):
        print(f"gpt2_parity: no executable at {args.exe}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpt2_parity: torch sees no CUDA device", file=sys.stderr)
        return 2
    if args.seq > args.context:
        print("gpt2_parity: --seq must not exceed --context", file=sys.stderr)
        return 2

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(args.device)
    work = args.workdir or tempfile.mkdtemp(prefix="tg_gpt2_")
    os.makedirs(work, exist_ok=True)

    # ---- the model and the batches
    torch.manual_seed(args.seed)
    cfg = GPT2Config(n_layer=args.layers, n_head=args.heads, n_embd=args.width, n_positions=args.context,
                     vocab_size=args.vocab, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     activation_function="gelu_new", layer_norm_epsilon=1e-5, tie_word_embeddings=True)
    GPT2LMHeadModel(cfg).save_pretrained(work, safe_serialization=True)
    weights = os.path.join(work, "model.safetensors")
    g = torch.Generator().manual_seed(args.seed + 1)
    tokens = torch.randint(0, args.vocab, (args.steps, args.batch, args.seq + 1), generator=g, dtype=torch.int64)
    batches = os.path.join(work, "batches.safetensors")
    save_file({"tokens": tokens}, batches)

    def get_lr(it):  # nanoGPT's, decay to min_lr at the last step (the example's --decay-steps 0)
        if it < args.warmup:
            return args.lr * (it + 1) / (args.warmup + 1)
        if it > args.steps or args.steps <= args.warmup:
            return args.min_lr
        ratio = (it - args.warmup) / (args.steps - args.warmup)
        return args.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (args.lr - args.min_lr)

    def torch_run(bf16):
        """Logits and loss of batch 0 (before training) and every step's loss, in PyTorch."""
        model = GPT2LMHeadModel.from_pretrained(work, attn_implementation="eager").to(dev).float()
        model.train()
        decay = [p for _, p in model.named_parameters() if p.dim() >= 2]
        no_decay = [p for _, p in model.named_parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
        ctx = lambda: torch.autocast(device_type=args.device, dtype=torch.bfloat16, enabled=bf16)
        tok = tokens.to(dev)
        with torch.no_grad(), ctx():
            x, y = tok[0, :, :-1], tok[0, :, 1:]
            logits = model(input_ids=x).logits
            loss0 = F.cross_entropy(logits.float().reshape(-1, args.vocab), y.reshape(-1))
        losses = []
        for it in range(args.steps):
            for group in opt.param_groups:
                group["lr"] = get_lr(it)
            x, y = tok[it, :, :-1], tok[it, :, 1:]
            opt.zero_grad(set_to_none=True)
            with ctx():
                loss = F.cross_entropy(model(input_ids=x).logits.reshape(-1, args.vocab), y.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
        return logits.float().cpu(), loss0.item(), losses

    def tg_run(bf16):
        out = os.path.join(work, f"tg_logits_{'bf16' if bf16 else 'fp32'}.safetensors")
        cmd = [args.exe, "--batches", batches, "--logits-out", out, "--init-hf", weights, "--layers", str(args.layers),
               "--heads", str(args.heads), "--width", str(args.width), "--context", str(args.context), "--vocab",
               str(args.vocab), "--lr", repr(args.lr), "--min-lr", repr(args.min_lr), "--warmup", str(args.warmup),
               "--weight-decay", "0.1", "--grad-clip", "1.0", "--precision", "bf16" if bf16 else "fp32",
               "--device", args.device, "--seed", str(args.seed)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"gpt2_parity: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}",
                  file=sys.stderr)
            return None
        losses = [float(m.group(2)) for m in re.finditer(r"^step (\d+) loss (\S+)$", proc.stdout, re.M)]
        res = load_file(out)
        return res["logits"], float(res["loss"]), losses

    ok = True

    def check(what, passed, detail):
        nonlocal ok
        ok &= passed
        print(f"{what}: {detail}: {'PASS' if passed else 'FAIL'}")

    # ---- fp32
    t_logits, t_loss0, t_losses = torch_run(False)
    got = tg_run(False)
    if got is None:
        return 1
    g_logits, g_loss0, g_losses = got
    if g_logits.shape != t_logits.shape:
        check("logits fp32", False, f"shape {tuple(g_logits.shape)} vs PyTorch's {tuple(t_logits.shape)}")
    else:
        rel = ((g_logits - t_logits).abs().max() / t_logits.abs().max()).item()
        check("logits fp32", rel <= args.rtol_logits, f"max |diff| / max |logit| = {rel:.3g} (<= {args.rtol_logits:g})")
    rel = abs(g_loss0 - t_loss0) / abs(t_loss0)
    check("loss fp32", rel <= args.rtol_loss,
          f"tapegrad {g_loss0:.9g} PyTorch {t_loss0:.9g} (ln vocab {math.log(args.vocab):.4f}), rel {rel:.3g} "
          f"(<= {args.rtol_loss:g})")

    def compare_steps(what, mine, theirs, rtol):
        if len(mine) != len(theirs):
            check(what, False, f"{len(mine)} steps vs PyTorch's {len(theirs)}")
            return
        print(f"{'step':>4} {'tapegrad':>14} {'PyTorch':>14} {'rel':>10}")
        worst = 0.0
        for i, (a, b) in enumerate(zip(mine, theirs)):
            r = abs(a - b) / abs(b)
            worst = max(worst, r)
            print(f"{i:>4} {a:>14.9g} {b:>14.9g} {r:>10.3g}")
        check(what, worst <= rtol, f"{len(mine)} AdamW steps, worst relative loss difference {worst:.3g} (<= {rtol:g})")

    compare_steps("train fp32", g_losses, t_losses, args.rtol_steps)

    # ---- bf16 autocast (CUDA)
    if args.device == "cuda":
        _, _, tb_losses = torch_run(True)
        got = tg_run(True)
        if got is None:
            return 1
        compare_steps("train bf16 autocast", got[2], tb_losses, args.rtol_bf16)
    else:
        print("train bf16 autocast: skipped on the CPU")
    print("gpt2_parity:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
