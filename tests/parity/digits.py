#!/usr/bin/env python3
"""scikit-learn's bundled digits dataset (1797 8x8 images, 10 classes; no download) as the files
examples/classify reads (issue #15).

The rows are shuffled with a fixed seed; the first 1500 are the training rows and the last 297
the test rows, so `classify --test-size 297` splits them the same way. Written into --out:

    digits-images-idx3-ubyte   IDX uint8 [1797, 8, 8], pixel values 0..16 (classify --scale 0.0625)
    digits-labels-idx1-ubyte   IDX uint8 [1797]
    X.npy                      float32 [1797, 64], pixels / 16
    y.npy                      int64 [1797]

    python3 tests/parity/digits.py --out DIR [--seed 0]

Needs numpy and scikit-learn. Exits 2 when they are missing.
"""
import argparse
import os
import struct
import sys

N_TRAIN, N_TEST = 1500, 297


def write_idx(path, array):
    """An IDX file (big-endian dims and elements) of a uint8 / int8 / int16 / int32 / float32 / float64 array."""
    import numpy as np
    codes = {np.uint8: 0x08, np.int8: 0x09, np.int16: 0x0B, np.int32: 0x0C, np.float32: 0x0D, np.float64: 0x0E}
    code = codes[array.dtype.type]
    with open(path, "wb") as f:
        f.write(bytes([0, 0, code, array.ndim]))
        f.write(b"".join(struct.pack(">I", n) for n in array.shape))
        f.write(np.ascontiguousarray(array).astype(array.dtype.newbyteorder(">")).tobytes())


def convert(out, seed=0):
    """Writes the four files into `out`; returns (X float32 [N, 64], y int64 [N]) in file order."""
    import numpy as np
    from sklearn.datasets import load_digits
    d = load_digits()
    images = d.images.astype(np.uint8)  # 0..16
    labels = d.target.astype(np.int64)
    assert images.shape == (N_TRAIN + N_TEST, 8, 8), images.shape
    perm = np.random.default_rng(seed).permutation(images.shape[0])
    images, labels = images[perm], labels[perm]
    os.makedirs(out, exist_ok=True)
    write_idx(os.path.join(out, "digits-images-idx3-ubyte"), images)
    write_idx(os.path.join(out, "digits-labels-idx1-ubyte"), labels.astype(np.uint8))
    x = (images.reshape(-1, 64).astype(np.float32) / 16.0).astype(np.float32)
    np.save(os.path.join(out, "X.npy"), x)
    np.save(os.path.join(out, "y.npy"), labels)
    return x, labels


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    try:
        import numpy  # noqa: F401
        import sklearn  # noqa: F401
    except ImportError as e:
        print(f"digits: missing module: {e}", file=sys.stderr)
        return 2
    x, y = convert(args.out, args.seed)
    print(f"digits: {x.shape[0]} rows ({N_TRAIN} train / {N_TEST} test), {x.shape[1]} features, "
          f"{int(y.max()) + 1} classes -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
