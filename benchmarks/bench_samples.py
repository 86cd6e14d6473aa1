"""End-to-end onnxruntime latency before and after `scanopt optimize` for every committed
sample model (models/**/*.onnx), default policy (target onnxruntime) with verification.

    python benchmarks/bench_samples.py [--seconds 0.3] [--target portable] [--filter rnn]

Each changed model and its original run on the same synthesized inputs (the ones
verification uses) with scanopt.timing's timer (the one the cost policy measures with):
one intra-op thread, thread CPU time, runs interleaved, medians, an A/A pair of two
sessions of the original. speedup = median of the paired before/after ratios, ± half their
interquartile range; A/A = that run's noise estimate. "unchanged" rows are models the
default leaves as they are (the reason is in `scanopt optimize`'s report); "n/a" where
onnxruntime cannot run the original on synthesized inputs. A summary per folder follows.
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import time

import onnx
import onnxruntime as ort

import scanopt
from scanopt.timing import measure
from scanopt.verify import runnable_feeds

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.3, help="measuring time per model")
    parser.add_argument("--target", default="onnxruntime")
    parser.add_argument("--filter", default="", help="only samples whose path contains this")
    args = parser.parse_args(argv)
    paths = sorted(p for p in glob.glob(os.path.join(ROOT, "**", "*.onnx"), recursive=True) if args.filter in p)
    print(f"onnxruntime {ort.__version__}, 1 intra-op thread, thread CPU time, interleaved, target {args.target}\n")
    print("| sample | forms applied | before ms | after ms | speedup | A/A | optimize s |\n|---|---|---|---|---|---|---|")
    folders: dict[str, dict] = {}
    for path in paths:
        name = os.path.relpath(path, ROOT)
        folder = folders.setdefault(os.path.dirname(name) or ".", {"count": 0, "unchanged": 0, "speedups": [], "noise": []})
        folder["count"] += 1
        model = onnx.load(path)
        start = time.perf_counter()
        try:
            out, report = scanopt.optimize(model, seeds=1, options={"target": args.target})
        except Exception as exc:  # noqa: BLE001 - a sample the pipeline refuses is a row, not a crash
            print(f"| {name} | error: {str(exc).splitlines()[0][:60]} | | | | | |")
            continue
        took = time.perf_counter() - start
        forms = sorted({o.pass_name for o in report.outcomes if o.applied})
        if out is model:
            folder["unchanged"] += 1
            print(f"| {name} | unchanged | | | | | {took:.2f} |", flush=True)
            continue
        try:
            feeds = runnable_feeds(model, seeds=1, engine="ort")[0]
            timed = measure({"before": model, "after": out}, feeds, threads=1, seconds=args.seconds, check_budget=False)
        except Exception as exc:  # noqa: BLE001
            print(f"| {name} | {', '.join(forms)} | n/a ({str(exc).splitlines()[0][:50]}) | | | | {took:.2f} |",
                  flush=True)
            continue
        before, after = timed.forms["before"], timed.forms["after"]
        speedup = 1 / after.ratio
        folder["speedups"].append(speedup)
        folder["noise"].append(timed.noise)
        print(f"| {name} | {', '.join(forms)} | {before.seconds * 1e3:.3f} | {after.seconds * 1e3:.3f} | "
              f"{speedup:.2f} ±{after.spread / after.ratio ** 2:.2f} | {timed.noise:.2f} | {took:.2f} |", flush=True)
    print("\n| samples | count | rewritten and timed | unchanged | speedup min / median / max | A/A median (max) |\n"
          "|---|---|---|---|---|---|")
    for folder, row in folders.items():
        s, noise = sorted(row["speedups"]), row["noise"]
        spread = f"{s[0]:.2f} / {statistics.median(s):.2f} / {s[-1]:.2f}" if s else "-"
        aa = f"{statistics.median(noise):.2f} ({max(noise):.2f})" if noise else "-"
        print(f"| `models/{folder}` | {row['count']} | {len(s)} | {row['unchanged']} | {spread} | {aa} |")


if __name__ == "__main__":
    main()
