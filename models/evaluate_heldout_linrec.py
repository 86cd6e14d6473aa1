"""Print what scanopt does with each model of models/heldout_linrec/ (issue 21's held-out set).

    python models/evaluate_heldout_linrec.py             # every mode, 2 seeds
    python models/evaluate_heldout_linrec.py --only dyn_gla
    python models/evaluate_heldout_linrec.py --mode declared --declared-t 256   # where the forms pay

Three modes per model: *default* (``scanopt optimize in out``: no shapes, the cost policy over
the unknown dims: a chunked form on a symbolic length keeps the loop, as it measured slower
below 64 steps), *portable* (``--target portable``: every form applied whatever its speed; the
matchers' reach) and *declared* (``--input-shape``: every symbolic T made 16 and B made 4, one
intra-op thread; at T=16 the cost policy may keep a loop it measured faster than every
loop-free form: counted as *matched*, not as loop-free). Per model and mode: the loop ops before and after, which of the model's own
loops no longer run, whether onnxruntime on the result reproduces the source's stored outputs,
whether verification passed, and the outcome lines of linrec, distances and vectorize (and any
rewrite the cost policy measured), which hold the reason of each loop left. The layout facts
(BATCH_FIRST, MAPS, T, B) are generate_heldout_linrec.py's; the comparison and counting
helpers are evaluate_heldout_producers.py's.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import onnx

import evaluate_heldout_producers as producers
import scanopt
from evaluate_heldout_producers import HeldOutSet, loop_names, loop_ops, outputs_equal

PASSES = ("loop_to_scan", "linrec", "distances", "vectorize")
REWRITES = ("linrec", "distances", "vectorize")


def optimize(held: HeldOutSet, name: str, mode: str, seeds: int = 2):
    """The model, its stored outputs, and ``scanopt.optimize``'s (result, report) in ``mode``."""
    model = onnx.load(os.path.join(held.out, f"{name}.onnx"))
    stored = np.load(os.path.join(held.out, f"{name}.expected.npz"))
    if mode in ("default", "portable"):
        out, report = scanopt.optimize(model, seeds=seeds, options={"target": "onnxruntime" if mode == "default" else mode})
    else:
        out, report = scanopt.optimize(model, input_shapes=held.declared(model, stored, name), seeds=seeds,
                                       options={"threads": 1})
    return model, stored, out, report


def evaluate(held: HeldOutSet, name: str, mode: str, seeds: int) -> dict:
    model, stored, out, report = optimize(held, name, mode, seeds)
    equal = outputs_equal(model, out, stored)
    passed = (report.verification or {}).get("passed")
    own, left = loop_names(model), loop_names(out)
    applied = sorted({o.pass_name for o in report.outcomes if o.applied})
    # matched: a loop-free rewrite applied, or matched and then measured slower than the loop (cost policy)
    matched = any(o.pass_name in REWRITES and (o.applied or o.measured) for o in report.outcomes)
    print(f"{name:28s} {mode:8s} {loop_ops(model)} -> {loop_ops(out)} loop-free={len(own - left)}/{len(own)} "
          f"equal={equal} verified={passed} applied={applied}")
    for o in report.outcomes:
        if o.pass_name in PASSES or o.measured:
            speed = f" [measured {o.speedup:.2f}x]" if o.measured and o.speedup else ""
            print(f"    {o.pass_name}: {'applied' if o.applied else 'skipped'}{speed}: {o.detail[:200]}")
    if passed is False:
        print(f"    verification: {(report.verification or {}).get('summary', '')[:300]}")
    return {"map": held.is_map(name), "own": len(own), "gone": len(own - left), "equal": equal, "verified": passed,
            "matched": matched}


def summarize(mode: str, rows: dict[str, dict]) -> None:
    after = {n: r for n, r in rows.items() if n.startswith("after_")}  # tried after the fixes: counted apart
    if after:
        print(f"== {mode}: tried after the fixes: loop-free {sum(r['gone'] for r in after.values())}/"
              f"{sum(r['own'] for r in after.values())}, equal {sum(r['equal'] for r in after.values())}/{len(after)}")
        rows = {n: r for n, r in rows.items() if n not in after}
    rec = {n: r for n, r in rows.items() if not r["map"]}
    maps = {n: r for n, r in rows.items() if r["map"]}
    count = lambda rs, key: sum(r[key] for r in rs.values())  # noqa: E731
    print(f"== {mode}: recurrences made loop-free {count(rec, 'gone')}/{count(rec, 'own')} (matched "
          f"{count(rec, 'matched')}/{len(rec)}: the rest of the matched kept as the cost policy measured faster); "
          f"maps {count(maps, 'gone')}/{count(maps, 'own')}; equal to the source "
          f"{sum(r['equal'] for r in rows.values())}/{len(rows)}; verification failed "
          f"{[n for n, r in rows.items() if r['verified'] is False]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--only", action="append", help="evaluate only these models")
    p.add_argument("--mode", action="append", choices=("default", "portable", "declared"))
    p.add_argument("--declared-t", type=int, default=producers.DECLARED_T,
                   help=f"the symbolic T declared mode makes static (default {producers.DECLARED_T})")
    args = p.parse_args()
    producers.DECLARED_T = args.declared_t  # read by HeldOutSet.declared
    held = HeldOutSet("heldout_linrec")
    rows = {mode: {} for mode in args.mode or ("default", "portable", "declared")}
    for name in args.only or held.names():
        for mode in rows:
            rows[mode][name] = evaluate(held, name, mode, args.seeds)
    for mode, by_name in rows.items():
        summarize(mode, by_name)


if __name__ == "__main__":
    main()
