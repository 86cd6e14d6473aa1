"""The Mamba-style selective scan (T=1024, B=1, D=64, N=16) against its Scan: linrec's own
two-pass form, and a hand-built form of the same structure with the state laid out [N, D]
(the evidence for how far the pass's form is from what this machine allows; README, "The
loop-free family").

    python benchmarks/bench_mamba_forms.py [--seconds 1.0] [--chunks 32,64]

The hand-built form is linrec's structure (steps permuted to [C, K = T/C] on the small inputs;
a Scan over the C positions carrying each chunk's local state from zero and reading y_local =
C_t · h there; each chunk's decay Exp(A ⊗ ΣΔ); the chunk starts carried across by a Scan over
K; a correction Scan over the positions carrying G = a ⊙ G from the starts and adding C_t · G)
with the state laid [B, N, D] (D innermost) instead of the body's [B, D, N]: Δ ⊗ A is one Mul
broadcasting over a middle axis (linrec: Δ @ ones[1, N], then the Mul), Δx ⊗ B_t a K=1 MatMul,
y a row-vector MatMul; Softplus as linrec emits it. Timing as bench_linrec (thread CPU time,
one thread, interleaved, A/A).
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
              _ints("last", [-1]), _ints("first", [0]), _ints("second_last", [-2]), _ints("state", state),
              h.make_tensor("one", TP.FLOAT, [], [1.0])]
    nodes = []

    def node(op, ins, outs, **attrs):
        nodes.append(h.make_node(op, ins, outs, **attrs))

    def graph(name, body, inputs, outputs):
        return h.make_graph([h.make_node(*n[:3], **(n[3] if len(n) > 3 else {})) for n in body], name,
                            inputs, outputs)

    node("Exp", ["A_log"], ["A_pos"])
    node("Neg", ["A_pos"], ["A"])
    node("Transpose", ["A"], ["A_nd"], perm=[1, 0])
    # Softplus as passes/loopfree/softplus.py: Relu(x) + Log(w) - ((w - 1) - u), u = Exp(-|x|), w = 1 + u
    node("Abs", ["DL"], ["abs"])
    node("Neg", ["abs"], ["neg"])
    node("Exp", ["neg"], ["u"])
    node("Add", ["u", "one"], ["w"])
    node("Sub", ["w", "one"], ["w1"])
    node("Sub", ["w1", "u"], ["err"])
    node("Log", ["w"], ["log_w"])
    node("Sub", ["log_w", "err"], ["log1p"])
    node("Relu", ["DL"], ["relu"])
    node("Add", ["relu", "log1p"], ["delta"])
    node("Mul", ["delta", "X"], ["dx"])
    for src, shape in (("delta", "by_d"), ("dx", "by_d"), ("BT", "by_n"), ("CT", "by_n")):
        node("Reshape", [src, shape], [src + "_k"])
        node("Transpose", [src + "_k"], [src + "_r"], perm=[1, 0, 2, 3])  # [C, K, 1, .]
    node("Unsqueeze", ["delta_r", "second_last"], ["delta5"])  # [C, K, 1, 1, D]
    node("Unsqueeze", ["dx_r", "second_last"], ["dx5"])
    node("Unsqueeze", ["BT_r", "last"], ["bt5"])  # [C, K, 1, N, 1]
    node("Unsqueeze", ["CT_r", "second_last"], ["ct5"])  # [C, K, 1, 1, N]
    node("Transpose", ["h0"], ["h0_nd"], perm=[0, 2, 1])
    node("ConstantOfShape", ["state"], ["zeros"], value=h.make_tensor("zero", TP.FLOAT, [1], [0.0]))
    a_of = [("Mul", ["di", "A_nd"], ["dA"]), ("Exp", ["dA"], ["ai"])]
    first = graph("chunk_pass", a_of + [("MatMul", ["bti", "dxi"], ["bi"]), ("Mul", ["ai", "hi"], ["ah"]),
                                        ("Add", ["ah", "bi"], ["ho"]), ("MatMul", ["cti", "ho"], ["yl"])],
                  [_vi("hi", state), _vi("di", [k, 1, 1, D]), _vi("dxi", [k, 1, 1, D]), _vi("bti", [k, 1, N, 1]),
                   _vi("cti", [k, 1, 1, N])], [_vi("ho", state), _vi("yl", [k, 1, 1, D])])
    node("Scan", ["zeros", "delta5", "dx5", "bt5", "ct5"], ["ends_b", "y_local"], body=first, num_scan_inputs=4)
    node("ReduceSum", ["delta_r", "first"], ["delta_sum"], keepdims=0)  # [K, 1, D]
    node("Unsqueeze", ["delta_sum", "second_last"], ["delta_sum4"])
    node("Mul", ["delta_sum4", "A_nd"], ["dA_sum"])
    node("Exp", ["dA_sum"], ["ends_a"])  # Π a over the chunk = Exp(A ⊗ ΣΔ)
    across = graph("across", [("Identity", ["si"], ["before"]), ("Mul", ["ea", "si"], ["m"]), ("Add", ["m", "eb"], ["so"])],
                   [_vi("si", rows), _vi("ea", rows), _vi("eb", rows)], [_vi("so", rows), _vi("before", rows)])
    node("Scan", ["h0_nd", "ends_a", "ends_b"], ["hT_nd", "starts"], body=across, num_scan_inputs=2)
    correction = graph("correction", a_of + [("Mul", ["ai", "gi"], ["go"]), ("MatMul", ["cti", "go"], ["yc"])],
                       [_vi("gi", state), _vi("di", [k, 1, 1, D]), _vi("cti", [k, 1, 1, N])],
                       [_vi("go", state), _vi("yc", [k, 1, 1, D])])
    node("Scan", ["starts", "delta5", "ct5"], ["g_last", "y_correction"], body=correction, num_scan_inputs=2)
    node("Add", ["y_local", "y_correction"], ["ys"])
    node("Squeeze", ["ys", "second_last"], ["ys4"])
    node("Transpose", ["ys4"], ["ys_t"], perm=[1, 0, 2, 3])
    node("Reshape", ["ys_t", "steps"], ["Y"])
    node("Transpose", ["hT_nd"], ["hT"], perm=[0, 2, 1])
    main_graph = h.make_graph(nodes, "laid_out", list(reference.graph.input), list(reference.graph.output),
                              initializer=inits)
    model = h.make_model(main_graph, opset_imports=list(reference.opset_import))
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
        print(row(f"mamba T={T} D={D} N={N}, hand-built, state [N, D], C={chunk}", reference,
                  laid_out(reference, chunk), args.seconds), flush=True)


if __name__ == "__main__":
    main()
