"""Verification's weak-spot inputs (scanopt.weak_spots): where random feeds never go, the
model's own data and lengths take it — a Loop's fed trip count at 64 steps."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto as TP
from onnx import helper as oh

from builders import vi
from reference_helpers import const
from scanopt.verify import compare_models
from scanopt.weak_spots import LONG_LOOP, long_trip_counts
from test_loop_to_scan_forms import loop_model


def _counter_sum(cap: int | None = None):
    """s_final = sum of Cast(i) over M steps (i capped at ``cap``: a candidate wrong only past
    step ``cap``); M is a graph input, the trip count of a TorchScript-style Loop."""
    counter = "i" if cap is None else "i_capped"
    body = ([oh.make_node("Min", ["i", "cap"], ["i_capped"])] if cap is not None else []) + [
        oh.make_node("Cast", [counter], ["i_f"], to=TP.FLOAT), oh.make_node("Add", ["s", "i_f"], ["s_new"])]
    outer = [const("s_0", np.zeros([1], np.float32))] + ([const("cap", np.array(cap, np.int64))] if cap is not None else [])
    return loop_model(body, carried=("s",), carried_out=("s_new",), trip="M", outer=outer,
                      inputs=[vi("x", [1]), vi("M", [], TP.INT64)], outputs=[vi("s_final", [1])])


def test_a_loop_wrong_only_past_its_fifth_step_is_caught_at_the_long_trip_count():
    original, wrong = _counter_sum(), _counter_sum(cap=5)
    result = compare_models(original, wrong, seeds=3)
    assert not result.passed
    assert any(f"'M' = {LONG_LOOP}" in line for line in result.failures()), result.failures()


def test_the_long_trip_count_changes_only_the_fed_count():
    feeds = {"x": np.zeros([1], np.float32), "M": np.array(3, np.int64)}
    probes = list(long_trip_counts(_counter_sum(), feeds))
    assert len(probes) == 1 and probes[0][1]["M"] == LONG_LOOP and probes[0][1]["x"] is feeds["x"]


def test_row_queries_keep_a_batch_the_query_shares_with_another_input():
    """x [batch, 5] and h0 [batch, 6] beside a table [2, 6]: probing h0 at the table's rows
    must keep batch at the seed's size (x still has it): 24 rows against x's 8 made a feed
    set no model accepts, and the dims test read it as unsound."""
    from onnx import numpy_helper

    from scanopt.weak_spots import row_queries

    graph = oh.make_graph(
        [oh.make_node("Add", ["h0", "h0"], ["y"])], "g",
        [vi("x", ["batch", 5]), vi("h0", ["batch", 6])], [vi("y", ["batch", 6])],
        [numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(2, 6), "table")])
    model = oh.make_model(graph)
    feeds = {"x": np.zeros([8, 5], np.float32), "h0": np.zeros([8, 6], np.float32)}
    probes = list(row_queries(model, feeds))
    assert probes and all(p["h0"].shape == (8, 6) for _, p in probes)
    alone = oh.make_model(oh.make_graph(graph.node, "g", [vi("h0", ["n", 6])], [vi("y", ["n", 6])], graph.initializer))
    free = list(row_queries(alone, {"h0": np.zeros([8, 6], np.float32)}))
    assert free and free[0][1]["h0"].shape[0] != 8


def _symbolic_cumsum(bump_from: int | None = None):
    """The running sum h0 + CumSum(X) over a named length T, [T, 8]; with ``bump_from``, 1.0
    too much from that step on (a form wrong only late in a long sequence)."""
    from onnx import numpy_helper

    nodes = [oh.make_node("CumSum", ["X", "axis"], ["cs"]), oh.make_node("Add", ["cs", "h0"], ["Y0"])]
    inits = [numpy_helper.from_array(np.int64(0), "axis"), numpy_helper.from_array(np.int64(-1), "last")]
    y = "Y0"
    if bump_from is not None:
        nodes += [oh.make_node("Shape", ["X"], ["shape"]), oh.make_node("Gather", ["shape", "zero"], ["t"], axis=0),
                  oh.make_node("Range", ["zero", "t", "one"], ["steps"]), oh.make_node("Cast", ["steps"], ["steps_f"], to=TP.FLOAT),
                  oh.make_node("Sub", ["steps_f", "start"], ["past"]), oh.make_node("Relu", ["past"], ["late"]),
                  oh.make_node("Min", ["late", "one_f"], ["bump"]), oh.make_node("Unsqueeze", ["bump", "one"], ["bump_col"]),
                  oh.make_node("Add", ["Y0", "bump_col"], ["Y1"])]
        inits += [numpy_helper.from_array(np.int64(0), "zero"), numpy_helper.from_array(np.array([1], np.int64), "one"),
                  numpy_helper.from_array(np.float32(bump_from - 1), "start"), numpy_helper.from_array(np.float32(1), "one_f")]
        y = "Y1"
    nodes += [oh.make_node("Identity", [y], ["Y"]), oh.make_node("Gather", ["Y", "last"], ["hT"], axis=0)]
    graph = oh.make_graph(nodes, "g", [vi("h0", [8]), vi("X", ["T", 8])], [vi("hT", [8]), vi("Y", ["T", 8])], inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


def test_a_form_wrong_only_late_in_a_named_length_is_caught_at_the_long_sequence():
    """Seeds draw a named T of a few dozen steps; a loop-free form wrong from step 200 on (or
    drifting there) passed them all. The Scan's length also runs LONG_SEQUENCE steps."""
    import linrec_builders as lb
    from scanopt.weak_spots import LONG_SEQUENCE

    original = lb.running_sum(T="T", H=8)
    wrong = compare_models(original, _symbolic_cumsum(bump_from=200), seeds=2)
    assert not wrong.passed
    assert any(f"'T' = {LONG_SEQUENCE} steps" in line for line in wrong.failures()), wrong.failures()
    right = compare_models(original, _symbolic_cumsum(), seeds=2)
    assert right.passed, right.failures()
    assert any(f"'T' = {LONG_SEQUENCE} steps" in note for note in right.notes), right.notes


def test_long_sequences_stretch_every_input_axis_of_that_name():
    import linrec_builders as lb
    from scanopt.weak_spots import LONG_SEQUENCE, long_sequences

    feeds = {"h0": np.ones([8], np.float32), "X": np.arange(24, dtype=np.float32).reshape(3, 8)}
    (label, probe), = long_sequences(lb.running_sum(T="T", H=8), feeds)
    assert probe["X"].shape == (LONG_SEQUENCE, 8) and probe["h0"] is feeds["h0"]
    assert np.array_equal(probe["X"][3], feeds["X"][0])  # the seed's own values, repeated
    assert list(long_sequences(lb.running_sum(T=16, H=8), feeds)) == []  # a static length is run as declared


def test_row_queries_mark_the_rows_a_scan_reads_as_reference_points():
    """A table the Scan scans (through a constant scaling, as skl2onnx's GP writes rows / l) is
    a distance map's reference points; a weight of the same width beside it is not. An input of
    unnamed row count that is the only one gets MAX_QUERIES rows."""
    from onnx import numpy_helper

    from scanopt.weak_spots import MAX_QUERIES, row_queries

    body = oh.make_graph(
        [oh.make_node("Identity", ["q_in"], ["q_out"]), oh.make_node("Sub", ["q_in", "r"], ["d"]),
         oh.make_node("ReduceSumSquare", ["d"], ["dd"], axes=[1], keepdims=0)],
        "body", [vi("q_in", ["n", 3]), vi("r", [3])], [vi("q_out", ["n", 3]), vi("dd", ["n"])])
    graph = oh.make_graph(
        [oh.make_node("Div", ["rows", "scale"], ["scaled"]), oh.make_node("Div", ["X", "scale"], ["q"]),
         oh.make_node("Scan", ["q", "scaled"], ["q_last", "D"], body=body, num_scan_inputs=1),
         oh.make_node("MatMul", ["X", "weight"], ["Y"])], "g",
        [oh.make_tensor_value_info("X", TP.FLOAT, [None, 3])], [vi("D", [5, None]), vi("Y", [None, 3])],
        [numpy_helper.from_array(np.arange(15, dtype=np.float32).reshape(5, 3), "rows"),
         numpy_helper.from_array(np.float32(2), "scale"),
         numpy_helper.from_array(np.ones([3, 3], np.float32), "weight")])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    probes = {label: p for label, p in row_queries(model, {"X": np.zeros([8, 3], np.float32)})}
    reference = [p for p in probes.values() if p.reference]
    assert len(probes) == 2 and len(reference) == 1, list(probes)
    assert "'rows' (the reference points a Scan reads)" in next(k for k, p in probes.items() if p.reference)
    assert all(p["X"].shape == (MAX_QUERIES, 3) for p in probes.values())
