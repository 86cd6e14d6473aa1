"""onnxscript model for models/generate_heldout_mamba.py (needs ``pip install onnxscript``).
A module of its own: onnxscript resolves the names a script uses (FLOAT, op) from its module's
globals. A selective scan as an onnxscript author writes it: the per-step decay
Exp(Einsum('bld,dn->bldn', delta, -Exp(A_log))) and input Mul(Unsqueeze(delta * u), Unsqueeze(B))
computed for every step outside the Scan, which reads them (and C) on axis 1."""

from onnxscript import FLOAT, graph, script
from onnxscript import opset17 as op


@script(default_opset=op)
def einsum_outside_os(u: FLOAT["B", "L", "D"], delta: FLOAT["B", "L", "D"], A_log: FLOAT["D", "N"],
                      B: FLOAT["B", "L", "N"], C: FLOAT["B", "L", "N"], h0: FLOAT["B", "D", "N"]) -> FLOAT["B", "L", "D"]:
    A = op.Neg(op.Exp(A_log))
    deltaA = op.Exp(op.Einsum(delta, A, equation="bld,dn->bldn"))
    du = op.Unsqueeze(op.Mul(delta, u), op.Constant(value_ints=[-1]))
    deltaB_u = op.Mul(du, op.Unsqueeze(B, op.Constant(value_ints=[2])))

    @graph()
    def step(h: FLOAT["B", "D", "N"], dA: FLOAT["B", "D", "N"], dBu: FLOAT["B", "D", "N"], c: FLOAT["B", "N"]):
        h2 = op.Add(op.Mul(dA, h), dBu)
        y = op.ReduceSum(op.Mul(h2, op.Unsqueeze(c, op.Constant(value_ints=[1]))), op.Constant(value_ints=[-1]),
                         keepdims=0)
        return h2, y

    hn, ys = op.Scan(h0, deltaA, deltaB_u, C, body=step, num_scan_inputs=3, scan_input_axes=[1, 1, 1],
                     scan_output_axes=[1])
    return ys


MODELS = {f.name: f for f in (einsum_outside_os,)}
