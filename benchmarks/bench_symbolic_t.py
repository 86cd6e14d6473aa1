"""Symbolic T, no shapes: the loop against what the default command writes (issue 28's last done-when).

    python benchmarks/bench_symbolic_t.py [--seconds 1.0] [--busy 2] [--only EMA] [--lengths 1024,2048]
                                          [--baseline DIR] [--repeat 3]
    python benchmarks/bench_symbolic_t.py --crossover [--seconds 0.5]

Models (tests/linrec_builders.py) with their length a name, nothing declared: a running sum
H=128 B=1, an EMA with a learned per-channel decay H=128, minGRU I=H=64 B=1. Each is written
once by ``scanopt optimize in.onnx out.onnx`` (the CLI, default options, verification on) and
both are timed at T = 16, 64, 1024, 4096 (``--lengths``) with scanopt.timing.measure: thread CPU time of
``session.run`` at one intra-op thread, loop and output interleaved in rotating order with an
A/A pair of the loop. A row gives the medians, the ratio loop / output from the median of
paired ratios (above 1: the output is faster) ± half their interquartile range, and the A/A
noise; the first row times the loop against itself. ``--busy N`` starts N busy-loop
processes beside the timing (stopped at the end). ``--baseline DIR``: the output of the
scanopt checkout at DIR (``git worktree add DIR <commit>``, its scanopt/passes a link to
../passes where the install is editable) is timed in the same rounds: a before/after
comparison that a change of load between two runs cannot skew. ``--repeat N``: N measurements
per row, each with fresh sessions, medians and the ratio's range (two sessions of one
memory-bound model can differ by 10% within one measurement).

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


def default_command(model: onnx.ModelProto, folder: str, name: str, root: str = ROOT) -> onnx.ModelProto:
    """The model written by ``scanopt optimize in.onnx out.onnx`` (default options), by the
    scanopt checkout at ``root``."""
    tag = "opt" if root == ROOT else "baseline"
    src, dst = os.path.join(folder, f"{name}.onnx"), os.path.join(folder, f"{name}.{tag}.onnx")
    onnx.save(model, src)
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # run in root: ``python -m`` puts the working directory first on sys.path
    done = subprocess.run([sys.executable, "-m", "scanopt", "optimize", src, dst], env=env, cwd=root,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"scanopt optimize failed on {name}:\n{done.stdout}{done.stderr}")
    return onnx.load(dst)


def row(label: str, loop, other, steps: int, seconds: float, baseline=None, repeat: int = 1) -> str:
    """One table row; with ``repeat`` > 1, that many measurements, each with fresh sessions, and
    their medians (the ratio's range across them instead of one measurement's spread): two
    sessions of the same model measured up to 10% apart in one measurement (a running sum's
    output, T = 1024-4096), in either direction from one measurement to the next."""
    # with a baseline, a second loop session runs between the two outputs, so each follows a loop run
    forms = {"loop": loop, "other": other, **({"loop again": loop, "baseline": baseline} if baseline is not None else {})}
    runs = [measure(forms, feeds_at(loop, steps), threads=1, seconds=seconds, check_budget=False)
            for _ in range(repeat)]

    def cells(name: str) -> str:
        ratios = [1 / t.forms[name].ratio for t in runs]
        time = float(np.median([t.forms[name].seconds for t in runs]))
        spread = f"±{runs[0].forms[name].spread:.2f}" if repeat == 1 else f"({min(ratios):.2f}-{max(ratios):.2f})"
        return f"{time * 1e3:.3f} | {float(np.median(ratios)):.2f}x {spread} | "

    loop_ms = float(np.median([t.forms["loop"].seconds for t in runs])) * 1e3
    noise = float(np.median([t.noise for t in runs])) * 100
    rounds = "/".join(str(t.rounds) for t in runs)
    before = cells("baseline") if baseline is not None else ""
    return f"| {label} | {steps} | {loop_ms:.3f} | {before}{cells('other')}{noise:.0f}% | {rounds} |"


def busy() -> None:
    while True:
        pass


def table(args) -> None:
    print(f"onnxruntime CPU, 1 intra-op thread, thread CPU time, interleaved with an A/A pair; "
          f"{args.busy} busy-loop process(es) beside it")
    before = "baseline ms | loop / baseline | " if args.baseline else ""
    print(f"| case | T | loop ms | {before}scanopt ms | loop / scanopt | A/A noise | rounds |")
    print("|---|---|---|---|---|---|---|" + "---|---|" * bool(args.baseline))
    with tempfile.TemporaryDirectory() as folder:
        aa = CASES["EMA"]()
        print(row("A/A: EMA loop vs itself", aa, aa, 1024, args.seconds, aa if args.baseline else None, args.repeat),
              flush=True)
        for name in args.only or CASES:
            model = CASES[name]()
            out = default_command(model, folder, name.replace(" ", "_"))
            base = default_command(model, folder, name.replace(" ", "_"), args.baseline) if args.baseline else None
            for steps in args.lengths:
                print(row(name, model, out, steps, args.seconds, base, args.repeat), flush=True)


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
    parser.add_argument("--lengths", type=lambda v: [int(x) for x in v.split(",")], default=list(LENGTHS),
                        help="comma-separated lengths of the table (default 16,64,1024,4096)")
    parser.add_argument("--baseline", help="another scanopt checkout (its root): its output is timed in the same "
                                           "rounds, for a before/after comparison that load cannot skew")
    parser.add_argument("--repeat", type=int, default=1, help="measurements per row, each with fresh sessions "
                                                              "(medians; the ratio's range across them)")
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
