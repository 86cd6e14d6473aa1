"""loop_to_scan on hand-built Loops: each form a Loop can take that is a scan (converted,
then compared with the original in onnxruntime and the reference executor), and the forms
that are not (left alone, with the reason the report gives)."""

from __future__ import annotations

import os
import re

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper as oh

import scanopt
from scanopt import engines
from scanopt.errors import InvalidModelError
from builders import vi
from equivalence import assert_equivalent, ops, the_scan, work_ops
from reference_helpers import const, make_model

OPSET = 17
F, I64, BOOL = TP.FLOAT, TP.INT64, TP.BOOL


def loop_model(body_nodes, *, carried=(), carried_out=(), scan_outs=(), outer=(), trip="T", cond="true",
               inputs=None, outputs=None, after=(), x_shape=("T", "B", 3), extra_inputs=(), init_nodes=None):
    """A model with one Loop over x: ``body_nodes`` read ``i`` (the counter), ``cond_in`` and
    the carried values ``carried`` (body names, initial values ``<name>_0`` from outside),
    and write ``carried_out`` and ``scan_outs``. ``trip``: "T" is Shape(x)[0]."""
    nodes = [const("true", np.array(True)), const("zero", np.array(0, np.int64))] + list(outer)
    if trip == "T":
        nodes += [oh.make_node("Shape", ["x"], ["shape_x"]), oh.make_node("Gather", ["shape_x", "zero"], ["T"], axis=0)]
    body_inputs = [vi("i", [], I64), vi("cond_in", [], BOOL)] + [oh.make_value_info(c, onnx.TypeProto()) for c in carried]
    body_outputs = [vi("cond_out", [], BOOL)] + [oh.make_value_info(c, onnx.TypeProto()) for c in carried_out]
    body_outputs += [oh.make_value_info(s, onnx.TypeProto()) for s in scan_outs]
    body_nodes = list(body_nodes)
    if not any("cond_out" in n.output for n in body_nodes):
        body_nodes.append(oh.make_node("Identity", ["cond_in"], ["cond_out"]))
    body = oh.make_graph(body_nodes, "body", body_inputs, body_outputs)
    loop_outs = [f"{c}_final" for c in carried] + [f"{s}_stacked" for s in scan_outs]
    nodes.append(oh.make_node("Loop", [trip, cond] + [f"{c}_0" for c in carried], loop_outs, body=body))
    nodes += list(after)
    graph_inputs = inputs or [vi("x", list(x_shape))] + list(extra_inputs)
    graph_outputs = outputs or [oh.make_value_info(o, onnx.TypeProto()) for o in loop_outs]
    model = make_model(OPSET, (init_nodes or []) + nodes, graph_inputs, graph_outputs)
    return model


def _fix_types(model):
    """Shape inference fills the bodies' and outputs' types (the builders leave them open)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    for out in model.graph.output:
        found = next((v for v in list(inferred.graph.value_info) + list(inferred.graph.output) if v.name == out.name), None)
        if found is not None and found.type.HasField("tensor_type"):
            out.CopyFrom(found)
    return model


def converted(model, **kwargs):
    optimized, report = scanopt.optimize(model, passes=["loop_to_scan"], verify=False, **kwargs)
    outcomes = [o for o in report.outcomes if o.pass_name == "loop_to_scan"]
    return optimized, outcomes


def rnn_step(x_t="x_t", h="h", out="h_new"):
    return [oh.make_node("MatMul", [x_t, "W"], ["xw"]), oh.make_node("MatMul", [h, "R"], ["hr"]),
            oh.make_node("Add", ["xw", "hr"], ["pre"]), oh.make_node("Tanh", ["pre"], [out])]


WEIGHTS = [const("W", np.random.default_rng(0).uniform(-0.5, 0.5, (3, 4)).astype(np.float32)),
           const("R", np.random.default_rng(1).uniform(-0.5, 0.5, (4, 4)).astype(np.float32))]


def rnn_loop(read_nodes, *, stack="scan_output", **kwargs):
    """A tanh RNN over x [T, B, 3] whose step reads x_t by ``read_nodes``."""
    body = list(read_nodes) + rnn_step()
    if stack == "scan_output":
        body.append(oh.make_node("Identity", ["h_new"], ["y_t"]))
        return loop_model(body, carried=["h"], carried_out=["h_new"], scan_outs=["y_t"], init_nodes=WEIGHTS,
                          **{"extra_inputs": [vi("h_0", ["B", 4])], **kwargs})
    raise AssertionError(stack)


def assert_converts(model, *, inputs=None, **kwargs):
    model = _fix_types(model)
    optimized, outcomes = converted(model, **kwargs)
    assert outcomes and outcomes[0].applied, outcomes[0].detail if outcomes else "no outcome"
    assert ops(optimized)["Loop"] == 0 and ops(optimized)["Scan"] >= 1
    assert_equivalent(model, optimized, inputs=inputs)
    return optimized, outcomes[0].detail


def assert_declines(model, reason):
    model = _fix_types(model)
    optimized, outcomes = converted(model)
    assert outcomes and not outcomes[0].applied
    assert reason in outcomes[0].detail, outcomes[0].detail
    assert optimized is model


# ---- forms that convert ----

def test_gather_at_the_counter_with_a_loop_scan_output():
    _, detail = assert_converts(rnn_loop([oh.make_node("Gather", ["x", "i"], ["x_t"], axis=0)]))
    assert "1 scan input(s), 1 state(s)" in detail


def test_reversed_read_at_t_minus_one_minus_i():
    reads = [const("one", np.array(1, np.int64)), oh.make_node("Sub", ["T", "one"], ["last"]),
             oh.make_node("Sub", ["last", "i"], ["j"]), oh.make_node("Gather", ["x", "j"], ["x_t"], axis=0)]
    optimized, detail = assert_converts(rnn_loop(reads))
    assert "reversed reads" in detail
    scan = the_scan(optimized)
    assert [list(a.ints) for a in scan.attribute if a.name == "scan_input_directions"] == [[1]]


def test_slice_from_i_to_i_plus_one_keeps_the_axis():
    reads = [const("axes0", np.array([0], np.int64)), const("one", np.array(1, np.int64)),
             oh.make_node("Unsqueeze", ["i", "axes0"], ["start"]), oh.make_node("Add", ["i", "one"], ["i1"]),
             oh.make_node("Unsqueeze", ["i1", "axes0"], ["end"]),
             oh.make_node("Slice", ["x", "start", "end", "axes0"], ["x_row"]),
             oh.make_node("Squeeze", ["x_row", "axes0"], ["x_t"])]
    assert_converts(rnn_loop(reads))


def test_gather_with_a_one_element_index_keeps_the_axis():
    reads = [const("shape1", np.array([1], np.int64)), oh.make_node("Reshape", ["i", "shape1"], ["i1d"]),
             oh.make_node("Gather", ["x", "i1d"], ["x_row"], axis=0),
             const("axes0", np.array([0], np.int64)), oh.make_node("Squeeze", ["x_row", "axes0"], ["x_t"])]
    assert_converts(rnn_loop(reads))


def test_counter_cast_to_int32_still_indexes():
    reads = [oh.make_node("Cast", ["i"], ["i32"], to=TP.INT32), oh.make_node("Gather", ["x", "i32"], ["x_t"], axis=0)]
    assert_converts(rnn_loop(reads))


@pytest.mark.parametrize("keepdims", [0, 1])
def test_sequence_at_of_a_split_into_rows(keepdims):
    """SequenceAt(SplitToSequence(x), i) without a split: keepdims decides the row's rank,
    and the trip count SequenceLength of the split is the length of x."""
    outer = [oh.make_node("SplitToSequence", ["x"], ["rows"], axis=0, keepdims=keepdims),
             oh.make_node("SequenceLength", ["rows"], ["n"])]
    reads = [oh.make_node("SequenceAt", ["rows", "i"], ["x_row"])]
    reads += [oh.make_node("Identity", ["x_row"], ["x_t"])] if not keepdims else [
        const("axes0", np.array([0], np.int64)), oh.make_node("Squeeze", ["x_row", "axes0"], ["x_t"])]
    _, detail = assert_converts(rnn_loop(reads, trip="n", outer=outer))
    assert "cut" not in detail


def test_read_along_a_negative_axis():
    model = loop_model(
        [oh.make_node("Gather", ["x", "i"], ["x_t"], axis=-1), oh.make_node("Relu", ["x_t"], ["y_t"])],
        scan_outs=["y_t"], trip="n", x_shape=["B", 3, 5],
        outer=[oh.make_node("Shape", ["x"], ["shape_x"]), const("two", np.array(2, np.int64)),
               oh.make_node("Gather", ["shape_x", "two"], ["n"], axis=0)])
    optimized, detail = assert_converts(model)
    assert "cut" not in detail  # n is Shape(x)[2]: the length is proven


def test_trip_count_that_is_not_the_length_cuts_the_input():
    """M is a graph input: the scan input is cut to M, and runs shorter than x are right.
    (M = 0 is not compared: onnxruntime's Scan refuses a zero-length scan input, where
    its Loop runs zero times; README, loop_to_scan.)"""
    model = loop_model([oh.make_node("Gather", ["x", "i"], ["x_t"], axis=0), oh.make_node("Neg", ["x_t"], ["y_t"])],
                       scan_outs=["y_t"], trip="m", extra_inputs=[vi("m", [], I64)], x_shape=[6, 2, 3])
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((6, 2, 3)).astype(np.float32), "m": np.array(k, np.int64)} for k in (6, 4, 1)]
    _, detail = assert_converts(model, inputs=feeds)
    assert "1 input(s) cut to the trip count" in detail


def test_a_negative_trip_count_runs_no_step():
    """M = -2 runs the Loop zero times; the cut is Slice(x, 0, max(M, 0)), not x[:-2] (which
    kept 4 rows: a Scan of 4 steps). Compared on the reference executor (onnxruntime's Scan
    refuses zero steps)."""
    model = _fix_types(loop_model([oh.make_node("Gather", ["x", "i"], ["x_t"], axis=0), oh.make_node("Neg", ["x_t"], ["y_t"])],
                                  scan_outs=["y_t"], trip="m", extra_inputs=[vi("m", [], I64)], x_shape=[6, 2, 3]))
    optimized, outcomes = converted(model)
    assert outcomes[0].applied, outcomes[0].detail
    feeds = {"x": np.ones((6, 2, 3), np.float32), "m": np.array(-2, np.int64)}
    assert engines.run(optimized, feeds, "reference")["y_t_stacked"].shape == (0, 2, 3)
    assert engines.run(model, feeds, "reference")["y_t_stacked"].shape == (0, 2, 3)


def test_constant_trip_count_equal_to_a_static_length():
    model = loop_model([oh.make_node("Gather", ["x", "i"], ["x_t"], axis=0), oh.make_node("Neg", ["x_t"], ["y_t"])],
                       scan_outs=["y_t"], trip="five", outer=[const("five", np.array(5, np.int64))], x_shape=[5, 2, 3])
    _, detail = assert_converts(model)
    assert "cut" not in detail


def test_sequence_insert_then_concat_from_sequence_and_a_growing_concat():
    empty = const("empty", np.zeros((0, 2, 3), np.float32))
    body = [oh.make_node("Gather", ["x", "i"], ["x_t"], axis=0), oh.make_node("Sin", ["x_t"], ["s_t"]),
            oh.make_node("SequenceInsert", ["seq", "s_t"], ["seq_new"]),
            const("axes0", np.array([0], np.int64)), oh.make_node("Unsqueeze", ["s_t", "axes0"], ["row"]),
            oh.make_node("Concat", ["acc", "row"], ["acc_new"], axis=0)]
    outer = [oh.make_node("SequenceEmpty", [], ["seq_0"], dtype=F), empty, oh.make_node("Identity", ["empty"], ["acc_0"])]
    after = [oh.make_node("ConcatFromSequence", ["seq_final"], ["stacked"], axis=1, new_axis=1)]
    model = loop_model(body, carried=["seq", "acc"], carried_out=["seq_new", "acc_new"], outer=outer, after=after,
                       x_shape=["T", 2, 3], outputs=[vi("stacked", None), vi("acc_final", None)])
    optimized, detail = assert_converts(model)
    assert "2 stacked output(s) from SequenceInsert and growing Concat" in detail
    assert ops(optimized)["SequenceInsert"] == 0


def test_stacking_the_state_before_its_update():
    """``outs.append(h); h = f(x[i], h)``: the stacked value is a body input, which the Scan
    writes through an Identity (onnxruntime miscomputes a body output that is a body input)."""
    body = [oh.make_node("Gather", ["x", "i"], ["x_t"], axis=0), *rnn_step(),
            oh.make_node("SequenceInsert", ["seq", "h"], ["seq_new"])]
    model = loop_model(body, carried=["h", "seq"], carried_out=["h_new", "seq_new"], init_nodes=WEIGHTS,
                       extra_inputs=[vi("h_0", ["B", 4])], outer=[oh.make_node("SequenceEmpty", [], ["seq_0"], dtype=F)],
                       after=[oh.make_node("ConcatFromSequence", ["seq_final"], ["hs"], axis=0, new_axis=1)],
                       outputs=[vi("hs", None), vi("h_final", None)])
    assert_converts(model)


def test_while_loop_with_a_counter_test():
    """torch.while_loop's form: no trip count, a counter c carried from 0, c+1 < n."""
    body = [oh.make_node("Gather", ["x", "c"], ["x_t"], axis=0), const("one", np.array(1, np.int64)),
            oh.make_node("Add", ["c", "one"], ["c_new"]), oh.make_node("Less", ["c_new", "T"], ["cond_out"]),
            oh.make_node("Cos", ["x_t"], ["y_t"])]
    outer = [oh.make_node("Shape", ["x"], ["shape_x"]), oh.make_node("Gather", ["shape_x", "zero"], ["T"], axis=0),
             oh.make_node("Less", ["zero", "T"], ["go"]), oh.make_node("Identity", ["zero"], ["c_0"])]
    model = loop_model(body, carried=["c"], carried_out=["c_new"], scan_outs=["y_t"], trip="", cond="go",
                       outer=outer, outputs=[vi("y_t_stacked", None)])
    _, detail = assert_converts(model)
    assert "0 state(s)" in detail


def test_nested_loops_both_convert():
    inner_body = oh.make_graph(
        [oh.make_node("Gather", ["row", "j"], ["x_ij"], axis=0), oh.make_node("Exp", ["x_ij"], ["e"]),
         oh.make_node("Identity", ["c2"], ["c2_out"])],
        "inner", [vi("j", [], I64), vi("c2", [], BOOL)], [vi("c2_out", [], BOOL), oh.make_value_info("e", onnx.TypeProto())])
    body = [oh.make_node("Gather", ["x", "i"], ["row"], axis=0),
            oh.make_node("Shape", ["x"], ["sx"]), const("one", np.array(1, np.int64)),
            oh.make_node("Gather", ["sx", "one"], ["n"], axis=0),
            oh.make_node("Loop", ["n", "true"], ["row_out"], body=inner_body)]
    model = loop_model(body, scan_outs=["row_out"])
    optimized, _ = assert_converts(model)
    assert work_ops(optimized)["Scan"] == 2


# ---- forms that stay Loops ----

def _reduce_cond():
    return [oh.make_node("ReduceSum", ["h_new"], ["total"], keepdims=0), const("zf", np.array(0, np.float32)),
            oh.make_node("Greater", ["total", "zf"], ["cond_out"])]


def _slice_next_row(finish: str):
    """x[i+1] as ``Slice(x, [i+1], [i+2])`` then ``finish`` over the axis (Squeeze or ReduceSum)."""
    return [const("one", np.array(1, np.int64)), const("two", np.array(2, np.int64)),
            oh.make_node("Add", ["i", "one"], ["i1"]), oh.make_node("Add", ["i", "two"], ["i2"]),
            const("zero_axes", np.array([0], np.int64)),
            oh.make_node("Unsqueeze", ["i1", "zero_axes"], ["s"]), oh.make_node("Unsqueeze", ["i2", "zero_axes"], ["e"]),
            oh.make_node("Slice", ["x", "s", "e", "zero_axes"], ["x_row"]),
            oh.make_node(finish, ["x_row", "zero_axes"], ["x_t"], **({"keepdims": 0} if finish == "ReduceSum" else {}))]


def test_slice_of_the_next_row_squeezed_is_gathered():
    """Slice(x, [i+1], [i+2]) read only by a Squeeze of the axis: past x's end the Squeeze
    of the empty row fails as Gather(x, i+1) does, so the rows are gathered at 1 + arange(T)."""
    model = rnn_loop(_slice_next_row("Squeeze"), trip="m", extra_inputs=[vi("h_0", ["B", 4]), vi("m", [], I64)])
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((6, 2, 3)).astype(np.float32), "h_0": rng.standard_normal((2, 4)).astype(np.float32),
              "m": np.array(k, np.int64)} for k in (5, 2, 7)]
    optimized, detail = assert_converts(model, inputs=feeds[:2])
    assert "gathered at the Loop's indices (x[i + 1])" in detail, detail
    for engine in ("ort", "reference"):  # m = 7 reads x[6], past the end: both fail
        for candidate in (model, optimized):
            with pytest.raises(engines.EngineError):
                engines.run(candidate, feeds[2], engine)


@pytest.mark.parametrize("build, reason", [
    (lambda: rnn_loop([oh.make_node("Gather", ["x", "i"], ["x_t"], axis=0)] + _reduce_cond()),
     "the condition is computed from data"),
    (lambda: rnn_loop([oh.make_node("Gather", ["x", "i"], ["x_raw"], axis=0),
                       oh.make_node("Cast", ["i"], ["fi"], to=TP.FLOAT), oh.make_node("Mul", ["x_raw", "fi"], ["x_t"])]),
     "the iteration counter is used in arithmetic"),
    # a Slice at [i+1, i+2) summed over its axis: where a Gather would fail past the end, the
    # Slice gives an empty row and its sum zeros (squeezed, it fails too: that form converts)
    (lambda: rnn_loop(_slice_next_row("ReduceSum")), "reads [i + 1, i + 2), not [i, i+1)"),
    (lambda: rnn_loop([oh.make_node("Gather", ["x", "i"], ["x_t"], axis=0)], trip="", cond="go",
                      outer=[oh.make_node("Identity", ["true"], ["go"])]),
     "no trip count"),
    (lambda: rnn_loop([oh.make_node("Gather", ["x", "i"], ["x_t"], axis=0)], cond="c0",
                      inputs=[vi("x", ["T", "B", 3]), vi("h_0", ["B", 4]), vi("c0", [], BOOL)]),
     "initial condition is not constant true"),
    # range(0, n, 2): every second row, not a scan over x
    (lambda: rnn_loop([const("two", np.array(2, np.int64)), oh.make_node("Mul", ["i", "two"], ["j"]),
                       oh.make_node("Gather", ["x", "j"], ["x_t"], axis=0)]),
     "read at 2·i: steps of ±1 only"),
    # an index times a value computed from data
    (lambda: rnn_loop([oh.make_node("Shape", ["h"], ["sh"]), oh.make_node("ReduceMax", ["sh"], ["k"], keepdims=0),
                       oh.make_node("Mul", ["i", "k"], ["j"]), oh.make_node("Gather", ["x", "j"], ["x_t"], axis=0)]),
     "the iteration counter is used in arithmetic (Mul"),
    (lambda: rnn_loop([oh.make_node("Neg", ["h"], ["x_t_unused"]), oh.make_node("Gather", ["x", "zero"], ["x_t"], axis=0)]),
     "reads no outer tensor per iteration"),
    (lambda: rnn_loop([oh.make_node("If", ["true"], ["x_t"],
                                    then_branch=oh.make_graph([oh.make_node("Gather", ["x", "i"], ["xa"], axis=0)], "t", [],
                                                              [oh.make_value_info("xa", onnx.TypeProto())]),
                                    else_branch=oh.make_graph([oh.make_node("Gather", ["x", "zero"], ["xb"], axis=0)], "e", [],
                                                              [oh.make_value_info("xb", onnx.TypeProto())]))]),
     "read inside a nested graph"),
])
def test_loops_that_are_not_scans_stay(build, reason):
    assert_declines(build(), reason)


def _concatenating_loop(x_shape, axis):
    body = [oh.make_node("Gather", ["x", "i"], ["x_t"], axis=0), oh.make_node("Exp", ["x_t"], ["e_t"]),
            oh.make_node("SequenceInsert", ["seq", "e_t"], ["seq_new"])]
    return loop_model(body, carried=["seq"], carried_out=["seq_new"], x_shape=x_shape,
                      outer=[oh.make_node("SequenceEmpty", [], ["seq_0"], dtype=F)],
                      after=[oh.make_node("ConcatFromSequence", ["seq_final"], ["cat"], axis=axis)], outputs=[vi("cat", None)])


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_sequence_concatenated_without_a_new_axis_merges_the_step_axis(axis):
    """torch.cat(outs, d): steps of a static length along d become one scan output whose
    step axis is merged into d by a Reshape."""
    optimized, detail = assert_converts(_concatenating_loop(["T", 2, 3], axis))
    assert "concatenated" in detail and ops(optimized)["Reshape"] == 1


def test_sequence_concatenated_along_a_dynamic_length_stays():
    """The Loop takes steps of different lengths there; a Scan output would not."""
    assert_declines(_concatenating_loop(["T", "B", 3], 0), "not static")


def test_a_state_that_grows_each_step_stays():
    """A history read in the step (acc = Concat(acc, x_t) then ReduceSum(acc)): a Scan state
    keeps its shape, a Loop's carried value need not."""
    body = [oh.make_node("Gather", ["x", "i"], ["x_t"], axis=0), const("axes0", np.array([0], np.int64)),
            oh.make_node("Unsqueeze", ["x_t", "axes0"], ["row"]), oh.make_node("Concat", ["acc", "row"], ["acc_new"], axis=0),
            oh.make_node("ReduceSum", ["acc_new"], ["y_t"], keepdims=0)]
    model = loop_model(body, carried=["acc"], carried_out=["acc_new"], scan_outs=["y_t"], x_shape=["T", 2],
                       outer=[const("acc_0", np.zeros((0, 2), np.float32))])
    assert_declines(model, "grows each step")


def test_concat_growing_from_a_non_empty_start_stays():
    body = [oh.make_node("Gather", ["x", "i"], ["x_t"], axis=0), const("axes0", np.array([0], np.int64)),
            oh.make_node("Unsqueeze", ["x_t", "axes0"], ["row"]), oh.make_node("Concat", ["acc", "row"], ["acc_new"], axis=0)]
    model = loop_model(body, carried=["acc"], carried_out=["acc_new"], extra_inputs=[vi("acc_0", [None, "B", 3])])
    assert_declines(model, "not provably empty")


# ---- random maps and accumulations ----

@settings(max_examples=12, deadline=None)
@given(steps=st.integers(1, 4), batch=st.integers(1, 3), reverse=st.booleans(), accumulate=st.booleans(),
       stack=st.sampled_from(["scan_output", "sequence", "concat"]), op=st.sampled_from(["Relu", "Sin", "Neg"]))
def test_random_loops_convert_and_agree(steps, batch, reverse, accumulate, stack, op):
    reads = [oh.make_node("Gather", ["x", "i"], ["x_t"], axis=0)]
    if reverse:
        reads = [const("one", np.array(1, np.int64)), oh.make_node("Sub", ["T", "one"], ["last"]),
                 oh.make_node("Sub", ["last", "i"], ["j"]), oh.make_node("Gather", ["x", "j"], ["x_t"], axis=0)]
    body = reads + [oh.make_node(op, ["x_t"], ["v"])]
    carried, carried_out, scan_outs, outer, after, outputs = [], [], [], [], [], []
    if accumulate:
        body.append(oh.make_node("Add", ["s", "v"], ["s_new"]))
        carried, carried_out = ["s"], ["s_new"]
        outer.append(oh.make_node("Identity", ["s0_in"], ["s_0"]))
        outputs.append(vi("s_final", None))
    if stack == "scan_output":
        scan_outs, outputs = ["v"], outputs + [vi("v_stacked", None)]
    elif stack == "sequence":
        body.append(oh.make_node("SequenceInsert", ["seq", "v"], ["seq_new"]))
        carried, carried_out = carried + ["seq"], carried_out + ["seq_new"]
        outer.append(oh.make_node("SequenceEmpty", [], ["seq_0"], dtype=F))
        after.append(oh.make_node("ConcatFromSequence", ["seq_final"], ["stacked"], axis=0, new_axis=1))
        outputs.append(vi("stacked", None))
    else:
        body += [const("axes0", np.array([0], np.int64)), oh.make_node("Unsqueeze", ["v", "axes0"], ["row"]),
                 oh.make_node("Concat", ["acc", "row"], ["acc_new"], axis=0)]
        carried, carried_out = carried + ["acc"], carried_out + ["acc_new"]
        outer.append(const("acc_0", np.zeros((0, batch, 3), np.float32)))
        outputs.append(vi("acc_final", None))
    model = loop_model(body, carried=carried, carried_out=carried_out, scan_outs=scan_outs, outer=outer, after=after,
                       outputs=outputs, x_shape=[steps, batch, 3],
                       extra_inputs=[vi("s0_in", [batch, 3])] if accumulate else [])
    rng = np.random.default_rng(steps * 7 + batch)
    feeds = {"x": rng.standard_normal((steps, batch, 3)).astype(np.float32)}
    if accumulate:
        feeds["s0_in"] = rng.standard_normal((batch, 3)).astype(np.float32)
    assert_converts(model, inputs=[feeds])


@pytest.mark.parametrize("position", [-1, 0])
def test_sequence_insert_at_an_explicit_position_stays(position):
    """``SequenceInsert(seq, v, -1)`` looks like an append but inserts before the last element
    (both engines: [a] then b at -1 gives [b, a]); at 0 it prepends. Neither is a stack in
    step order."""
    body = [oh.make_node("Gather", ["x", "i"], ["x_t"], axis=0), oh.make_node("Sin", ["x_t"], ["s_t"]),
            const("pos", np.array(position, np.int64)), oh.make_node("SequenceInsert", ["seq", "s_t", "pos"], ["seq_new"])]
    model = loop_model(body, carried=["seq"], carried_out=["seq_new"],
                       outer=[oh.make_node("SequenceEmpty", [], ["seq_0"], dtype=F)],
                       after=[oh.make_node("ConcatFromSequence", ["seq_final"], ["stacked"], axis=0, new_axis=1)],
                       outputs=[vi("stacked", None)])
    assert_declines(model, "inserted into at a position")


def _rnn_over_axis_1(reads):
    """A tanh RNN over x [B, T, 3] whose trip count is Shape(x)[1]."""
    body = list(reads) + rnn_step() + [oh.make_node("Identity", ["h_new"], ["y_t"])]
    outer = [oh.make_node("Shape", ["x"], ["sx"]), const("one_o", np.array(1, np.int64)),
             oh.make_node("Gather", ["sx", "one_o"], ["n"], axis=0)]
    return loop_model(body, carried=["h"], carried_out=["h_new"], scan_outs=["y_t"], init_nodes=WEIGHTS, trip="n",
                      outer=outer, x_shape=["B", "T", 3], extra_inputs=[vi("h_0", ["B", 4])])


def _counter_loop(compare, dtype):
    """A while loop on a carried counter of ``dtype``: ``c+1 < T`` or ``T > c+1``."""
    np_type = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    test = oh.make_node("Less", ["c_new", "Tc"], ["cond_out"]) if compare == "Less" else \
        oh.make_node("Greater", ["Tc", "c_new"], ["cond_out"])
    body = [oh.make_node("Gather", ["x", "c"], ["x_t"], axis=0), const("one_c", np.array(1, np_type)),
            oh.make_node("Add", ["one_c", "c"], ["c_new"]), test, oh.make_node("Cos", ["x_t"], ["y_t"])]
    outer = [oh.make_node("Shape", ["x"], ["shape_x"]), oh.make_node("Gather", ["shape_x", "zero"], ["T"], axis=0),
             oh.make_node("Cast", ["T"], ["Tc"], to=dtype), const("zero_c", np.array(0, np_type)),
             oh.make_node("Less", ["zero_c", "Tc"], ["go"]), oh.make_node("Identity", ["zero_c"], ["c_0"])]
    return loop_model(body, carried=["c"], carried_out=["c_new"], scan_outs=["y_t"], trip="", cond="go",
                      outer=outer, outputs=[vi("y_t_stacked", None)])


def _growing_concat_on_axis_1():
    body = [oh.make_node("Gather", ["x", "i"], ["x_t"], axis=0), oh.make_node("Sin", ["x_t"], ["s_t"]),
            const("axes1", np.array([1], np.int64)), oh.make_node("Unsqueeze", ["s_t", "axes1"], ["row"]),
            oh.make_node("Concat", ["acc", "row"], ["acc_new"], axis=1)]
    return loop_model(body, carried=["acc"], carried_out=["acc_new"], x_shape=["T", 2, 3],
                      outer=[const("acc_e", np.zeros((2, 0, 3), np.float32)), oh.make_node("Identity", ["acc_e"], ["acc_0"])])


_SLICE_AXIS_1 = [const("axes1", np.array([1], np.int64)), const("axes0", np.array([0], np.int64)),
                 const("one", np.array(1, np.int64)), oh.make_node("Unsqueeze", ["i", "axes0"], ["start"]),
                 oh.make_node("Add", ["i", "one"], ["i1"]), oh.make_node("Unsqueeze", ["i1", "axes0"], ["end"]),
                 oh.make_node("Slice", ["x", "start", "end", "axes1"], ["x_row"]),
                 oh.make_node("Squeeze", ["x_row", "axes1"], ["x_t"])]
_GATHER = [oh.make_node("Gather", ["x", "i"], ["x_t"], axis=0)]


@pytest.mark.parametrize("build", [
    lambda: _rnn_over_axis_1(_SLICE_AXIS_1),  # Slice(i, i+1, axes=[1]) then Squeeze
    lambda: _rnn_over_axis_1([oh.make_node("Gather", ["x", "i"], ["x_t"], axis=1)]),
    lambda: rnn_loop(_GATHER + [const("cond_out", np.array(True))]),  # a condition that is a body constant
    lambda: rnn_loop(_GATHER + [const("k1", np.array(1, np.int64)), oh.make_node("Equal", ["k1", "k1"], ["cond_out"])]),
    lambda: rnn_loop(_GATHER + [const("no", np.array(False)), oh.make_node("Not", ["no"], ["cond_out"])]),
    lambda: rnn_loop(_GATHER + [oh.make_node("Identity", ["true"], ["cond_out"])]),  # the outer true
    lambda: _counter_loop("Less", TP.INT32),
    lambda: _counter_loop("Greater", I64),
    _growing_concat_on_axis_1,
    lambda: loop_model([oh.make_node("Gather", ["x", "i"], ["x_t"], axis=0)] + rnn_step(), carried=["h"],
                       carried_out=["h_new"], scan_outs=["h_new"], init_nodes=WEIGHTS, extra_inputs=[vi("h_0", ["B", 4])],
                       outputs=[vi("h_final", None), vi("h_new_stacked", None)]),  # one value both state and scan output
    lambda: loop_model([oh.make_node("Gather", ["x", "i"], ["x_t"], axis=0), oh.make_node("MatMul", ["x_t", "Wc"], ["xw"]),
                        oh.make_node("Tanh", ["xw"], ["y_t"])], carried=["Wc"], carried_out=["Wc"], scan_outs=["y_t"],
                       init_nodes=[WEIGHTS[0], oh.make_node("Identity", ["W"], ["Wc_0"])],
                       outputs=[vi("y_t_stacked", None)]),  # weights carried through unchanged
    lambda: loop_model([oh.make_node("Gather", ["x", "i"], ["x_t"], axis=0), oh.make_node("Neg", ["x_t"], ["y_t"])],
                       scan_outs=["y_t"], trip="n", outer=[oh.make_node("Shape", ["x"], ["s01"], start=0, end=1),
                                                           oh.make_node("Squeeze", ["s01"], ["n"])]),
], ids=["slice-axis-1", "gather-axis-1", "cond-constant", "cond-equal", "cond-not", "cond-outer-true",
        "int32-counter", "greater-counter", "concat-axis-1", "state-is-scan-output", "carried-weights", "shape-start-end"])
def test_more_hand_written_forms_convert(build):
    assert_converts(build())


def test_a_body_with_fewer_outputs_than_carried_values_is_declined_not_a_traceback():
    """A damaged Loop (the fuzzer dropped a body output): 2 carried values, 2 body outputs;
    the counter analysis indexed past the outputs (IndexError)."""
    path = os.path.join(os.path.dirname(__file__), "..", "models", "loop_ranges", "ts_read_n_minus.onnx")
    model = onnx.load(path)
    body = next(n for n in model.graph.node if n.op_type == "Loop").attribute[0].g
    del body.output[1]
    # onnx's Loop inference (which onnxruntime runs on load) refuses it, and so does loading
    with pytest.raises(InvalidModelError, match=re.escape("Loop node '/Loop': body has 2 outputs; expected 1 + 2 = 3")):
        scanopt.optimize(model, verify=False)
    from scanopt.pipeline import optimize

    _, report = optimize(model, verify=False, validated=[])  # the pass, where nothing validated the model first
    (reason,) = [o.detail for o in report.outcomes if o.pass_name == "loop_to_scan"]
    assert reason.startswith("malformed Loop: 2 carried value(s), but the body has 4 inputs and 2 outputs"), reason
