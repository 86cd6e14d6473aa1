"""Verification's edge inputs (issue 33, scanopt.edge_inputs): a candidate that changes
the outcome where the original runs (a different shape on an empty batch, a NaN read from
a later step, a GRU that would abort onnxruntime) fails with the edge named."""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h

import builders
import scanopt
from builders import init, vi
from scanopt.edge_inputs import edge_sets
from scanopt.verify import compare_models

MODELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")


def failed_edges(result) -> list[str]:
    return [comp.inputs for comp in result.comparisons if not comp.passed]


def square(extra=()) -> onnx.ModelProto:
    """y = x * x over x [N, 4] (plus ``extra`` nodes writing y instead)."""
    nodes = list(extra) or [h.make_node("Mul", ["x", "x"], ["y"])]
    inits = [init("one", np.array([1], np.int64)), init("zero", np.array([0], np.int64)),
             init("shape", np.array([1, 4], np.int64))]
    return builders.model(h.make_graph(nodes, "sq", [vi("x", ["N", 4])], [vi("y", ["N", 4])], inits), 17)


def test_a_candidate_with_another_shape_on_an_empty_batch_fails():
    wrong = square([  # the first max(N, 1) rows of [x*x; 0]: the same wherever N >= 1
        h.make_node("Mul", ["x", "x"], ["xx"]), h.make_node("Shape", ["x"], ["s"], end=1),
        h.make_node("Max", ["s", "one"], ["rows"]),
        h.make_node("ConstantOfShape", ["shape"], ["zeros"], value=h.make_tensor("v", TP.FLOAT, [1], [0.0])),
        h.make_node("Concat", ["xx", "zeros"], ["padded"], axis=0),
        h.make_node("Slice", ["padded", "zero", "rows", "zero"], ["y"])])
    result = compare_models(square(), wrong, engine="ort", seeds=2)
    assert not result.passed
    assert failed_edges(result) == ["edge: dimension 'N' = 0 (an empty batch or sequence)"]
    assert compare_models(square(), square(), engine="ort", seeds=2).passed


def test_a_candidate_reading_a_later_step_fails_on_a_nan():
    """Y = CumSum(X) + 0 * ReduceSum(X): equal on finite inputs; a NaN at the middle step
    reaches every step through 0 * NaN, where the loop's earlier steps stay finite."""
    original = builders.scan9_sum(opset=13, steps="T")
    nodes = [h.make_node("CumSum", ["X", "axis0"], ["cs"]), h.make_node("ReduceSum", ["X", "axis0"], ["total"]),
             h.make_node("Mul", ["total", "zero"], ["nothing"]), h.make_node("Add", ["cs", "nothing"], ["cs2"]),
             h.make_node("Add", ["cs2", "s0"], ["Y"]), h.make_node("Squeeze", ["total", "axis0"], ["t"]),
             h.make_node("Add", ["s0", "t"], ["s_final"])]
    graph = h.make_graph(nodes, "main", [vi("s0", [2]), vi("X", ["T", 2])], [vi("s_final", [2]), vi("Y", ["T", 2])],
                         [init("axis0", np.array([0], np.int64)), init("zero", np.float32(0))])
    candidate = builders.model(graph, 13)
    result = compare_models(original, candidate, engine="ort", seeds=2)
    assert not result.passed
    assert failed_edges(result) and all(" at step " in label for label in failed_edges(result))
    # the candidate's NaN where the original is NaN (later steps) is not what failed: earlier steps are
    comp = next(c for c in result.comparisons if not c.passed)
    y = next(c for c in comp.checks if c.name == "Y")
    assert not y.passed and y.worst_index[0] < int(comp.inputs.split("step ")[1])


def test_a_fused_gru_without_its_guard_fails_on_an_empty_batch_without_killing_verification():
    model = scanopt.load_model(os.path.join(MODELS, "scan_gru.onnx"))
    fused, _ = scanopt.optimize(model, input_shapes={"X": [100, 8, 3]}, verify=False)
    assert compare_models(model, fused, engine="ort", seeds=2).passed
    bare = unguarded(fused)
    result = compare_models(model, bare, engine="ort", seeds=2)  # in this process: an abort would end the test
    assert not result.passed
    (comp,) = [c for c in result.comparisons if not c.passed]
    assert comp.inputs == "edge: dimension 'batch' = 0 (an empty batch or sequence)"
    assert "process dies on the candidate" in comp.error


def test_an_original_that_kills_onnxruntime_on_an_empty_batch_is_not_run_on_it_in_process():
    """onnxruntime's Scan over axis 1 dies of SIGFPE on an empty batch: the edge is dropped
    with a note, and verification goes on (in this process: a crash would end the test)."""
    import cell_builders as cb

    body = cb.Body()
    states, h_new = cb.cell("RNN", body)
    m = cb.scan_model(body, states, ys=[h_new], in_axis=1)
    result = compare_models(m, m, engine="ort", seeds=2)
    assert result.passed
    assert any("process dies on the original" in note for note in result.notes), result.notes


def unguarded(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each If replaced by its else branch's nodes (main's fused form)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = []
    for node in out.graph.node:
        if node.op_type != "If":
            nodes.append(node)
            continue
        branch = next(a.g for a in node.attribute if a.name == "else_branch")
        rename = {o.name: n for o, n in zip(branch.output, node.output)}
        for inner in branch.node:
            inner.output[:] = [rename.get(o, o) for o in inner.output]
            nodes.append(inner)
        out.graph.initializer.extend(branch.initializer)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def test_edge_sets_name_trip_counts_lengths_and_non_finite_steps():
    scan8 = builders.scan8_sum()
    lens, s0, x = (i.name for i in scan8.graph.input)
    feeds = {lens: np.array([3, 2], np.int64), s0: np.zeros((2, 2), np.float32), x: np.ones((2, 3, 2), np.float32)}
    labels = [label for label, _ in edge_sets(scan8, feeds)]
    assert f"'{x}' with nan at step 1" in labels and not any(' with inf ' in label for label in labels)
    assert any("sequence_lens entry" in label for label in labels)
    assert any(label.startswith("dimension 'B' = 0") for label in labels)
    loop = builders.model(h.make_graph(
        [h.make_node("Loop", ["M", "", "v0"], ["v"], body=h.make_graph(
            [h.make_node("Identity", ["c"], ["c2"]), h.make_node("Identity", ["vi"], ["vo"])], "b",
            [vi("i", [], TP.INT64), vi("c", [], TP.BOOL), vi("vi", [2])], [vi("c2", [], TP.BOOL), vi("vo", [2])]))],
        "loop", [vi("M", [], TP.INT64), vi("v0", [2])], [vi("v", [2])]), 17)
    sets = dict(edge_sets(loop, {"M": np.array(5, np.int64), "v0": np.zeros(2, np.float32)}))
    assert sets["'M' = 0 (a Loop's trip count)"]["M"] == 0


def test_the_screening_child_outlives_a_crash_and_serves_the_next_screening():
    """One child answers every screening of a process; a run that kills it is that run's
    "crash" alone: a new child takes the runs after it (a crash read as a timeout had marked
    every later run "crash", so guarded candidates failed as if they had died)."""
    import cell_builders as cb
    from scanopt import isolated

    body = cb.Body()
    states, h_new = cb.cell("RNN", body)
    dies = cb.scan_model(body, states, ys=[h_new], in_axis=1)  # SIGFPE on a zero-length sequence
    rng = np.random.default_rng(0)  # X [batch, seq, 3] scanned over axis 1, h0 [batch, 4]
    full = {"X": rng.standard_normal([5, 4, 3]).astype(np.float32), "h0": np.zeros([5, 4], np.float32)}
    empty = {"X": full["X"][:, :0], "h0": full["h0"]}
    status = isolated.screen([dies, dies], [full, empty, full])
    assert status == [["ok", "crash", "ok"], ["ok", "crash", "ok"]]
    child = isolated._child
    assert child is not None and child.poll() is None
    assert isolated.screen([dies], [full]) == [["ok"]]
    assert isolated._child is child  # the same process answered
