"""onnxruntime latency of an opset-8 batched Scan against its upgraded forms, per strategy.

    python benchmarks/bench_upgrade.py [--batches 1,8,32] [--steps 16,128] [--hidden 64]
                                       [--target 17] [--seconds 0.3] [--threads 1]

The model is a BiDAF-style recurrence written as a Scan-8 (the form old TensorFlow/Keras
converters emit): h = tanh(concat(x_t, h) @ W + b) with W and b outer-scope initializers,
x [B, T, hidden], h [B, hidden]. Two variants: without sequence_lens, and with lengths
drawn in [T/2, T]. Every strategy that applies to a case is forced in turn (scanopt.migrate.
migrate with options upgrade_strategy): (a) only at batch 1 without lengths, (b) and (c)
always. Each upgraded model is checked equal to the original on the benchmark inputs
first. Timed by scanopt.timing.measure (thread CPU time with one thread, forms interleaved in
rotating order, an A/A pair of the original for the noise; ~``--seconds`` per case): ratio =
original / upgraded from the median of paired ratios (above 1: the upgraded model is faster),
± half the interquartile range of those ratios.
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

from scanopt.migrate import migrate
from scanopt.timing import measure

F = TP.FLOAT


def vi(name, shape, elem=F):
    return h.make_tensor_value_info(name, elem, shape)


def scan8_model(batch: int, steps: int, hidden: int, lens: bool) -> onnx.ModelProto:
    rng = np.random.default_rng(hidden)
    w = rng.uniform(-0.2, 0.2, (2 * hidden, hidden)).astype(np.float32)
    b = rng.uniform(-0.2, 0.2, (hidden,)).astype(np.float32)
    body = h.make_graph(
        [h.make_node("Concat", ["x_t", "h_in"], ["xh"], axis=0),
         h.make_node("MatMul", ["xh", "W"], ["pre"]),
         h.make_node("Add", ["pre", "b"], ["act"]),
         h.make_node("Tanh", ["act"], ["h_out"]),
         h.make_node("Identity", ["h_out"], ["y_t"])],
        "body", [vi("h_in", [hidden]), vi("x_t", [hidden])], [vi("h_out", [hidden]), vi("y_t", [hidden])])
    scan = h.make_node("Scan", ["lens" if lens else "", "h0", "x"], ["h_final", "y"], name="scan8",
                       num_scan_inputs=1, body=body)
    inputs = ([vi("lens", [batch], TP.INT64)] if lens else []) + [vi("h0", [batch, hidden]), vi("x", [batch, steps, hidden])]
    graph = h.make_graph([scan], "bidaf_like", inputs, [vi("h_final", [batch, hidden]), vi("y", [batch, steps, hidden])],
                         initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 8)], ir_version=8)


def feeds(batch: int, steps: int, hidden: int, lens: bool) -> dict:
    rng = np.random.default_rng(batch * 1000 + steps)
    out = {"h0": rng.standard_normal((batch, hidden)).astype(np.float32),
           "x": rng.standard_normal((batch, steps, hidden)).astype(np.float32)}
    if lens:
        out["lens"] = rng.integers(max(1, steps // 2), steps + 1, size=batch).astype(np.int64)
    return out


def session(model: onnx.ModelProto, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 4
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--steps", default="16,128")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--target", type=int, default=17)
    parser.add_argument("--seconds", type=float, default=0.3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    print(f"onnxruntime {ort.__version__}, hidden {args.hidden}, target opset {args.target}, "
          f"{args.threads} thread(s), scanopt.timing.measure ({'thread CPU' if args.threads == 1 else 'wall'} "
          "time, forms interleaved, medians of paired ratios +- half the IQR); ratio = Scan-8 time / upgraded time")
    print("| lengths | B | T | Scan-8 ms | (a) | (b) | (c) | A/A noise |")
    print("|---|---|---|---|---|---|---|---|")
    for lens in (False, True):
        for batch in map(int, args.batches.split(",")):
            for steps in map(int, args.steps.split(",")):
                original = scan8_model(batch, steps, args.hidden, lens)
                inputs = feeds(batch, steps, args.hidden, lens)
                models = {"orig": original}
                for strategy in ("a", "b", "c"):
                    if strategy == "a" and (lens or batch != 1):
                        continue
                    models[strategy] = migrate(original, args.target, options={"upgrade_strategy": strategy}).model
                sessions = {name: session(m, args.threads) for name, m in models.items()}
                expected = sessions["orig"].run(None, inputs)
                for name, s in sessions.items():
                    for e, g in zip(expected, s.run(None, inputs)):
                        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5, err_msg=name)
                timed = measure(models, inputs, threads=args.threads, seconds=args.seconds, check_budget=False)
                t = timed.forms
                cells = [f"{1 / t[k].ratio:.2f}x ±{t[k].spread:.2f}" if k in t else "-" for k in ("a", "b", "c")]
                print(f"| {'[T/2, T]' if lens else 'none'} | {batch} | {steps} | {t['orig'].seconds * 1e3:.3f} | "
                      + " | ".join(cells) + f" | {timed.noise:.2f} |", flush=True)


if __name__ == "__main__":
    main()
