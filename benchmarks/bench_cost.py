"""The measurements behind scanopt/cost.py: onnxruntime CPU latency of each Scan form.

    python benchmarks/bench_cost.py [--seconds 0.3] [--only fuse,unroll] [--emit]

fuse: RNN/GRU/LSTM cells written as PyTorch's exporter writes them (benchmarks/bench_fuse.py
builds them) at sizes (T, B, I, H) spanning the crossovers: the Scan, the fuse pass's output
and a hand-written native op, one interleaved run per size; ratio = scan / fused (> 1: the
fused form is faster). unroll: a Scan with K scan outputs and a non-cell body at T steps;
ratio = looped / unrolled. ``--emit`` prints the Python tables to paste into cost.py.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

import scanopt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fuse import latencies, native_model, scan_model, session, torch_weights  # noqa: E402

FUSE_SIZES = [  # T, B, I, H
    (16, 1, 16, 16), (64, 1, 64, 64), (100, 1, 128, 128),
    (32, 2, 64, 64), (50, 2, 256, 256), (32, 4, 64, 64), (32, 8, 64, 64),
    (50, 8, 256, 256), (32, 16, 64, 64), (32, 32, 128, 256),
]
UNROLL_CASES = [(t, k, hd) for hd in (16, 256) for k in (1, 4) for t in (1, 2, 4, 8)]
PORTABLE = {"target": "portable"}  # apply every rewrite: we are measuring them


def bench_fuse(seconds: float):
    rows = []
    for kind in ("RNN", "GRU", "LSTM"):
        for t, b, i, hd in FUSE_SIZES:
            wts = torch_weights(kind, i, hd)
            scan = scan_model(kind, i, hd, wts)
            fused, report = scanopt.optimize(scan, passes=["fuse", "cleanup"], verify=False, options=PORTABLE)
            if not report.modified:
                raise SystemExit(f"{kind} {t}x{b}x{i}x{hd}: not fused")
            native = native_model(kind, i, hd, wts)
            rng = np.random.default_rng(1)
            feeds = {"X": rng.standard_normal((t, b, i)).astype(np.float32)}
            feeds.update({f"{s}0": rng.standard_normal((b, hd)).astype(np.float32) for s in ["h", "c"][:1 + (kind == "LSTM")]})
            sessions = [session(m, 1) for m in (scan, fused, native)]
            scan_s, fused_s, native_s = latencies(sessions, feeds, seconds)
            rows.append((kind, t, b, i, hd, scan_s * 1e3, fused_s * 1e3, native_s * 1e3))
            print(f"| {kind} | {t} | {b} | {i} | {hd} | {scan_s * 1e3:.3f} | {fused_s * 1e3:.3f} | {native_s * 1e3:.3f} "
                  f"| {scan_s / fused_s:.2f} | {fused_s / native_s:.2f} |", flush=True)
    return rows


def unroll_model(steps: int, outputs: int, hidden: int):
    """h = relu(x W + h R): not a cell fuse recognizes; K scan outputs of h (Identity, Neg, ...)."""
    rng = np.random.default_rng(hidden)
    vi = h.make_tensor_value_info
    ops = ["Identity", "Neg", "Abs", "Sigmoid"][:outputs]
    nodes = [h.make_node("MatMul", ["x_t", "W"], ["xw"]), h.make_node("MatMul", ["h_in", "R"], ["hr"]),
             h.make_node("Add", ["xw", "hr"], ["pre"]), h.make_node("Relu", ["pre"], ["h_out"])]
    nodes += [h.make_node(op, ["h_out"], [f"y{k}_t"]) for k, op in enumerate(ops)]
    body = h.make_graph(nodes, "body", [vi("h_in", TP.FLOAT, [1, hidden]), vi("x_t", TP.FLOAT, [1, hidden])],
                        [vi("h_out", TP.FLOAT, [1, hidden])] + [vi(f"y{k}_t", TP.FLOAT, [1, hidden]) for k in range(outputs)])
    scan = h.make_node("Scan", ["h0", "X"], ["h_n"] + [f"Y{k}" for k in range(outputs)], num_scan_inputs=1, body=body)
    inits = [numpy_helper.from_array((rng.standard_normal((hidden, hidden)) * 0.1).astype(np.float32), n) for n in ("W", "R")]
    graph = h.make_graph([scan], "unroll", [vi("X", TP.FLOAT, [steps, 1, hidden]), vi("h0", TP.FLOAT, [1, hidden])],
                         [vi("h_n", TP.FLOAT, [1, hidden])] + [vi(f"Y{k}", TP.FLOAT, [steps, 1, hidden]) for k in range(outputs)],
                         initializer=inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def bench_unroll(seconds: float):
    rows = []
    for t, k, hd in UNROLL_CASES:
        looped = unroll_model(t, k, hd)
        unrolled, report = scanopt.optimize(looped, passes=["unroll", "cleanup"], verify=False,
                                            options=dict(PORTABLE, unroll_max=8))
        if not report.modified:
            raise SystemExit(f"unroll T={t} K={k} H={hd}: not unrolled")
        rng = np.random.default_rng(2)
        feeds = {"X": rng.standard_normal((t, 1, hd)).astype(np.float32), "h0": rng.standard_normal((1, hd)).astype(np.float32)}
        loop_s, unrolled_s = latencies([session(looped, 1), session(unrolled, 1)], feeds, seconds)
        rows.append((t, k, hd, loop_s * 1e3, unrolled_s * 1e3))
        print(f"| {t} | {k} | {hd} | {loop_s * 1e3:.4f} | {unrolled_s * 1e3:.4f} | {loop_s / unrolled_s:.2f} |", flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.3, help="measuring time per model and case")
    parser.add_argument("--only", default="fuse,unroll")
    parser.add_argument("--emit", action="store_true", help="print the tables for scanopt/cost.py")
    args = parser.parse_args(argv)
    print(f"onnxruntime {ort.__version__}, 1 intra-op thread; median ms per run, models interleaved")
    fuse_rows = unroll_rows = []
    if "fuse" in args.only:
        print("\n| cell | T | B | I | H | scan ms | fused ms | native ms | scan/fused | fused/native |\n|---|---|---|---|---|---|---|---|---|---|")
        fuse_rows = bench_fuse(args.seconds)
    if "unroll" in args.only:
        print("\n| T | scan outputs | H | looped ms | unrolled ms | looped/unrolled |\n|---|---|---|---|---|---|")
        unroll_rows = bench_unroll(args.seconds)
    if args.emit:
        print("\nFUSE_MEASURED = (  # kind, T, B, I, H, scan/fused")
        for kind, t, b, i, hd, scan_ms, fused_ms, _ in fuse_rows:
            print(f'    ("{kind}", {t}, {b}, {i}, {hd}, {scan_ms / fused_ms:.2f}),')
        print(")\nUNROLL_MEASURED = (  # T, scan outputs, H, looped/unrolled")
        for t, k, hd, loop_ms, unrolled_ms in unroll_rows:
            print(f"    ({t}, {k}, {hd}, {loop_ms / unrolled_ms:.2f}),")
        print(")")


if __name__ == "__main__":
    main()
