"""Verification probes the sequences a top-level Loop that is a scan reads (TorchScript's
``for i in range(x.size(0)): x[i]``) as it probes a top-level Scan's: a NaN at one step, a
long sequence, a wide batch. loop_to_scan records them (``PassContext.loop_reads``), the
pipeline hands them to verification. Before, only Scans of the original model were probed,
and a fused LSTM whose cell-state sequence is recomputed from x (NaN from the NaN step on,
where onnxruntime's per-step LSTM of the original stays finite) was written."""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h

import builders
import scanopt
from builders import vi
from scanopt.edge_inputs import edge_sets
from scanopt.scan_view import top_scanned_inputs
from scanopt.weak_spots import LONG_SEQUENCE, WIDE_BATCH, long_sequences, wide_batches

MODELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")
CELL = os.path.join(MODELS, "cells", "torch_script_lstmcell_hc.onnx")  # x [T, B, 3], h0/c0 [B, 4]; y, c_seq, h_n, c_n


def _feeds(T: int, B: int, nan_at: int | None = None) -> dict:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((T, B, 3)).astype(np.float32)
    if nan_at is not None:
        x[nan_at, 0, 0] = np.nan
    return {"x": x, "h0": rng.standard_normal((B, 4)).astype(np.float32),
            "c0": rng.standard_normal((B, 4)).astype(np.float32)}


def _optimized(target: str):
    model = onnx.load(CELL)
    return model, *scanopt.optimize(model, options={"target": target} if target != "default" else {})


def test_the_pipeline_names_the_sequence_a_top_level_loop_reads():
    _, _, report = _optimized("default")
    assert ("loop_to_scan", "/Loop") in [(o.pass_name, o.node) for o in report.outcomes if o.applied]
    assert report.loop_reads == [("x", 0)]
    labels = [c["inputs"] for c in report.verification["details"]["comparisons"]]
    assert any(label.startswith("edge: 'x' with nan at step ") for label in labels)
    assert f"'T' = {LONG_SEQUENCE} steps (a Scan's length)" in labels
    assert f"'B' = {WIDE_BATCH} (a Scan's batch)" in labels


def test_edge_sets_put_a_nan_in_a_sequence_a_loop_reads():
    model = onnx.load(CELL)
    feeds = _feeds(8, 3)
    assert not any("with nan" in label for label, _ in edge_sets(model, feeds))  # a Loop alone: not a Scan's input
    sets = dict(edge_sets(model, feeds, [("x", 0)]))
    probe = sets["'x' with nan at step 4"]
    assert np.isnan(probe["x"][4, 0, 0]) and np.isnan(probe["x"]).sum() == 1
    assert not np.isnan(feeds["x"]).any()  # seed 0's own feeds untouched
    (label, long), = long_sequences(model, feeds, [("x", 0)])
    assert label == f"'T' = {LONG_SEQUENCE} steps (a Scan's length)" and long["x"].shape == (LONG_SEQUENCE, 3, 3)
    (label, wide), = wide_batches(model, feeds, [("x", 0)])
    assert label == f"'B' = {WIDE_BATCH} (a Scan's batch)"
    assert wide["x"].shape == (8, WIDE_BATCH, 3) and wide["h0"].shape == wide["c0"].shape == (WIDE_BATCH, 4)


def test_a_loop_read_through_a_transpose_is_probed_on_the_graph_input():
    """``x.transpose(0, 1)`` then a Loop over the result: the NaN goes into x's axis 1."""
    body = h.make_graph([h.make_node("Gather", ["xt", "i"], ["row"]), h.make_node("Add", ["s", "row"], ["s2"]),
                         h.make_node("Identity", ["c"], ["c2"])], "b",
                        [vi("i", [], TP.INT64), vi("c", [], TP.BOOL), vi("s", [4])],
                        [vi("c2", [], TP.BOOL), vi("s2", [4])])
    graph = h.make_graph([h.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
                          h.make_node("Shape", ["xt"], ["shape"], end=1), h.make_node("Squeeze", ["shape"], ["n"]),
                          h.make_node("Loop", ["n", "", "s0"], ["s"], body=body)],
                         "main", [vi("x", ["B", "T", 4]), vi("s0", [4])], [vi("s", [4])])
    model = builders.model(graph, 17)
    assert top_scanned_inputs(model) == []
    assert top_scanned_inputs(model, [("xt", 0), ("xt", 0), ("s0", -1), ("nowhere", 0)]) == [("x", 1)]
    feeds = {"x": np.zeros((2, 6, 4), np.float32), "s0": np.zeros(4, np.float32)}
    probe = dict(edge_sets(model, feeds, [("xt", 0)]))["'x' with nan at step 3"]
    assert np.isnan(probe["x"][0, 3, 0])


def _finite_where_original_is(original, candidate, feeds):
    import onnxruntime as ort

    ran = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
           for m in (original, candidate)]
    for out, want, got in zip(original.graph.output, *ran):
        finite = np.isfinite(want)
        assert want.shape == got.shape, out.name
        assert np.isfinite(got[finite]).all(), f"{out.name}: non-finite where the original is finite"
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-5, err_msg=out.name)


def test_the_portable_rewrite_is_not_written_wrong_on_a_nan_step():
    """Fails before the fix: portable's fused LSTM recomputes c_seq from x, NaN from step 4
    on, where the original's per-step LSTM (onnxruntime clamps it) stays finite."""
    original, candidate, report = _optimized("portable")
    _finite_where_original_is(original, candidate, _feeds(9, 2, nan_at=4))
    _finite_where_original_is(original, candidate, _feeds(9, 2))
    verification = report.verification
    if verification["rolled_back"]:  # rolled back, the failed comparison named
        failed = [c["inputs"] for c in verification["details"]["comparisons"] if not c["passed"]]
        assert failed and verification["summary"].startswith("rolled back")


def test_the_default_target_is_right_on_a_nan_step_too():
    original, candidate, _ = _optimized("default")  # what is written depends on the times measured
    _finite_where_original_is(original, candidate, _feeds(9, 2, nan_at=4))
