"""Scans in the shape tf2onnx writes for TF1 ``dynamic_rnn`` (issue 20), built by hand.

    python models/generate_tf2onnx_style.py

What makes them hard is not the cell but the dims: tf2onnx names every unknown dim
``unk__N`` with its own N, in the main graph and in the body, so no two dims share a
symbol, and the zero initial state is computed from X's shape
(Shape -> Gather -> Unsqueeze -> Concat -> ConstantOfShape, TF's ``cell.zero_state``).
Forms: a tanh cell written as ``Concat([x, h]) . W`` (batch-major input transposed to
time-major before the Scan and back after it), the same with a ReLU cell, and one whose
initial state is a graph input (only the body's Concat ties its batch to X's).
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tf2onnx_style")
F, I64 = TP.FLOAT, TP.INT64
INPUT, HIDDEN = 3, 4


class _Unk:
    """tf2onnx's dim names: a fresh ``unk__N`` per unknown dim."""

    def __init__(self, start: int = 120):
        self.n = start

    def __call__(self) -> str:
        self.n += 1
        return f"unk__{self.n}"


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _body(unk: _Unk, activation: str) -> onnx.GraphProto:
    nodes = [
        h.make_node("Concat", ["x", "h"], ["xh"], axis=1),
        h.make_node("MatMul", ["xh", "rnn/kernel"], ["pre0"]),
        h.make_node("Add", ["pre0", "rnn/bias"], ["pre"]),
        h.make_node(activation, ["pre"], ["h_next"]),
        h.make_node("Identity", ["h_next"], ["y"]),
    ]
    return h.make_graph(
        nodes, "rnn_while_body",
        [h.make_tensor_value_info("h", F, [unk(), HIDDEN]), h.make_tensor_value_info("x", F, [unk(), INPUT])],
        [h.make_tensor_value_info("h_next", F, [unk(), HIDDEN]), h.make_tensor_value_info("y", F, [unk(), HIDDEN])],
    )


def dynamic_rnn(*, activation: str = "Tanh", state_input: bool = False, seed: int = 0) -> onnx.ModelProto:
    """X [batch, time, INPUT] -> (Y [batch, time, HIDDEN], h_final [batch, HIDDEN])."""
    unk = _Unk()
    rng = np.random.default_rng(seed)
    inits = [
        _init("rnn/kernel", rng.uniform(-0.4, 0.4, (INPUT + HIDDEN, HIDDEN)).astype(np.float32)),
        _init("rnn/bias", rng.uniform(-0.1, 0.1, HIDDEN).astype(np.float32)),
        _init("perm_tbi", np.array([1, 0, 2], np.int64)),
    ]
    inputs = [h.make_tensor_value_info("X:0", F, [unk(), unk(), INPUT])]
    nodes = [h.make_node("Transpose", ["X:0"], ["rnn/transpose:0"], perm=[1, 0, 2])]
    if state_input:
        inputs.append(h.make_tensor_value_info("h0:0", F, [unk(), HIDDEN]))
        state = "h0:0"
    else:  # cell.zero_state(batch): zeros of [Shape(X)[0], HIDDEN]
        inits += [_init("zero_idx", np.array(0, np.int64)), _init("hidden_dim", np.array([HIDDEN], np.int64)),
                  _init("axes0", np.array([0], np.int64))]
        nodes += [
            h.make_node("Shape", ["X:0"], ["rnn/Shape:0"]),
            h.make_node("Gather", ["rnn/Shape:0", "zero_idx"], ["rnn/strided_slice:0"], axis=0),
            h.make_node("Unsqueeze", ["rnn/strided_slice:0", "axes0"], ["rnn/batch:0"]),
            h.make_node("Concat", ["rnn/batch:0", "hidden_dim"], ["rnn/zeros_shape:0"], axis=0),
            h.make_node("ConstantOfShape", ["rnn/zeros_shape:0"], ["rnn/zeros:0"],
                        value=h.make_tensor("v", F, [1], [0.0])),
        ]
        state = "rnn/zeros:0"
    nodes += [
        h.make_node("Scan", [state, "rnn/transpose:0"], ["rnn/h_final:0", "rnn/Y_tbh:0"], name="rnn/while",
                    body=_body(unk, activation), num_scan_inputs=1),
        h.make_node("Transpose", ["rnn/Y_tbh:0"], ["Y:0"], perm=[1, 0, 2]),
        h.make_node("Identity", ["rnn/h_final:0"], ["h_final:0"]),
    ]
    graph = h.make_graph(
        nodes, "tf2onnx", inputs,
        [h.make_tensor_value_info("Y:0", F, [unk(), unk(), HIDDEN]),
         h.make_tensor_value_info("h_final:0", F, [unk(), HIDDEN])],
        initializer=inits,
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)], ir_version=8,
                         producer_name="tf2onnx-style (scanopt, hand-built)")
    onnx.checker.check_model(model, full_check=True)
    return model


FORMS = {
    "dynamic_rnn_tanh_zero_state": lambda: dynamic_rnn(),
    "dynamic_rnn_relu_zero_state": lambda: dynamic_rnn(activation="Relu", seed=1),
    "dynamic_rnn_tanh_state_input": lambda: dynamic_rnn(state_input=True, seed=2),
}


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    for name, build in FORMS.items():
        onnx.save(build(), os.path.join(OUT, f"{name}.onnx"))
        print(name)


if __name__ == "__main__":
    main()
