#!/usr/bin/env python3
"""The classifier example against PyTorch on scikit-learn's digits (issue #15).

1. Accuracy: digits.py's files (1500 train / 297 test, fixed seed); the recipe 64-128-10, Adam
   lr 1e-2, batch 64, 30 epochs, in PyTorch and in examples/classify (from X.npy / y.npy, and
   from the IDX files for the IDX path). tapegrad's final test accuracy must be >= --min-acc (97%).
2. Parity: the same initial weights (PyTorch's, saved as safetensors, `classify --init`) and
   the same batch order (`classify --order`), 50 fp32 steps with TF32 off: every step's loss
   within --rtol (1e-5) relative of PyTorch's.

    python3 tests/parity/classify_parity.py --exe build/<dir>/examples/classify [--device cuda|cpu]

Needs torch, safetensors, numpy and scikit-learn. Exits 1 on a failed check, 2 when something
is missing.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def run(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"classify_parity: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}",
              file=sys.stderr)
        return None
    return proc.stdout


def final_accuracy(stdout):
    accs = re.findall(r"test_acc (\S+)", stdout)
    return float(accs[-1]) if accs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", required=True, help="path to the classify example")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--steps", type=int, default=50, help="parity steps")
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--min-acc", type=float, default=0.97)
    ap.add_argument("--rtol", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default="", help="keep the files here (default: a temporary directory)")
    args = ap.parse_args()

    try:
        import numpy as np
        import torch
        from safetensors.torch import save_file
        import digits
    except ImportError as e:
        print(f"classify_parity: missing module: {e}", file=sys.stderr)
        return 2
    if not os.path.exists(args.exe):
        print(f"classify_parity: no executable at {args.exe}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("classify_parity: torch sees no CUDA device", file=sys.stderr)
        return 2

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(args.device)
    work = args.workdir or tempfile.mkdtemp(prefix="tg_classify_")
    x_np, y_np = digits.convert(work, args.seed)
    n_train = digits.N_TRAIN
    x = torch.from_numpy(x_np)
    y = torch.from_numpy(y_np)
    xtr, ytr, xte, yte = x[:n_train].to(dev), y[:n_train].to(dev), x[n_train:].to(dev), y[n_train:].to(dev)
    ok = True

    def model():
        return torch.nn.Sequential(torch.nn.Linear(64, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 10))

    # ---- 1. accuracy: PyTorch's recipe, then ours from the .npy and the IDX files.
    torch.manual_seed(args.seed)
    net = model().to(dev)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    g = torch.Generator().manual_seed(args.seed)
    for _ in range(args.epochs):
        perm = torch.randperm(n_train, generator=g).to(dev)
        for s in range(0, n_train, args.batch):
            idx = perm[s:s + args.batch]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(xtr[idx]), ytr[idx]).backward()
            opt.step()
    with torch.no_grad():
        torch_acc = (net(xte).argmax(1) == yte).float().mean().item()

    common = ["--test-size", str(digits.N_TEST), "--hidden", str(args.hidden), "--epochs", str(args.epochs),
              "--batch", str(args.batch), "--lr", repr(args.lr), "--seed", str(args.seed), "--device", args.device,
              "--no-progress"]
    out_npy = run([args.exe, "--x", os.path.join(work, "X.npy"), "--y", os.path.join(work, "y.npy"),
                   "--out", os.path.join(work, "tg_npy.safetensors")] + common)
    out_idx = run([args.exe, "--x", os.path.join(work, "digits-images-idx3-ubyte"),
                   "--y", os.path.join(work, "digits-labels-idx1-ubyte"), "--scale", "0.0625",
                   "--out", os.path.join(work, "tg_idx.safetensors")] + common)
    acc_npy = final_accuracy(out_npy or "")
    acc_idx = final_accuracy(out_idx or "")
    if acc_npy is None or acc_idx is None:
        print(f"classify_parity: no test accuracy in the example's output:\n{out_npy}\n{out_idx}", file=sys.stderr)
        return 1
    acc_ok = acc_npy >= args.min_acc and acc_idx >= args.min_acc
    ok &= acc_ok
    print(f"digits 64-{args.hidden}-10, Adam lr {args.lr:g}, batch {args.batch}, {args.epochs} epochs "
          f"({args.device}): test accuracy PyTorch {torch_acc:.4f}, tapegrad {acc_npy:.4f} (npy) "
          f"{acc_idx:.4f} (IDX) {'>=' if acc_ok else '<'} {args.min_acc:g}: {'PASS' if acc_ok else 'FAIL'}")

    # ---- 2. parity: same initial weights and batch order, per-step losses.
    torch.manual_seed(args.seed + 1)
    net = model()
    init = {k: v.detach().contiguous() for k, v in net.state_dict().items()}
    per_epoch = n_train // args.batch
    chunks, left = [], args.steps
    while left > 0:
        perm = torch.randperm(n_train, generator=g)[: per_epoch * args.batch].view(per_epoch, args.batch)
        chunks.append(perm[:left])
        left -= perm[:left].shape[0]
    order = torch.cat(chunks).contiguous()
    f_init, f_order = os.path.join(work, "init.safetensors"), os.path.join(work, "order.safetensors")
    save_file(init, f_init)
    save_file({"order": order}, f_order)
    net = net.to(dev)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    od = order.to(dev)
    ref = []
    for s in range(order.shape[0]):
        idx = od[s]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(xtr.index_select(0, idx)), ytr.index_select(0, idx))
        loss.backward()
        opt.step()
        ref.append(loss.item())
    out = run([args.exe, "--x", os.path.join(work, "X.npy"), "--y", os.path.join(work, "y.npy"),
               "--test-size", str(digits.N_TEST), "--hidden", str(args.hidden), "--lr", repr(args.lr),
               "--device", args.device, "--init", f_init, "--order", f_order, "--no-progress",
               "--out", os.path.join(work, "tg_parity.safetensors")])
    if out is None:
        return 1
    ours = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"^step (\d+) loss (\S+)$", out, re.MULTILINE)}
    if len(ours) != len(ref):
        print(f"classify_parity: expected {len(ref)} steps, got {len(ours)}:\n{out}", file=sys.stderr)
        return 1
    worst = 0.0
    print(f"{'step':>4}  {'torch':>14}  {'tapegrad':>14}  {'rel diff':>9}")
    for s, r in enumerate(ref):
        rel = abs(ours[s] - r) / max(abs(r), 1e-30)
        worst = max(worst, rel)
        print(f"{s:4d}  {r:14.9g}  {ours[s]:14.9g}  {rel:9.2e}")
    par_ok = worst <= args.rtol
    ok &= par_ok
    print(f"classify parity ({args.device}, {len(ref)} steps, batch {args.batch}): max relative loss difference "
          f"{worst:.3e} {'<=' if par_ok else '>'} {args.rtol:g}: {'PASS' if par_ok else 'FAIL'}")
    print(f"classify: {'PASS' if ok else 'FAIL'} (accuracy {acc_npy:.4f} npy / {acc_idx:.4f} IDX, "
          f"PyTorch {torch_acc:.4f}; parity {worst:.3e})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
