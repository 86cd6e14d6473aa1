"""onnxruntime CPU time of Scans over a state pair (h, an accumulation of h) with and without
canonicalize's loop fission (the README's fission table).

    python benchmarks/bench_fission.py [--seconds 1.0]

Models: tf2onnx's tf.scan over (h, sum of h) (models/heldout_producers/tf_scan_pair.onnx) and
the hand-built RNN beside a running sum / an EMA of h (tests/test_canonicalize_fission.py),
at T=16/128 and B=1/8, H=4 (the exports' sizes: where loop overhead, not FLOPs, dominates).
Forms, each built with verification off and tuning off:
- ``whole``: the pipeline with option fission=never (what scanopt did before: one Scan);
- ``split loop``: the split forced (fission=always) with only linrec after it (the cell stays
  a loop, the accumulation becomes linrec's form): what splitting without a native cell gives;
- ``split native``: --target portable (RNN + CumSum);
- ``default``: the default pipeline (target onnxruntime, shapes unknown so modelled, fission auto);
- ``tuned``: the default pipeline with these T, B declared (measured forms, fission auto).
Timing: scanopt.timing.measure (thread CPU time of session.run, one intra-op thread, the forms
interleaved in rotating order with an A/A copy of the first form); ratio = whole / form from
the median of paired ratios (above 1: faster), with half their interquartile range.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import scanopt  # noqa: E402
from scanopt.engines import run  # noqa: E402
from scanopt.timing import measure  # noqa: E402


def _hand(kind):
    import test_canonicalize_fission as t

    return t._pair(t._sum if kind == "sum" else t._ema)


def forms(model) -> dict:
    def opt(**kw):
        passes = kw.pop("passes", None)
        out, _ = scanopt.optimize(model, verify=False, passes=passes, options={"tune": False, **kw})
        return out

    return {
        "whole": opt(fission="never"),
        "split loop": opt(passes=["loop_to_scan", "canonicalize", "linrec", "cleanup"], fission="always"),
        "split native": opt(target="portable"),
        "default": opt(),
    }


def feeds_for(model, T, B) -> dict:
    rng = np.random.default_rng(0)
    feeds = {}
    for value in model.graph.input:
        dims = [d.dim_value if d.dim_value else None for d in value.type.tensor_type.shape.dim]
        if value.name in ("x", "X"):  # [T, B, I] (tf.scan over axis 0) or the cell's [T, B, I]
            dims = [T, B, dims[-1]]
        else:
            dims = [B] + dims[1:]
        feeds[value.name] = rng.uniform(-1, 1, dims).astype(np.float32)
    return feeds


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args(argv)
    cases = {"tf_scan_pair": onnx.load(os.path.join(ROOT, "models/heldout_producers/tf_scan_pair.onnx")),
             "rnn + sum": _hand("sum"), "rnn + ema": _hand("ema")}
    print(f"onnxruntime {ort.__version__}, 1 intra-op thread, scanopt.timing.measure (thread CPU time, interleaved, A/A)")
    print("| model | T, B | whole ms | split loop | split native | default | tuned | A/A noise |")
    print("|---|---|---|---|---|---|---|---|")
    for name, model in cases.items():
        built = forms(model)
        for T, B in ((16, 1), (128, 1), (128, 8)):
            feeds = feeds_for(model, T, B)
            reference = run(built["whole"], feeds, "ort")
            for form, m in built.items():  # (tuned: verified by scanopt's own run below)
                got = run(m, feeds, "ort")
                for key in reference:
                    np.testing.assert_allclose(got[key], reference[key], rtol=1e-4, atol=1e-4, err_msg=f"{name} {form}")
            shapes = {k: list(v.shape) for k, v in feeds.items()}
            tuned, _ = scanopt.optimize(model, verify=False, input_shapes=shapes, options={"tune_cache": "off"})
            built_here = dict(built, tuned=tuned)
            t = measure(built_here, feeds, threads=1, seconds=args.seconds, check_budget=False)
            cells = [f"{1 / t.forms[f].ratio:.2f}x ±{t.forms[f].spread:.2f}" for f in ("split loop", "split native", "default", "tuned")]
            print(f"| {name} | {T}, {B} | {t.forms['whole'].seconds * 1e3:.3f} | " + " | ".join(cells)
                  + f" | {t.noise:.2f} |", flush=True)


if __name__ == "__main__":
    main()
