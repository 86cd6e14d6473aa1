"""onnxruntime CPU time of skl2onnx pairwise-distance Scans before and after `vectorize`.

    python benchmarks/bench_vectorize.py [--seconds 1.0] [--maps]

KNeighborsRegressor (k=5) and GaussianProcessRegressor (RBF, fixed kernel) fitted on 100 and
2,000 training rows of 10 features, converted by skl2onnx (opset 17), optimized by scanopt's
default pipeline without `distances` (canonicalize drops the pass-through state, vectorize lifts
the body into its broadcast form), and
run on 1 and 256 query rows. Timing as bench_linrec: thread CPU time of ``session.run`` with
one intra-op thread, the two models interleaved run by run for about ``--seconds``, median
±interquartile range; the A/A row times a Scan against a second session of itself (the noise
floor). ratio = Scan / vectorized (above 1: faster). The outputs are compared first (max abs
difference printed; 0 means bit-identical). Needs skl2onnx and scikit-learn (only for
building the models). ``--maps`` times the hand-written maps of models/maps at T = 2, 16, 128
(other symbolic dims 8) instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_linrec import row  # noqa: E402 - the thread-CPU interleaved timer

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

    print("| map, T | Scan ms | vectorized ms | ratio | max abs diff |")
    print("|---|---|---|---|---|")
    for name in MAPS:
        model = onnx.load(os.path.join(MAP_DIR, f"{name}.onnx"))
        optimized, _ = scanopt.optimize(model, passes=["vectorize"], verify=False)
        if name == MAPS[0]:
            print(row(f"A/A: {name}, T=16, Scan vs itself", model, model, args.seconds, map_feeds(model, 16)), flush=True)
        for steps in (2, 16, 128):
            print(row(f"{name}, T={steps}", model, optimized, args.seconds, map_feeds(model, steps)), flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--maps", action="store_true", help="time the hand-written maps of models/maps instead")
    args = parser.parse_args(argv)
    print(f"onnxruntime {ort.__version__}, 1 intra-op thread, thread CPU time, median ±IQR%")
    if args.maps:
        maps_table(args)
        return
    print("| model, train rows, query rows | Scan ms | vectorized ms | ratio | max abs diff |")
    print("|---|---|---|---|---|")
    for kind in ("knn", "gp"):
        for rows in (100, 2000):
            model = build(kind, rows)
            # the broadcast form: the default pipeline gives these bodies to `distances` first
            # (benchmarks/bench_linrec.py times that GEMM form)
            optimized, report = scanopt.optimize(model, verify=False, skip=["distances"])
            assert any(o.pass_name == "vectorize" and o.applied for o in report.outcomes), report.format()
            for queries in (1, 256):
                feeds = {"X": np.random.default_rng(queries).standard_normal((queries, FEATURES)).astype(np.float32)}
                if kind == "knn" and rows == 100 and queries == 1:
                    print(row("A/A: knn, 100, 1, Scan vs itself", model, model, args.seconds, feeds), flush=True)
                print(row(f"{kind}, {rows}, {queries}", model, optimized, args.seconds, feeds), flush=True)


if __name__ == "__main__":
    main()
