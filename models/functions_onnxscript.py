"""Model-local functions holding loops, authored with onnxscript, for models/generate_functions.py
(needs ``pip install onnxscript``). A module of its own: onnxscript resolves the names a
script uses (FLOAT, op) from its module's globals."""

import onnxscript
from onnxscript import BOOL, FLOAT, graph, script
from onnxscript import opset17 as op

layers = onnxscript.values.Opset("layers", 1)


@script(layers, default_opset=op)
def rnn_layer(xs: FLOAT["T", "B", 3], h0: FLOAT["B", 4], w: FLOAT[3, 4], r: FLOAT[4, 4]) -> FLOAT["T", "B", 4]:
    @graph()
    def step(h: FLOAT["B", 4], x: FLOAT["B", 3]):
        h2 = op.Tanh(op.Add(op.MatMul(x, w), op.MatMul(h, r)))
        return h2, op.Identity(h2)

    hn, ys = op.Scan(h0, xs, body=step, num_scan_inputs=1)
    return ys


@script(layers, default_opset=op)
def relu_map(xs: FLOAT["T", "B", 3], w: FLOAT[3, 4]) -> FLOAT["T", "B", 4]:
    @graph()
    def each(x: FLOAT["B", 3]):
        return op.Relu(op.MatMul(x, w))

    ys = op.Scan(xs, body=each, num_scan_inputs=1)
    return ys


@script(default_opset=op)
def fn_rnn_twice(x: FLOAT["T", "B", 3], h0: FLOAT["B", 4], w: FLOAT[3, 4], r: FLOAT[4, 4],
                 w2: FLOAT[3, 4]) -> FLOAT["T", "B", 4]:
    return op.Add(rnn_layer(x, h0, w, r), rnn_layer(x, h0, w2, r))


@script(default_opset=op)
def fn_rnn_if_branches(x: FLOAT["T", "B", 3], h0: FLOAT["B", 4], w: FLOAT[3, 4], r: FLOAT[4, 4],
                       flag: BOOL) -> FLOAT["T", "B", 4]:
    if flag:
        y = rnn_layer(x, h0, w, r)
    else:
        y = op.Neg(rnn_layer(x, h0, w, r))
    return y


@script(default_opset=op)
def fn_rnn_once(x: FLOAT["T", "B", 3], h0: FLOAT["B", 4], w: FLOAT[3, 4], r: FLOAT[4, 4]) -> FLOAT["T", "B", 4]:
    return rnn_layer(x, h0, w, r)


@script(default_opset=op)
def fn_map_twice(x: FLOAT["T", "B", 3], w: FLOAT[3, 4], w2: FLOAT[3, 4]) -> FLOAT["T", "B", 4]:
    return op.Mul(relu_map(x, w), relu_map(x, w2))


MODELS = {f.name: f for f in (fn_rnn_twice, fn_rnn_if_branches, fn_rnn_once, fn_map_twice)}


@script(layers, default_opset=op)
def rnn_loop_layer(xs: FLOAT["T", "B", 3], h0: FLOAT["B", 4], w: FLOAT[3, 4], r: FLOAT[4, 4]) -> FLOAT["B", 4]:
    h = h0
    for i in range(op.Gather(op.Shape(xs), 0)):
        h = op.Tanh(op.Add(op.MatMul(op.Gather(xs, i), w), op.MatMul(h, r)))
    return h


@script(default_opset=op)
def fn_loop_twice(x: FLOAT["T", "B", 3], h0: FLOAT["B", 4], w: FLOAT[3, 4], r: FLOAT[4, 4],
                  w2: FLOAT[3, 4]) -> FLOAT["B", 4]:
    return op.Add(rnn_loop_layer(x, h0, w, r), rnn_loop_layer(x, h0, w2, r))


MODELS["fn_loop_twice"] = fn_loop_twice


@script(layers, default_opset=op)
def gated_state(xs: FLOAT["T", "B", 16], h0: FLOAT["B", 16]) -> FLOAT["T", "B", 16]:
    @graph()
    def step(h: FLOAT["B", 16], x: FLOAT["B", 16]):
        h2 = op.Tanh(op.Mul(h, x))
        return h2, op.Identity(h2)

    hn, ys = op.Scan(h0, xs, body=step, num_scan_inputs=1)
    return ys


@script(default_opset=op)
def fn_scan_symbolic_carry(x: FLOAT[6, 2, 16], h0: FLOAT[2, 16]) -> FLOAT[6, 2, 16]:
    return op.Add(gated_state(x, h0), gated_state(op.Neg(x), h0))


MODELS["fn_scan_symbolic_carry"] = fn_scan_symbolic_carry
