"""onnxruntime latency of unrolled vs looped Scans, to choose the unroll pass's default.

    python benchmarks/bench_unroll.py [--steps 1,2,4,8,16,32,64] [--seconds 0.5] [--threads 1] [--scan8]

Cells (weights are outer-scope initializers, as PyTorch exports them; batch 1):
  rnn-16 / rnn-256: h = tanh(x W + h R + b)                      (5 body nodes)
  gru-16 / gru-256: a GRU cell written out (MatMul, Split, gates) (15 body nodes)
For each cell and trip count T the looped Scan and the unroll pass's output run on the
same inputs (checked equal first), timed by scanopt.timing.measure (thread CPU time with one
thread, the two interleaved in rotating order with an A/A pair of the loop, ~``--seconds``
per case). ratio = unrolled / looped, the median of paired ratios (below 1: unrolling is
faster), ± half their interquartile range. Also printed: nodes and file size
after unrolling, and how long the pass took.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

from scanopt.graph import NameAllocator, cleanup
from scanopt.ir import export_model, import_model
from scanopt.pass_api import PassContext
from scanopt.passes.unroll import Unroll
from scanopt.shapes import ShapeTable
from scanopt.engines import run
from scanopt.timing import measure

F = TP.FLOAT


def vi(name, shape):
    return h.make_tensor_value_info(name, F, shape)


def cell_model(kind: str, hidden: int, steps: int) -> onnx.ModelProto:
    """Scan over X [T, 1, hidden] with state h [1, hidden]; the body is an RNN or GRU cell."""
    rng = np.random.default_rng(hidden)
    gates = 1 if kind == "rnn" else 3
    w = rng.uniform(-0.3, 0.3, (hidden, gates * hidden)).astype(np.float32)
    r = rng.uniform(-0.3, 0.3, (hidden, gates * hidden)).astype(np.float32)
    bias = rng.uniform(-0.3, 0.3, (gates * hidden,)).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in ((w, "W"), (r, "R"), (bias, "Bias"))]
    if kind == "rnn":
        nodes = [
            h.make_node("MatMul", ["x_t", "W"], ["xw"]),
            h.make_node("MatMul", ["h_in", "R"], ["hr"]),
            h.make_node("Add", ["xw", "hr"], ["pre0"]),
            h.make_node("Add", ["pre0", "Bias"], ["pre"]),
            h.make_node("Tanh", ["pre"], ["h_out"]),
        ]
    else:
        inits.append(numpy_helper.from_array(np.array([hidden] * 3, np.int64), "split3"))
        nodes = [
            h.make_node("MatMul", ["x_t", "W"], ["xw0"]),
            h.make_node("Add", ["xw0", "Bias"], ["xw"]),
            h.make_node("MatMul", ["h_in", "R"], ["hr"]),
            h.make_node("Split", ["xw", "split3"], ["xz", "xr", "xh"], axis=1),
            h.make_node("Split", ["hr", "split3"], ["hz", "hr_r", "hh"], axis=1),
            h.make_node("Add", ["xz", "hz"], ["z0"]),
            h.make_node("Sigmoid", ["z0"], ["z"]),
            h.make_node("Add", ["xr", "hr_r"], ["r0"]),
            h.make_node("Sigmoid", ["r0"], ["r"]),
            h.make_node("Mul", ["r", "hh"], ["rh"]),
            h.make_node("Add", ["xh", "rh"], ["c0"]),
            h.make_node("Tanh", ["c0"], ["c"]),
            h.make_node("Sub", ["h_in", "c"], ["d"]),
            h.make_node("Mul", ["z", "d"], ["zd"]),
            h.make_node("Add", ["c", "zd"], ["h_out"]),
        ]
    nodes.append(h.make_node("Identity", ["h_out"], ["y_t"]))
    body = h.make_graph(nodes, "cell", [vi("h_in", [1, hidden]), vi("x_t", [1, hidden])],
                        [vi("h_out", [1, hidden]), vi("y_t", [1, hidden])])
    scan = h.make_node("Scan", ["h0", "X"], ["h_n", "Y"], name="scan", body=body, num_scan_inputs=1)
    graph = h.make_graph([scan], "bench", [vi("h0", [1, hidden]), vi("X", [steps, 1, hidden])],
                         [vi("h_n", [1, hidden]), vi("Y", [steps, 1, hidden])], initializer=inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def unroll(model: onnx.ModelProto, steps: int) -> onnx.ModelProto:
    """The unroll pass alone on ``model``. These cells are ones the fuse pass turns into
    native ops, so fusion is marked as rolled back (``denied``), as after a failed
    verification: unroll then takes them."""
    graph = import_model(model)
    opset = model.opset_import[0].version
    ctx = PassContext(opset=opset, names=NameAllocator(graph), shapes=ShapeTable(model),
                      options={"unroll_max": steps}, denied=frozenset({("fuse", "scan")}))
    result = Unroll()(graph, ctx)
    if not result.modified:
        raise SystemExit(f"T={steps}: not unrolled: {[o.detail for o in result.outcomes]}")
    return export_model(cleanup(graph), model)


def timed(looped: onnx.ModelProto, unrolled: onnx.ModelProto, feeds: dict, args) -> tuple[float, float, str]:
    """(looped s, unrolled s, 'ratio ±spread, A/A noise') from scanopt.timing.measure: thread CPU
    time with one thread, the two forms interleaved with an A/A pair of the loop."""
    t = measure({"loop": looped, "unrolled": unrolled}, feeds, threads=args.threads, seconds=args.seconds,
                check_budget=False)
    u = t.forms["unrolled"]
    return t.forms["loop"].seconds, u.seconds, f"{u.ratio:.2f} ±{u.spread:.2f} (A/A {t.noise:.2f})"


def scan8_model(batch: int, steps: int, hidden: int, lens: bool) -> onnx.ModelProto:
    """An opset-8 Scan (a BiDAF-style tanh cell, h = tanh(x W + h R)) over X [B, T, H]."""
    rng = np.random.default_rng(hidden)
    w, r = (rng.uniform(-0.3, 0.3, (hidden, hidden)).astype(np.float32) for _ in range(2))
    nodes = [h.make_node("MatMul", ["x_t", "W"], ["xw"]), h.make_node("MatMul", ["h_in", "R"], ["hr"]),
             h.make_node("Add", ["xw", "hr"], ["pre"]), h.make_node("Tanh", ["pre"], ["h_out"]),
             h.make_node("Identity", ["h_out"], ["y_t"])]
    body = h.make_graph(nodes, "cell", [vi("h_in", [1, hidden]), vi("x_t", [1, hidden])],
                        [vi("h_out", [1, hidden]), vi("y_t", [1, hidden])])
    scan = h.make_node("Scan", ["L" if lens else "", "h0", "X"], ["h_n", "Y"], name="scan", body=body,
                       num_scan_inputs=1)
    inputs = [vi("h0", [batch, 1, hidden]), vi("X", [batch, steps, 1, hidden])]
    if lens:
        inputs.insert(0, h.make_tensor_value_info("L", TP.INT64, [batch]))
    graph = h.make_graph([scan], "bench8", inputs, [vi("h_n", [batch, 1, hidden]), vi("Y", [batch, steps, 1, hidden])],
                         initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(r, "R")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 8)], ir_version=8)


def scan8_table(args) -> None:
    """Scan-8 unrolled in place at opset 8 against its loop."""
    print("| B | T | sequence_lens | looped us | unrolled us | ratio | nodes |")
    print("|---|---|---|---|---|---|---|")
    for batch in (1, 4):
        for steps in (2, 4):
            for lens in (False, True):
                looped = scan8_model(batch, steps, 16, lens)
                unrolled = unroll(looped, steps)
                rng = np.random.default_rng(steps)
                feeds = {"h0": rng.standard_normal((batch, 1, 16)).astype(np.float32),
                         "X": rng.standard_normal((batch, steps, 1, 16)).astype(np.float32)}
                if lens:
                    feeds["L"] = np.maximum(1, steps - np.arange(batch) % steps).astype(np.int64)
                for a, b in zip(run(looped, feeds, "ort").values(), run(unrolled, feeds, "ort").values()):
                    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
                t_loop, t_unroll, ratio = timed(looped, unrolled, feeds, args)
                print(f"| {batch} | {steps} | {'yes' if lens else 'no'} | {t_loop * 1e6:.1f} | {t_unroll * 1e6:.1f} | "
                      f"{ratio} | {len(unrolled.graph.node)} |", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="1,2,4,8,16,32,64")
    parser.add_argument("--cells", default="rnn-16,rnn-256,gru-16,gru-256")
    parser.add_argument("--seconds", type=float, default=0.5, help="timing budget per case")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--scan8", action="store_true", help="time opset-8 Scans unrolled in place instead")
    args = parser.parse_args(argv)
    if args.scan8:
        scan8_table(args)
        return
    steps_list = [int(s) for s in args.steps.split(",")]
    print(f"onnxruntime {ort.__version__}, {args.threads} intra-op thread(s), scanopt.timing.measure (thread CPU "
          "time with 1 thread, interleaved, medians of paired ratios +- half the IQR, A/A noise), batch 1")
    header = (f"{'cell':<8} {'T':>3} {'looped us':>10} {'unrolled us':>12} {'ratio unrolled/looped':>24} {'nodes':>6} "
              f"{'KB':>6} {'pass ms':>8}")
    print(header)
    print("-" * len(header))
    started = time.perf_counter()
    for cell in args.cells.split(","):
        kind, hidden = cell.split("-")
        for steps in steps_list:
            looped = cell_model(kind, int(hidden), steps)
            t0 = time.perf_counter()
            unrolled = unroll(looped, steps)
            pass_ms = (time.perf_counter() - t0) * 1e3
            rng = np.random.default_rng(steps)
            feeds = {"h0": rng.standard_normal((1, int(hidden))).astype(np.float32),
                     "X": rng.standard_normal((steps, 1, int(hidden))).astype(np.float32)}
            for a, b in zip(run(looped, feeds, "ort").values(), run(unrolled, feeds, "ort").values()):
                np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
            t_loop, t_unroll, ratio = timed(looped, unrolled, feeds, args)
            nodes = len(unrolled.graph.node)
            size_kb = unrolled.ByteSize() / 1024
            print(f"{cell:<8} {steps:>3} {t_loop * 1e6:>10.1f} {t_unroll * 1e6:>12.1f} {ratio:>24} "
                  f"{nodes:>6} {size_kb:>6.0f} {pass_ms:>8.1f}", flush=True)
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
