#!/usr/bin/env python3
"""Parity of tg::optim::lr_scheduler with torch.optim.lr_scheduler.

Runs examples/lr_schedules (which prints, as JSON, every group's lr after the constructor and
after each of 100 steps for each configuration below) and the same configurations in PyTorch
(SGD or Adam with two parameter groups, lr 0.1 and 0.02), and compares every value, and the
momentum / beta1 that OneCycleLR cycles. Both sides compute in float64 with the same formulas, so
the tolerance is tight (1e-12 relative).

    python3 tests/parity/lr_scheduler_parity.py --bin build/<dir>/examples/lr_schedules

Needs torch. Exits 1 on a mismatch, 2 when torch or the program is missing.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import warnings


def sgd(torch):
    a = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    return torch.optim.SGD([{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.02}], lr=0.1, momentum=0.9)


def adam(torch):
    a = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    return torch.optim.Adam([{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.02}], lr=0.1, betas=(0.9, 0.98))


def plateau_metric(e):
    return 10.0 - 0.2 * e if e < 30 else 4.0 + 0.001 * ((e * 7) % 5)


def cases(torch, steps):
    S = torch.optim.lr_scheduler
    return {
        "StepLR": (sgd, lambda o: S.StepLR(o, 7, 0.5), None),
        "MultiStepLR": (sgd, lambda o: S.MultiStepLR(o, [10, 25, 25, 60], 0.3), None),
        "ConstantLR": (sgd, lambda o: S.ConstantLR(o, 0.25, 12), None),
        "LinearLR": (sgd, lambda o: S.LinearLR(o, 0.2, 0.9, 30), None),
        "ExponentialLR": (sgd, lambda o: S.ExponentialLR(o, 0.97), None),
        "CosineAnnealingLR": (sgd, lambda o: S.CosineAnnealingLR(o, 40, 0.001), None),
        "CosineAnnealingWarmRestarts": (sgd, lambda o: S.CosineAnnealingWarmRestarts(o, 10, 2, 0.0005), None),
        "LambdaLR": (sgd, lambda o: S.LambdaLR(o, [lambda e: 1.0 / (1.0 + 0.05 * e), lambda e: math.pow(0.99, e)]),
                     None),
        "SequentialLR": (sgd, lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.1, 1.0, 5), S.CosineAnnealingLR(o, 60)],
                                                        [5]), None),
        "SequentialLR3": (sgd, lambda o: S.SequentialLR(
            o, [S.ConstantLR(o, 0.5, 3), S.ExponentialLR(o, 0.9), S.StepLR(o, 10, 0.5)], [10, 30]), None),
        "SequentialLRWarmRestarts": (sgd, lambda o: S.SequentialLR(
            o, [S.ConstantLR(o, 0.5, 5), S.CosineAnnealingWarmRestarts(o, 10, 1, 0.001)], [8]), None),
        "ReduceLROnPlateau": (sgd, lambda o: S.ReduceLROnPlateau(o, factor=0.7, patience=3, threshold=0.01,
                                                                 cooldown=2, min_lr=1e-3), None),
        "ReduceLROnPlateauMaxAbs": (sgd, lambda o: S.ReduceLROnPlateau(
            o, mode="max", factor=0.5, patience=2, threshold=0.05, threshold_mode="abs", min_lr=[1e-3, 1e-4]), None),
        "OneCycleLR": (sgd, lambda o: S.OneCycleLR(o, [0.5, 0.1], total_steps=steps), lambda g: g["momentum"]),
        "OneCycleLRLinearThreePhaseAdam": (adam, lambda o: S.OneCycleLR(
            o, 0.8, epochs=steps // 10, steps_per_epoch=10, pct_start=0.25, anneal_strategy="linear",
            base_momentum=0.8, max_momentum=0.9, div_factor=10, final_div_factor=100, three_phase=True),
            lambda g: g["betas"][0]),
    }


def torch_run(torch, make_opt, make_sched, momentum, steps, plateau):
    opt = make_opt(torch)
    sched = make_sched(opt)
    lrs, moms = [], []

    def record():
        lrs.append([float(g["lr"]) for g in opt.param_groups])
        if momentum is not None:
            moms.append([float(momentum(g)) for g in opt.param_groups])

    record()
    for e in range(steps):
        opt.step()  # no gradients: nothing moves, but PyTorch sees the optimizer step first
        if plateau:
            sched.step(plateau_metric(e))
        else:
            sched.step()
        record()
    return lrs, moms


def compare(name, what, ours, theirs, rtol):
    if len(ours) != len(theirs):
        return [f"{name} {what}: {len(ours)} rows from tapegrad, {len(theirs)} from torch"], math.inf
    bad, worst = [], 0.0
    for e, (a, b) in enumerate(zip(ours, theirs)):
        if len(a) != len(b):
            bad.append(f"{name} {what} step {e}: {len(a)} groups vs {len(b)}")
            continue
        for g, (x, y) in enumerate(zip(a, b)):
            err = abs(x - y) / max(abs(y), 1e-300)
            worst = max(worst, err)
            if err > rtol and abs(x - y) > 1e-300:
                bad.append(f"{name} {what} step {e} group {g}: tapegrad {x!r} torch {y!r} (rel {err:.3g})")
    return bad, worst


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="path to the lr_schedules example")
    ap.add_argument("--steps", type=int, default=100, help="steps per schedule (a multiple of 10)")
    ap.add_argument("--rtol", type=float, default=1e-12)
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"lr_scheduler_parity: missing module: {e}", file=sys.stderr)
        return 2
    if not os.path.exists(args.bin):
        print(f"lr_scheduler_parity: no program at {args.bin}", file=sys.stderr)
        return 2
    out = subprocess.run([args.bin, "--steps", str(args.steps)], check=True, capture_output=True, text=True).stdout
    ours = json.loads(out)
    warnings.simplefilter("ignore")
    table = cases(torch, args.steps)
    failures = []
    if set(ours) != set(table):
        failures.append(f"configurations differ: only tapegrad {sorted(set(ours) - set(table))}, "
                        f"only torch {sorted(set(table) - set(ours))}")
    print(f"torch {torch.__version__}; {args.steps} steps per schedule; rtol {args.rtol:g}")
    print(f"{'schedule':34s} {'values':>7s} {'max rel diff':>13s}  result")
    for name, (make_opt, make_sched, momentum) in table.items():
        if name not in ours:
            continue
        lrs, moms = torch_run(torch, make_opt, make_sched, momentum, args.steps, name.startswith("ReduceLROnPlateau"))
        bad, worst = compare(name, "lr", ours[name]["lr"], lrs, args.rtol)
        count = sum(len(r) for r in lrs)
        if momentum is not None:
            bad_m, worst_m = compare(name, "momentum", ours[name].get("momentum", []), moms, args.rtol)
            bad += bad_m
            worst = max(worst, worst_m)
            count += sum(len(r) for r in moms)
        failures += bad
        print(f"{name:34s} {count:7d} {worst:13.3g}  {'ok' if not bad else 'FAIL'}")
    for f in failures[:40]:
        print("  " + f)
    print("PASS" if not failures else f"FAIL ({len(failures)} mismatches)")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
