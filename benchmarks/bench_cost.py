"""Fit the analytic cost model of scanopt/cost.py to this machine's onnxruntime.

    python benchmarks/bench_cost.py [--seconds 0.3] [--threads 1] [--emit] [--from FILE]
                                    [--widths 4x4,32x32,...] [--batches 1,8,32] [--lengths 16,128] [--max-flop 4e9]

The model (cost.model_seconds) prices each form as per-step overhead plus FLOPs and is linear
in its constants (seconds per Scan step, per kernel launch, per FLOP of a one-row, a
several-row and a whole-sequence MatMul, per native step and per recurrent FLOP of the native
kernels). This times the loop, the native op and the hoisted loop of the RNN, GRU
(linear_before_reset 0 and 1) and LSTM cells of benchmarks/bench_policy.py over a grid of
sizes (scanopt.timing: thread CPU time, interleaved, medians, A/A pair), fits the constants by
non-negative least squares on relative error, and prints per form how far the fitted model is
from the measurements. ``--emit`` prints the dict to paste into cost.DEFAULT_CONSTANTS (what a
run without measurements uses on every machine). A point whose loop would do more than
``--max-flop`` FLOPs per run is skipped (the widest cells at the longest lengths). The residuals
table (model / measured per form, at all points and at large ones: T >= 512 or H >= 512) and how
often the model's fastest form is the measured fastest (or within 5% of it) are printed as
markdown for docs/cost-policy.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_policy import cell_model, feeds_of, form, shapes_of  # noqa: E402

from scanopt import cost  # noqa: E402
from scanopt.timing import measure  # noqa: E402

KINDS = ("RNN", "GRU0", "GRU1", "LSTM")
WIDTHS = ((4, 4), (32, 32), (64, 128), (256, 256))  # I, H
BATCHES = (1, 8, 32)
LENGTHS = (16, 128)
FORMS = {"loop": [], "native": ["fuse"], "hoisted": ["hoist"]}
MODEL_FORM = {"loop": "loop", "native": "fuse", "hoisted": "hoist"}


def body_nodes(model) -> int:
    scan = next(n for n in model.graph.node if n.op_type == "Scan")
    return len(next(a.g for a in scan.attribute if a.name == "body").node)


def collect(seconds: float, threads: int, widths=WIDTHS, batches=BATCHES, lengths=LENGTHS, max_flop=float("inf")):
    rows = []  # (form, kind, sizes, body nodes, lifted, measured seconds)
    for kind in KINDS:
        g = cost.GATES[kind.rstrip("01")]
        for i, hd in widths:
            dynamic, states = cell_model(kind, i, hd)
            models = {name: form(dynamic, passes) for name, passes in FORMS.items()}
            nodes = body_nodes(models["loop"])
            lifted = nodes - body_nodes(models["hoisted"]) + 1 if "Scan" in [n.op_type for n in models["hoisted"].graph.node] else 2
            for b in batches:
                for t in lengths:
                    if 2 * t * b * (i + hd) * hd * g > max_flop:
                        continue
                    result = measure(models, feeds_of(shapes_of(states, t, b, i, hd)), threads=threads, seconds=seconds, check_budget=False)
                    if isinstance(result, str):
                        continue
                    for name, timing in result.forms.items():
                        rows.append((MODEL_FORM[name], kind.rstrip("01"), dict(T=t, B=b, I=i, H=hd, K=1), nodes, lifted,
                                     timing.seconds))
                    print(f"{kind:5} T={t:<4} B={b:<3} I={i:<4} H={hd:<4} " + " ".join(
                        f"{n} {v.seconds * 1e3:.3f} ms" for n, v in result.forms.items()) + f" (A/A noise {result.noise:.2f})",
                        flush=True)
    return rows


def reread(path):
    """The rows of an earlier run, from its printed lines (body sizes rebuilt, not re-timed)."""
    import re

    rows, shapes = [], {}
    pattern = re.compile(r"^(\w+)\s+T=(\d+)\s+B=(\d+)\s+I=(\d+)\s+H=(\d+)\s+loop ([\d.]+) ms native ([\d.]+) ms hoisted ([\d.]+) ms")
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            found = pattern.match(line)
            if not found:
                continue
            kind, t, b, i, hd = found.group(1), *(int(v) for v in found.groups()[1:5])
            if (kind, i, hd) not in shapes:
                dynamic, _ = cell_model(kind, i, hd)
                loop, hoisted = form(dynamic, []), form(dynamic, ["hoist"])
                shapes[(kind, i, hd)] = (body_nodes(loop), body_nodes(loop) - body_nodes(hoisted) + 1)
            nodes, lifted = shapes[(kind, i, hd)]
            for name, value in zip(("loop", "fuse", "hoist"), found.groups()[5:]):
                rows.append((name, kind.rstrip("01"), dict(T=t, B=b, I=i, H=hd, K=1), nodes, lifted, float(value) / 1e3))
    return rows


def fit(rows):
    keys = list(cost.DEFAULT_CONSTANTS)
    unit = {k: {j: float(j == k) for j in keys} for k in keys}
    a = np.array([[cost.model_seconds(f, kind, p, n, unit[k], lifted) / secs for k in keys]
                  for f, kind, p, n, lifted, secs in rows])
    try:
        from scipy.optimize import nnls

        x, _ = nnls(a, np.ones(len(rows)))
    except ImportError:
        x = _nnls(a, np.ones(len(rows)))
    return dict(zip(keys, (float(v) for v in x)))


def _nnls(a, y):
    """Non-negative least squares without scipy: least squares over the free constants, the
    most negative one fixed at 0 until none is negative (an active-set loop)."""
    free = [k for k in range(a.shape[1]) if a[:, k].any()]
    x = np.zeros(a.shape[1])
    while free:
        solution = np.linalg.lstsq(a[:, free], y, rcond=None)[0]
        if (solution >= 0).all():
            x[free] = solution
            break
        free.pop(int(np.argmin(solution)))
    return x


def residuals(rows, constants) -> None:
    """Markdown: model / measured per cell and form (median, range), at all points and at large
    ones (T >= 512 or H >= 512); and how often the model's fastest form is the measured one."""
    print("| cell | form | points | model/measured median (range) | large: points | median (range) |")
    print("|---|---|---|---|---|---|")
    for kind in ("RNN", "GRU", "LSTM"):
        for f in MODEL_FORM.values():
            found = [(p, cost.model_seconds(f, k, p, n, constants, lifted) / secs)
                     for g, k, p, n, lifted, secs in rows if g == f and k == kind]
            if not found:
                continue
            big = [r for p, r in found if p["T"] >= 512 or p["H"] >= 512]
            every = [r for _, r in found]
            span = lambda rs: f"{statistics.median(rs):.2f} ({min(rs):.2f}-{max(rs):.2f})" if rs else "-"  # noqa: E731
            print(f"| {kind} | {f} | {len(every)} | {span(every)} | {len(big)} | {span(big)} |")
    groups: dict = {}
    for f, kind, p, n, lifted, secs in rows:
        groups.setdefault((kind, p["T"], p["B"], p["I"], p["H"], n, lifted), {})[f] = secs
    agree = near = big_agree = big = 0
    for (kind, t, b, i, hd, n, lifted), times in groups.items():
        p = dict(T=t, B=b, I=i, H=hd, K=1)
        modelled = {f: cost.model_seconds(f, kind, p, n, constants, lifted) for f in times}
        pick = min(modelled, key=modelled.get)
        best = min(times, key=times.get)
        agree += pick == best
        near += times[pick] <= 1.05 * times[best]
        if t >= 512 or hd >= 512:
            big += 1
            big_agree += times[pick] <= 1.05 * times[best]
    print(f"model's fastest form = measured fastest at {agree}/{len(groups)} points, within 5% of it at {near}; "
          f"large points (T >= 512 or H >= 512): within 5% at {big_agree}/{big}")


def safe_margins(rows, constants) -> dict:
    """Per form, the smallest margin (cost.MODEL_MARGIN) for which the policy's rule over
    unknown T and B (never modelled more than cost.RANGE_BOUND the loop's at any point of the range, best in
    geometric mean) picks that form only for cells where it measured at most 5% slower than
    the loop at every measured point."""
    groups: dict = {}
    for f, kind, p, n, lifted, secs in rows:
        groups.setdefault((kind, p["I"], p["H"], n, lifted), {}).setdefault((p["T"], p["B"]), {})[f] = secs
    margins = {}
    for form_ in ("fuse", "hoist"):
        margin = 1.0
        while margin < 4:
            bad = False
            for (kind, i, hd, n, lifted), points in groups.items():
                if _chosen(form_, kind, i, hd, n, lifted, constants, margin) and any(
                        t[form_] > 1.05 * t["loop"] for t in points.values() if form_ in t):
                    bad = True
                    break
            if not bad:
                break
            margin += 0.05
        margins[form_] = round(margin, 2)
    return margins


def _chosen(form_, kind, i, hd, n, lifted, constants, margin) -> bool:
    ratios = [margin * cost.model_seconds(form_, kind, dict(T=t, B=b, I=i, H=hd, K=1), n, constants, lifted)
              / cost.model_seconds("loop", kind, dict(T=t, B=b, I=i, H=hd, K=1), n, constants)
              for b in cost.UNKNOWN_RANGE["B"] for t in cost.UNKNOWN_RANGE["T"]]
    return max(ratios) <= cost.RANGE_BOUND and statistics.geometric_mean(ratios) < 1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=0.3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--emit", action="store_true")
    p.add_argument("--from", dest="previous", metavar="FILE", action="append",
                   help="refit from the printed output of an earlier run (repeatable)")
    p.add_argument("--widths", default=",".join(f"{i}x{hd}" for i, hd in WIDTHS), help="I x H, comma-separated")
    p.add_argument("--batches", default=",".join(map(str, BATCHES)))
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    p.add_argument("--max-flop", type=float, default=float("inf"), help="skip points whose loop does more FLOPs per run")
    args = p.parse_args(argv)
    print(f"onnxruntime {ort.__version__}, intra-op threads {args.threads}, thread CPU time")
    if args.previous:
        rows = [row for path in args.previous for row in reread(path)]
    else:
        widths = [tuple(int(v) for v in w.split("x")) for w in args.widths.split(",")]
        rows = collect(args.seconds, args.threads, widths, [int(v) for v in args.batches.split(",")],
                       [int(v) for v in args.lengths.split(",")], args.max_flop)
    fitted = fit(rows)
    for name, constants in (("committed", cost.DEFAULT_CONSTANTS), ("fitted", fitted)):
        print(f"{name} constants: model / measured per form (median, worst low, worst high)")
        for f in MODEL_FORM.values():
            errs = [cost.model_seconds(f, kind, p, n, constants, lifted) / secs
                    for g, kind, p, n, lifted, secs in rows if g == f]
            print(f"  {f:6} {statistics.median(errs):.2f} {min(errs):.2f} {max(errs):.2f}")
    for name, constants in (("committed", cost.DEFAULT_CONSTANTS), ("fitted", fitted)):
        print(f"{name} constants:")
        residuals(rows, constants)
    margins = safe_margins(rows, fitted)
    print("MODEL_MARGIN (smallest factor with no modelled choice >5% slower than the loop at a measured point): "
          + ", ".join(f"{f} {m:.2f}" for f, m in margins.items()))
    if args.emit:
        print(f"MODEL_MARGIN = {{{', '.join(f'{chr(34)}{f}{chr(34)}: {m:.2f}' for f, m in margins.items())}}}")
        print("DEFAULT_CONSTANTS = {")
        for k, v in fitted.items():
            print(f'    "{k}": {v:.3g},')
        print("}")
    return fitted


if __name__ == "__main__":
    main()
