"""The Mamba-style selective scan (T=1024, B=1, D=64, N=16) against its Scan: linrec's own
two-pass form, and a hand-built two-pass form laid out for onnxruntime's kernels (the evidence
for how far the pass's form is from what this machine allows; README, "The loop-free family").

    python benchmarks/bench_mamba_forms.py [--seconds 1.0] [--chunks 32,64]

The hand-built form is linrec's two-pass structure (steps permuted to [C, K = T/C] on the
small inputs; a Scan over the C positions carrying each chunk's local state from zero; the
chunk ends composed by a Scan over K, whose end-of-chunk decay is Exp(A ⊗ ΣΔ) on [K, D]; a
second Scan over the positions from the chunk starts reading y inside) with the layout
linrec keeps as the body writes it changed: the state laid [B, N, D] (D innermost), so Δ ⊗ A
is a Mul broadcasting over leading axes only, Δx ⊗ B_t a K=1 MatMul and y = C_t · h a
row-vector MatMul (linrec: Δ ⊗ A widened by a MatMul with ones first, y a matrix-vector
MatMul), and its a and b are lifted over all steps (linrec computes them in its Loops at this
size); it keeps onnxruntime's Softplus (linrec emits a faster one). Measured apart (one op over 1M floats, one thread):
Δ ⊗ A as [T, D, 1]·[D, N] 0.71 ms, as [T, 1, D]·[N, D] 0.31 ms; Δx ⊗ B_t as Mul 0.81 ms, as
MatMul 0.23 ms; Exp 0.19 ms; a same-shape Mul or Add 0.16 ms; Softplus over Δ [T, D] (64K
elements) 0.79 ms, which the loop pays too. Timing as bench_linrec (thread CPU time, one
thread, interleaved, A/A).
"""

from __future__ import annotations

import argparse
import os
import sys

import onnx
from onnx import TensorProto as TP
from onnx import helper as h

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_linrec import lb, rewrite, row  # noqa: E402

T, D, N = 1024, 64, 16


def _vi(name, shape):
    return h.make_tensor_value_info(name, TP.FLOAT, shape)


def _ints(name, values):
    return h.make_tensor(name, TP.INT64, [len(values)], values)


def laid_out(reference: onnx.ModelProto, chunk: int) -> onnx.ModelProto:
    """The hand-built form of the module docstring, reading the reference model's inputs and A_log."""
    k = T // chunk
    state, rows = [k, 1, N, D], [1, N, D]
    inits = [i for i in reference.graph.initializer if i.name == "A_log"]
    inits += [_ints("by_d", [k, chunk, 1, D]), _ints("by_n", [k, chunk, 1, N]), _ints("steps", [T, 1, D]),
              _ints("last", [-1]), _ints("first", [0]), _ints("second_last", [-2]), _ints("state", state)]
    nodes = []

    def node(op, ins, outs, **attrs):
        nodes.append(h.make_node(op, ins, outs, **attrs))

    node("Exp", ["A_log"], ["A_pos"])
    node("Neg", ["A_pos"], ["A"])
    node("Transpose", ["A"], ["A_nd"], perm=[1, 0])
    node("Softplus", ["DL"], ["delta"])
    node("Mul", ["delta", "X"], ["dx"])
    for src, shape in (("delta", "by_d"), ("dx", "by_d"), ("BT", "by_n"), ("CT", "by_n")):
        node("Reshape", [src, shape], [src + "_k"])
        node("Transpose", [src + "_k"], [src + "_r"], perm=[1, 0, 2, 3])  # [C, K, 1, .]
    node("Unsqueeze", ["delta_r", "second_last"], ["delta5"])
    node("Mul", ["delta5", "A_nd"], ["dA"])
    node("Exp", ["dA"], ["a"])
    node("Unsqueeze", ["BT_r", "last"], ["bt5"])
    node("Unsqueeze", ["dx_r", "second_last"], ["dx5"])
    node("MatMul", ["bt5", "dx5"], ["b"])  # [C, K, 1, N, D]
    node("Unsqueeze", ["CT_r", "second_last"], ["ct5"])  # [C, K, 1, 1, N]
    node("Transpose", ["h0"], ["h0_nd"], perm=[0, 2, 1])
    node("ConstantOfShape", ["state"], ["zeros"], value=h.make_tensor("zero", TP.FLOAT, [1], [0.0]))
    within = h.make_graph([h.make_node("Mul", ["ai", "hi"], ["ah"]), h.make_node("Add", ["ah", "bi"], ["ho"])],
                          "within", [_vi("hi", state), _vi("ai", state), _vi("bi", state)], [_vi("ho", state)])
    node("Scan", ["zeros", "a", "b"], ["ends_b"], body=within, num_scan_inputs=2)
    node("ReduceSum", ["delta_r", "first"], ["delta_sum"], keepdims=0)  # [K, 1, D]
    node("Unsqueeze", ["delta_sum", "second_last"], ["delta_sum4"])
    node("Mul", ["delta_sum4", "A_nd"], ["dA_sum"])
    node("Exp", ["dA_sum"], ["ends_a"])  # Π a over the chunk = Exp(A ⊗ ΣΔ)
    across = h.make_graph([h.make_node("Identity", ["si"], ["before"]), h.make_node("Mul", ["ea", "si"], ["m"]),
                           h.make_node("Add", ["m", "eb"], ["so"])], "across",
                          [_vi("si", rows), _vi("ea", rows), _vi("eb", rows)], [_vi("so", rows), _vi("before", rows)])
    node("Scan", ["h0_nd", "ends_a", "ends_b"], ["hT_nd", "starts"], body=across, num_scan_inputs=2)
    again = h.make_graph([h.make_node("Mul", ["ai", "hi"], ["ah"]), h.make_node("Add", ["ah", "bi"], ["ho"]),
                          h.make_node("MatMul", ["ci", "ho"], ["y"])], "again",
                         [_vi("hi", state), _vi("ai", state), _vi("bi", state), _vi("ci", [k, 1, 1, N])],
                         [_vi("ho", state), _vi("y", [k, 1, 1, D])])
    node("Scan", ["starts", "a", "b", "ct5"], ["h_last", "ys"], body=again, num_scan_inputs=3)
    node("Squeeze", ["ys", "second_last"], ["ys4"])
    node("Transpose", ["ys4"], ["ys_t"], perm=[1, 0, 2, 3])
    node("Reshape", ["ys_t", "steps"], ["Y"])
    node("Transpose", ["hT_nd"], ["hT"], perm=[0, 2, 1])
    graph = h.make_graph(nodes, "laid_out", list(reference.graph.input), list(reference.graph.output),
                         initializer=inits)
    model = h.make_model(graph, opset_imports=list(reference.opset_import))
    model.ir_version = reference.ir_version
    onnx.checker.check_model(model)
    return model


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--chunks", default="32,64")
    args = parser.parse_args(argv)
    reference = lb.mamba(T=T, B=1, D=D, N=N)
    print("| case | Scan ms | form ms | ratio | max abs diff |")
    print("|---|---|---|---|---|")
    optimized, detail = rewrite(reference)
    print(row(f"mamba T={T} D={D} N={N}, linrec: {detail.split(' (')[0]}", reference, optimized, args.seconds),
          flush=True)
    for chunk in (int(c) for c in args.chunks.split(",")):
        print(row(f"mamba T={T} D={D} N={N}, hand-built [N, D] layout, MatMul products, C={chunk}", reference,
                  laid_out(reference, chunk), args.seconds), flush=True)


if __name__ == "__main__":
    main()
