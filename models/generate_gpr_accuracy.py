"""Regenerate models/gpr/: skl2onnx Gaussian process regressors for the accuracy check of
issue 29 (queries at, near and far from the training rows), as a user writes them.

    python models/generate_gpr_accuracy.py                        # models/gpr/, 200 training rows
    python models/generate_gpr_accuracy.py --rows 2000 --out DIR  # the benchmark's size (not committed:
                                                                  # return_std stores K⁻¹, 16 MB at 2,000 rows)

Needs `pip install skl2onnx scikit-learn` (generation only). Each model is fitted with
scikit-learn's defaults (hyperparameters optimized, float64 data) on rows far from the origin,
centred near 1000 (issue 33's S1: where ‖x‖² − 2·x·q + ‖q‖² cancels), converted by
``skl2onnx.to_onnx`` with a float32 input and ``{'return_std': True}``, default target opset:
- gpr_expsine_<rows>:      ExpSineSquared(1, 3), 1 feature in [1000, 1020], y = sin(2πx/3) + noise,
                           alpha 1e-2 (the kernel has no noise term of its own)
- gpr_dot_rbf_white_<rows>: DotProduct() + RBF() + WhiteKernel(), 4 features ~ N(0, 1) (standardized
                           data), y linear plus sin
- gpr_dot_rbf_white_offset_<rows>: the same kernel and targets on features ~ N(1000, 1): the
                           DotProduct term makes K so ill-conditioned that the float32 model itself
                           is far from scikit-learn (kept: it is what such a user gets)
``<name>.queries.npz`` holds the queries (float32 [Q, F]: exact training rows, near-duplicates
at 1e-6 relative, ordinary points among the rows, far points), ``kind`` (0 exact, 1 near,
2 among, 3 far, per query) and scikit-learn's float64 ``mean`` and ``std`` at them.
Each model is fitted and exported in a fresh process with PYTHONHASHSEED=0 (skl2onnx orders
opset_import by string hash), so the files are byte-identical between runs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "gpr")
NAMES = ("gpr_expsine", "gpr_dot_rbf_white", "gpr_dot_rbf_white_offset")
KINDS = ("exact", "near", "among", "far")
PER_KIND = 32  # queries of each kind
NEAR = 1e-6  # relative offset of a near-duplicate


def data(name: str, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Training rows (float32 values held in float64, as a user's data read from float32
    storage) and targets."""
    rng = np.random.RandomState(0)
    if name == "gpr_expsine":
        x = 1000 + rng.uniform(0, 20, (rows, 1))
        x = x.astype(np.float32).astype(np.float64)
        return x, np.sin(2 * np.pi * x[:, 0] / 3) + 0.1 * rng.randn(rows)
    offset = 1000.0 if name.endswith("_offset") else 0.0
    x = (offset + rng.randn(rows, 4)).astype(np.float32).astype(np.float64)
    w = np.array([0.5, -1.0, 0.25, 2.0])
    return x, (x - offset) @ w + np.sin(3 * x[:, 0]) + 0.05 * rng.randn(rows)


def estimator(name: str):
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, DotProduct, ExpSineSquared, WhiteKernel

    if name == "gpr_expsine":
        return GaussianProcessRegressor(ExpSineSquared(1.0, 3.0), alpha=1e-2, random_state=0)
    return GaussianProcessRegressor(DotProduct() + RBF() + WhiteKernel(), random_state=0)


def queries(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float32 queries, kind per query): PER_KIND training rows exactly, the same rows moved by
    NEAR relative per feature (random signs), points among the rows (a row moved by a tenth of
    the rows' spread), and far points (ten spreads away)."""
    rng = np.random.default_rng(1)
    spread = x.std(axis=0)
    picked = x[rng.permutation(len(x))[:PER_KIND]]
    sign = rng.choice([-1.0, 1.0], picked.shape)
    parts = [picked, picked * (1 + sign * NEAR), picked + 0.1 * spread * rng.standard_normal(picked.shape),
             picked + 10 * spread * rng.choice([-1.0, 1.0], picked.shape)]
    kinds = np.repeat(np.arange(len(parts)), PER_KIND)
    return np.concatenate(parts).astype(np.float32), kinds


def write(name: str, rows: int, out: str) -> None:
    import onnx
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType

    warnings.filterwarnings("ignore")
    x, y = data(name, rows)
    est = estimator(name).fit(x, y)
    model = to_onnx(est, initial_types=[("X", FloatTensorType([None, x.shape[1]]))],
                    options={id(est): {"return_std": True}})
    q, kinds = queries(x)
    mean, std = est.predict(q.astype(np.float64), return_std=True)
    stem = os.path.join(out, f"{name}_{rows}")
    onnx.save(model, stem + ".onnx")
    sys.path.insert(0, HERE)
    from generate import save_npz

    save_npz(stem + ".queries.npz", {"X": q, "kind": kinds, "mean": mean.reshape(-1, 1), "std": std})
    print(f"{stem}.onnx: {est.kernel_}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200)
    p.add_argument("--out", default=OUT)
    p.add_argument("--only", action="append", choices=NAMES)
    p.add_argument("--in-process", action="store_true", help="fit and export here (default: a fresh process each)")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    for name in args.only or NAMES:
        if args.in_process:
            write(name, args.rows, args.out)
        else:
            subprocess.run([sys.executable, os.path.abspath(__file__), "--in-process", "--only", name,
                            "--rows", str(args.rows), "--out", args.out],
                           env={**os.environ, "PYTHONHASHSEED": "0"}, check=True)


if __name__ == "__main__":
    main()
