"""onnxruntime latency of recurrent Scans with and without `hoist`, and of the native RNN.

    python benchmarks/bench_hoist.py [--threads 1] [--seconds 0.3]

Two cells over X [T, B, I] with state h [B, H], weights as outer initializers:
  residual: h' = tanh(x W + b + h R) + 0.5 h   (not fusable: the residual is outside the activation)
  tanh-rnn: h' = tanh(x W + b + h R)           (fusable: the native RNN op is timed too)
``hoist`` moves ``x W + b`` out of the loop as one MatMul over the whole sequence (a new scan
input). Timing is scanopt.timing's: thread CPU time, runs interleaved one by one, about
``--seconds`` per model, medians, Scan/hoisted the median of paired ratios, A/A the noise of
two sessions of the Scan; outputs are checked equal first. native = the fused model
(scanopt's fuse pass; both built with --target portable: this times the forms, whether the
default picks them is bench_policy.py's).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import scanopt  # noqa: E402
from scanopt.timing import measure  # noqa: E402 - thread CPU time, interleaved, A/A pair

CONFIGS = [(16, 1, 32, 32), (100, 1, 128, 128), (100, 8, 64, 128), (32, 32, 64, 64), (64, 4, 256, 256)]


def cell(kind: str, steps: int, batch: int, inputs: int, hidden: int) -> onnx.ModelProto:
    rng = np.random.default_rng(hidden)
    scale = 1 / np.sqrt(hidden)  # PyTorch's RNN initialization
    w = rng.uniform(-scale, scale, (inputs, hidden)).astype(np.float32)
    r = rng.uniform(-scale, scale, (hidden, hidden)).astype(np.float32)
    b = rng.uniform(-scale, scale, (hidden,)).astype(np.float32)
    nodes = [h.make_node("MatMul", ["x", "W"], ["xw"]), h.make_node("Add", ["xw", "b"], ["xwb"]),
             h.make_node("MatMul", ["h", "R"], ["hr"]), h.make_node("Add", ["xwb", "hr"], ["pre"])]
    if kind == "residual":
        nodes += [h.make_node("Tanh", ["pre"], ["act"]), h.make_node("Mul", ["h", "half"], ["hh"]),
                  h.make_node("Add", ["act", "hh"], ["h_next"])]
    else:
        nodes += [h.make_node("Tanh", ["pre"], ["h_next"])]
    nodes.append(h.make_node("Identity", ["h_next"], ["y"]))
    f = TP.FLOAT
    body = h.make_graph(nodes, "cell", [h.make_tensor_value_info("h", f, [batch, hidden]),
                                        h.make_tensor_value_info("x", f, [batch, inputs])],
                        [h.make_tensor_value_info("h_next", f, [batch, hidden]),
                         h.make_tensor_value_info("y", f, [batch, hidden])],
                        initializer=[numpy_helper.from_array(np.float32(0.5), "half")] if kind == "residual" else [])
    scan = h.make_node("Scan", ["H0", "X"], ["H", "Y"], name="scan_cell", body=body, num_scan_inputs=1)
    graph = h.make_graph([scan], "bench", [h.make_tensor_value_info("H0", f, [batch, hidden]),
                                           h.make_tensor_value_info("X", f, [steps, batch, inputs])],
                         [h.make_tensor_value_info("H", f, [batch, hidden]),
                          h.make_tensor_value_info("Y", f, [steps, batch, hidden])],
                         initializer=[numpy_helper.from_array(a, n) for a, n in ((w, "W"), (r, "R"), (b, "b"))])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=0.3)
    args = parser.parse_args(argv)
    print(f"onnxruntime {ort.__version__}, {args.threads} intra-op thread(s)")
    print("| cell | T | B | I | H | Scan ms | hoisted ms | native ms | Scan/hoisted | native/hoisted | A/A |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for kind in ("residual", "tanh-rnn"):
        for steps, batch, inputs, hidden in CONFIGS:
            model = cell(kind, steps, batch, inputs, hidden)
            hoisted, report = scanopt.optimize(model, passes=["hoist", "canonicalize"], verify=False,
                                               options={"target": "portable"})
            assert any(o.pass_name == "hoist" and o.applied for o in report.outcomes), report.format()
            models = [model, hoisted]
            if kind == "tanh-rnn":
                fused, report = scanopt.optimize(model, passes=["fuse"], verify=False, options={"target": "portable"})
                assert report.modified, report.format()
                models.append(fused)
            rng = np.random.default_rng(steps)
            feeds = {"H0": rng.standard_normal((batch, hidden)).astype(np.float32),
                     "X": rng.standard_normal((steps, batch, inputs)).astype(np.float32)}
            results = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
                       for m in models]
            for other in results[1:]:  # batched and native kernels sum in another order
                for a, b in zip(results[0], other):
                    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
            named = dict(zip(("scan", "hoisted", "native"), models))
            timed = measure(named, feeds, threads=args.threads, seconds=args.seconds * len(named), check_budget=False)
            times = [timed.forms[k].seconds for k in named]
            native = f"{times[2] * 1e3:.3f}" if len(times) > 2 else "–"
            versus = f"{times[2] / times[1]:.2f}x" if len(times) > 2 else "–"
            print(f"| {kind} | {steps} | {batch} | {inputs} | {hidden} | {times[0] * 1e3:.3f} | {times[1] * 1e3:.3f} | "
                  f"{native} | {1 / timed.forms['hoisted'].ratio:.2f}x | {versus} | {timed.noise:.2f} |", flush=True)


if __name__ == "__main__":
    main()
