#!/usr/bin/env python3
"""Draw a metrics log (tg::data::MetricsLog: JSON lines or CSV) as PNG curves.

    python3 scripts/plot_metrics.py run.jsonl                  # writes run.png
    python3 scripts/plot_metrics.py run.csv -o curves.png --x epoch

One panel per group: the values whose name holds "loss", those that hold "acc" (accuracy), and
every other value in a panel of its own (lr, samples_per_s, ...); step, epoch and time are x axes,
not curves. Non-finite values (null in JSON, nan/inf in CSV) and empty CSV cells are gaps.

Needs matplotlib (pip install matplotlib); installs nothing itself. Exit codes: 0 done, 1 matplotlib
missing, 2 a bad command line or log.
"""
import argparse
import csv
import json
import math
import os
import sys

AXES = ("step", "epoch", "time")


def read_log(path):
    """The records of a .jsonl/.ndjson or .csv log as a list of {name: float or None}."""
    records = []
    if path.endswith(".csv"):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                records.append({k: (float(v) if v not in ("", None) else None) for k, v in row.items()})
    elif path.endswith((".jsonl", ".ndjson")):
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                rec = json.loads(line)
                if not isinstance(rec, dict):
                    raise ValueError(f"line {n}: not a JSON object")
                records.append({k: (float(v) if isinstance(v, (int, float)) else None) for k, v in rec.items()})
    else:
        raise ValueError("the name must end in .jsonl, .ndjson or .csv")
    return records


def groups(names):
    """Panels: losses together, accuracies together, every other value alone."""
    loss = [n for n in names if "loss" in n.lower()]
    acc = [n for n in names if "acc" in n.lower() and n not in loss]
    rest = [[n] for n in names if n not in loss and n not in acc]
    return [g for g in [loss, acc] if g] + rest


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", help="metrics log (.jsonl, .ndjson or .csv)")
    ap.add_argument("-o", "--out", help="PNG to write (default: the log's name with .png)")
    ap.add_argument("--x", choices=AXES, default=None, help="x axis (default: step, or epoch when step is absent)")
    ap.add_argument("--title", default=None, help="figure title (default: the log's file name)")
    args = ap.parse_args(argv)

    try:
        records = read_log(args.log)
    except (OSError, ValueError) as e:
        print(f"plot_metrics: {args.log}: {e}", file=sys.stderr)
        return 2
    if not records:
        print(f"plot_metrics: {args.log}: no records", file=sys.stderr)
        return 2
    xname = args.x or next((a for a in ("step", "epoch") if any(r.get(a) is not None for r in records)), None)
    if xname is None or not any(r.get(xname) is not None for r in records):
        print(f"plot_metrics: {args.log}: no '{args.x or 'step'}' field to plot against", file=sys.stderr)
        return 2
    names = []
    for r in records:
        names += [k for k in r if k not in AXES and k not in names]
    if not names:
        print(f"plot_metrics: {args.log}: no values to plot (only {', '.join(AXES)})", file=sys.stderr)
        return 2

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_metrics: matplotlib is not installed; install it with `python3 -m pip install matplotlib` "
              "(this script installs nothing itself)", file=sys.stderr)
        return 1

    panels = groups(names)
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 2.6 * len(panels)), sharex=True, squeeze=False)
    for ax, panel in zip(axes[:, 0], panels):
        for name in panel:
            pts = [(r[xname], r[name]) for r in records
                   if r.get(xname) is not None and r.get(name) is not None and math.isfinite(r[name])]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 50 else None, label=name)
        ax.set_ylabel(panel[0] if len(panel) == 1 else ("loss" if "loss" in panel[0].lower() else "accuracy"))
        ax.grid(True, alpha=0.3)
        if len(panel) > 1 or ax.get_ylabel() != panel[0]:
            ax.legend()
    axes[-1, 0].set_xlabel(xname)
    fig.suptitle(args.title or os.path.basename(args.log))
    fig.tight_layout()
    out = args.out or os.path.splitext(args.log)[0] + ".png"
    fig.savefig(out, format="png", dpi=100)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
