"""Write the onnxscript-authored Scan samples in models/real/untidy_onnxscript_*.onnx.

    pip install onnxscript && python models/generate_untidy.py

onnxscript writes what onnx.checker rejects and onnxruntime runs: graph and body outputs
declared by name only, without a type. scanopt must accept them with a warning naming the
values (tests/test_untidy_models.py). Running the script twice writes identical files.
onnxscript reads the functions' source and resolves names in this module's globals, so
everything they use is defined at module level.
"""

import os

import numpy as np
import onnx
from onnxscript import FLOAT, graph, script
from onnxscript import opset17 as op

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "real")
IR_VERSION = 8  # readable by every onnxruntime the dependency range admits

_rng = np.random.default_rng(0)
W_IN = onnx.numpy_helper.from_array((_rng.standard_normal((3, 4)) * 0.5).astype(np.float32), "w")
R_REC = onnx.numpy_helper.from_array((_rng.standard_normal((4, 4)) * 0.5).astype(np.float32), "r")


@script()
def running_sum(s0: FLOAT[2], X: FLOAT["T", 2]) -> FLOAT[2]:
    """A running sum over a dynamic length; only the final state is a graph output."""

    @graph()
    def body(s: FLOAT[2], x: FLOAT[2]):
        s_next = op.Add(s, x)
        y = op.Tanh(s_next)
        return s_next, y

    s_final, ys = op.Scan(s0, X, body=body, num_scan_inputs=1)
    return s_final


@script()
def rnn_cell(h0: FLOAT[1, 4], X: FLOAT[3, 1, 3]) -> (FLOAT[1, 4], FLOAT[3, 1, 4]):
    """h' = tanh(x·W + h·R) over a static length of 3; the body reads W and R from outside."""
    W = op.Constant(value=W_IN)
    R = op.Constant(value=R_REC)

    @graph()
    def step(h: FLOAT[1, 4], x: FLOAT[1, 3]):
        h_next = op.Tanh(op.Add(op.MatMul(x, W), op.MatMul(h, R)))
        y = op.Identity(h_next)
        return h_next, y

    h_final, ys = op.Scan(h0, X, body=step, num_scan_inputs=1)
    return h_final, ys


def main() -> None:
    os.makedirs(HERE, exist_ok=True)
    for name, function in (("untidy_onnxscript_scan_sum", running_sum), ("untidy_onnxscript_scan_rnn", rnn_cell)):
        model = function.to_model_proto()
        model.ir_version = IR_VERSION
        model.producer_name, model.producer_version = "onnxscript", ""
        path = os.path.join(HERE, f"{name}.onnx")
        with open(path, "wb") as handle:
            handle.write(model.SerializeToString(deterministic=True))
        print("wrote", os.path.relpath(path))


if __name__ == "__main__":
    main()
