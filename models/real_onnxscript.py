"""Scans authored with onnxscript, for models/generate_real.py (needs ``pip install onnxscript``).

A module of its own: onnxscript resolves the names a script uses (FLOAT, op) from its
module's globals, and reads its annotations unevaluated.
"""

from onnxscript import FLOAT, graph, script
from onnxscript import opset16 as op


@script()
def cumulative_tanh(init: FLOAT[2], xs: FLOAT["N", 2]) -> tuple[FLOAT[2], FLOAT["N", 2]]:
    @graph()
    def body(s: FLOAT[2], x: FLOAT[2]):
        s2 = op.Add(s, x)
        return s2, op.Tanh(s2)

    final, ys = op.Scan(init, xs, body=body, num_scan_inputs=1)
    return final, ys


@script()
def reverse_rnn(h0: FLOAT["B", 4], xs: FLOAT["T", "B", 3], w: FLOAT[3, 4], r: FLOAT[4, 4]):
    # No output annotations: onnxscript then writes graph outputs without a type.
    @graph()
    def step(h: FLOAT["B", 4], x: FLOAT["B", 3]):
        h2 = op.Tanh(op.Add(op.MatMul(x, w), op.MatMul(h, r)))  # w, r captured from the outer graph
        return h2, op.Identity(h2)

    hn, ys = op.Scan(h0, xs, body=step, num_scan_inputs=1, scan_input_directions=[1])
    return hn, ys


MODELS = {
    "os_cumulative_tanh": cumulative_tanh,
    "os_reverse_rnn_untyped_outputs": reverse_rnn,
}
