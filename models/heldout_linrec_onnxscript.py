"""onnxscript model for models/generate_heldout_linrec.py (needs ``pip install onnxscript``).
A module of its own: onnxscript resolves the names a script uses (FLOAT, op) from its module's
globals. An EMA as an onnxscript author writes it: the decay Sigmoid(w) of a model input w
computed outside the loop and captured by the Scan body, ``a * h + (1 - a) * x_t``."""

from onnxscript import FLOAT, graph, script
from onnxscript import opset17 as op


@script(default_opset=op)
def os_scan_ema(x: FLOAT["T", "B", 4], h0: FLOAT["B", 4], w: FLOAT[4]) -> FLOAT["T", "B", 4]:
    a = op.Sigmoid(w)
    one_minus_a = op.Sub(op.Constant(value_float=1.0), a)

    @graph()
    def step(h: FLOAT["B", 4], x_t: FLOAT["B", 4]):
        h2 = op.Add(op.Mul(a, h), op.Mul(one_minus_a, x_t))
        return h2, op.Identity(h2)

    hn, ys = op.Scan(h0, x, body=step, num_scan_inputs=1)
    return ys


MODELS = {f.name: f for f in (os_scan_ema,)}
