"""onnxruntime CPU time of linear-recurrence Scans before and after `linrec` (issue 21's table).

    python benchmarks/bench_linrec.py [--seconds 1.0] [--only ema] [--chunks 8,16,32,64]

Models are the hand-written forms of tests/linrec_builders.py at the issue's sizes (B=1):
cumulative sum H=128; EMA with learned decay H=128; minGRU I=H=64; Mamba-style selective scan
D=64, N=16; decayed linear attention DK=DV=64 (also with the state stored transposed); each also
at T=16 and 64 (the "never slower at T <= 64" rows). Timing: thread CPU time
(``time.thread_time``) of ``session.run`` with one intra-op thread, the two sessions
interleaved run by run; the median over the runs and the
spread (interquartile range as % of the median). The A/A row times the Scan against a second
session of itself: its ratio is the noise floor. ratio = Scan / rewritten (above 1: faster).
The rewrite is the pass's own form (tuning off). Outputs are compared first (max abs
difference printed). ``--chunks`` times the chunked form at
several chunk lengths instead (how DEFAULT_CHUNK was chosen). ``knn`` rows: skl2onnx
KNeighborsRegressor (k=5, 2,000 training rows of 10 features, needs skl2onnx and scikit-learn)
at 1 and 64 queries, the `distances` GEMM form and vectorize's broadcast form against the Scan.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
import linrec_builders as lb  # noqa: E402

import scanopt  # noqa: E402

CASES = {
    "cumsum": (lambda T: lb.running_sum(T=T, H=128, B=1), (16, 64, 4096), "5x at T=4096"),
    "ema": (lambda T: lb.ema(T=T, H=128), (16, 64, 2048), "3x at T=2048"),
    "mingru": (lambda T: lb.mingru(T=T, I=64, H=64, B=1), (16, 64, 1024), "3x at T=1024"),
    "mamba": (lambda T: lb.mamba(T=T, B=1, D=64, N=16), (16, 64, 1024), "3x at T=1024"),
    "linear_attention": (lambda T: lb.linear_attention(T=T, DK=64, DV=64), (16, 64, 1024), "2x at T=1024"),
    "linear_attention_transposed": (lambda T: lb.linear_attention_transposed(T=T, DK=64, DV=64), (16, 64, 1024),
                                    "2x at T=1024"),
}


def session(model) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def cpu_times(sessions, feeds, seconds: float) -> list[list[float]]:
    """Thread CPU seconds per run of each session, interleaved run by run after a warmup."""
    for s in sessions:
        for _ in range(3):
            s.run(None, feeds)
    start = time.thread_time()
    sessions[0].run(None, feeds)
    once = max(time.thread_time() - start, 1e-6)
    runs = int(min(500, max(7, seconds / (once * len(sessions)))))
    times: list[list[float]] = [[] for _ in sessions]
    for _ in range(runs):
        for s, bucket in zip(sessions, times):
            t0 = time.thread_time()
            s.run(None, feeds)
            bucket.append(time.thread_time() - t0)
    return times


def summary(times: list[float]) -> tuple[float, float]:
    """(median, interquartile range as % of the median)."""
    q = statistics.quantiles(times, n=4)
    median = statistics.median(times)
    return median, 100 * (q[2] - q[0]) / median


def feeds_for(model) -> dict:
    rng = np.random.default_rng(0)
    feeds = {}
    for value in model.graph.input:
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def row(label: str, model, optimized, seconds: float, feeds=None) -> str:
    sessions = [session(model), session(optimized)]
    feeds = feeds if feeds is not None else feeds_for(model)
    before, after = (s.run(None, feeds) for s in sessions)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(before, after))
    (t0, s0), (t1, s1) = (summary(t) for t in cpu_times(sessions, feeds, seconds))
    return (f"| {label} | {t0 * 1e3:.3f} ±{s0:.0f}% | {t1 * 1e3:.3f} ±{s1:.0f}% | {t0 / t1:.2f}x | {diff:.2g} |")


def rewrite(model, **options):
    """The pass's own form: tuning off, so a timing under load does not quietly keep the loop
    (the rows would then time the Scan against itself)."""
    optimized, report = scanopt.optimize(model, verify=False, options={"tune": False, **options})
    details = [o.detail for o in report.outcomes if o.pass_name == "linrec" and o.applied]
    return optimized, (details[0] if details else "not applied")


def knn_model(rows: int = 2000, features: int = 10):
    import warnings

    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.neighbors import KNeighborsRegressor

    warnings.filterwarnings("ignore")
    rng = np.random.RandomState(rows)
    x = rng.randn(rows, features).astype(np.float32)
    est = KNeighborsRegressor(5).fit(x, x.sum(axis=1))
    return to_onnx(est, initial_types=[("X", FloatTensorType([None, features]))], target_opset=17)


def knn_rows(seconds: float) -> None:
    model = knn_model()
    gemm, _ = scanopt.optimize(model, verify=False)
    broadcast, _ = scanopt.optimize(model, verify=False, skip=["distances"])
    for queries in (1, 64):
        feeds = {"X": np.random.default_rng(queries).standard_normal((queries, 10)).astype(np.float32)}
        for label, optimized in (("GEMM (distances)", gemm), ("broadcast (vectorize)", broadcast)):
            print(row(f"knn 2,000 rows x {queries} queries, {label}" + (" (issue: >= 20x)" if queries == 64 and
                                                                          "GEMM" in label else ""),
                      model, optimized, seconds, feeds), flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--only", action="append", choices=sorted(CASES) + ["knn"])
    parser.add_argument("--chunks", help="comma-separated chunk lengths to compare at each case's largest T")
    args = parser.parse_args(argv)
    print(f"onnxruntime {ort.__version__}, 1 intra-op thread, thread CPU time, median ±IQR%")
    print("| case | Scan ms | rewritten ms | ratio | max abs diff |")
    print("|---|---|---|---|---|")
    aa = CASES["ema"][0](256)
    print(row("A/A: EMA T=256 Scan vs itself", aa, aa, args.seconds), flush=True)
    for name in args.only or list(CASES) + ["knn"]:
        if name == "knn":
            knn_rows(args.seconds)
            continue
        build, lengths, bar = CASES[name]
        if args.chunks:
            model = build(lengths[-1])
            for chunk in (int(c) for c in args.chunks.split(",")):
                optimized, _ = rewrite(model, linrec_chunk=chunk, linrec_attention_chunk=chunk, linrec_min_steps=1,
                                       linrec_max_state=1 << 30)
                print(row(f"{name} T={lengths[-1]} C={chunk}", model, optimized, args.seconds), flush=True)
            continue
        for steps in lengths:
            model = build(steps)
            optimized, detail = rewrite(model)
            label = f"{name} T={steps}" + (f" (issue: >= {bar})" if steps == lengths[-1] else "")
            if detail == "not applied":
                print(f"| {label} | loop kept | | 1.00x | 0 |", flush=True)
                continue
            print(row(label, model, optimized, args.seconds), flush=True)


if __name__ == "__main__":
    main()
