"""Differential fuzz of the passes' forms (issue 33): random models of the shapes the passes
target (linear recurrences, RNN/GRU/LSTM cells as Scan-9 and Scan-8 with sequence_lens),
optimized by ``scanopt.optimize`` (verification on), then the original and the optimized model
run in a child process at 5 regimes each: seed 0's inputs, large values (x1e4: saturated
activations, overflowing states), and the edges verification knows (scanopt.edge_inputs):
an empty dimension (zero-length sequence, empty batch), a sequence_lens entry of 0 or a trip
count of 0 where the model has one, a NaN and an inf at the middle step.

A finding: the original ran and the optimized crashed, failed, or gave another shape, a value
beyond float tolerance, or a NaN where the original has none. Where the original fails the
optimized may fail too; where the original crashes the regime is not judged.

    PYTHONPATH=. python -m tests.fuzz_differential --count 2000          # the issue's full run
    PYTHONPATH=. nice -n 10 python -m tests.fuzz_differential --count 300 --seed 1

Measuring forms is off (SCANOPT_TUNE=0, the modelled cost decides: runs are machine-
independent); odd-numbered models are optimized with ``--target portable`` so the loop-free
and native forms are written even where the cost model keeps a small loop.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections import Counter

import numpy as np
import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
os.environ.setdefault("SCANOPT_TUNE", "0")

import cell_builders as cb  # noqa: E402
import linrec_builders as lb  # noqa: E402
from child_run import run_in_child  # noqa: E402

RTOL, ATOL = 1e-3, 1e-4  # float32 through another association, against the loop's own rounding
REGIMES = ("seed", "large", "empty", "zero_length_or_count", "nan_inf")


def random_model(rng: random.Random) -> tuple[str, onnx.ModelProto]:
    """(description, model) of one of the forms the passes target, sizes drawn by ``rng``."""
    kind = rng.choice(["running_sum", "ema", "mingru", "mamba", "mamba_wide", "linear_attention",
                       "cumulative_product", "decay_input", "mamba_einsum", "cell9", "cell8"])
    T = rng.choice([1, 2, 5, 16, 17, 33, 64])
    seed = rng.randrange(1 << 16)
    if kind == "running_sum":
        m = lb.running_sum(T=T, H=rng.choice([1, 4, 8]), B=rng.choice([None, 2]), reverse=rng.random() < 0.3)
    elif kind == "ema":
        m = lb.ema(T=T, H=rng.choice([4, 16]), seed=seed)
    elif kind == "mingru":
        m = lb.mingru(T=T, I=rng.choice([4, 8]), H=rng.choice([4, 8]), B=rng.choice([1, 2]), seed=seed)
    elif kind == "mamba":
        m = lb.mamba(T=T, B=rng.choice([1, 2]), D=rng.choice([2, 4]), N=rng.choice([2, 3]), seed=seed)
    elif kind == "mamba_wide":  # over linrec_max_state: the two-pass form
        m = lb.mamba(T=max(T, 16), B=1, D=rng.choice([32, 48]), N=16, seed=seed)
    elif kind == "linear_attention":
        m = lb.linear_attention(T=T, DK=4, DV=4, gamma=rng.choice([0.5, 0.9, 1.0]))
    elif kind == "cumulative_product":
        m = lb.cumulative_product(T=T, H=rng.choice([2, 8]))
    elif kind == "decay_input":
        m = lb.decay_input(T=T, H=4, product=rng.random() < 0.5)
    elif kind == "mamba_einsum":
        m = lb.mamba_einsum(T=T, B=1, D=4, N=3)
    else:
        cell = rng.choice(["RNN", "GRU", "LSTM"])
        body = cb.Body(batch=kind == "cell9", opset=17 if kind == "cell9" else 8)
        states, h_new = cb.cell(cell, body, seed=seed)
        if kind == "cell9":
            m = cb.scan_model(body, states, ys=(h_new,), in_dir=rng.choice([0, 1]))
        else:
            m = cb.scan8_model(body, states, ys=(h_new,), lens=rng.random() < 0.7, reverse=rng.random() < 0.3)
        return f"{kind}:{cell} seed={seed}", m
    if kind not in ("mamba_wide",) and rng.random() < 0.5:
        m = lb.symbolic_steps(m)
    return f"{kind} T={T} seed={seed}", m


def regimes(model: onnx.ModelProto) -> list[tuple[str, dict | None]]:
    """(regime, feeds or None where the model has no such input) for the 5 regimes."""
    from scanopt.edge_inputs import edge_sets
    from scanopt.inputs import synthesize_inputs

    base = synthesize_inputs(model, seed=0)
    large = {k: (v * np.asarray(1e4, v.dtype) if v.dtype.kind == "f" else v) for k, v in base.items()}
    edges = list(edge_sets(model, base))
    pick = lambda *words: next((f for label, f in edges if any(w in label for w in words)), None)  # noqa: E731
    return [("seed", base), ("large", large), ("empty", pick("dimension")),
            ("zero_length_or_count", pick("sequence_lens", "trip count")), ("nan_inf", pick("with nan", "with inf"))]


def compare(original, optimized) -> str | None:
    """Why ``optimized``'s run differs from ``original``'s, or None."""
    (status, got), (want_status, want) = optimized, original
    if want_status == "crash":
        return None
    if want_status == "error":
        return "crash where the original failed cleanly: " + got if status == "crash" else None
    if status != "ok":
        return f"{status} where the original ran: {got}"
    for name, expected in want.items():
        if name not in got:
            return f"output {name} missing"
        actual = got[name]
        if actual.shape != expected.shape:
            return f"output {name}: shape {actual.shape}, the original's {expected.shape}"
        if expected.dtype.kind != "f":
            if not np.array_equal(actual, expected):
                return f"output {name}: integer values differ"
            continue
        nan = np.isnan(actual) & ~np.isnan(expected)
        if nan.any():
            return f"output {name}: NaN at {np.argwhere(nan)[0].tolist()} where the original has {expected[nan][0]}"
        finite = np.isfinite(expected)
        if not np.array_equal(np.isinf(actual) & ~finite, np.isinf(expected) & ~np.isnan(expected)) \
                or (np.isinf(expected) & (actual != expected)).any():
            return f"output {name}: infinities differ"
        scale = float(np.abs(expected[finite]).max()) if finite.any() else 0.0
        close = np.isclose(actual[finite], expected[finite], rtol=RTOL, atol=ATOL * max(1.0, scale))
        if not close.all():
            at = np.argwhere(finite)[np.argmin(close)].tolist()
            return f"output {name}: {actual[tuple(at)]} against {expected[tuple(at)]} at {at}"
    return None


def fuzz(count: int, seed: int = 0, log=print) -> dict:
    """Run ``count`` models; returns the counts and the findings [(model, regime, why)]."""
    from scanopt.pipeline import optimize

    rng = random.Random(seed)
    counts, findings = Counter(), []
    for i in range(count):
        what, model = random_model(rng)
        options = {"target": "portable"} if i % 2 else {}
        try:
            optimized, report = optimize(model, options=options)
        except Exception as exc:  # noqa: BLE001 - a finding, with its reason
            findings.append((what, "optimize", f"{type(exc).__name__}: {exc}"))
            counts["optimize errors"] += 1
            continue
        counts["models"] += 1
        counts["rewritten"] += optimized is not model
        if optimized is model:
            continue
        for regime, feeds in regimes(model):
            if feeds is None:
                counts["regimes without such an input"] += 1
                continue
            original = run_in_child(model, feeds)
            counts[f"original {original[0]}"] += 1
            why = compare(original, run_in_child(optimized, feeds))
            counts["runs compared"] += 1
            if why:
                findings.append((what + (" portable" if options else ""), regime, why))
                log(f"FINDING {what} [{regime}]: {why}")
        if log and (i + 1) % 25 == 0:
            log(f"{i + 1}/{count} models, {len(findings)} findings, {dict(counts)}")
    counts["findings"] = len(findings)
    return {"counts": dict(counts), "findings": findings}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    started = time.time()
    result = fuzz(args.count, args.seed)
    print(f"{args.count} models x {len(REGIMES)} regimes in {time.time() - started:.0f} s: {result['counts']}")
    for what, regime, why in result["findings"]:
        print(f"  {what} [{regime}]: {why}")
    return 1 if result["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
