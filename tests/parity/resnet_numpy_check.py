#!/usr/bin/env python3
"""examples/resnet's parity mode against a float64 NumPy ResNet-18 (no PyTorch needed; CPU).

Weights: the example's own checkpoint after one synthetic training step (so batch-norm statistics
and weights are not at their initial values). Batch: 4 random 3x32x32 images and labels, written
as safetensors (and as .npy for the --input x.npy --labels y.npy path). The example runs one SGD
step (lr 0.05, momentum 0.9, weight_decay 5e-4); checked against NumPy in float64:
  - eval-mode and train-mode logits, and the loss;
  - running_mean / running_var of every batch norm after the step (momentum 0.1, unbiased
    variance) and num_batches_tracked + 1;
  - fc.weight and fc.bias after the step (their gradients in closed form: softmax - one-hot).
Tolerance --rtol (1e-4), relative to each tensor's largest magnitude.

    python3 tests/parity/resnet_numpy_check.py --exe build/<dir>/examples/resnet

Needs numpy. Exits 1 on a failed check, 2 when numpy or the executable is missing.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", required=True)
    ap.add_argument("--rtol", type=float, default=1e-4)
    args = ap.parse_args()
    try:
        import numpy as np
    except ImportError as e:
        print(f"resnet_numpy_check: missing module: {e}", file=sys.stderr)
        return 2
    if not os.path.exists(args.exe):
        print(f"resnet_numpy_check: no executable at {args.exe}", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="tg_resnet_np_")
    lr, momentum, wd = 0.05, 0.9, 5e-4

    def save(tensors, path):  # safetensors: 8-byte header length, JSON header, data
        header, blobs, off = {}, [], 0
        for k, v in tensors.items():
            b = np.ascontiguousarray(v).tobytes()
            header[k] = {"dtype": {"float32": "F32", "int64": "I64"}[str(v.dtype)], "shape": list(v.shape),
                         "data_offsets": [off, off + len(b)]}
            off += len(b)
            blobs.append(b)
        h = json.dumps(header).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))

    def load(path):
        with open(path, "rb") as f:
            b = f.read()
        n = struct.unpack("<Q", b[:8])[0]
        header, data, out = json.loads(b[8:8 + n]), b[8 + n:], {}
        for k, v in header.items():
            if k == "__metadata__":
                continue
            dt = {"F32": np.float32, "F64": np.float64, "I64": np.int64}[v["dtype"]]
            s, e = v["data_offsets"]
            a = np.frombuffer(data[s:e], dtype=dt).reshape(v["shape"])
            out[k] = a.astype(np.float64) if dt != np.int64 else a.copy()
        return out

    def run(cmd):
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            print(f"resnet_numpy_check: {' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}",
                  file=sys.stderr)
            sys.exit(1)

    f_init, f_batch = os.path.join(work, "init.safetensors"), os.path.join(work, "batch.safetensors")
    f_logits, f_after = os.path.join(work, "logits.safetensors"), os.path.join(work, "after.safetensors")
    run([args.exe, "--device", "cpu", "--synthetic", "1", "--batch", "4", "--lr", "0.01", "--quiet", "--save", f_init])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, 4).astype(np.int64)
    save({"x": x, "y": y}, f_batch)
    np.save(os.path.join(work, "x.npy"), x)
    np.save(os.path.join(work, "y.npy"), y)
    common = ["--device", "cpu", "--load", f_init, "--steps", "1", "--lr", repr(lr), "--momentum", repr(momentum),
              "--weight-decay", repr(wd), "--quiet"]
    run([args.exe, "--input", f_batch, "--logits", f_logits, "--save", f_after] + common)
    f_logits_npy = os.path.join(work, "logits_npy.safetensors")
    run([args.exe, "--input", os.path.join(work, "x.npy"), "--labels", os.path.join(work, "y.npy"),
         "--logits", f_logits_npy] + common)
    W, ours, after, ours_npy = load(f_init), load(f_logits), load(f_after), load(f_logits_npy)
    xb = x.astype(np.float64)

    def conv(t, w, stride, pad):
        t = np.pad(t, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        k = w.shape[2]
        win = np.lib.stride_tricks.sliding_window_view(t, (k, k), axis=(2, 3))[:, :, ::stride, ::stride]
        return np.einsum("nchwij,ocij->nohw", win, w)

    stats = {}  # batch norm -> (batch mean, unbiased batch variance) of the train-mode forward

    def bn(t, p, train):
        if train:
            m, v = t.mean((0, 2, 3)), t.var((0, 2, 3))
            n = t.size / t.shape[1]
            stats[p] = (m, v * n / (n - 1))
        else:
            m, v = W[p + ".running_mean"], W[p + ".running_var"]
        c = lambda a: a[None, :, None, None]
        return (t - c(m)) / np.sqrt(c(v) + 1e-5) * c(W[p + ".weight"]) + c(W[p + ".bias"])

    def maxpool(t):
        t = np.pad(t, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
        return np.lib.stride_tricks.sliding_window_view(t, (3, 3), axis=(2, 3))[:, :, ::2, ::2].max((4, 5))

    relu = lambda t: np.maximum(t, 0)

    def forward(train):
        h = maxpool(relu(bn(conv(xb, W["conv1.weight"], 2, 3), "bn1", train)))
        for layer in range(1, 5):
            for b in range(2):
                p, s = f"layer{layer}.{b}", 2 if layer > 1 and b == 0 else 1
                o = relu(bn(conv(h, W[p + ".conv1.weight"], s, 1), p + ".bn1", train))
                o = bn(conv(o, W[p + ".conv2.weight"], 1, 1), p + ".bn2", train)
                ds = p + ".downsample.0.weight"
                h = relu(o + (bn(conv(h, W[ds], s, 0), p + ".downsample.1", train) if ds in W else h))
        feat = h.mean((2, 3))
        return feat, feat @ W["fc.weight"].T + W["fc.bias"]

    ok = True

    def check(label, got, want):
        nonlocal ok
        r = float(np.abs(np.asarray(got) - np.asarray(want)).max() / max(np.abs(np.asarray(want)).max(), 1e-30))
        good = r <= args.rtol
        ok &= good
        print(f"resnet numpy check: {label}: {r:.3e} {'<=' if good else '>'} {args.rtol:g}: "
              f"{'PASS' if good else 'FAIL'}")

    _, ref_eval = forward(False)
    feat, ref_train = forward(True)
    check("eval logits", ours["eval"], ref_eval)
    check("eval logits (.npy input)", ours_npy["eval"], ref_eval)
    check("train logits", ours["train"], ref_train)
    z = ref_train - ref_train.max(1, keepdims=True)
    prob = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    loss = float((np.log(np.exp(z).sum(1)) - z[np.arange(4), y]).mean())
    check("loss", ours["loss"][:1], [loss])
    worst_mean, worst_var, nbt_ok = 0.0, 0.0, True
    for p, (m, v) in stats.items():
        check_m = np.abs(after[p + ".running_mean"] - (0.9 * W[p + ".running_mean"] + 0.1 * m)).max()
        check_v = np.abs(after[p + ".running_var"] - (0.9 * W[p + ".running_var"] + 0.1 * v)).max()
        worst_mean = max(worst_mean, check_m / max(np.abs(0.9 * W[p + ".running_mean"] + 0.1 * m).max(), 1e-30))
        worst_var = max(worst_var, check_v / max(np.abs(0.9 * W[p + ".running_var"] + 0.1 * v).max(), 1e-30))
        nbt_ok &= int(after[p + ".num_batches_tracked"]) == int(W[p + ".num_batches_tracked"]) + 1
    for label, worst in (("running_mean", worst_mean), ("running_var", worst_var)):
        good = worst <= args.rtol
        ok &= good
        print(f"resnet numpy check: {label} of {len(stats)} batch norms after the step: {worst:.3e} "
              f"{'<=' if good else '>'} {args.rtol:g}: {'PASS' if good else 'FAIL'}")
    ok &= nbt_ok
    print(f"resnet numpy check: num_batches_tracked + 1: {'PASS' if nbt_ok else 'FAIL'}")
    # SGD with momentum, first step: buf = g + wd * p; p -= lr * buf.
    d = (prob - np.eye(10)[y]) / 4
    for name, g in (("fc.weight", d.T @ feat), ("fc.bias", d.sum(0))):
        check(f"{name} after one SGD step", after[name], W[name] - lr * (g + wd * W[name]))
    print(f"resnet numpy check: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
