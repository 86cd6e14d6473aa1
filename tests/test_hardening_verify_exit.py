"""`scanopt verify` with a candidate whose outputs differ in dtype, rank or count is a
failed verification (exit 1, the README's exit codes), not bad input (exit 2)."""

from __future__ import annotations

import json

import onnx
import pytest
from onnx import TensorProto as TP, helper as h


def _model(outputs):
    """x float [2, 3] -> each (name, dtype, shape, nodes) of ``outputs``."""
    nodes, outs = [], []
    for name, dtype, shape, node_list in outputs:
        nodes += node_list
        outs.append(h.make_tensor_value_info(name, dtype, shape))
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [2, 3])], outs)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def _y(dtype=TP.FLOAT):
    if dtype == TP.FLOAT:
        return ("y", TP.FLOAT, [2, 3], [h.make_node("Relu", ["x"], ["y"])])
    return ("y", dtype, [2, 3], [h.make_node("Relu", ["x"], ["r"]), h.make_node("Cast", ["r"], ["y"], to=dtype)])


CANDIDATES = {
    "dtype": [_y(TP.DOUBLE)],
    "rank": [("y", TP.FLOAT, [6], [h.make_node("Relu", ["x"], ["r"]),
                                    h.make_node("Flatten", ["r"], ["f"], axis=0),
                                    h.make_node("Squeeze", ["f", "zero"], ["y"])])],
    "count": [_y(), ("z", TP.FLOAT, [2, 3], [h.make_node("Neg", ["x"], ["z"])])],
}


@pytest.fixture
def original(tmp_path):
    path = tmp_path / "original.onnx"
    onnx.save(_model([_y()]), path)
    return path


def _candidate(tmp_path, kind):
    model = _model(CANDIDATES[kind])
    if kind == "rank":
        model.graph.initializer.append(onnx.numpy_helper.from_array(__import__("numpy").array([0], "int64"), "zero"))
    onnx.checker.check_model(model)
    path = tmp_path / f"{kind}.onnx"
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("kind, said", [("dtype", "double in the candidate"), ("rank", "rank 2 in the original but 1"),
                                        ("count", "outputs only in the candidate: 'z'")])
def test_outputs_of_another_dtype_rank_or_count_fail_verification(cli, tmp_path, original, kind, said):
    result = cli("verify", original, _candidate(tmp_path, kind), "--seeds", "1")
    assert result.code == 1, result
    assert result.err == ""
    assert result.out.startswith("FAILED: ") and said in result.out


def test_the_json_verdict_says_not_equivalent(cli, tmp_path, original):
    result = cli("verify", original, _candidate(tmp_path, "dtype"), "--json")
    assert result.code == 1
    data = json.loads(result.out)
    assert data["passed"] is False and "double in the candidate" in data["summary"]


def test_a_missing_candidate_is_still_bad_input(cli, tmp_path, original):
    result = cli("verify", original, tmp_path / "nope.onnx")
    assert result.code == 2 and "no such file" in result.err
