"""End-to-end onnxruntime latency before and after `scanopt optimize` for every committed
sample model (models/**/*.onnx), default policy (target onnxruntime) with verification.

    python benchmarks/bench_samples.py [--seconds 0.1] [--target portable] [--filter rnn]

Each changed model and its original run on the same synthesized inputs (the ones
verification uses), interleaved; latency = median per run. "unchanged" rows are models the
default leaves as they are (the reason is in `scanopt optimize`'s report); "n/a" where
onnxruntime cannot run the original on synthesized inputs. speedup = before / after.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time

import onnx
import onnxruntime as ort

import scanopt
from scanopt.verify import runnable_feeds

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fuse import latencies, session  # noqa: E402 - the one interleaved timer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.1, help="measuring time per model")
    parser.add_argument("--target", default="onnxruntime")
    parser.add_argument("--filter", default="", help="only samples whose path contains this")
    args = parser.parse_args(argv)
    paths = sorted(p for p in glob.glob(os.path.join(ROOT, "**", "*.onnx"), recursive=True) if args.filter in p)
    print(f"onnxruntime {ort.__version__}, 1 thread, target {args.target}\n")
    print("| sample | forms applied | before ms | after ms | speedup | optimize s |\n|---|---|---|---|---|---|")
    for path in paths:
        name = os.path.relpath(path, ROOT)
        model = onnx.load(path)
        start = time.perf_counter()
        try:
            out, report = scanopt.optimize(model, seeds=1, options={"target": args.target})
        except Exception as exc:  # noqa: BLE001 - a sample the pipeline refuses is a row, not a crash
            print(f"| {name} | error: {str(exc).splitlines()[0][:60]} | | | | |")
            continue
        took = time.perf_counter() - start
        forms = sorted({o.pass_name for o in report.outcomes if o.applied})
        if out is model:
            print(f"| {name} | unchanged | | | | {took:.2f} |", flush=True)
            continue
        try:
            feeds = runnable_feeds(model, seeds=1, engine="ort")[0]
            before, after = latencies([session(model, 1), session(out, 1)], feeds, args.seconds)
        except Exception as exc:  # noqa: BLE001
            print(f"| {name} | {', '.join(forms)} | n/a ({str(exc).splitlines()[0][:50]}) | | | {took:.2f} |", flush=True)
            continue
        print(f"| {name} | {', '.join(forms)} | {before * 1e3:.3f} | {after * 1e3:.3f} | {before / after:.2f} | {took:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
