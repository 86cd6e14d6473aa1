"""onnxruntime latency of skl2onnx pairwise-distance Scans before and after `vectorize`.

    python benchmarks/bench_vectorize.py [--threads 1] [--seconds 0.3] [--maps]

KNeighborsRegressor (k=5) and GaussianProcessRegressor (RBF, fixed kernel) fitted on 100 and
2,000 training rows of 10 features, converted by skl2onnx (opset 17), optimized by scanopt's
default pipeline without `distances` (canonicalize drops the pass-through state, vectorize lifts
the body into its broadcast form), and
run on 1 and 256 query rows. Each latency is the median over about ``--seconds`` of runs per
model, the two models interleaved in blocks. ratio = Scan / vectorized (above 1: faster).
The outputs are compared first (max abs difference printed; 0 means bit-identical).
Needs skl2onnx and scikit-learn (only for building the models). ``--maps`` times the
hand-written maps of models/maps at T = 2, 16, 128 (other symbolic dims 8; 300 runs) instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_unroll import latencies, session  # noqa: E402 - the one interleaved timer

import scanopt  # noqa: E402

FEATURES = 10


def build(kind: str, rows: int):
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF
    from sklearn.neighbors import KNeighborsRegressor

    warnings.filterwarnings("ignore")
    rng = np.random.RandomState(rows)
    x = rng.randn(rows, FEATURES).astype(np.float32)
    y = x.sum(axis=1)
    est = (KNeighborsRegressor(5) if kind == "knn" else
           GaussianProcessRegressor(RBF(3.0), optimizer=None, alpha=1e-2)).fit(x, y)
    return to_onnx(est, initial_types=[("X", FloatTensorType([None, FEATURES]))], target_opset=17)


MAPS = ("map_elementwise", "map_matmul_outer", "map_softmax_rows", "map_axis1", "map_reverse")
MAP_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "maps")


def map_feeds(model, steps: int) -> dict:
    """Inputs for a committed map sample: the symbolic seq dim = ``steps``, other symbols 8."""
    feeds = {}
    rng = np.random.default_rng(steps)
    for value in model.graph.input:
        dims = [d.dim_value or (steps if d.dim_param == "seq" else 8) for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def maps_table(args) -> None:
    import onnx

    print("| map | T | Scan ms | vectorized ms | ratio | max abs diff |")
    print("|---|---|---|---|---|---|")
    for name in MAPS:
        model = onnx.load(os.path.join(MAP_DIR, f"{name}.onnx"))
        optimized, _ = scanopt.optimize(model, passes=["vectorize"], verify=False)
        sessions = [session(model, args.threads), session(optimized, args.threads)]
        for steps in (2, 16, 128):
            feeds = map_feeds(model, steps)
            before, after = (s.run(None, feeds) for s in sessions)
            diff = max(float(np.max(np.abs(a - b))) for a, b in zip(before, after))
            t_scan, t_vec = latencies(sessions, feeds, 300)
            print(f"| {name} | {steps} | {t_scan * 1e3:.3f} | {t_vec * 1e3:.3f} | {t_scan / t_vec:.2f}x | {diff:.2g} |",
                  flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=0.3)
    parser.add_argument("--maps", action="store_true", help="time the hand-written maps of models/maps instead")
    args = parser.parse_args(argv)
    print(f"onnxruntime {ort.__version__}, {args.threads} intra-op thread(s)")
    if args.maps:
        maps_table(args)
        return
    header = "| model | train rows | query rows | Scan ms | vectorized ms | ratio | max abs diff |"
    print(header)
    print("|---|---|---|---|---|---|---|")
    for kind in ("knn", "gp"):
        for rows in (100, 2000):
            model = build(kind, rows)
            # the broadcast form: the default pipeline gives these bodies to `distances` first
            # (benchmarks/bench_linrec.py times that GEMM form)
            optimized, report = scanopt.optimize(model, verify=False, skip=["distances"])
            assert any(o.pass_name == "vectorize" and o.applied for o in report.outcomes), report.format()
            sessions = [session(model, args.threads), session(optimized, args.threads)]
            for queries in (1, 256):
                feeds = {"X": np.random.default_rng(queries).standard_normal((queries, FEATURES)).astype(np.float32)}
                before, after = (s.run(None, feeds) for s in sessions)
                diff = max(float(np.max(np.abs(a - b))) if a.size else 0.0 for a, b in zip(before, after))
                start = time.perf_counter()
                sessions[0].run(None, feeds)
                once = time.perf_counter() - start
                runs = int(min(2000, max(20, args.seconds / max(once, 1e-6))))
                t_scan, t_vec = latencies(sessions, feeds, runs)
                print(f"| {kind} | {rows} | {queries} | {t_scan * 1e3:.3f} | {t_vec * 1e3:.3f} | "
                      f"{t_scan / t_vec:.2f}x | {diff:.2g} |", flush=True)


if __name__ == "__main__":
    main()
