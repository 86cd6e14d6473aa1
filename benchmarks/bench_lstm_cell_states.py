"""onnxruntime CPU time of an LSTM Scan that emits (h, c) per step, before and after fuse (issue 20).

    python benchmarks/bench_lstm_cell_states.py [--seconds 1.0]

The Scan is tests/cell_builders.py's ONNX-order LSTM (one MatMul per source, Split into gates)
with both h and c as scan outputs, sizes I = H in {16, 64, 256}, B in {1, 8}, T in {16, 128}.
Forms: the loop; "native" = fuse alone (LSTM + the c recurrence as a two-node Scan over
a = f, b = i ⊙ g recomputed from Y); "native+linrec" = the c Scan made loop-free by linrec
(the positions form, the length being symbolic). Timing: scanopt.timing.measure (thread CPU
time of ``session.run``, one intra-op thread, the forms interleaved in rotating order with an
A/A pair of the loop, whose deviation and spread give each row's noise); ratio = loop / form
from the median of paired ratios (above 1: faster), ± half their interquartile range.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
import cell_builders as cb  # noqa: E402

import scanopt  # noqa: E402
from scanopt.engines import run  # noqa: E402
from scanopt.timing import measure  # noqa: E402


def lstm_hc(H: int):
    body = cb.Body(hidden=H, inputs=H)
    h_new, c_new = cb.lstm(body, "x", "h", "c")
    return cb.scan_model(body, [("h", h_new, H), ("c", c_new, H)], ys=[h_new, c_new])


def forms(model) -> dict:
    out = {"loop": model}
    for label, passes in (("native", ["fuse", "cleanup"]), ("native+linrec", ["fuse", "linrec", "cleanup"])):
        out[label], _ = scanopt.optimize(model, passes=passes, verify=False, options={"target": "portable"})
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--sizes", default="16,64,256")
    args = parser.parse_args(argv)
    print(f"onnxruntime {ort.__version__}, 1 intra-op thread, scanopt.timing.measure (thread CPU time, interleaved, A/A)")
    print("| H=I | B | T | loop ms | native | native+linrec | A/A noise | max abs diff |")
    print("|---|---|---|---|---|---|---|---|")
    for H in (int(s) for s in args.sizes.split(",")):
        built = forms(lstm_hc(H))
        for B in (1, 8):
            for T in (16, 128):
                feeds = cb.feeds(built["loop"], T=T, B=B)[0]
                base = run(built["loop"], feeds, "ort")
                diff = max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
                           for name in ("native", "native+linrec")
                           for a, b in zip(base.values(), run(built[name], feeds, "ort").values()))
                t = measure(built, feeds, threads=1, seconds=args.seconds, check_budget=False)
                cells = " | ".join(f"{1 / t.forms[n].ratio:.2f}x ±{t.forms[n].spread:.2f}" for n in ("native", "native+linrec"))
                print(f"| {H} | {B} | {T} | {t.forms['loop'].seconds * 1e3:.3f} | {cells} | {t.noise:.2f} | {diff:.2g} |",
                      flush=True)


if __name__ == "__main__":
    main()
