"""ShapeTable: inferred shapes, computed without copying big weights."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

from scanopt.shapes import BIG, ShapeTable, _without_big_weights


def _model():
    big = np.zeros((BIG // 4 + 1, 3), np.float32)  # over the threshold
    shape = np.array([-1, 6], np.int64)  # small: data propagation needs its value
    nodes = [h.make_node("Gather", ["table", "ids"], ["rows"]), h.make_node("Reshape", ["rows", "shape"], ["out"])]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("ids", TP.INT64, [4])],
                         [h.make_tensor_value_info("out", TP.FLOAT, None)],
                         initializer=[numpy_helper.from_array(big, "table"), numpy_helper.from_array(shape, "shape")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def test_inference_sees_big_weights_as_typed_inputs_and_small_ones_as_values():
    model = _model()
    light = _without_big_weights(model)
    assert [t.name for t in light.graph.initializer] == ["shape"]
    assert "table" in [v.name for v in light.graph.input]
    table = ShapeTable(model)
    assert table.type_of("rows") == (TP.FLOAT, [4, 3])
    assert table.type_of("out") == (TP.FLOAT, [2, 6])  # needs the small constant's value
    assert table.type_of("table") == (TP.FLOAT, [BIG // 4 + 1, 3])
    assert len(model.graph.initializer) == 2  # the input model is untouched
