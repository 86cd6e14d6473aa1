"""loop_to_scan on while loops bounded by a counter test (``while i < n``): the PyTorch 2.13
exports of models/while_loops (generate_while_loops.py: TorchScript's INT64_MAX trip count
*and* ``i + 1 < n``, from 0 and 1, ``<=``, a bound from a shape or an input, the counter
returned; the dynamo ``while_loop`` from 1), each fused or declined with its reason and
equal to torch's outputs on both engines; and a hand-built Loop whose start, bound and trip
count are data: wherever the Loop runs, the Scan gives the same outputs (the final counter
included), and where the Loop fails, so does it."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper as oh

import scanopt
from equivalence import top_ops
from builders import vi
from reference_helpers import const, make_model
from scanopt import engines

MODELS = Path(__file__).resolve().parent.parent / "models" / "while_loops"
HELDOUT = Path(__file__).resolve().parent.parent / "models" / "heldout_producers_2"
LOOP_OPS = ("Scan", "Loop", "RNN", "GRU", "LSTM")

ZERO = "may stop the Loop before its first step on a non-empty input"
# name -> (loop ops after optimize with the portable target, reason the Loop stays or "")
OUTCOMES = {
    "ts_while_lt_size": ({"RNN": 1}, ""),
    "ts_while_from_1": ({"RNN": 1}, ""),
    "ts_while_le": ({"RNN": 1}, ""),
    "ts_while_from_1_le": ({"RNN": 1}, ""),
    "ts_while_bound_input": ({"RNN": 1}, ""),
    "ts_while_counter_out": ({"RNN": 1}, ""),
    "dyn_while_from_1": ({"Loop": 1}, ZERO),  # only h: at T = 1 the Loop returns h0
    "ts_while_gt": ({"RNN": 1}, ""),  # n > i
    "ts_while_reverse": ({"RNN": 1}, ""),  # x[n - 1 - i]: a reversed scan input
    "ts_while_data_exit": ({"Loop": 1}, "the condition is computed from data each step"),
    "ts_while_step2": ({"Loop": 1}, "the tested counter steps by 2, not 1"),
    "ts_while_bound_moves": ({"Loop": 1}, "changes in the body (computed from the step's values)"),
    # tf2onnx: x[i] as a Slice with end max(i + 1, 10**9) and step 10**9, squeezed; float tests
    "tf_while_le": ({"RNN": 1}, ""),  # i <= n - 1, n - 1 recomputed in the body from a carried n
    "tf_while_gather": ({"RNN": 1}, ""),
    "tf_while_step2": ({"Loop": 1}, "the tested counter steps by 2, not 1"),
    # zero steps on a non-empty x (T = 1 from i = 1, n = 0, m = 0) return h0 and an empty
    # TensorArray, where onnxruntime's Scan cannot run: the counter test itself is accepted
    # (the reason comes after it), the conversion is not
    "tf_while_from_1": ({"Loop": 1}, ZERO),
    "tf_while_bound_input": ({"Loop": 1}, ZERO),
    "tf_while_max_iter": ({"Loop": 1}, ZERO),  # maximum_iterations: a conjunction with k < M
}


def test_every_sample_is_listed():
    assert sorted(p.stem for p in MODELS.glob("*.onnx")) == sorted(OUTCOMES)


def _check_exported(path: Path, after: dict, reason: str) -> list[str]:
    model = onnx.load(str(path))
    out, report = scanopt.optimize(model, options={"target": "portable"})
    counts = top_ops(out)
    details = [o.detail for o in report.outcomes if o.pass_name == "loop_to_scan"]
    assert {op: counts[op] for op in LOOP_OPS if counts[op]} == after, details
    if reason:
        assert any(reason in o.detail for o in report.outcomes if o.pass_name == "loop_to_scan" and not o.applied), details
        assert out is model or not report.modified
        return details
    assert report.verification["passed"] is True, report.verification
    stored = np.load(path.with_suffix(".expected.npz"))
    feeds = {i.name: stored[i.name] for i in model.graph.input}
    for engine in ("ort", "reference"):
        got = engines.run(out, feeds, engine)
        for output in model.graph.output:
            np.testing.assert_allclose(got[output.name], stored[output.name], rtol=1e-4, atol=1e-5, err_msg=engine)
    return details


@pytest.mark.parametrize("name", sorted(OUTCOMES))
def test_exported_while_loop(name):
    _check_exported(MODELS / f"{name}.onnx", *OUTCOMES[name])


def test_held_out_torchscript_gru_while_fuses():
    """models/heldout_producers_2/ts_gru_while: INT64_MAX and ``i + 1 < x.size(0)`` -> GRU."""
    details = _check_exported(HELDOUT / "ts_gru_while.onnx", {"GRU": 1}, "")
    assert any("bounded by a counter test (c + 1 < /Gather_output_0 from c = 0)" in d for d in details), details


def test_held_out_tf_while_loop_fuses():
    """models/heldout_producers_2/tf_while_loop_rnn: float tests on an int32 counter, x[i]
    as tf2onnx's one-row Slice of x carried through the loop -> RNN."""
    details = _check_exported(HELDOUT / "tf_while_loop_rnn.onnx", {"RNN": 1}, "")
    assert any("bounded by a counter test (c + 1 < strided_slice__61:0 from c = 0)" in d for d in details), details


def test_start_at_one_reads_through_the_gathered_indices():
    """From 1 the Loop reads x[1 + k]: rows gathered at 1 + arange(trip), trip = max(0, n - 1)."""
    model = onnx.load(str(MODELS / "ts_while_from_1.onnx"))
    _, report = scanopt.optimize(model, passes=["loop_to_scan"], verify=False)
    assert "gathered at the Loop's indices (x[i + 1])" in report.outcomes[0].detail, report.outcomes[0].detail


# ---- a hand-built while loop whose start, bound and trip count are data ----

def _while_loop(start: int, compare: str, dtype: int, limit: bool, bound: str = "input", stack: str = "sequence"):
    """y[k] = 2·x[c], h += x[c] for c = start, start+1, ... while ``c + 1 compare n`` (and
    k < m where ``limit``; else TorchScript's INT64_MAX); returns y, h and the final c. n is
    the input ``n``, or with ``bound="shape"`` ``len(z) - 1`` (TorchScript's ``<=`` bound:
    provably below INT64_MAX). y is stacked as TorchScript does (SequenceInsert, then
    ConcatFromSequence: zero steps fail) or, with ``stack="scan_output"``, by the Loop."""
    np_type = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    body = [oh.make_node("Gather", ["x", "c"], ["x_t"], axis=0), const("two", np.array(2, np.float32)),
            oh.make_node("Mul", ["x_t", "two"], ["y_t"]), oh.make_node("Add", ["h", "x_t"], ["h_new"]),
            const("one", np.array(1, np_type)), oh.make_node("Add", ["c", "one"], ["c_new"]),
            oh.make_node(compare, ["c_new", "n_c"], ["cond_out"])]
    body_in = [vi("k", [], TP.INT64), vi("cond_in", [], TP.BOOL), vi("h", [3]), vi("c", [], dtype)]
    body_out = [vi("cond_out", [], TP.BOOL), vi("h_new", [3]), vi("c_new", [], dtype)]
    if stack == "sequence":
        body.append(oh.make_node("SequenceInsert", ["seq", "y_t"], ["seq_new"]))
        body_in.append(oh.make_tensor_sequence_value_info("seq", TP.FLOAT, [3]))
        body_out.append(oh.make_tensor_sequence_value_info("seq_new", TP.FLOAT, [3]))
    else:
        body_out.append(vi("y_t", [3]))
    graph_body = oh.make_graph(body, "body", body_in, body_out)
    if bound == "shape":
        outer = [oh.make_node("Shape", ["z"], ["z_shape"]), const("zero", np.array(0, np.int64)),
                 oh.make_node("Gather", ["z_shape", "zero"], ["z_len"], axis=0), const("one_out", np.array(1, np.int64)),
                 oh.make_node("Sub", ["z_len", "one_out"], ["n_c"])]
    else:
        outer = [oh.make_node("Cast", ["n"], ["n_c"], to=dtype)]
    outer += [const("start", np.array(start, np_type)),
             oh.make_node(compare, ["start", "n_c"], ["go"]), const("h0", np.zeros(3, np.float32))]
    if not limit:
        outer.append(const("m", np.array(np.iinfo(np.int64).max, np.int64)))
    if stack == "sequence":
        outer += [oh.make_node("SequenceEmpty", [], ["seq0"], dtype=TP.FLOAT),
                  oh.make_node("Loop", ["m", "go", "h0", "start", "seq0"], ["h_n", "c_n", "seq_n"], body=graph_body),
                  oh.make_node("ConcatFromSequence", ["seq_n"], ["y"], axis=0, new_axis=1)]
    else:
        outer.append(oh.make_node("Loop", ["m", "go", "h0", "start"], ["h_n", "c_n", "y"], body=graph_body))
    inputs = [vi("x", ["L", 3]), vi("z", ["N"]) if bound == "shape" else vi("n", [], TP.INT64)]
    inputs += [vi("m", [], TP.INT64)] if limit else []
    return make_model(17, outer, inputs, [vi("y", [None, 3]), vi("h_n", [3]), vi("c_n", [], dtype)])


def _run(model, feeds, engine):
    try:
        return engines.run(model, feeds, engine)
    except Exception:  # noqa: BLE001 - the failure itself is what is compared
        return None


_CONVERTED = {}


def _converted(*form):
    if form not in _CONVERTED:
        model = _while_loop(*form)
        out, report = scanopt.optimize(model, passes=["loop_to_scan"], verify=False)
        assert top_ops(out)["Loop"] == 0, [o.detail for o in report.outcomes]
        _CONVERTED[form] = (model, out)
    return _CONVERTED[form]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(length=st.integers(1, 6), bound=st.integers(-3, 9), trips=st.integers(-2, 9), start=st.integers(0, 3),
       form=st.sampled_from([("Less", TP.INT64, "input"), ("Less", TP.INT32, "input"), ("Less", TP.INT64, "shape"),
                             ("LessOrEqual", TP.INT64, "shape")]),
       limit=st.booleans())
def test_counter_test_equals_the_loop_wherever_it_runs(length, bound, trips, start, form, limit):
    """Every start, bound (past the length and negative too) and trip count M: the same
    stacked rows, state and final counter wherever the Loop runs; where it fails (a read past
    x's end), a read gathered from a start above 0 fails too. At zero steps the Loop's empty
    stack fails to concatenate (what lets a start above 0 or a bound from data convert:
    onnxruntime's Scan refuses zero steps)."""
    compare, dtype, source = form
    model, out = _converted(start, compare, dtype, limit, source)
    x = np.arange(3 * length, dtype=np.float32).reshape(length, 3)
    if source == "shape":
        bound = max(bound, -1)
        feeds = {"x": x, "z": np.zeros(bound + 1, np.float32)}
    else:
        feeds = {"x": x, "n": np.array(bound, np.int64)}
    if limit:
        feeds["m"] = np.array(trips, np.int64)
    steps = max(0, bound + (compare == "LessOrEqual") - start)
    steps = max(0, min(trips, steps)) if limit else steps
    for engine in ("reference", "ort"):
        want, got = _run(model, feeds, engine), _run(out, feeds, engine)
        if not steps:
            assert want is None, engine  # ConcatFromSequence of an empty sequence
            continue
        if want is None:  # the Loop failed on a read past x's end, nothing else
            assert start + steps > length
            if start:  # x gathered at start + arange(trip): the same read fails
                assert got is None, engine
            continue  # from 0, x is cut to the trip count: past its end the Loop fails, the Scan may run
        assert got is not None, engine
        for name in ("y", "h_n", "c_n"):
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{engine} {name}")
        assert int(want["c_n"]) == start + steps
        np.testing.assert_array_equal(want["y"].reshape(-1, 3), 2 * x[start:start + steps])


def _declined(model) -> str:
    out, report = scanopt.optimize(model, passes=["loop_to_scan"], verify=False)
    assert out is model or not report.modified
    return report.outcomes[0].detail


def _body_node(model, op):
    loop = next(n for n in model.graph.node if n.op_type == "Loop")
    body = next(a.g for a in loop.attribute if a.name == "body")
    return body, next(n for n in body.node if n.op_type == op or n.output[0] == op)


@pytest.mark.parametrize("start, limit, bound", [(1, False, "shape"), (0, True, "shape"), (0, False, "input")])
def test_a_loop_that_may_run_zero_steps_with_results_stays(start, limit, bound):
    """Stacked by the Loop itself (no ConcatFromSequence to fail), zero steps give the
    initial state and an empty y, which a Scan cannot give on onnxruntime: from 1 at
    len(z) = 1, M = 0, or n = 0. ``c + 1 <= len(z) - 1`` from 0 runs zero steps only at
    len(z) = 0 (the documented zero-length case): it converts."""
    model = _while_loop(start, "Less", TP.INT64, limit, bound, stack="scan_output")
    assert "may stop the Loop before its first step on a non-empty input" in _declined(model)
    plain = _while_loop(0, "LessOrEqual", TP.INT64, False, "shape", stack="scan_output")  # c + 1 <= len(z) - 1
    out, report = scanopt.optimize(plain, passes=["loop_to_scan"], verify=False)
    assert top_ops(out)["Loop"] == 0, report.outcomes[0].detail


def test_a_step_other_than_one_stays():
    model = _while_loop(0, "Less", TP.INT64, False)
    body, one = _body_node(model, "one")
    one.attribute[0].t.CopyFrom(onnx.numpy_helper.from_array(np.array(3, np.int64), "one"))
    assert "the tested counter steps by 3, not 1" in _declined(model)


def test_a_test_before_the_increment_stays():
    """``c < n`` on the old value runs one step more than ``c + 1 < n``: refused, not guessed."""
    model = _while_loop(0, "Less", TP.INT64, False)
    _, test = _body_node(model, "cond_out")
    test.input[0] = "c"
    assert "tests the counter before its increment" in _declined(model)


def test_an_initial_condition_of_another_predicate_stays():
    """Initially ``start <= n`` but ``c + 1 < n`` in the body: not the same predicate."""
    model = _while_loop(0, "Less", TP.INT64, False)
    go = next(n for n in model.graph.node if n.output[0] == "go")
    go.op_type = "LessOrEqual"
    assert "the initial condition is not the counter test at the counter's start" in _declined(model)


def test_an_inclusive_bound_that_may_be_the_maximum_stays():
    """``c + 1 <= n`` with n an int64 input: at n = INT64_MAX, c + 1 would overflow first."""
    model = _while_loop(0, "LessOrEqual", TP.INT64, False)
    cast = next(n for n in model.graph.node if n.output[0] == "n_c")
    cast.op_type = "Identity"
    del cast.attribute[:]
    assert "may overflow before the test fails" in _declined(model)


def _slice_loop(offset: int, step: int, floor: int):
    """tf2onnx's x[c]: ``Slice(x, [c + offset], [max(c + 1, floor)], [0], [step])`` in a
    ``c + 1 < len(x)`` while loop; y[k] = 2 · that row."""
    i64 = lambda name, v: const(name, np.array(v, np.int64))  # noqa: E731
    body = [i64("one", 1), i64("offset", offset), i64("floor", floor), const("axes", np.array([0], np.int64)),
            const("steps", np.array([step], np.int64)), oh.make_node("Add", ["c", "offset"], ["at"]),
            oh.make_node("Unsqueeze", ["at", "axes"], ["starts"]), oh.make_node("Add", ["c", "one"], ["c_new"]),
            oh.make_node("Add", ["c", "one"], ["c_1"]), oh.make_node("Max", ["c_1", "floor"], ["end"]), oh.make_node("Unsqueeze", ["end", "axes"], ["ends"]),
            oh.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["row"]),
            const("two", np.array(2, np.float32)), oh.make_node("Mul", ["row", "two"], ["y_t"]),
            oh.make_node("Less", ["c_new", "n"], ["cond_out"])]
    graph_body = oh.make_graph(body, "body", [vi("k", [], TP.INT64), vi("cond_in", [], TP.BOOL), vi("c", [], TP.INT64)],
                               [vi("cond_out", [], TP.BOOL), vi("c_new", [], TP.INT64), vi("y_t", [1, 3])])
    outer = [oh.make_node("Shape", ["x"], ["shape"]), i64("zero", 0), oh.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
             oh.make_node("Less", ["zero", "n"], ["go"]),
             oh.make_node("Loop", ["", "go", "zero"], ["c_n", "y"], body=graph_body)]
    return make_model(17, outer, [vi("x", ["L", 3])], [vi("y", [None, 1, 3])])


def test_a_one_row_slice_end_reads_row_c():
    """end = max(c + 1, 10**9), step 10**9: in [c + 1, c + step], exactly row c."""
    model = _slice_loop(0, 10**9, 10**9)
    out, report = scanopt.optimize(model, passes=["loop_to_scan"], verify=False)
    assert top_ops(out)["Loop"] == 0, report.outcomes[0].detail
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    for engine in ("ort", "reference"):
        np.testing.assert_array_equal(_run(out, {"x": x}, engine)["y"], 2 * x[:, None, :])
        np.testing.assert_array_equal(_run(model, {"x": x}, engine)["y"], 2 * x[:, None, :])


@pytest.mark.parametrize("offset, step, floor, reason", [
    (1, 10**9, 10**9, "reads [i + 1, i + 1)"),  # the end is proven for c, the start is c + 1
    (0, 2, 10, "the iteration counter is used in arithmetic (Max"),  # end up to 10 > c + 2: rows c and c + 2
])
def test_a_slice_end_not_proven_one_row_stays(offset, step, floor, reason):
    assert reason in _declined(_slice_loop(offset, step, floor))
