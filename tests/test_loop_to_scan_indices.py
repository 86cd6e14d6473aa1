"""loop_to_scan on reads at ``c ± i`` (TorchScript's ``range(a, b, ±1)`` loops, ``x[-1-i]``,
``x[i-1]``): the PyTorch 2.13 exports of models/loop_ranges (generate_loop_ranges.py) each
fused or declined with its reason and equal to torch's outputs on both engines, and a
hand-built Loop whose trip count and offset are inputs: wherever the Loop runs, the Scan
reads the same rows (Gather's negative wrap included), and where the Loop fails, so does it."""

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

MODELS = Path(__file__).resolve().parent.parent / "models" / "loop_ranges"

# name -> (loop ops after optimize with the portable target, reason the Loop stays or "")
OUTCOMES = {
    "ts_range_n": ({"RNN": 1}, ""),
    "ts_range_0_n_1": ({"RNN": 1}, ""),
    "ts_range_reverse": ({"RNN": 1}, ""),
    "ts_range_reverse_cat": ({"RNN": 1}, ""),
    "ts_range_1_n": ({"RNN": 1}, ""),
    "ts_range_1_n_prev": ({"RNN": 1}, ""),
    "ts_read_last_minus": ({"RNN": 1}, ""),
    "ts_read_prev": ({"RNN": 1}, ""),
    "ts_read_n_minus": ({"RNN": 1}, ""),
    "ts_range_bf_reverse": ({"RNN": 1}, ""),
    "ts_read_diff": ({"RNN": 1}, ""),  # x[i+1] - x[i]: two scan inputs, the difference folded into W
    "ts_read_n_minus_i_minus_1": ({"RNN": 1}, ""),
    "ts_range_half": ({"RNN": 1}, ""),
    "ts_range_rev_offset": ({"RNN": 1}, ""),
    "ts_range_reverse_cat_list": ({"RNN": 1}, ""),  # torch.cat(outs, 1): the step axis merged by a Reshape
    "ts_range_step2": ({"Loop": 1}, "'x' is read at 2·i: steps of ±1 only"),
    "ts_range_neg_step2": ({"Loop": 1}, "- 2·i: steps of ±1 only"),
    "ts_break": ({"Loop": 1}, "the condition is computed from data each step"),
}
LOOP_OPS = ("Scan", "Loop", "RNN", "GRU", "LSTM")


def test_every_sample_is_listed():
    assert sorted(p.stem for p in MODELS.glob("*.onnx")) == sorted(OUTCOMES)


@pytest.mark.parametrize("name", sorted(OUTCOMES))
def test_exported_range_loop(name):
    model = onnx.load(str(MODELS / f"{name}.onnx"))
    out, report = scanopt.optimize(model, options={"target": "portable"})
    after, reason = OUTCOMES[name]
    counts = top_ops(out)
    details = [o.detail for o in report.outcomes]
    assert {op: counts[op] for op in LOOP_OPS if counts[op]} == after, details
    if reason:
        assert any(reason in o.detail for o in report.outcomes if o.pass_name == "loop_to_scan" and not o.applied), details
        assert out is model or not report.modified
        return
    assert report.verification["passed"] is True, report.verification
    stored = np.load(MODELS / f"{name}.expected.npz")
    feeds = {i.name: stored[i.name] for i in model.graph.input}
    for engine in ("ort", "reference"):
        got = engines.run(out, feeds, engine)
        for output in model.graph.output:
            np.testing.assert_allclose(got[output.name], stored[output.name], rtol=1e-4, atol=1e-5, err_msg=engine)


def test_range_reverse_is_gathered_at_the_loops_indices():
    """range(n-1, -1, -1): the float trip count is not provably n (only below 2**24), so the
    scan input is x gathered at n-1 - arange(M) for the Loop's own M, not x reversed."""
    model = onnx.load(str(MODELS / "ts_range_reverse.onnx"))
    _, report = scanopt.optimize(model, passes=["loop_to_scan"])
    detail = next(o.detail for o in report.outcomes if o.pass_name == "loop_to_scan")
    assert "gathered at the Loop's indices (x[/Sub_output_0 - i])" in detail


# ---- a Loop whose trip count m, offset c and step s are data ----

def _offset_loop(scale: int, via: str):
    """y[k] = x[c + scale·k] * 2 for k < m (m, c inputs), stacked as the Loop's scan output;
    ``via`` spells c + scale·i as TorchScript does (Add(c, Mul(i, s))) or as Sub."""
    if via == "mul":
        index = [const("s", np.array(scale, np.int64)), oh.make_node("Mul", ["i", "s"], ["si"]),
                 oh.make_node("Add", ["c", "si"], ["j"])]
    else:
        index = [oh.make_node("Sub" if scale < 0 else "Add", ["c", "i"], ["j"])]
    body = index + [oh.make_node("Gather", ["x", "j"], ["x_t"], axis=1),
                    const("two", np.array(2, np.float32)), oh.make_node("Mul", ["x_t", "two"], ["y_t"]),
                    oh.make_node("Identity", ["cond_in"], ["cond_out"])]
    graph_body = oh.make_graph(body, "body", [vi("i", [], TP.INT64), vi("cond_in", [], TP.BOOL)],
                               [vi("cond_out", [], TP.BOOL), vi("y_t", [2, None])])
    nodes = [const("true", np.array(True)), oh.make_node("Loop", ["m", "true"], ["y"], body=graph_body)]
    inputs = [vi("x", [2, "L"]), vi("m", [], TP.INT64), vi("c", [], TP.INT64)]
    return make_model(17, nodes, inputs, [vi("y", [None, 2, None])])


def _run(model, feeds, engine="ort"):
    try:
        return engines.run(model, feeds, engine)["y"]
    except Exception:  # noqa: BLE001 - the failure itself is what is compared
        return None


@pytest.mark.parametrize("scale, via", [(1, "mul"), (-1, "mul"), (-1, "sub"), (1, "add")])
def test_offset_read_converts(scale, via):
    model = _offset_loop(scale, via)
    out, report = scanopt.optimize(model, passes=["loop_to_scan"], verify=False)
    assert top_ops(out)["Loop"] == 0, [o.detail for o in report.outcomes]
    assert "gathered at the Loop's indices" in report.outcomes[0].detail
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    feeds = {"x": x, "m": np.array(5, np.int64), "c": np.array(4 if scale < 0 else -2, np.int64)}
    want = _run(model, feeds)
    assert want is not None
    for engine in ("ort", "reference"):
        np.testing.assert_array_equal(_run(out, feeds, engine), want)


_CONVERTED = {}


def _converted(scale, via):
    key = (scale, via)
    if key not in _CONVERTED:
        model = _offset_loop(scale, via)
        out, _ = scanopt.optimize(model, passes=["loop_to_scan"], verify=False)
        _CONVERTED[key] = (model, out)
    return _CONVERTED[key]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(length=st.integers(1, 6), trips=st.integers(1, 14), offset=st.integers(-14, 14),
       form=st.sampled_from([(1, "mul"), (-1, "mul"), (-1, "sub")]))
def test_offset_read_equals_the_loop_wherever_it_runs(length, trips, offset, form):
    """Any trip count (past the length too: x[c - i] wraps through the negative indices and
    runs up to 2L steps before failing), any offset: the same rows, or both fail."""
    model, out = _converted(*form)
    x = np.arange(2 * length, dtype=np.float32).reshape(2, length)
    feeds = {"x": x, "m": np.array(trips, np.int64), "c": np.array(offset, np.int64)}
    want, got = _run(model, feeds), _run(out, feeds)
    if want is None:
        assert got is None
    else:
        np.testing.assert_array_equal(got, want)
        rows = [(offset + form[0] * k) for k in range(trips)]
        np.testing.assert_array_equal(want, np.stack([x[:, r] * 2 for r in rows]))


def test_index_cast_to_int32_after_arithmetic_stays():
    """int32 arithmetic wraps where the gathered int64 indices would not."""
    model = _offset_loop(-1, "sub")
    body = next(a.g for a in model.graph.node[1].attribute if a.name == "body")
    gather = next(n for n in body.node if n.op_type == "Gather")
    gather.input[1] = "j32"
    body.node.insert(1, oh.make_node("Cast", ["j"], ["j32"], to=TP.INT32))
    out, report = scanopt.optimize(model, passes=["loop_to_scan"], verify=False)
    assert out is model
    assert "is cast to int32 (Cast" in report.outcomes[0].detail and "may wrap where int64 does not" in report.outcomes[0].detail


def test_slice_read_past_an_unproven_length_stays():
    """Slice(x, [i], [i+1]) with a trip count m from data: for m > len(x) the Loop reads
    empty rows (a Slice clamps) and may still run; a Scan over x[:m] would stop at len(x)."""
    axes = const("axes0", np.array([0], np.int64))
    body = [axes, const("one", np.array(1, np.int64)), oh.make_node("Unsqueeze", ["i", "axes0"], ["start"]),
            oh.make_node("Add", ["i", "one"], ["i1"]), oh.make_node("Unsqueeze", ["i1", "axes0"], ["end"]),
            oh.make_node("Slice", ["x", "start", "end", "axes0"], ["x_row"]),
            oh.make_node("ReduceSum", ["x_row"], ["y_t"], keepdims=0),
            oh.make_node("Identity", ["cond_in"], ["cond_out"])]
    graph_body = oh.make_graph(body, "body", [vi("i", [], TP.INT64), vi("cond_in", [], TP.BOOL)],
                               [vi("cond_out", [], TP.BOOL), vi("y_t", [])])
    nodes = [const("true", np.array(True)), oh.make_node("Loop", ["m", "true"], ["y"], body=graph_body)]
    model = make_model(17, nodes, [vi("x", ["L", 3]), vi("m", [], TP.INT64)], [vi("y", [None])])
    feeds = {"x": np.ones((2, 3), np.float32), "m": np.array(3, np.int64)}
    np.testing.assert_array_equal(_run(model, feeds), [3, 3, 0])  # the third row is empty, its sum 0
    out, report = scanopt.optimize(model, passes=["loop_to_scan"], verify=False)
    assert out is model
    assert "whose length is not provably the trip count" in report.outcomes[0].detail


def test_reversed_read_in_int32_stays_a_reversed_scan_input():
    """T-1-i computed in int32 (tf2onnx's index type) needs no gathered indices: x reversed."""
    nodes_before = [const("one32", np.array(1, np.int32)), oh.make_node("Shape", ["x"], ["sx"]),
                    const("zero", np.array(0, np.int64)), oh.make_node("Gather", ["sx", "zero"], ["T"], axis=0),
                    oh.make_node("Cast", ["T"], ["T32"], to=TP.INT32), oh.make_node("Sub", ["T32", "one32"], ["last32"])]
    body = [oh.make_node("Cast", ["i"], ["i32"], to=TP.INT32), oh.make_node("Sub", ["last32", "i32"], ["j"]),
            oh.make_node("Gather", ["x", "j"], ["x_t"], axis=0), oh.make_node("Neg", ["x_t"], ["y_t"]),
            oh.make_node("Identity", ["cond_in"], ["cond_out"])]
    graph_body = oh.make_graph(body, "body", [vi("i", [], TP.INT64), vi("cond_in", [], TP.BOOL)],
                               [vi("cond_out", [], TP.BOOL), vi("y_t", [3])])
    nodes = nodes_before + [const("true", np.array(True)), oh.make_node("Loop", ["T", "true"], ["y"], body=graph_body)]
    model = make_model(17, nodes, [vi("x", ["L", 3])], [vi("y", [None, 3])])
    out, report = scanopt.optimize(model, passes=["loop_to_scan"], verify=False)
    assert "reversed reads" in report.outcomes[0].detail, report.outcomes[0].detail
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(_run(out, {"x": x}), -x[::-1])
    np.testing.assert_array_equal(_run(model, {"x": x}), -x[::-1])
