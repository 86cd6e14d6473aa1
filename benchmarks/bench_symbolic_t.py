"""Symbolic T, no shapes: the loop against what the default command writes (issue 28's last done-when).

    python benchmarks/bench_symbolic_t.py [--seconds 1.0] [--busy 2] [--only ema]
    python benchmarks/bench_symbolic_t.py --crossover [--seconds 0.5]

Models (tests/linrec_builders.py) with their length a name, nothing declared: a running sum
H=128 B=1, an EMA with a learned per-channel decay H=128, minGRU I=H=64 B=1. Each is written
once by ``scanopt optimize in.onnx out.onnx`` (the CLI, default options, verification on) and
both are timed at T = 16, 64, 1024, 4096 with scanopt.timing.measure: thread CPU time of
``session.run`` at one intra-op thread, loop and output interleaved in rotating order with an
A/A pair of the loop. A row gives the medians, the ratio loop / output from the median of
paired ratios (above 1: the output is faster) ± half their interquartile range, and the A/A
noise; the first row times the loop against itself. ``--busy N`` starts N busy-loop
processes beside the timing (stopped at the end).

``--crossover`` finds linrec's dispatch threshold (passes/loopfree/dispatch.THRESHOLD): per
case and width, the chunked form (the dispatch with threshold 0: always the else branch, If
overhead included) against the loop as the pipeline otherwise leaves it (hoisted: ``skip
linrec``) at T = 16 ... 512; the crossover is the smallest T from which the chunked form is
faster at every longer T measured.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, ROOT)
import linrec_builders as lb  # noqa: E402

import scanopt  # noqa: E402
from scanopt.timing import measure  # noqa: E402

CASES = {
    "running sum": lambda: lb.running_sum(T="T", H=128, B=1),
    "EMA": lambda: lb.ema(T="T", H=128),
    "minGRU": lambda: lb.mingru(T="T", I=64, H=64, B=1),
}
LENGTHS = (16, 64, 1024, 4096)
WIDTHS = {
    "EMA": [(f"H={w}", lambda w=w: lb.ema(T="T", H=w)) for w in (64, 128, 256)],
    "minGRU": [(f"I=H={w}", lambda w=w: lb.mingru(T="T", I=w, H=w, B=1)) for w in (32, 64, 128)],
    "running sum": [("H=128", lambda: lb.running_sum(T="T", H=128, B=1))],
}
CROSSOVER_LENGTHS = (16, 32, 48, 64, 96, 128, 192, 256, 512)


def feeds_at(model: onnx.ModelProto, steps: int) -> dict:
    rng = np.random.default_rng(steps)
    return {v.name: rng.standard_normal([d.dim_value if d.dim_value else steps for d in v.type.tensor_type.shape.dim])
            .astype(np.float32) for v in model.graph.input}


def default_command(model: onnx.ModelProto, folder: str, name: str) -> onnx.ModelProto:
    """The model written by ``scanopt optimize in.onnx out.onnx`` (default options)."""
    src, dst = os.path.join(folder, f"{name}.onnx"), os.path.join(folder, f"{name}.opt.onnx")
    onnx.save(model, src)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-m", "scanopt", "optimize", src, dst], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"scanopt optimize failed on {name}:\n{done.stdout}{done.stderr}")
    return onnx.load(dst)


def row(label: str, loop, other, steps: int, seconds: float) -> str:
    t = measure({"loop": loop, "other": other}, feeds_at(loop, steps), threads=1, seconds=seconds, check_budget=False)
    a, b = t.forms["loop"], t.forms["other"]
    return (f"| {label} | {steps} | {a.seconds * 1e3:.3f} | {b.seconds * 1e3:.3f} | {1 / b.ratio:.2f}x "
            f"±{b.spread:.2f} | {t.noise * 100:.0f}% | {t.rounds} |")


def busy() -> None:
    while True:
        pass


def table(args) -> None:
    print(f"onnxruntime CPU, 1 intra-op thread, thread CPU time, interleaved with an A/A pair; "
          f"{args.busy} busy-loop process(es) beside it")
    print("| case | T | loop ms | scanopt ms | loop / scanopt | A/A noise | rounds |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        aa = CASES["EMA"]()
        print(row("A/A: EMA loop vs itself", aa, aa, 1024, args.seconds), flush=True)
        for name in args.only or CASES:
            model = CASES[name]()
            out = default_command(model, folder, name.replace(" ", "_"))
            for steps in LENGTHS:
                print(row(name, model, out, steps, args.seconds), flush=True)


def crossover(args) -> None:
    print("chunked (dispatch threshold 0) against the loop as the pipeline leaves it without linrec (hoisted); "
          "ratio = loop / chunked, thread CPU time, 1 thread")
    for name in args.only or WIDTHS:
        for width, build in WIDTHS[name]:
            model = build()
            plain, _ = scanopt.optimize(model, verify=False, skip=["linrec"], options={"tune": False})
            chunked, _ = scanopt.optimize(model, verify=False, options={"tune": False, "linrec_dispatch_below": 0})
            ratios = {}
            for steps in CROSSOVER_LENGTHS:
                t = measure({"loop": plain, "chunked": chunked}, feeds_at(model, steps), threads=1,
                            seconds=args.seconds, check_budget=False)
                ratios[steps] = 1 / t.forms["chunked"].ratio
            wins = [s for s in CROSSOVER_LENGTHS if all(ratios[u] > 1 for u in CROSSOVER_LENGTHS if u >= s)]
            cross = wins[0] if wins else None
            print(f"{name} {width}: " + ", ".join(f"T={s} {r:.2f}x" for s, r in ratios.items())
                  + f" -> chunked faster from T={cross}", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--busy", type=int, default=0, help="busy-loop processes started beside the timing")
    parser.add_argument("--only", action="append", choices=sorted(CASES))
    parser.add_argument("--crossover", action="store_true")
    args = parser.parse_args(argv)
    print(f"scanopt from {os.path.dirname(scanopt.__file__)}")
    workers = [multiprocessing.Process(target=busy, daemon=True) for _ in range(args.busy)]
    for w in workers:
        w.start()
    try:
        crossover(args) if args.crossover else table(args)
    finally:
        for w in workers:
            w.terminate()
            w.join()


if __name__ == "__main__":
    main()
