"""Is one bidirectional RNN/GRU/LSTM node faster than a forward and a reverse node over the same X?

    python benchmarks/bench_bidirectional.py [--seconds 1.0]

The question of issue 20's tf2onnx bidirectional pairs (fuse writes two native nodes; a
merge into one ``direction="bidirectional"`` node would be one launch). Forms: ``two`` = a
forward and a reverse node, their Y concatenated on the direction axis and Y_h on axis 0
(what one bidirectional node returns); ``one`` = that node. I=3, weights uniform(-0.5, 0.5).
Timing: scanopt.timing.measure (thread CPU time, one intra-op thread, interleaved, A/A);
ratio = two / one (above 1: the merged node is faster).
Measured (onnxruntime 1.32): 1.12-1.16x at T=16 B=1 H=4 (about 2 us of launch overhead),
0.98-1.04x (within noise) at T=128 B=8 H=4/64 and T=512 B=1 H=64: no merge pass was written.
"""

from __future__ import annotations

import argparse

import numpy as np
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from scanopt.timing import measure


def models(kind, T, B, I, H):
    G = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    rng = np.random.default_rng(0)
    W = rng.uniform(-.5, .5, (2, G * H, I)).astype(np.float32)
    R = rng.uniform(-.5, .5, (2, G * H, H)).astype(np.float32)
    bias = rng.uniform(-.5, .5, (2, 2 * G * H)).astype(np.float32)
    X = h.make_tensor_value_info("X", TP.FLOAT, [T, B, I])
    outs = [h.make_tensor_value_info("Y", TP.FLOAT, None), h.make_tensor_value_info("Yh", TP.FLOAT, None)]
    inits = [nh.from_array(a[d:d + 1], f"{n}{d}") for n, a in (("W", W), ("R", R), ("B", bias)) for d in range(2)]
    nodes = [h.make_node(kind, ["X", f"W{d}", f"R{d}", f"B{d}"], [f"Y{d}", f"Yh{d}"], hidden_size=H,
                         direction=["forward", "reverse"][d]) for d in range(2)]
    nodes += [h.make_node("Concat", ["Y0", "Y1"], ["Y"], axis=1), h.make_node("Concat", ["Yh0", "Yh1"], ["Yh"], axis=0)]
    opset = [h.make_opsetid("", 17)]
    two = h.make_model(h.make_graph(nodes, "two", [X], outs, initializer=inits), opset_imports=opset, ir_version=8)
    inits = [nh.from_array(W, "W"), nh.from_array(R, "R"), nh.from_array(bias, "B")]
    node = h.make_node(kind, ["X", "W", "R", "B"], ["Y", "Yh"], hidden_size=H, direction="bidirectional")
    one = h.make_model(h.make_graph([node], "one", [X], outs, initializer=inits), opset_imports=opset, ir_version=8)
    return two, one


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args(argv)
    print("| op | T, B, H | two nodes ms | one node ms | ratio | A/A noise |")
    print("|---|---|---|---|---|---|")
    for kind in ("RNN", "GRU", "LSTM"):
        for T, B, H in ((16, 1, 4), (128, 8, 4), (128, 8, 64), (512, 1, 64)):
            two, one = models(kind, T, B, 3, H)
            feeds = {"X": np.random.default_rng(1).standard_normal((T, B, 3)).astype(np.float32)}
            t = measure({"two": two, "one": one}, feeds, threads=1, seconds=args.seconds, check_budget=False)
            print(f"| {kind} | {T}, {B}, {H} | {t.forms['two'].seconds * 1e3:.3f} | {t.forms['one'].seconds * 1e3:.3f} | "
                  f"{1 / t.forms['one'].ratio:.2f}x ±{t.forms['one'].spread:.2f} | {t.noise:.2f} |", flush=True)


if __name__ == "__main__":
    main()
