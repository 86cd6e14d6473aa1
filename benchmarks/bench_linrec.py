"""onnxruntime CPU time of linear-recurrence Scans before and after `linrec` (issue 21's table).

    python benchmarks/bench_linrec.py [--seconds 1.0] [--only ema] [--chunks 8,16,32,64]

Models are the hand-written forms of tests/linrec_builders.py at the issue's sizes (B=1):
cumulative sum H=128; EMA with learned decay H=128; minGRU I=H=64; Mamba-style selective scan
D=64, N=16, and ``mamba_torch``, PyTorch's dynamo export of a selective scan with its projections in
the step (models/linrec/torch_mamba_wide.onnx, length re-declared); ``mamba_minimal``, mamba-minimal's
selective_scan as PyTorch exports it, the whole model (models/linrec/torch_mamba_minimal_wide.onnx: its
projections, deltaA and deltaB_u computed for all steps before the Scan by two Einsums, y read by an
Einsum; linrec takes the Einsums into its steps), and ``mamba_minimal_scan``, its Scan alone (a, b and C
as inputs); ``mamba_hf``, Hugging Face's slow-path layout (tests/linrec_builders.mamba_hf: deltaA and
deltaB_u by broadcast Muls on [B, D, T, N] before a Scan on axis 2); decayed linear attention DK=DV=64
(also with the state stored transposed); each also
at T=16 and 64 (the "never slower at T <= 64" rows). Timing: scanopt.timing.measure, the
one timer tune and every benchmark use (thread CPU time of ``session.run`` with one intra-op
thread, the forms interleaved in rotating order with an A/A pair of the Scan, whose deviation
and spread give each row's noise); ratio = Scan / rewritten from the median of paired ratios
(above 1: faster), ± half their interquartile range. The A/A row times the Scan against
itself as a second form: its ratio is the noise floor.
The rewrite is the pass's own form (tuning off). Outputs are compared first (max abs
difference printed). ``--chunks`` times the chunked form at
several chunk lengths instead (how DEFAULT_CHUNK was chosen; Mamba in its two-pass form). ``knn`` rows: skl2onnx
KNeighborsRegressor (k=5, 2,000 training rows of 10 features, needs skl2onnx and scikit-learn)
at 1 and 64 queries, the `distances` GEMM form and vectorize's broadcast form against the Scan.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import onnx
import onnx.utils
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
import linrec_builders as lb  # noqa: E402

import scanopt  # noqa: E402
from scanopt.engines import run  # noqa: E402
from scanopt.timing import measure  # noqa: E402

CASES = {
    "cumsum": (lambda T: lb.running_sum(T=T, H=128, B=1), (16, 64, 4096), "5x at T=4096"),
    "ema": (lambda T: lb.ema(T=T, H=128), (16, 64, 2048), "3x at T=2048"),
    "mingru": (lambda T: lb.mingru(T=T, I=64, H=64, B=1), (16, 64, 1024), "3x at T=1024"),
    "mamba": (lambda T: lb.mamba(T=T, B=1, D=64, N=16), (16, 64, 1024), "3x at T=1024"),
    "mamba_torch": (lambda T: torch_export_at("torch_mamba_wide", T), (16, 64, 1024), "3x at T=1024"),
    "mamba_minimal": (lambda T: model_at("torch_mamba_minimal_wide", 1, T), (16, 64, 1024), "3x at T=1024"),
    "mamba_minimal_scan": (lambda T: scan_alone_at("torch_mamba_minimal_wide", T), (16, 64, 1024), "3x at T=1024"),
    "mamba_hf": (lambda T: lb.mamba_hf(T=T, B=1, D=64, N=16), (16, 64, 1024), "3x at T=1024"),
    "linear_attention": (lambda T: lb.linear_attention(T=T, DK=64, DV=64), (16, 64, 1024), "2x at T=1024"),
    "linear_attention_transposed": (lambda T: lb.linear_attention_transposed(T=T, DK=64, DV=64), (16, 64, 1024),
                                    "2x at T=1024"),
}


def torch_export_at(name: str, steps: int):
    """A committed PyTorch export (models/linrec, one Scan node) with its length re-declared:
    the body does not depend on T, so this is the same export at ``steps`` steps."""
    model = onnx.load(os.path.join(os.path.dirname(HERE), "models", "linrec", f"{name}.onnx"))
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_value = steps
    return model


def model_at(name: str, axis: int, steps: int):
    """A committed PyTorch export (models/linrec), the whole model, with the length on ``axis`` of
    its inputs and outputs re-declared (the graph does not depend on it; inferred shapes dropped)."""
    model = onnx.load(os.path.join(os.path.dirname(HERE), "models", "linrec", f"{name}.onnx"))
    for value in list(model.graph.input) + list(model.graph.output):
        dims = value.type.tensor_type.shape.dim
        if len(dims) > axis:
            dims[axis].dim_value = steps
    del model.graph.value_info[:]
    return model


def scan_alone_at(name: str, steps: int):
    """The one Scan of a committed PyTorch export (models/linrec) cut out with its own inputs, the
    scanned ones (and the stacked outputs) re-declared ``steps`` long: what linrec rewrites, without
    the projections around it."""
    model = onnx.load(os.path.join(os.path.dirname(HERE), "models", "linrec", f"{name}.onnx"))
    scan = next(node for node in model.graph.node if node.op_type == "Scan")
    alone = onnx.utils.Extractor(onnx.shape_inference.infer_shapes(model)).extract_model(
        [name for name in scan.input if name], list(scan.output))
    states = len(scan.input) - next(a.i for a in scan.attribute if a.name == "num_scan_inputs")
    stacked = list(alone.graph.input)[states:] + list(alone.graph.output)[states:]
    for value in stacked:
        value.type.tensor_type.shape.dim[0].dim_value = steps
    del alone.graph.value_info[:]  # the extractor's copies of the inputs' and outputs' old shapes
    return alone


def feeds_for(model) -> dict:
    rng = np.random.default_rng(0)
    feeds = {}
    for value in model.graph.input:
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def row(label: str, model, optimized, seconds: float, feeds=None) -> str:
    """A table row: the loop and the rewritten form timed by scanopt.timing.measure (thread CPU
    time, one thread, interleaved in rotating order with an A/A pair of the loop)."""
    feeds = feeds if feeds is not None else feeds_for(model)
    before, after = (run(m, feeds, "ort") for m in (model, optimized))
    diff = max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
               for a, b in zip(before.values(), after.values()))
    t = measure({"loop": model, "rewritten": optimized}, feeds, threads=1, seconds=seconds, check_budget=False)
    loop, new = t.forms["loop"], t.forms["rewritten"]
    return (f"| {label} | {loop.seconds * 1e3:.3f} | {new.seconds * 1e3:.3f} | {1 / new.ratio:.2f}x ±{new.spread:.2f} "
            f"(A/A {t.noise:.2f}) | {diff:.2g} |")


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
    print(f"onnxruntime {ort.__version__}, 1 intra-op thread, scanopt.timing.measure (thread CPU time, interleaved, A/A)")
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
                wide = {"linrec_form": "two-pass"} if name == "mamba" else {"linrec_max_state": 1 << 30}
                optimized, _ = rewrite(model, linrec_chunk=chunk, linrec_attention_chunk=chunk, linrec_min_steps=1,
                                       **wide)
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
