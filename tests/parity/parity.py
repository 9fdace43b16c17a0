#!/usr/bin/env python3
"""Parity of the regression example with PyTorch (issue #4).

PyTorch draws the data, the initial weights of Sequential(Linear(64, 1)) and a
batch order, writes them as safetensors, and trains 50 Adam steps on the MSE.
Our example (examples/train_regression.cpp in parity mode) trains from the same
files; the per-step losses must agree within 1e-5 relative (fp32, TF32 off).

    python3 tests/parity/parity.py --exe build/<dir>/examples/train_regression [--device cuda|cpu]

Needs torch and safetensors. Exits 1 on a mismatch, 2 when something is missing.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", required=True, help="path to the train_regression example")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--rows", type=int, default=0, help="dataset rows (default: steps * batch, one epoch)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--rtol", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default="", help="keep the files here (default: a temporary directory)")
    args = ap.parse_args()

    try:
        import torch
        from safetensors.torch import save_file
    except ImportError as e:
        print(f"parity: missing module: {e}", file=sys.stderr)
        return 2
    if not os.path.exists(args.exe):
        print(f"parity: no executable at {args.exe}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("parity: torch sees no CUDA device", file=sys.stderr)
        return 2

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(args.device)
    g = torch.Generator().manual_seed(args.seed)
    rows = args.rows or args.steps * args.batch
    raw = torch.rand(rows, 64, generator=g)
    x = ((raw - raw.mean(0)) / raw.std(0)).contiguous()
    y = torch.randn(rows, 1, generator=g)
    # The batch order: a new permutation per epoch, full batches only, [steps, batch].
    per_epoch = rows // args.batch
    assert per_epoch > 0, "rows must be >= batch"
    chunks, left = [], args.steps
    while left > 0:
        perm = torch.randperm(rows, generator=g)[: per_epoch * args.batch].view(per_epoch, args.batch)
        chunks.append(perm[:left])
        left -= perm[:left].shape[0]
    order = torch.cat(chunks).contiguous()

    torch.manual_seed(args.seed)
    net = torch.nn.Sequential(torch.nn.Linear(64, 1))
    init = {k: v.detach().contiguous() for k, v in net.state_dict().items()}

    work = args.workdir or tempfile.mkdtemp(prefix="tg_parity_")
    os.makedirs(work, exist_ok=True)
    f_init, f_data, f_order = (os.path.join(work, n) for n in ("init.safetensors", "data.safetensors", "order.safetensors"))
    save_file(init, f_init)
    save_file({"x": x, "y": y}, f_data)
    save_file({"order": order}, f_order)

    # PyTorch's run.
    net = net.to(dev)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    xd, yd, od = x.to(dev), y.to(dev), order.to(dev)
    ref = []
    for s in range(order.shape[0]):
        idx = od[s]
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(xd.index_select(0, idx)), yd.index_select(0, idx))
        loss.backward()
        opt.step()
        ref.append(loss.item())

    # Ours.
    cmd = [args.exe, "--init", f_init, "--data", f_data, "--order", f_order, "--lr", repr(args.lr),
           "--out", os.path.join(work, "tg_net.safetensors")]
    if args.device == "cpu":
        cmd.append("--cpu")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"parity: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}", file=sys.stderr)
        return 1
    ours = {int(m.group(1)): float(m.group(2))
            for m in re.finditer(r"^step (\d+) loss (\S+)$", proc.stdout, re.MULTILINE)}
    if len(ours) != len(ref):
        print(f"parity: expected {len(ref)} steps, got {len(ours)}:\n{proc.stdout}", file=sys.stderr)
        return 1

    worst = 0.0
    print(f"{'step':>4}  {'torch':>14}  {'tapegrad':>14}  {'rel diff':>9}")
    for s, r in enumerate(ref):
        o = ours[s]
        rel = abs(o - r) / max(abs(r), 1e-30)
        worst = max(worst, rel)
        print(f"{s:4d}  {r:14.9g}  {o:14.9g}  {rel:9.2e}")
    ok = worst <= args.rtol
    print(f"parity ({args.device}, {len(ref)} steps, batch {args.batch}): max relative loss difference "
          f"{worst:.3e} {'<=' if ok else '>'} {args.rtol:g}: {'PASS' if ok else 'FAIL'}")
    # The final weights too, for information.
    try:
        from safetensors.torch import load_file
        theirs = {k: v.cpu() for k, v in net.state_dict().items()}
        mine = load_file(os.path.join(work, "tg_net.safetensors"))
        diff = max((theirs[k] - mine[k]).abs().max().item() for k in theirs)
        print(f"final weights: max abs difference {diff:.3e}")
    except Exception as e:  # informational only
        print(f"final weights: not compared ({e})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
