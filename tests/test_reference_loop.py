"""The reference executor's Loop, checked against onnxruntime and, where onnxruntime and the
spec disagree or onnxruntime cannot tell (zero iterations), against numpy loops written here.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper as oh
from onnx.reference import ReferenceEvaluator

from builders import vi
from reference_helpers import BOOL, FLOAT, INT64, assert_outputs_close, const, make_model, run_ort, scan_node
from scanopt.reference import run_model

OPSET = 21
rng = np.random.default_rng(0)


def rand(*shape) -> np.ndarray:
    return rng.uniform(-1, 1, shape).astype(np.float32)


def scalar(name: str, elem) -> onnx.ValueInfoProto:
    return vi(name, [], elem)


def loop_node(m: str, cond: str, carried: list[str], outputs: list[str], body: onnx.GraphProto) -> onnx.NodeProto:
    return oh.make_node("Loop", [m, cond, *carried], outputs, body=body)


def model_inputs(m: str, cond: str, *float_names: str, shapes=None) -> list:
    inputs = []
    if m:
        inputs.append(scalar(m, INT64))
    if cond:
        inputs.append(scalar(cond, BOOL))
    shapes = shapes or {}
    return inputs + [vi(n, shapes.get(n)) for n in float_names]


def check_against_ort(model: onnx.ModelProto, feeds: dict) -> dict:
    got = run_model(model, feeds)
    assert_outputs_close(got, run_ort(model, feeds))
    return got


def feeds_for(m=None, cond=None, **floats) -> dict:
    feeds = dict(floats)
    if m is not None:
        feeds["M"] = np.array(m, np.int64)
    if cond is not None:
        feeds["C"] = np.array(cond, np.bool_)
    return feeds


# -- a body with a loop-carried [2, 3] state and scan outputs of rank 0, 1 and 2 ---------


def rank_body(limit: float = 1e9, declare_outputs: bool = True) -> onnx.GraphProto:
    """s' = s * 0.5 + 1 + i; cond' = sum(s') < limit; scans: sum(s'), s'[0], s', i."""
    out_shape = (lambda shape: shape) if declare_outputs else (lambda shape: None)
    nodes = [
        oh.make_node("Cast", ["i"], ["i_f"], to=FLOAT),
        const("half", np.array(0.5, np.float32)),
        const("one", np.array(1.0, np.float32)),
        const("limit", np.array(limit, np.float32)),
        const("zero_idx", np.array(0, np.int64)),
        oh.make_node("Mul", ["s", "half"], ["s_half"]),
        oh.make_node("Add", ["s_half", "one"], ["s_plus"]),
        oh.make_node("Add", ["s_plus", "i_f"], ["s_out"]),
        oh.make_node("ReduceSum", ["s_out"], ["total"], keepdims=0),
        oh.make_node("Less", ["total", "limit"], ["c_out"]),
        oh.make_node("Identity", ["total"], ["y0"]),
        oh.make_node("Gather", ["s_out", "zero_idx"], ["y1"], axis=0),
        oh.make_node("Identity", ["s_out"], ["y2"]),
        oh.make_node("Identity", ["i"], ["yi"]),
    ]
    return oh.make_graph(
        nodes,
        "body",
        [scalar("i", INT64), scalar("c", BOOL), vi("s", [2, 3])],
        [
            scalar("c_out", BOOL),
            vi("s_out", out_shape([2, 3])),
            vi("y0", out_shape([])),
            vi("y1", out_shape([3])),
            vi("y2", out_shape([2, 3])),
            vi("yi", out_shape([]), INT64),
        ],
    )


def rank_model(m: str, cond: str, limit: float = 1e9, declare_outputs: bool = True) -> onnx.ModelProto:
    outs = ["s_final", "y0", "y1", "y2", "yi"]
    node = loop_node(m, cond, ["s0"], outs, rank_body(limit, declare_outputs))
    outputs = [vi(n, None) for n in outs[:-1]] + [vi("yi", None, INT64)]
    return make_model(OPSET, [node], model_inputs(m, cond, "s0"), outputs)


def expected_rank(s0: np.ndarray, steps: int) -> dict:
    s, y0, y1, y2, yi = s0.copy(), [], [], [], []
    for i in range(steps):
        s = s * np.float32(0.5) + np.float32(1) + np.float32(i)
        y0.append(s.sum())
        y1.append(s[0])
        y2.append(s)
        yi.append(i)
    return {
        "s_final": s,
        "y0": np.array(y0, np.float32).reshape(steps),
        "y1": np.array(y1, np.float32).reshape(steps, 3),
        "y2": np.array(y2, np.float32).reshape(steps, 2, 3),
        "yi": np.array(yi, np.int64).reshape(steps),
    }


def test_trip_count_only_stacks_scan_outputs_of_rank_0_1_2():
    s0 = rand(2, 3)
    got = check_against_ort(rank_model("M", ""), feeds_for(m=4, s0=s0))
    assert got["y0"].shape == (4,) and got["y1"].shape == (4, 3) and got["y2"].shape == (4, 2, 3)
    want = expected_rank(s0, 4)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, err_msg=name)


def test_cond_only_is_a_while_loop():
    # sum(s') grows each step; stops after the step where it reaches 20
    s0 = np.zeros((2, 3), np.float32)
    got = check_against_ort(rank_model("", "C", limit=20.0), feeds_for(cond=True, s0=s0))
    assert 1 < got["y0"].shape[0] < 10 and got["y0"][-1] >= 20 and np.all(got["y0"][:-1] < 20)


@pytest.mark.parametrize("m,limit", [(3, 1e9), (10, 20.0), (0, 1e9)])
def test_trip_count_and_cond_stop_at_whichever_comes_first(m, limit):
    s0 = np.zeros((2, 3), np.float32)
    check_against_ort(rank_model("M", "C", limit=limit), feeds_for(m=m, cond=True, s0=s0))


def test_false_initial_cond_runs_no_iteration():
    s0 = rand(2, 3)
    got = run_model(rank_model("M", "C"), feeds_for(m=5, cond=False, s0=s0))
    np.testing.assert_array_equal(got["s_final"], s0)
    assert got["y2"].shape == (0, 2, 3) and got["yi"].dtype == np.int64


def test_omitted_cond_runs_trip_count_times_ignoring_body_cond():
    """Spec: ``input (trip_count, "")`` is a for loop, the body's cond is ignored.

    onnxruntime 1.31 stops as soon as the body's condition turns false, so this case is
    checked against numpy rather than onnxruntime.
    """
    s0 = np.zeros((2, 3), np.float32)
    got = run_model(rank_model("M", "", limit=20.0), feeds_for(m=6, s0=s0))
    want = expected_rank(s0, 6)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, err_msg=name)


def test_both_omitted_runs_until_body_cond_is_false():
    s0 = np.zeros((2, 3), np.float32)
    got = check_against_ort(rank_model("", "", limit=20.0), feeds_for(s0=s0))
    assert got["y0"][-1] >= 20 and np.all(got["y0"][:-1] < 20)


@pytest.mark.parametrize("declare_outputs", [True, False], ids=["declared", "inferred"])
def test_zero_iterations_return_initial_state_and_empty_scans(declare_outputs):
    s0 = rand(2, 3)
    got = run_model(rank_model("M", "", declare_outputs=declare_outputs), feeds_for(m=0, s0=s0))
    want = {
        "s_final": s0,
        "y0": np.zeros((0,), np.float32),
        "y1": np.zeros((0, 3), np.float32),
        "y2": np.zeros((0, 2, 3), np.float32),
        "yi": np.zeros((0,), np.int64),
    }
    assert_outputs_close(got, want)


def test_onnx_reference_loop_gets_rank_2_scan_outputs_wrong():
    """Why scanopt overrides Loop: onnx.reference concatenates with vstack."""
    s0 = rand(2, 3)
    model = rank_model("M", "C")
    feeds = feeds_for(m=3, cond=True, s0=s0)
    onnx_ref = ReferenceEvaluator(model)
    theirs = dict(zip(onnx_ref.output_names, onnx_ref.run(None, feeds)))
    assert theirs["y2"].shape == (6, 3)  # [3, 2, 3] flattened into [6, 3]
    ours = run_model(model, feeds)
    assert ours["y2"].shape == (3, 2, 3)
    np.testing.assert_allclose(ours["y2"], run_ort(model, feeds)["y2"], rtol=1e-6)
    # and with cond omitted it runs no iteration at all (scanopt's runs M, checked above)
    no_cond = rank_model("M", "")
    onnx_ref = ReferenceEvaluator(no_cond)
    with pytest.raises(ValueError):  # zero iterations: np.vstack of nothing
        onnx_ref.run(None, feeds_for(m=3, s0=s0))


# -- several loop-carried values, outer-scope capture ------------------------------------


def test_several_carried_values_and_outer_scope_capture():
    """a' = a + w (w from the outer graph); b' = b * a'; scan: a' - b'."""
    body = oh.make_graph(
        [
            oh.make_node("Add", ["a", "w"], ["a_out"]),
            oh.make_node("Mul", ["b", "a_out"], ["b_out"]),
            oh.make_node("Sub", ["a_out", "b_out"], ["y"]),
            oh.make_node("Identity", ["c"], ["c_out"]),
        ],
        "body",
        [scalar("i", INT64), scalar("c", BOOL), vi("a", [4]), vi("b", [4])],
        [scalar("c_out", BOOL), vi("a_out", [4]), vi("b_out", [4]), vi("y", [4])],
    )
    node = loop_node("M", "C", ["a0", "b0"], ["a", "b", "y"], body)
    model = make_model(
        OPSET, [oh.make_node("Neg", ["w_in"], ["w"]), node],
        model_inputs("M", "C", "a0", "b0", "w_in"), [vi(n, None) for n in ("a", "b", "y")],
    )
    a0, b0, w = rand(4), rand(4), rand(4)
    got = check_against_ort(model, feeds_for(m=3, cond=True, a0=a0, b0=b0, w_in=w))
    assert got["y"].shape == (3, 4)


# -- nested graphs -----------------------------------------------------------------------


def test_loop_containing_a_scan():
    """Each iteration runs a running-sum Scan over x (outer scope) starting from s."""
    scan_body = oh.make_graph(
        [oh.make_node("Add", ["st", "x_t"], ["st_out"]), oh.make_node("Identity", ["st_out"], ["z"])],
        "scan_body",
        [vi("st", [3]), vi("x_t", [3])],
        [vi("st_out", [3]), vi("z", [3])],
    )
    body = oh.make_graph(
        [
            scan_node(["s", "x"], ["s_out", "zs"], scan_body, 1),
            oh.make_node("Identity", ["c"], ["c_out"]),
        ],
        "body",
        [scalar("i", INT64), scalar("c", BOOL), vi("s", [3])],
        [scalar("c_out", BOOL), vi("s_out", [3]), vi("zs", [5, 3])],
    )
    node = loop_node("M", "", ["s0"], ["s", "zs_all"], body)
    model = make_model(OPSET, [node], model_inputs("M", "", "s0", "x"), [vi("s", None), vi("zs_all", None)])
    got = check_against_ort(model, feeds_for(m=3, s0=rand(3), x=rand(5, 3)))
    assert got["zs_all"].shape == (3, 5, 3)


def test_loop_containing_a_loop_and_an_if():
    """Outer i: inner loop adds i + 1 to s (i + 1 times); If on the iteration's parity."""
    inner = oh.make_graph(
        [
            oh.make_node("Cast", ["oi"], ["oi_f"], to=FLOAT),
            const("one", np.array(1.0, np.float32)),
            oh.make_node("Add", ["oi_f", "one"], ["inc"]),
            oh.make_node("Add", ["t", "inc"], ["t_out"]),
            oh.make_node("Identity", ["ic"], ["ic_out"]),
            oh.make_node("Identity", ["t_out"], ["tz"]),
        ],
        "inner",
        [scalar("ii", INT64), scalar("ic", BOOL), vi("t", [2])],
        [scalar("ic_out", BOOL), vi("t_out", [2]), vi("tz", [2])],
    )
    then_g = oh.make_graph([oh.make_node("Neg", ["s_mid"], ["r_then"])], "then", [], [vi("r_then", [2])])
    else_g = oh.make_graph([oh.make_node("Identity", ["s_mid"], ["r_else"])], "else", [], [vi("r_else", [2])])
    body = oh.make_graph(
        [
            const("one_i", np.array(1, np.int64)),
            const("two_i", np.array(2, np.int64)),
            oh.make_node("Add", ["oi", "one_i"], ["n_inner"]),
            oh.make_node("Loop", ["n_inner", "", "s"], ["s_mid", "tz_all"], body=inner),
            oh.make_node("Mod", ["oi", "two_i"], ["parity"]),
            oh.make_node("Cast", ["parity"], ["odd"], to=BOOL),
            oh.make_node("If", ["odd"], ["r"], then_branch=then_g, else_branch=else_g),
            oh.make_node("Identity", ["oc"], ["oc_out"]),
        ],
        "outer",
        [scalar("oi", INT64), scalar("oc", BOOL), vi("s", [2])],
        [scalar("oc_out", BOOL), vi("s_mid", [2]), vi("r", [2])],
    )
    node = loop_node("M", "", ["s0"], ["s", "rs"], body)
    model = make_model(OPSET, [node], model_inputs("M", "", "s0"), [vi("s", None), vi("rs", None)])
    s0 = rand(2)
    got = check_against_ort(model, feeds_for(m=4, s0=s0))
    s, rs = s0.copy(), []
    for i in range(4):
        for _ in range(i + 1):
            s = s + np.float32(i + 1)
        rs.append(-s if i % 2 else s)
    np.testing.assert_allclose(got["s"], s, rtol=1e-6)
    np.testing.assert_allclose(got["rs"], np.stack(rs), rtol=1e-6)


@pytest.mark.parametrize("opset", [11, 13, 16, 19])
def test_older_opsets(opset):
    s0 = rand(2, 3)
    model = rank_model("M", "C", limit=20.0)
    model.opset_import[0].version = opset
    model.ir_version = 7
    check_against_ort(model, feeds_for(m=5, cond=True, s0=s0))
