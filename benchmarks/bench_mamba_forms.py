"""A hand-built chunked form of the Mamba-style selective scan against its Scan (the evidence
behind linrec declining it; README, "The loop-free family").

    python benchmarks/bench_mamba_forms.py [--seconds 1.0] [--chunks 16,32,64]

Model: tests/linrec_builders.mamba at T=1024, B=1, D=64, N=16. The form, for chunk length C
(K = T/C chunks): the per-step inputs (Δ, x, B_t, C_t: [T, 1, D] or [T, 1, N], small) are
permuted to [C, K, ...] first, so a = exp(Δ·A) and b = Δx ⊗ B_t come out [C, K, 1, D, N] with no
large Transpose; a Scan over the C positions composes every chunk from zero at once (state
[K, 1, D, N]: the chunk's b-scan and a-product); a Scan over the K chunk ends gives each
chunk's starting state; a second Scan over the positions recomputes h from those starts and
emits y = Σ_n h ⊙ C_t. Timing as bench_linrec (thread CPU time, one thread, interleaved).
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
from bench_linrec import lb, row  # noqa: E402

T, D, N = 1024, 64, 16


def _vi(name, shape):
    return h.make_tensor_value_info(name, TP.FLOAT, shape)


def _ints(name, values):
    return h.make_tensor(name, TP.INT64, [len(values)], values)


def two_pass(reference: onnx.ModelProto, chunk: int) -> onnx.ModelProto:
    """The form of the module docstring, reading the reference model's inputs and A_log."""
    k = T // chunk
    state = [k, 1, D, N]
    inits = [i for i in reference.graph.initializer if i.name == "A_log"]
    inits += [_ints("last", [-1]), _ints("two", [2]), _ints("by_d", [k, chunk, 1, D]), _ints("by_n", [k, chunk, 1, N]),
              _ints("steps", [T, 1, D]), _ints("state", state)]
    nodes = []

    def node(op, ins, outs, **attrs):
        nodes.append(h.make_node(op, ins, outs, **attrs))

    node("Exp", ["A_log"], ["A_pos"])
    node("Neg", ["A_pos"], ["A"])
    node("Softplus", ["DL"], ["delta"])
    node("Mul", ["delta", "X"], ["dx"])
    for src, shape in (("delta", "by_d"), ("dx", "by_d"), ("BT", "by_n"), ("CT", "by_n")):
        node("Reshape", [src, shape], [src + "_k"])
        node("Transpose", [src + "_k"], [src + "_r"], perm=[1, 0, 2, 3])  # [C, K, 1, .]
    node("Unsqueeze", ["delta_r", "last"], ["delta5"])
    node("Mul", ["delta5", "A"], ["dA"])
    node("Exp", ["dA"], ["a"])
    node("Unsqueeze", ["dx_r", "last"], ["dx5"])
    node("Unsqueeze", ["BT_r", "two"], ["bt5"])
    node("Mul", ["dx5", "bt5"], ["b"])
    node("Unsqueeze", ["CT_r", "two"], ["ct5"])
    node("ConstantOfShape", ["state"], ["zeros"], value=h.make_tensor("zero", TP.FLOAT, [1], [0.0]))
    node("ConstantOfShape", ["state"], ["ones"], value=h.make_tensor("one", TP.FLOAT, [1], [1.0]))
    within = h.make_graph([h.make_node("Mul", ["ai", "hi"], ["ah"]), h.make_node("Add", ["ah", "bi"], ["ho"]),
                           h.make_node("Mul", ["ai", "pi"], ["po"])], "within",
                          [_vi("hi", state), _vi("pi", state), _vi("ai", state), _vi("bi", state)],
                          [_vi("ho", state), _vi("po", state)])
    node("Scan", ["zeros", "ones", "a", "b"], ["ends_b", "ends_a"], body=within, num_scan_inputs=2)
    one = [1, D, N]
    across = h.make_graph([h.make_node("Identity", ["si"], ["before"]), h.make_node("Mul", ["ea", "si"], ["m"]),
                           h.make_node("Add", ["m", "eb"], ["so"])], "across",
                          [_vi("si", one), _vi("ea", one), _vi("eb", one)], [_vi("so", one), _vi("before", one)])
    node("Scan", ["h0", "ends_a", "ends_b"], ["hT", "starts"], body=across, num_scan_inputs=2)
    again = h.make_graph([h.make_node("Mul", ["ai", "hi"], ["ah"]), h.make_node("Add", ["ah", "bi"], ["ho"]),
                          h.make_node("Mul", ["ho", "ci"], ["hc"]),
                          h.make_node("ReduceSum", ["hc", "axis"], ["y"], keepdims=0)], "again",
                         [_vi("hi", state), _vi("ai", state), _vi("bi", state), _vi("ci", [k, 1, 1, N])],
                         [_vi("ho", state), _vi("y", [k, 1, D])], initializer=[_ints("axis", [-1])])
    node("Scan", ["starts", "a", "b", "ct5"], ["h_last", "ys"], body=again, num_scan_inputs=3)
    node("Transpose", ["ys"], ["ys_t"], perm=[1, 0, 2, 3])
    node("Reshape", ["ys_t", "steps"], ["Y"])
    graph = h.make_graph(nodes, "two_pass", list(reference.graph.input), list(reference.graph.output),
                         initializer=inits)
    model = h.make_model(graph, opset_imports=list(reference.opset_import))
    model.ir_version = reference.ir_version
    onnx.checker.check_model(model)
    return model


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--chunks", default="16,32,64")
    args = parser.parse_args(argv)
    reference = lb.mamba(T=T, B=1, D=D, N=N)
    print("| case | Scan ms | two-pass ms | ratio | max abs diff |")
    print("|---|---|---|---|---|")
    for chunk in (int(c) for c in args.chunks.split(",")):
        print(row(f"mamba T={T} D={D} N={N}, two-pass chunked C={chunk}", reference, two_pass(reference, chunk),
                  args.seconds), flush=True)


if __name__ == "__main__":
    main()
