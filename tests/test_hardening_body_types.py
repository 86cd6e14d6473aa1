"""A Scan body's declarations are checked against the outer graph by Scan's contract: strict
(exit 2, one line naming the value) where they contradict it — another dtype, another rank,
another static dim — and silent where information is only missing. Each strict case is one
onnx.checker's full check rejects too; each lenient one it accepts."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto as TP

import builders as b


def _body(m):
    return m.graph.node[0].attribute[0].g


def _set(value, elem=None, dims=None):
    tensor_type = value.type.tensor_type
    if elem is not None:
        tensor_type.elem_type = elem
    if dims == "none":
        tensor_type.ClearField("shape")
    elif dims is not None:
        tensor_type.ClearField("shape")
        tensor_type.shape.SetInParent()
        for d in dims:
            dim = tensor_type.shape.dim.add()
            if isinstance(d, int):
                dim.dim_value = d
            elif d:
                dim.dim_param = d


def scan9(**edit):
    """Scan-9+ running sum: outer s0 float [2], X float [T, 2]; body s [2], x [2]."""
    m = b.scan9_sum(steps="T")
    for index, change in edit.items():
        kind, i = index.split("_")
        _set(getattr(_body(m), kind)[int(i)], **change)
    return m


def scan8(**edit):
    """Scan-8: outer s0 [B, 2], X [B, T, 2]; the body sees [2] and [2]."""
    m = b.scan8_sum()
    for index, change in edit.items():
        kind, i = index.split("_")
        _set(getattr(_body(m), kind)[int(i)], **change)
    return m


def axis1(dims):
    """Scan-11 over axis 1 of X [2, T]: the body sees x [2]."""
    m = b.scan9_sum(steps="T", scan_input_axes=[1])
    m.graph.input[1].CopyFrom(b.vi("X", [2, "T"]))
    _set(_body(m).input[1], dims=dims)
    return m


STRICT = {
    "state float64": (scan9(input_0={"elem": TP.DOUBLE}), "body input 's' is declared double but the outer state 's0' gives it float"),
    "scan input [3]": (scan9(input_1={"dims": [3]}), "body input 'x' is declared with shape [3] but the outer scan input 'X' gives it [2]"),
    "scan input rank 2": (scan9(input_1={"dims": [2, 1]}), "body input 'x' is declared with shape [2, 1] but the outer scan input 'X' gives it [2]"),
    "scan input float64": (scan9(input_1={"elem": TP.DOUBLE}), "body input 'x' is declared double"),
    "state output int64": (scan9(output_0={"elem": TP.INT64}), "body state output 's_next' is declared int64 but its state input 's' is float"),
    "scan-8 scan input [3]": (scan8(input_1={"dims": [3]}), "body input 'x' is declared with shape [3] but the outer scan input 'X' gives it [2]"),
    "scan-8 state [B, 2]": (scan8(input_0={"dims": ["B", 2]}), "body input 's' is declared with shape [B, 2] but the outer state 's0' gives it [2]"),
    "axis 1, [T]": (axis1([5]), "body input 'x' is declared with shape [5] but the outer scan input 'X' gives it [2]"),
}

LENIENT = {
    "no shape": scan9(input_1={"dims": "none"}),
    "dim names": scan9(input_0={"dims": ["H"]}, input_1={"dims": [None]}),
    "scan-8 dim names": scan8(input_1={"dims": ["W"]}),
    "axis 1 as declared": axis1([2]),
}


@pytest.mark.parametrize("case", list(STRICT))
def test_contradicting_body_declarations_are_refused(cli, tmp_path, case):
    model, said = STRICT[case]
    with pytest.raises((onnx.checker.ValidationError, onnx.shape_inference.InferenceError)):
        onnx.checker.check_model(model, full_check=True)  # a real contradiction, by onnx's own rules
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    result = cli("optimize", path, tmp_path / "out.onnx")
    assert result.code == 2, result
    assert len(result.err.strip().splitlines()) == 1 and said in result.err, result.err
    assert not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("case", list(LENIENT))
def test_missing_information_in_a_body_is_accepted(cli, tmp_path, case):
    model = LENIENT[case]
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    result = cli("inspect", path)
    assert result.code == 0, result


def _loop(v_dtype=TP.FLOAT, iter_dtype=TP.INT64):
    from onnx import helper as h

    body = h.make_graph(
        [h.make_node("Identity", ["cond"], ["cond_out"]), h.make_node("Add", ["v", "v"], ["v_out"])],
        "loop_body",
        [b.vi("i", [], iter_dtype), b.vi("cond", [], TP.BOOL), b.vi("v", [2], v_dtype)],
        [b.vi("cond_out", [], TP.BOOL), b.vi("v_out", [2], v_dtype)],
    )
    node = h.make_node("Loop", ["n", "", "v0"], ["v_final"], body=body)
    graph = h.make_graph([node], "main", [b.vi("n", [], TP.INT64), b.vi("v0", [2])], [b.vi("v_final", [2])])
    return b.model(graph, 16)


@pytest.mark.parametrize("model, said", [
    (_loop(v_dtype=TP.DOUBLE), "body input 'v' is declared double but the outer value 'v0' is float"),
    (_loop(iter_dtype=TP.INT32), "body input 'i' is declared int32 but the iteration number is int64"),
], ids=["carried", "iteration"])
def test_a_loop_body_of_other_dtypes_is_refused(cli, tmp_path, model, said):
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    result = cli("inspect", path)
    assert result.code == 2 and said in result.err, result


def test_a_consistent_loop_is_accepted(cli, tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(_loop().SerializeToString())
    assert cli("inspect", path).code == 0
