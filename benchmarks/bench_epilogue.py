"""onnxruntime CPU time of Scans whose scan output is a per-step function of the new state
(a projection h_t·W_out), with the projection in the loop and computed once after it by
canonicalize (the README's canonicalize epilogue table).

    python benchmarks/bench_epilogue.py [--seconds 1.0]

Models: an RNN language model emitting logits h_t·W_out (hand-built: H=32 hidden, 3 inputs,
a vocabulary of 256; tests/cell_builders), the same emitting the logits alone (h's new value
stacked as a new scan output by canonicalize) and tf2onnx's tf.scan over (h, s) emitting (h·v, s, h)
(models/heldout_producers_2/tf_scan_tuple_two_out.onnx, H=6). Forms, each built with
verification and tuning off:
- ``in loop``: canonicalize (after loop_to_scan, for the tf.scan Loop) with its epilogue
  planning switched off (the projection stays in the loop), the baseline;
- ``after loop``: the same with it on (the projection is one MatMul over all steps; the cell
  stays a loop): this rewrite's own effect;
- ``portable``: --target portable (the cell then fuses into RNN);
- ``default``: the default pipeline (target onnxruntime, shapes unknown: modelled).
Timing: scanopt.timing.measure (thread CPU time of session.run, one intra-op thread, forms
interleaved in rotating order with an A/A copy of the baseline); ratio = baseline / form from
the median of paired ratios (above 1: faster), ± half their interquartile range.
"""

from __future__ import annotations

import argparse
import os
import sys
from unittest import mock

import numpy as np
import onnx
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import cell_builders as cb  # noqa: E402
from bench_fission import feeds_for  # noqa: E402 - x [T, B, I], the rest [B, ...], as there
import scanopt  # noqa: E402
from scanopt.engines import run  # noqa: E402
from scanopt.passes.canonicalize import canonicalize_pass  # noqa: E402
from scanopt.timing import measure  # noqa: E402

HIDDEN, VOCAB = 32, 256


def language_model(only_logits: bool = False) -> onnx.ModelProto:
    """h_t = tanh(x_t W + h_{t-1} R + b); scan outputs h_t and the logits h_t·W_out (with
    ``only_logits`` the logits alone: canonicalize then stacks h as a new scan output)."""
    body = cb.Body(hidden=HIDDEN)
    h_new = cb.rnn(body, "x", "h")
    logits = body.op("MatMul", h_new, body.const(cb.rand(9, HIDDEN, VOCAB), "w_out"))
    model = cb.scan_model(body, [("h", h_new, HIDDEN)], ys=[logits] if only_logits else [h_new, logits])
    scan_body = next(a.g for a in model.graph.node[-1].attribute if a.name == "body")
    for value, dims in ((scan_body.output[-1], ["batch", VOCAB]), (model.graph.output[-1], ["seq", "batch", VOCAB])):
        value.CopyFrom(onnx.helper.make_tensor_value_info(value.name, onnx.TensorProto.FLOAT, dims))
    return model


def forms(model) -> dict:
    def opt(passes=None, **options):
        out, _ = scanopt.optimize(model, verify=False, passes=passes, options={"tune": False, **options})
        return out

    canonical = ["loop_to_scan", "canonicalize", "cleanup"]
    with mock.patch.object(canonicalize_pass, "_plan_epilogues", lambda *args: None):
        in_loop = opt(passes=canonical, fission="never")
    return {
        "in loop": in_loop,
        "after loop": opt(passes=canonical, fission="never"),
        "portable": opt(target="portable"),
        "default": opt(),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args(argv)
    cases = {"RNN LM logits (H=32, V=256)": language_model(),
             "RNN LM logits only, h not stacked": language_model(only_logits=True),
             "tf_scan_tuple_two_out": onnx.load(os.path.join(ROOT, "models/heldout_producers_2/tf_scan_tuple_two_out.onnx"))}
    print(f"onnxruntime {ort.__version__}, 1 intra-op thread, scanopt.timing.measure (thread CPU time, interleaved, A/A)")
    print("| model | T, B | in loop ms | after loop | portable | default | A/A noise |")
    print("|---|---|---|---|---|---|---|")
    for name, model in cases.items():
        built = forms(model)
        for T, B in ((16, 1), (128, 1), (128, 8)):
            feeds = feeds_for(model, T, B)
            reference = run(built["in loop"], feeds, "ort")
            for form, m in built.items():
                got = run(m, feeds, "ort")
                for key in reference:
                    np.testing.assert_allclose(got[key], reference[key], rtol=1e-4, atol=1e-4, err_msg=f"{name} {form}")
            t = measure(built, feeds, threads=1, seconds=args.seconds, check_budget=False)
            cells = [f"{1 / t.forms[f].ratio:.2f}x ±{t.forms[f].spread:.2f}" for f in ("after loop", "portable", "default")]
            print(f"| {name} | {T}, {B} | {t.forms['in loop'].seconds * 1e3:.3f} | " + " | ".join(cells)
                  + f" | {t.noise:.2f} |", flush=True)


if __name__ == "__main__":
    main()
