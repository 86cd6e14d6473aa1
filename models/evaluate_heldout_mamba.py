"""Print what scanopt does with each selective scan of models/heldout_mamba/ and what it buys the whole model.

    python models/evaluate_heldout_mamba.py                    # committed sizes and issue 21's size
    python models/evaluate_heldout_mamba.py --only hf_mixer_dyn --no-issue-size

Per model and size, three results of ``scanopt.optimize``: *default* (no shapes, as ``scanopt
optimize in out``), *declared* (every input's shape given, the length included, one intra-op
thread: the cost policy measures the forms at that size) and *inputs* (declared, and verified
on the stored inputs instead of synthesized ones: at T=1024 synthesized dt of either sign make
exp(dt * A) grow until the loop overflows to -inf, where the chunked form gives NaN, so
verification rolls the rewrite back; Mamba's dt is softplus(.) > 0). For each: the loop ops before and
after, whether the model's own loop still runs, whether onnxruntime on the result reproduces
PyTorch's stored outputs, verification, and every linrec outcome line (the reason of a loop
left). Then the WHOLE model (the Scan is one node of it) timed before and after with
scanopt.timing.measure: thread CPU time, one intra-op thread, the forms interleaved, with the
A/A pair's noise; speedup = the loop's time / the form's (the median of per-round ratios).
Where linrec made the loop go, a second row times the results against what scanopt gives
without linrec (``skip=("linrec",)``, declared, verified on the stored inputs): linrec's own
share, which for a TorchScript Loop excludes what loop_to_scan and hoist already bought.

Two sizes: the committed one (generate_heldout_mamba.SIZES) and issue 21's row, T=1024, D=64,
N=16, B=1 (generate_heldout_mamba.ISSUE_SIZE), exported again here into a temporary folder and
compared with PyTorch's outputs at that size. The comparison and loop counting helpers are
evaluate_heldout_producers.py's.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import onnx

import generate_heldout_mamba as gen
import scanopt
from evaluate_heldout_producers import feeds_of, loop_names, loop_ops, outputs_equal
from scanopt.timing import measure

MODES = ("default", "declared", "inputs")


def declared_shapes(model: onnx.ModelProto, stored) -> dict:
    """Every input with a symbolic dim at its stored shape (the length declared)."""
    return {i.name: list(stored[i.name].shape) for i in model.graph.input
            if not all(d.HasField("dim_value") for d in i.type.tensor_type.shape.dim)}


def optimize(model, stored, mode: str, seeds: int, skip=()):
    if mode == "default":
        return scanopt.optimize(model, seeds=seeds, skip=skip)
    inputs = [feeds_of(model, stored)] if mode == "inputs" else None
    return scanopt.optimize(model, input_shapes=declared_shapes(model, stored), seeds=seeds, inputs=inputs,
                            skip=skip, options={"threads": 1})


def evaluate(name: str, size_label: str, model, stored, seeds: int, seconds: float) -> dict:
    """One model at one size: both modes' lines, then the whole-model timing row."""
    own = loop_names(model)
    forms, row = {"loop": model}, {}
    for mode in MODES:
        out, report = optimize(model, stored, mode, seeds)
        equal, passed = outputs_equal(model, out, stored), (report.verification or {}).get("passed")
        loop_free = not (own & loop_names(out))
        print(f"{name:22s} {size_label:7s} {mode:8s} {loop_ops(model)} -> {loop_ops(out)} "
              f"loop-free={loop_free} equal={equal} verified={passed}")
        for o in report.outcomes:
            if o.pass_name in ("linrec", "loop_to_scan") or o.measured or o.applied:
                speed = f" [measured {o.speedup:.2f}x]" if o.measured and o.speedup else ""
                print(f"    {o.pass_name}: {'applied' if o.applied else 'skipped'}{speed}: {o.detail[:240]}")
        if passed is False:
            print(f"    verification: {(report.verification or {}).get('summary', '')[:300]}")
        row[mode] = {"loop_free": loop_free, "equal": equal, "verified": passed}
        if out is not model:
            forms[mode] = out
    feeds = feeds_of(model, stored)
    row["speedup"] = whole_model_speedups(forms, feeds, seconds, "whole model")
    row["over_scan"] = {}
    if any(row[mode]["loop_free"] for mode in MODES):
        # linrec's own share: against what scanopt gives without it (the TorchScript Loops made
        # Scans by loop_to_scan, hoisted), declared and verified on the stored inputs
        without, _ = optimize(model, stored, "inputs", seeds, skip=("linrec",))
        freed = {mode: f for mode, f in forms.items() if mode != "loop" and row[mode]["loop_free"]}
        row["over_scan"] = whole_model_speedups({"without linrec": without, **freed}, feeds, seconds,
                                                "whole model over scanopt without linrec")
    return row


def whole_model_speedups(forms: dict, feeds: dict, seconds: float, label: str) -> dict:
    """form -> the first form's time over its own, printed with medians, spread and A/A noise."""
    if len(forms) == 1:
        print(f"    {label}: nothing changed, not timed")
        return {}
    t = measure(forms, feeds, threads=1, seconds=seconds, check_budget=False)
    first, *rest = t.forms
    speedups = {mode: 1 / t.forms[mode].ratio for mode in rest}
    cells = ", ".join(f"{mode} {t.forms[mode].seconds * 1e3:.3f} ms ({speedups[mode]:.2f}x, ratio spread "
                      f"{t.forms[mode].spread:.3f})" for mode in rest)
    print(f"    {label} ({t.clock}, 1 thread, median of {t.rounds} interleaved rounds, A/A noise "
          f"{t.noise:.3f}): {first} {t.forms[first].seconds * 1e3:.3f} ms; {cells}")
    return speedups


def summarize(rows: dict) -> None:
    for size_label in ("small", "T=1024"):
        here = {n: r for (n, s), r in rows.items() if s == size_label}
        if not here:
            continue
        for mode in MODES:
            free = [n for n, r in here.items() if r[mode]["loop_free"]]
            equal = sum(r[mode]["equal"] for r in here.values())
            speed = ", ".join(f"{n} {r['speedup'][mode]:.2f}x" for n, r in here.items() if mode in r["speedup"])
            share = ", ".join(f"{n} {r['over_scan'][mode]:.2f}x" for n, r in here.items() if mode in r["over_scan"])
            print(f"== {size_label} {mode}: loop-free {len(free)}/{len(here)}, equal {equal}/{len(here)}, "
                  f"verification failed {[n for n, r in here.items() if r[mode]['verified'] is False]}; "
                  f"whole-model speedups: {speed or 'none (nothing changed)'}; where loop-free, over scanopt "
                  f"without linrec: {share or 'none'}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--only", action="append", choices=gen.NAMES, help="evaluate only these models")
    p.add_argument("--no-issue-size", action="store_true", help="only the committed sizes")
    p.add_argument("--seconds", type=float, default=3.0, help="timing budget per model and size")
    args = p.parse_args()
    rows = {}
    for name in args.only or gen.NAMES:
        model = onnx.load(os.path.join(gen.OUT, f"{name}.onnx"))
        stored = np.load(os.path.join(gen.OUT, f"{name}.expected.npz"))
        rows[name, "small"] = evaluate(name, "small", model, stored, args.seeds, args.seconds)
        if not args.no_issue_size:
            big, big_stored = gen.build(name, gen.ISSUE_SIZE)
            rows[name, "T=1024"] = evaluate(name, "T=1024", big, big_stored, args.seeds, args.seconds)
    summarize(rows)


if __name__ == "__main__":
    main()
