"""onnxscript function for models/generate_heldout_producers_3.py (needs ``pip install onnxscript``).
A module of its own: onnxscript resolves the names a script uses (FLOAT, op) from its module's
globals. A form neither models/functions_onnxscript.py nor heldout2_onnxscript.py holds: a
GRU-like Scan with gate order (r, z, n) and the reset gate applied after the recurrent product
(linear_before_reset), its weights function inputs, in a function the model calls once."""

import onnxscript
from onnxscript import FLOAT, graph, script
from onnxscript import opset17 as op

layers = onnxscript.values.Opset("layers", 1)


@script(layers, default_opset=op)
def gru_rzn(xs: FLOAT["T", "B", 3], h0: FLOAT["B", 5], w: FLOAT[3, 15], r: FLOAT[5, 15],
            bw: FLOAT[15], br: FLOAT[15]) -> FLOAT["T", "B", 5]:
    @graph()
    def step(h: FLOAT["B", 5], x: FLOAT["B", 3]):
        gx = op.Add(op.MatMul(x, w), bw)
        gh = op.Add(op.MatMul(h, r), br)
        xr, xz, xn = op.Split(gx, axis=1)
        hr, hz, hn = op.Split(gh, axis=1)
        rr = op.Sigmoid(op.Add(xr, hr))
        z = op.Sigmoid(op.Add(xz, hz))
        n = op.Tanh(op.Add(xn, op.Mul(rr, hn)))
        h2 = op.Add(op.Mul(z, h), op.Mul(op.Sub(op.Constant(value_float=1.0), z), n))
        return h2, op.Identity(h2)

    hn, ys = op.Scan(h0, xs, body=step, num_scan_inputs=1)
    return ys


@script(default_opset=op)
def os_fn_gru_rzn_once(x: FLOAT["T", "B", 3], h0: FLOAT["B", 5], w: FLOAT[3, 15], r: FLOAT[5, 15],
                       bw: FLOAT[15], br: FLOAT[15]) -> FLOAT["T", "B", 5]:
    return op.Relu(gru_rzn(x, h0, w, r, bw, br))


MODELS = {f.name: f for f in (os_fn_gru_rzn_once,)}
