#!/usr/bin/env python3
"""ResNet-18 against torchvision (issue #17): the same weights and batch give the same logits and
the same SGD-momentum steps, fp32 with TF32 off on both sides.

1. torchvision.models.resnet18(num_classes=10) from --seed; its batch norms' weights, biases and
   running statistics are drawn at random (so that eval mode is not the identity there) and
   num_batches_tracked set to 3; the state_dict is saved as safetensors, with a batch of --batch
   3x--size x--size images and labels.
2. examples/resnet --load ... --input ... writes the eval-mode logits, the first step's train-mode
   logits and the losses, takes --steps SGD steps (lr, momentum, weight_decay) on the batch in
   train mode, and saves its state_dict.
3. The same in PyTorch. Checks: state_dict keys identical; logits (eval and train) within --rtol
   (1e-4) relative; every parameter and running statistic after the steps within --rtol relative;
   num_batches_tracked equal; each parameter's update (new - old) within --update-rtol (1e-3)
   relative. Relative: max |ours - torch| / max |torch| over the tensor.

    python3 tests/parity/resnet_parity.py --exe build/<dir>/examples/resnet [--device cuda|cpu]

Needs torch, torchvision and safetensors. Exits 1 on a failed check, 2 when something is missing.
"""
import argparse
import os
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", required=True, help="path to the resnet example")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--size", type=int, default=32, help="image height and width")
    ap.add_argument("--steps", type=int, default=2, help="SGD steps (2: the second one uses the momentum buffer)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=5e-4)
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--update-rtol", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default="", help="keep the files here (default: a temporary directory)")
    args = ap.parse_args()

    try:
        import torch
        import torchvision
        from safetensors.torch import load_file, save_file
    except ImportError as e:
        print(f"resnet_parity: missing module: {e}", file=sys.stderr)
        return 2
    if not os.path.exists(args.exe):
        print(f"resnet_parity: no executable at {args.exe}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("resnet_parity: torch sees no CUDA device", file=sys.stderr)
        return 2

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    dev = torch.device(args.device)
    work = args.workdir or tempfile.mkdtemp(prefix="tg_resnet_")
    os.makedirs(work, exist_ok=True)

    # ---- weights and batch
    torch.manual_seed(args.seed)
    model = torchvision.models.resnet18(num_classes=10)
    g = torch.Generator().manual_seed(args.seed + 1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                c = m.num_features
                m.weight.copy_(1 + 0.2 * torch.randn(c, generator=g))
                m.bias.copy_(0.1 * torch.randn(c, generator=g))
                m.running_mean.copy_(0.1 * torch.randn(c, generator=g))
                m.running_var.copy_(0.5 + torch.rand(c, generator=g))
                m.num_batches_tracked.fill_(3)
    init = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    x = torch.randn(args.batch, 3, args.size, args.size, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    f_init, f_batch = os.path.join(work, "init.safetensors"), os.path.join(work, "batch.safetensors")
    f_logits, f_after = os.path.join(work, "logits.safetensors"), os.path.join(work, "after.safetensors")
    save_file(init, f_init)
    save_file({"x": x.contiguous(), "y": y.contiguous()}, f_batch)

    # ---- tapegrad
    cmd = [args.exe, "--device", args.device, "--num-classes", "10", "--load", f_init, "--input", f_batch,
           "--logits", f_logits, "--save", f_after, "--steps", str(args.steps), "--lr", repr(args.lr),
           "--momentum", repr(args.momentum), "--weight-decay", repr(args.weight_decay), "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"resnet_parity: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}",
              file=sys.stderr)
        return 1
    ours_logits = load_file(f_logits)
    ours_after = load_file(f_after)

    # ---- PyTorch
    model = model.to(dev)
    xd, yd = x.to(dev), y.to(dev)
    model.eval()
    with torch.no_grad():
        ref_eval = model(xd).cpu()
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    ref_losses, ref_train = [], None
    for s in range(args.steps):
        opt.zero_grad()
        logits = model(xd)
        loss = torch.nn.functional.cross_entropy(logits, yd)
        loss.backward()
        opt.step()
        if s == 0:
            ref_train = logits.detach().cpu()
        ref_losses.append(loss.item())
    ref_after = {k: v.detach().cpu() for k, v in model.state_dict().items()}

    ok = True

    def rel(a, b):
        a, b = a.double(), b.double()
        return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()

    def check(label, value, tol):
        nonlocal ok
        good = value <= tol
        ok &= good
        print(f"resnet parity ({args.device}): {label}: {value:.3e} {'<=' if good else '>'} {tol:g}: "
              f"{'PASS' if good else 'FAIL'}")

    keys_ok = set(ours_after) == set(ref_after)
    ok &= keys_ok
    print(f"resnet parity ({args.device}): state_dict keys ({len(ref_after)}) "
          f"{'match' if keys_ok else 'DIFFER: ' + str(sorted(set(ours_after) ^ set(ref_after)))}: "
          f"{'PASS' if keys_ok else 'FAIL'}")
    if not keys_ok:
        return 1
    check("eval logits, max relative difference", rel(ours_logits["eval"], ref_eval), args.rtol)
    check("train logits (step 1), max relative difference", rel(ours_logits["train"], ref_train), args.rtol)
    ours_losses = ours_logits["loss"].double().tolist()
    for s, (a, b) in enumerate(zip(ours_losses, ref_losses)):
        print(f"  step {s}: loss torch {b:.9g} tapegrad {a:.9g}")
    check(f"losses of {args.steps} step(s)", max(abs(a - b) / max(abs(b), 1e-30)
                                                  for a, b in zip(ours_losses, ref_losses)), args.rtol)

    worst_p, worst_p_name, worst_u, worst_u_name, nbt_ok = 0.0, "", 0.0, "", True
    params = dict(model.named_parameters())
    for k, ref in ref_after.items():
        got = ours_after[k]
        if tuple(got.shape) != tuple(ref.shape):
            print(f"resnet parity: {k}: shape {tuple(got.shape)} != torch's {tuple(ref.shape)}: FAIL")
            ok = False
            continue
        if k.endswith("num_batches_tracked"):
            nbt_ok &= int(got.item()) == int(ref.item())
            continue
        r = rel(got, ref)
        if r > worst_p:
            worst_p, worst_p_name = r, k
        if k in params:
            u = rel(got.double() - init[k].double(), ref.double() - init[k].double())
            if u > worst_u:
                worst_u, worst_u_name = u, k
    check(f"parameters and running stats after {args.steps} SGD step(s) (worst {worst_p_name})", worst_p, args.rtol)
    check(f"parameter updates new - old (worst {worst_u_name})", worst_u, args.update_rtol)
    ok &= nbt_ok
    print(f"resnet parity ({args.device}): num_batches_tracked {'equal' if nbt_ok else 'DIFFER'}: "
          f"{'PASS' if nbt_ok else 'FAIL'}")
    print(f"resnet: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
