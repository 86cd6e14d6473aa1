"""Small hand-built models for the engine tests (onnx.helper, explicit IR and opset)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

IR_VERSION = 8
F = TP.FLOAT


def model(graph: onnx.GraphProto, opset: int = 17, ir_version: int = IR_VERSION) -> onnx.ModelProto:
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=ir_version)


def vi(name: str, shape, elem=F) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, elem, shape)


def init(name: str, array) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def sum_body(prefix: str = "", width: int = 2, weight: str | None = None) -> onnx.GraphProto:
    """state s, element x -> (s + x [* weight], s + x [* weight]): a running sum."""
    p = prefix
    nodes = []
    x = f"{p}x"
    if weight:
        nodes.append(h.make_node("Mul", [x, weight], [f"{p}xw"]))
        x = f"{p}xw"
    nodes += [h.make_node("Add", [f"{p}s", x], [f"{p}s_next"]), h.make_node("Identity", [f"{p}s_next"], [f"{p}y"])]
    return h.make_graph(
        nodes,
        f"{p}body",
        [vi(f"{p}s", [width]), vi(f"{p}x", [width])],
        [vi(f"{p}s_next", [width]), vi(f"{p}y", [width])],
    )


def scan9_sum(opset: int = 11, steps: int | str = 3, weight: np.ndarray | None = None, **attrs) -> onnx.ModelProto:
    """A Scan-9+ running sum over X [steps, 2]; optional outer-scope weight W."""
    body = sum_body(weight="W" if weight is not None else None)
    node = h.make_node("Scan", ["s0", "X"], ["s_final", "Y"], name="scan_sum", body=body, num_scan_inputs=1, **attrs)
    graph = h.make_graph(
        [node],
        "main",
        [vi("s0", [2]), vi("X", [steps, 2])],
        [vi("s_final", [2]), vi("Y", [steps, 2])],
        initializer=[init("W", weight.astype(np.float32))] if weight is not None else [],
    )
    return model(graph, opset)


def scan8_sum(batch: int | str = "B", steps: int | str = "T", seq_lens: bool = True, **attrs) -> onnx.ModelProto:
    """The backend test_scan_sum form: Scan-8 over X [B, T, 2], optional sequence_lens."""
    body = sum_body()
    inputs = ["lens" if seq_lens else "", "s0", "X"]
    node = h.make_node("Scan", inputs, ["s_final", "Y"], name="scan8_sum", body=body, num_scan_inputs=1, **attrs)
    graph_inputs = [vi("s0", [batch, 2]), vi("X", [batch, steps, 2])]
    if seq_lens:
        graph_inputs.insert(0, vi("lens", [batch], TP.INT64))
    graph = h.make_graph([node], "main", graph_inputs, [vi("s_final", [batch, 2]), vi("Y", [batch, steps, 2])])
    return model(graph, 8)


def scan_in_loop(opset: int = 16) -> onnx.ModelProto:
    """A Loop whose body holds a Scan whose body holds another Scan reading W from the top graph."""
    inner = sum_body("i_", weight="W")
    outer_body = h.make_graph(
        [h.make_node("Scan", ["o_s", "o_x"], ["o_s_next", "o_y"], name="inner_scan", body=inner, num_scan_inputs=1)],
        "o_body",
        [vi("o_s", [2]), vi("o_x", [3, 2])],
        [vi("o_s_next", [2]), vi("o_y", [3, 2])],
    )
    loop_body = h.make_graph(
        [
            h.make_node("Identity", ["cond_in"], ["cond_out"]),
            h.make_node("Scan", ["l_s", "X"], ["l_s_next", "l_y"], name="outer_scan", body=outer_body, num_scan_inputs=1),
        ],
        "loop_body",
        [vi("iter", [], TP.INT64), vi("cond_in", [], TP.BOOL), vi("l_s", [2])],
        [vi("cond_out", [], TP.BOOL), vi("l_s_next", [2]), vi("l_y", [4, 3, 2])],
    )
    graph = h.make_graph(
        [h.make_node("Loop", ["trips", "cond", "s0"], ["s_final", "ys"], name="loop", body=loop_body)],
        "main",
        [vi("trips", [], TP.INT64), vi("cond", [], TP.BOOL), vi("s0", [2]), vi("X", [4, 3, 2])],
        [vi("s_final", [2]), vi("ys", ["n", 4, 3, 2])],
        initializer=[init("W", np.array([0.5, 2.0], np.float32))],
    )
    return model(graph, opset)


def no_scan_model() -> onnx.ModelProto:
    graph = h.make_graph(
        [h.make_node("Add", ["a", "b"], ["c"], name="add")],
        "main",
        [vi("a", [2]), vi("b", [2])],
        [vi("c", [2])],
    )
    m = model(graph)
    m.producer_name = "builders"
    m.metadata_props.add(key="author", value="tests")
    return m


def ort_refuses(m: onnx.ModelProto) -> bool:
    """True when the installed onnxruntime cannot load ``m`` (probed, never assumed per release)."""
    from scanopt.engines import ort_load_error

    return ort_load_error(m) is not None


def layout1_rnn() -> onnx.ModelProto:
    """A batch-major (layout=1) RNN: valid ONNX the reference executor runs; onnxruntime up to
    at least 1.32 refuses to load it."""
    rng = np.random.default_rng(0)
    graph = h.make_graph(
        [h.make_node("RNN", ["X", "W", "R"], ["Y", "Y_h"], hidden_size=2, layout=1)],
        "main",
        [vi("X", [2, 3, 4])],
        [vi("Y", [2, 3, 1, 2]), vi("Y_h", [2, 1, 2])],
        [init("W", rng.standard_normal((1, 2, 4)).astype(np.float32)),
         init("R", rng.standard_normal((1, 2, 2)).astype(np.float32))],
    )
    return model(graph, opset=14)


def ort_unloadable(m: onnx.ModelProto | None = None) -> onnx.ModelProto:
    """A model the reference executor runs and the installed onnxruntime cannot load: ``m`` with
    the newest IR version onnx knows if onnxruntime refuses that, else a layout=1 RNN; skips the
    calling test when this onnxruntime loads both."""
    import pytest

    candidates = []
    if m is not None:
        newest = onnx.ModelProto()
        newest.CopyFrom(m)
        newest.ir_version = onnx.IR_VERSION
        candidates.append(newest)
    candidates.append(layout1_rnn())
    for candidate in candidates:
        if ort_refuses(candidate):
            return candidate
    pytest.skip("the installed onnxruntime loads every model this test would use to make it fail")
