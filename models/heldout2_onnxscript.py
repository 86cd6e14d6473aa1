"""onnxscript functions for models/generate_heldout_producers_2.py (needs ``pip install onnxscript``).
A module of its own: onnxscript resolves the names a script uses (FLOAT, op) from its module's
globals. Forms models/functions_onnxscript.py does not hold: a GRU-gated Scan whose weights
are function inputs, called twice with different initial states; a map function called by
another function, itself called from both branches of an If."""

import onnxscript
from onnxscript import BOOL, FLOAT, graph, script
from onnxscript import opset17 as op

cells = onnxscript.values.Opset("cells", 1)


@script(cells, default_opset=op)
def gru_layer(xs: FLOAT["T", "B", 5], h0: FLOAT["B", 6], w: FLOAT[5, 18], r: FLOAT[6, 18],
              b: FLOAT[18]) -> FLOAT["T", "B", 6]:
    @graph()
    def step(h: FLOAT["B", 6], x: FLOAT["B", 5]):
        gx = op.Add(op.MatMul(x, w), b)
        gh = op.MatMul(h, r)
        xz, xr, xn = op.Split(gx, axis=1)
        hz, hr, hn = op.Split(gh, axis=1)
        z = op.Sigmoid(op.Add(xz, hz))
        rr = op.Sigmoid(op.Add(xr, hr))
        n = op.Tanh(op.Add(xn, op.Mul(rr, hn)))
        h2 = op.Add(op.Mul(op.Sub(op.Constant(value_float=1.0), z), n), op.Mul(z, h))
        return h2, op.Identity(h2)

    hn, ys = op.Scan(h0, xs, body=step, num_scan_inputs=1)
    return ys


@script(default_opset=op)
def os_fn_gru_twice(x: FLOAT["T", "B", 5], h0: FLOAT["B", 6], h1: FLOAT["B", 6], w: FLOAT[5, 18],
                    r: FLOAT[6, 18], b: FLOAT[18]) -> FLOAT["T", "B", 6]:
    return op.Sub(gru_layer(x, h0, w, r, b), gru_layer(x, h1, w, r, b))


@script(cells, default_opset=op)
def sigmoid_map(xs: FLOAT["T", "B", 5], w: FLOAT[5, 6]) -> FLOAT["T", "B", 6]:
    @graph()
    def each(x: FLOAT["B", 5]):
        return op.Sigmoid(op.MatMul(x, w))

    ys = op.Scan(xs, body=each, num_scan_inputs=1)
    return ys


@script(cells, default_opset=op)
def scaled_map(xs: FLOAT["T", "B", 5], w: FLOAT[5, 6]) -> FLOAT["T", "B", 6]:
    return op.Mul(sigmoid_map(xs, w), op.Constant(value_float=2.0))


@script(default_opset=op)
def os_fn_nested_map_if(x: FLOAT["T", "B", 5], w: FLOAT[5, 6], flag: BOOL) -> FLOAT["T", "B", 6]:
    if flag:
        y = scaled_map(x, w)
    else:
        y = op.Neg(scaled_map(x, w))
    return y


MODELS = {f.name: f for f in (os_fn_gru_twice, os_fn_nested_map_if)}
