"""Accuracy of the optimized skl2onnx Gaussian process regressors (issue 29): the default
`scanopt optimize` output against the original, and each against scikit-learn's float64
prediction, on queries at, near and far from the training rows.

    python benchmarks/bench_gpr_accuracy.py                      # models/gpr/ (200 training rows)
    python benchmarks/bench_gpr_accuracy.py --dir DIR --rows 2000

DIR holds what ``models/generate_gpr_accuracy.py --rows N --out DIR`` writes (the 2,000-row
models are not committed: 16 MB each). Each model is optimized twice through the CLI, with
default flags and with ``--input-shape X:128,F`` (the query count a user would name), each in
a fresh process; then original and optimized run in onnxruntime (CPU) on the queries. Printed
per model, command and output: the max abs and max relative difference (relative to the
original, elements where it is 0 left out) optimized vs original, and each vs float64, and
whether the done-when holds: |optimized − original| <= 1e-4 + 1e-4·|original| everywhere.
Also per query kind (exact training rows, near-duplicates at 1e-6 relative, among, far) the
max abs difference optimized vs original, the passes the report names as applied, and below
the table why `distances` was not applied where it was not (the report's own reason). Exits 1
when an output misses the 1e-4 bound.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "models"))
from generate_gpr_accuracy import KINDS, NAMES  # noqa: E402

TOL = 1e-4


def run(path: str, x: np.ndarray) -> dict:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    return {o.name: v for o, v in zip(sess.get_outputs(), sess.run(None, {"X": x}))}


def optimize(src: str, dst: str, extra: list[str]) -> tuple[str, str]:
    """(the passes applied, why distances was not) from the CLI's own JSON report."""
    report = dst + ".json"
    cmd = [sys.executable, "-m", "scanopt", "optimize", src, dst, "--report", report, "-q", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
    with open(report) as f:
        data = json.load(f)
    why = next((o["detail"] for o in data.get("outcomes", []) if o["pass"] == "distances" and not o["applied"]), "")
    if why.startswith("rolled back"):
        why += ": " + ((data.get("verification") or {}).get("details") or {}).get("summary", "")
    return _forms(data), why


def _forms(report: dict) -> str:
    """The passes applied to a Scan, in order (the report's outcomes)."""
    return ",".join(o["pass"] for o in report.get("outcomes", []) if o.get("applied")) or "-"


def diff(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(max abs, max rel to b) of a − b."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64).reshape(np.shape(a))
    d = np.abs(a - b)
    nz = b != 0
    return float(d.max()), float((d[nz] / np.abs(b[nz])).max()) if nz.any() else 0.0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default=os.path.join(ROOT, "models", "gpr"))
    p.add_argument("--rows", type=int, default=200)
    p.add_argument("--only", action="append", choices=NAMES)
    args = p.parse_args(argv)
    failed, notes = False, []
    print(f"| model ({args.rows} rows) | command | output | opt vs orig abs / rel | orig vs f64 abs / rel "
          "| opt vs f64 abs / rel | opt vs orig abs at exact / near / among / far | within 1e-4 | forms |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only or NAMES:
            src = os.path.join(args.dir, f"{name}_{args.rows}.onnx")
            q = np.load(os.path.join(args.dir, f"{name}_{args.rows}.queries.npz"))
            x, kinds = q["X"], q["kind"]
            truth = {"GPmean": q["mean"], "GPcovstd": q["std"]}
            original = run(src, x)
            for label, extra in (("default", []), (f"--input-shape X:128,{x.shape[1]}", ["--input-shape", f"X:128,{x.shape[1]}"])):
                dst = os.path.join(tmp, f"{name}_{len(extra)}.onnx")
                forms, why = optimize(src, dst, extra)
                if why:
                    notes.append(f"{name}, {label}: distances {why}")
                optimized = run(dst, x)
                for out in ("GPmean", "GPcovstd"):
                    o, c, t = original[out], optimized[out], truth[out]
                    ok = bool(np.all(np.abs(c.astype(np.float64) - o) <= TOL + TOL * np.abs(o)))
                    failed |= not ok
                    per_kind = " / ".join(f"{diff(c[kinds == k], o[kinds == k])[0]:.1e}" for k in range(len(KINDS)))
                    cells = [diff(c, o), diff(o, t), diff(c, t)]
                    print(f"| {name} | {label} | {out} | " + " | ".join(f"{a:.1e} / {r:.1e}" for a, r in cells)
                          + f" | {per_kind} | {'yes' if ok else 'NO'} | {forms} |")
    for note in notes:
        print(f"\n- {note}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
