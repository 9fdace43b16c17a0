#!/usr/bin/env python3
"""AMP fidelity against PyTorch (issue #19): the seed's AMP loop from a huge initial scale.

PyTorch draws Linear(F, F)'s initial weights and the batches, writes them as safetensors, and
trains `steps` SGD steps (lr 1e-3) with fp16 autocast and torch.amp.GradScaler(init_scale);
examples/amp_train in fidelity mode trains from the same files. Checked: the per-step losses
agree (relative, --rtol), the final weights agree (--wtol), and tapegrad skips no more steps
than PyTorch (a skipped step is one whose scale went down). tapegrad's weight gradients are
float32 straight from the fp16 GEMM, so it can skip fewer: both counts are printed.

    python3 tests/parity/amp_fidelity.py --exe build/<dir>/examples/amp_train

Needs torch, safetensors and a CUDA device. Exits 1 on a mismatch, 2 when something is missing.
"""
import argparse
import os
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--features", type=int, default=4096)
    ap.add_argument("--init-scale", type=float, default=2.0**37)
    ap.add_argument("--rtol", type=float, default=1e-3)
    ap.add_argument("--wtol", type=float, default=1e-3)
    args = ap.parse_args()
    try:
        import torch
        from safetensors.torch import load_file, save_file
    except ImportError as e:
        print(f"amp_fidelity: missing module: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available() or not os.path.exists(args.exe):
        print("amp_fidelity: needs a CUDA device and the amp_train example", file=sys.stderr)
        return 2
    g = torch.Generator().manual_seed(0)
    f = args.features
    model = torch.nn.Linear(f, f)
    with torch.no_grad():
        model.weight.copy_(torch.randn(f, f, generator=g) / f**0.5)
        model.bias.copy_(torch.randn(f, generator=g) * 0.01)
    x = torch.randn(args.steps, args.batch, f, generator=g)
    with tempfile.TemporaryDirectory() as d:
        init, data, log = (os.path.join(d, n) for n in ("init.safetensors", "data.safetensors", "log.txt"))
        save_file({"weight": model.weight.detach().contiguous(), "bias": model.bias.detach().contiguous()}, init)
        save_file({"x": x}, data)
        subprocess.run([args.exe, "--init", init, "--data", data, "--log", log, "--init-scale", str(args.init_scale)],
                       check=True)
        ours = [tuple(float(v) for v in line.split()[1:]) for line in open(log)]
        our_w = load_file(log + ".safetensors")["weight"].double()

        m = model.cuda()
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cuda", init_scale=args.init_scale)
        theirs = []
        xc = x.cuda()
        for i in range(args.steps):
            opt.zero_grad()
            with torch.autocast("cuda", dtype=torch.float16):
                loss = m(xc[i]).pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            theirs.append((loss.item(), scaler.get_scale()))
        their_w = m.weight.detach().double().cpu()

    def skips(rows, init):
        prev, n = init, 0
        for _, s in rows:
            n += s < prev
            prev = s
        return n

    worst = max(abs(a[0] - b[0]) / max(abs(b[0]), 1e-12) for a, b in zip(ours, theirs))
    wdiff = ((our_w - their_w).abs().max() / their_w.abs().max()).item()
    ours_skipped, theirs_skipped = skips(ours, args.init_scale), skips(theirs, args.init_scale)
    ok = len(ours) == args.steps and worst <= args.rtol and wdiff <= args.wtol and ours_skipped <= theirs_skipped
    print(f"amp_fidelity: {args.steps} steps from scale {args.init_scale:g}: skipped tapegrad {ours_skipped}, "
          f"PyTorch {theirs_skipped}; worst loss rel diff {worst:.3g}; weights max rel diff {wdiff:.3g}; "
          f"final scale {ours[-1][1]:g} / {theirs[-1][1]:g}: {'ok' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
