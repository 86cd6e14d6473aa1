"""Model builders and runners shared by the reference-executor tests (``vi`` lives in builders)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto
from onnx import helper as oh

from builders import vi

BOOL = TensorProto.BOOL
FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64
STRING = TensorProto.STRING

ort.set_default_logger_severity(4)  # several cases expect onnxruntime to fail; keep stderr quiet

# float32 comparison of the reference with onnxruntime and numpy, as the issue states;
# tighter on purpose than scanopt.verify.TOLERANCES, which judges rewrites.
RTOL = 1e-5
ATOL = 1e-5


def floats(*names: str) -> list[onnx.ValueInfoProto]:
    """Float tensors with undeclared shapes, e.g. a graph's inputs or outputs."""
    return [vi(name, None) for name in names]


def ir_version_for(opset: int) -> int:
    """The smallest IR version onnxruntime accepts for a default-domain opset."""
    return max(7, oh.find_min_ir_version_for([oh.make_opsetid("", opset)]))


def make_model(
    opset: int,
    nodes: list,
    inputs: list,
    outputs: list,
    *,
    initializers: tuple = (),
    functions: tuple = (),
    extra_opsets: tuple = (),
) -> onnx.ModelProto:
    """A one-graph model at ``opset`` with an IR version onnxruntime 1.31 reads."""
    graph = oh.make_graph(nodes, "main", inputs, outputs, initializer=list(initializers))
    opsets = [oh.make_opsetid("", opset), *extra_opsets]
    return oh.make_model(graph, opset_imports=opsets, ir_version=ir_version_for(opset), functions=list(functions))


def scan_node(inputs: list, outputs: list, body: onnx.GraphProto, num_scan_inputs: int, **attrs) -> onnx.NodeProto:
    return oh.make_node("Scan", inputs, outputs, body=body, num_scan_inputs=num_scan_inputs, **attrs)


def const(name: str, value: np.ndarray) -> onnx.NodeProto:
    """A Constant node producing ``value`` under ``name``."""
    return oh.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.asarray(value), name))


def run_ort(model: onnx.ModelProto, feeds: dict) -> dict:
    """All graph outputs of ``model`` computed by onnxruntime's CPU provider, by name."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def assert_outputs_close(actual: dict, expected: dict) -> None:
    """Same output names, shapes and dtypes; float values within tolerance, others equal."""
    assert sorted(actual) == sorted(expected)
    for name, want in expected.items():
        got = actual[name]
        assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
        assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != {want.dtype}"
        if want.dtype.kind not in "fc":
            np.testing.assert_array_equal(got, want, err_msg=name)
        else:
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=name)
