#!/usr/bin/env python3
"""A tapegrad Adam state loaded into torch.optim.Adam (issue 16).

tapegrad (the test Checkpoint.WritesAdamStateForTorch of tg_nn_tests) trains Linear(5, 3) a few
Adam steps in two parameter groups (amsgrad, weight decay), and writes one checkpoint with the
model, the optimizer's StateDict, the data of the next step, and the model and optimizer state
after that step. This script maps the optimizer's flat names to torch's nested state_dict

    "state.<i>.<name>"            -> sd['state'][i][name]
    "param_groups.<g>.<option>"   -> sd['param_groups'][g][option]   (0-d -> float / bool, betas -> tuple)
    "param_groups.<g>.params"     -> sd['param_groups'][g]['params']  (list of indices)

loads it into a torch.optim.Adam over the same weights, takes the same step, and checks the
weights against tapegrad's (--rtol) and, mapped back to flat names, the optimizer state too.

    python3 tests/parity/optim_state_to_torch.py --exe build/<dir>/tests/tg_nn_tests

Needs torch and safetensors (CPU is enough). Exits 1 on a mismatch, 2 when something is missing.
"""
import argparse
import os
import subprocess
import sys
import tempfile


def is_bool(v):
    return str(v.dtype).endswith("bool")


def to_torch_optim_state(flat):
    """tapegrad's flat optimizer StateDict -> torch.optim's {'state': ..., 'param_groups': [...]}.
    Works on torch tensors and numpy arrays alike."""
    state, groups = {}, {}
    for key, v in flat.items():
        head, _, rest = key.partition(".")
        index, _, name = rest.partition(".")
        if head == "state":
            state.setdefault(int(index), {})[name] = v
        elif head == "param_groups":
            groups.setdefault(int(index), {})[name] = v
        else:
            raise ValueError(f"not an optimizer entry: {key}")
    param_groups = []
    for g in sorted(groups):
        d = {}
        for name, v in groups[g].items():
            if name == "params":
                d["params"] = [int(i) for i in v.tolist()]
            elif name == "betas":
                d["betas"] = tuple(float(b) for b in v.tolist())
            elif is_bool(v):
                d[name] = bool(v.item())
            else:
                d[name] = float(v.item())
        param_groups.append(d)
    return {"state": state, "param_groups": param_groups}


def from_torch_optim_state(sd, options):
    """torch.optim's state_dict -> tapegrad's flat names (only the options tapegrad has)."""
    flat = {}
    for i, st in sd["state"].items():
        for name, v in st.items():
            flat[f"state.{i}.{name}"] = v
    for g, group in enumerate(sd["param_groups"]):
        for name in options:
            flat[f"param_groups.{g}.{name}"] = group[name]
        flat[f"param_groups.{g}.params"] = group["params"]
    return flat


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", required=True, help="path to tg_nn_tests")
    ap.add_argument("--rtol", type=float, default=1e-5)
    ap.add_argument("--atol", type=float, default=1e-7)
    ap.add_argument("--workdir", default="", help="keep the files here (default: a temporary directory)")
    args = ap.parse_args()
    try:
        import torch
        from safetensors import safe_open
        from safetensors.torch import load_file
    except ImportError as e:
        print(f"optim_state_to_torch: missing module: {e}", file=sys.stderr)
        return 2
    if not os.path.exists(args.exe):
        print(f"optim_state_to_torch: no executable at {args.exe}", file=sys.stderr)
        return 2

    work = args.workdir or tempfile.mkdtemp(prefix="tg_optim_torch_")
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ, TG_TORCH_PARITY_DIR=work)
    run = subprocess.run([args.exe, "--gtest_filter=Checkpoint.WritesAdamStateForTorch"], env=env,
                         capture_output=True, text=True)
    path = os.path.join(work, "adam_state.safetensors")
    if run.returncode != 0 or not os.path.exists(path):
        print(run.stdout + run.stderr, file=sys.stderr)
        print("optim_state_to_torch: tapegrad did not write the checkpoint", file=sys.stderr)
        return 1
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    assert meta.get("format") == "tapegrad.checkpoint", meta
    flat = load_file(path)

    def part(name):
        p = name + "."
        return {k[len(p):]: v for k, v in flat.items() if k.startswith(p)}

    model, opt_flat, after, opt_after = part("model"), part("optimizer"), part("after"), part("optimizer_after")
    x, y = flat["x"], flat["y"]

    lin = torch.nn.Linear(5, 3)
    with torch.no_grad():
        lin.weight.copy_(model["weight"])
        lin.bias.copy_(model["bias"])
    # Other options than the checkpoint's: loading must set them.
    opt = torch.optim.Adam([{"params": [lin.weight]}, {"params": [lin.bias]}], lr=0.5)
    defaults = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
    sd = to_torch_optim_state(opt_flat)
    for g in sd["param_groups"]:
        for k, v in defaults.items():
            g.setdefault(k, v)  # foreach, capturable, ...: torch's defaults
    opt.load_state_dict(sd)
    for g, mine in zip(opt.param_groups, sd["param_groups"]):
        for k in ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"):
            assert g[k] == mine[k], (k, g[k], mine[k])

    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(lin(x), y)
    loss.backward()
    opt.step()

    failures = []

    def check(name, got, want):
        got, want = torch.as_tensor(got).double(), torch.as_tensor(want).double()
        ok = got.shape == want.shape and torch.allclose(got, want, rtol=args.rtol, atol=args.atol)
        if not ok:
            err = (got - want).abs().max().item() if got.shape == want.shape else float("nan")
            failures.append(f"{name}: shapes {list(got.shape)} / {list(want.shape)}, max abs difference {err:.3g}")
        print(f"  {name:40s} {'ok' if ok else 'MISMATCH'}")

    print("weights after one more step (torch from the loaded state vs tapegrad):")
    check("weight", lin.weight.detach(), after["weight"])
    check("bias", lin.bias.detach(), after["bias"])
    print("optimizer state after that step, mapped back to tapegrad's names:")
    back = from_torch_optim_state(opt.state_dict(), ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"))
    if set(back) != set(opt_after):
        failures.append(f"names differ: torch only {sorted(set(back) - set(opt_after))}, "
                        f"tapegrad only {sorted(set(opt_after) - set(back))}")
    for k in sorted(set(back) & set(opt_after)):
        want = opt_after[k]
        got = back[k]
        if isinstance(got, tuple):
            got = list(got)
        check(k, got, want)
    if failures:
        print("FAIL\n  " + "\n  ".join(failures))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
