"""Initializers read by one If branch alone move into it (scanopt.placement): onnxruntime
prepacks a GRU's or MatMul's weights only when they are its own graph's initializers."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

import cell_builders as cb
import scanopt
from scanopt.placement import sink_branch_initializers
from scanopt.protos import walk_proto_graphs


def _const(name, value):
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def _model():
    """If(c): then x·A + S, else If(c2): x·B + S else x·S; A only in then, B only in the inner
    then (two levels down), S in both branches, T at the top and in a branch, D a graph input
    with a default (IR 3 style)."""
    vi = h.make_tensor_value_info
    inner = h.make_node("If", ["c2"], ["e"], then_branch=h.make_graph(
        [h.make_node("MatMul", ["x", "B"], ["eb"]), h.make_node("Add", ["eb", "S"], ["e1"])], "inner_then", [],
        [vi("e1", TP.FLOAT, [2, 2])]), else_branch=h.make_graph(
        [h.make_node("MatMul", ["x", "S"], ["e2"])], "inner_else", [], [vi("e2", TP.FLOAT, [2, 2])]))
    then = h.make_graph([h.make_node("MatMul", ["x", "A"], ["ta"]), h.make_node("Add", ["ta", "S"], ["t0"]),
                         h.make_node("Add", ["t0", "T"], ["t1"]), h.make_node("Add", ["t1", "D"], ["t"])],
                        "then", [], [vi("t", TP.FLOAT, [2, 2])])
    outer = h.make_node("If", ["c"], ["y"], then_branch=then,
                        else_branch=h.make_graph([inner], "else", [], [vi("e", TP.FLOAT, [2, 2])]))
    top = h.make_node("Add", ["y", "T"], ["z"])
    rng = np.random.default_rng(0)
    inits = [_const(n, rng.standard_normal((2, 2))) for n in "ABSTD"]
    graph = h.make_graph([outer, top], "g",
                         [vi("x", TP.FLOAT, [2, 2]), vi("c", TP.BOOL, []), vi("c2", TP.BOOL, []), vi("D", TP.FLOAT, [2, 2])],
                         [vi("z", TP.FLOAT, [2, 2])], initializer=inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def _names(graph):
    return sorted(t.name for t in graph.initializer)


def _branches(node):
    return {a.name: a.g for a in node.attribute}


def _run(model, c, c2):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    return session.run(None, {"x": x, "c": np.array(c), "c2": np.array(c2)})[0]


def test_each_initializer_goes_to_the_one_branch_reading_it_and_the_outputs_stay():
    model = _model()
    moved = copy.deepcopy(model)
    assert sink_branch_initializers(moved.graph) == 2
    outer = _branches(moved.graph.node[0])
    inner = _branches(outer["else_branch"].node[0])
    assert _names(moved.graph) == ["D", "S", "T"]  # S: both branches; T: read at the top; D: a graph input
    assert _names(outer["then_branch"]) == ["A"]
    assert _names(outer["else_branch"]) == []
    assert _names(inner["then_branch"]) == ["B"]  # the deepest graph that alone reads it
    onnx.checker.check_model(moved, full_check=True)
    for c in (True, False):
        for c2 in (True, False):
            np.testing.assert_array_equal(_run(moved, c, c2), _run(model, c, c2))


def test_a_fused_gru_behind_its_guard_holds_its_own_weights():
    """fuse's empty-input guard: the GRU's W, R and B are initializers of the branch with the GRU."""
    body = cb.Body(hidden=8, inputs=8)
    states, h_new = cb.cell("GRU", body)
    model = cb.scan_model(body, states, ys=(h_new,))
    out, report = scanopt.optimize(model, passes=["canonicalize", "fuse", "cleanup"])
    assert report.verification["passed"] is True, report.format()
    gru_graphs = [g for g in walk_proto_graphs(out.graph) if any(n.op_type == "GRU" for n in g.node)]
    assert len(gru_graphs) == 1 and gru_graphs[0] is not out.graph
    gru = next(n for n in gru_graphs[0].node if n.op_type == "GRU")
    own = {t.name for t in gru_graphs[0].initializer}
    assert {gru.input[1], gru.input[2]} <= own, (list(gru.input), own)
    assert not own & {t.name for t in out.graph.initializer}


def test_a_weight_one_branch_reads_and_the_other_returns_stays_outside():
    """A branch may name an outer value as its output with no node reading it: that is a read
    too (an earlier version saw only node inputs and left the other branch's output undefined)."""
    vi = h.make_tensor_value_info
    then = h.make_graph([h.make_node("Add", ["x", "W"], ["t"])], "then", [], [vi("t", TP.FLOAT, [2])])
    other = h.make_graph([], "else", [], [vi("W", TP.FLOAT, [2])])
    graph = h.make_graph([h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "g",
                         [vi("x", TP.FLOAT, [2]), vi("c", TP.BOOL, [])], [vi("y", TP.FLOAT, [2])],
                         initializer=[_const("W", [1.0, 2.0])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    assert sink_branch_initializers(model.graph) == 0 and _names(model.graph) == ["W"]
    from onnx.reference import ReferenceEvaluator  # onnxruntime refuses an outer value as a branch output

    for c, want in ((True, [1.0, 3.0]), (False, [1.0, 2.0])):
        got = ReferenceEvaluator(model).run(None, {"x": np.array([0.0, 1.0], np.float32), "c": np.array(c)})[0]
        np.testing.assert_array_equal(got, want)
