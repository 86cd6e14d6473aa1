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


def test_inference_is_shared_within_a_run_and_dropped_after(monkeypatch):
    """Inside one optimize() the original is inferred once (the passes' ShapeTable and
    verification's feed synthesis share it); outside a run nothing is cached, and a proto
    edited in place (its size changed) is inferred anew."""
    import onnx

    import builders as b
    from scanopt import shapes

    calls = []
    real = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = b.scan9_sum(steps=3)
    shapes.inferred_model(model)
    shapes.inferred_model(model)
    assert len(calls) == 2  # no run open: no cache
    with shapes.shared_inference():
        first = shapes.inferred_model(model)
        assert shapes.inferred_model(model) is first and len(calls) == 3
        model.graph.node.add().CopyFrom(onnx.helper.make_node("Identity", ["x"], ["x_copy"]))  # edited in place
        assert shapes.inferred_model(model) is not first and len(calls) == 4
    assert shapes._CACHE is None


def test_a_verified_optimize_infers_the_original_once(monkeypatch):
    import onnx

    import builders as b
    from scanopt import optimize

    calls = []
    real = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", lambda *a, **k: calls.append(1) or real(*a, **k))
    _, report = optimize(b.scan9_sum(steps=3), passes=["unroll"])
    assert report.modified and report.verification["passed"]
    assert len(calls) == 1


def test_derived_rank_reads_slice_unsqueeze_squeeze_and_reductions():
    """TorchScript's loop bodies leave these untyped (x[..., None, :] is an Unsqueeze and a
    whole Slice, (S * k).sum(-2) a ReduceSum with keepdims=0): their ranks follow the input's."""
    import onnx_graphsurgeon as gs

    from scanopt.shapes import derived_rank

    x = gs.Variable("x", np.float32, [2, 3, 4])
    axes = gs.Constant("axes", np.array([-1], np.int64))
    un, sl, red, keep, sq = (gs.Variable(n, np.float32) for n in ("un", "sl", "red", "keep", "sq"))
    nodes = [gs.Node("Unsqueeze", inputs=[x, axes], outputs=[un]),
             gs.Node("Slice", inputs=[un, gs.Constant("s", np.array([0], np.int64)),
                                      gs.Constant("e", np.array([2**63 - 1], np.int64))], outputs=[sl]),
             gs.Node("ReduceSum", inputs=[sl, gs.Constant("ax2", np.array([-2], np.int64))], outputs=[red],
                     attrs={"keepdims": 0}),
             gs.Node("ReduceSum", inputs=[sl, gs.Constant("ax3", np.array([1], np.int64))], outputs=[keep]),
             gs.Node("Squeeze", inputs=[red, axes], outputs=[sq])]
    del nodes
    declared = lambda t: None if t.shape is None else len(t.shape)  # noqa: E731
    assert [derived_rank(t, declared, {}) for t in (un, sl, red, keep, sq)] == [4, 4, 3, 4, 2]


def test_derived_shape_keeps_the_dims_unsqueeze_einsum_and_broadcasts_prove():
    """onnxscript bodies read the enclosing function's Constant axes, which onnx inference does
    not see: Unsqueeze(exp(g), [2, 3]) of a [B, 2] step value is [B, 2, 1, 1] (linattn needs the
    trailing 1s to read a per-head decay), an Einsum's dims follow its letters, a broadcast Mul
    takes the dims its inputs prove, ReduceSum(keepdims=0) drops its axis."""
    import onnx_graphsurgeon as gs

    from scanopt.shapes import derived_shape

    g = gs.Variable("g", np.float32, ["B", 2])
    k = gs.Variable("k", np.float32, ["N", 8])
    v = gs.Variable("v", np.float32, ["N", 6])
    s = gs.Variable("s", np.float32, ["N", 8, 6])
    axes = gs.Variable("axes", np.int64)
    gs.Node("Constant", outputs=[axes], attrs={"value": gs.Constant("hw", np.array([2, 3], np.int64))})
    e, un, kv, add, red, q = (gs.Variable(n, np.float32) for n in ("e", "un", "kv", "add", "red", "q"))
    gs.Node("Exp", inputs=[g], outputs=[e])
    gs.Node("Unsqueeze", inputs=[e, axes], outputs=[un])
    gs.Node("Einsum", inputs=[k, v], outputs=[kv], attrs={"equation": "nk,nv->nkv"})
    gs.Node("Add", inputs=[s, kv], outputs=[add])
    gs.Node("ReduceSum", inputs=[add, gs.Constant("ax", np.array([-2], np.int64))], outputs=[red],
            attrs={"keepdims": 0})
    gs.Node("Mul", inputs=[un, gs.Constant("c", np.ones((1, 1, 8, 1), np.float32))], outputs=[q])
    declared = lambda t: None if t.shape is None else list(t.shape)  # noqa: E731
    got = {t.name: derived_shape(t, declared, {}) for t in (un, kv, add, red, q)}
    assert got == {"un": ["B", 2, 1, 1], "kv": ["N", 8, 6], "add": ["N", 8, 6], "red": ["N", 6],
                   "q": ["B", 2, 8, 1]}
