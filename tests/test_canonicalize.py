"""canonicalize on hand-built Scans and the sample models: each rewrite checked for
structure (which ops and attributes remain) and numbers (onnxruntime and the reference
executor); each decline for its reason; canonical models pass through byte for byte."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

import builders as b
import scanopt
from equivalence import assert_equivalent, ops
from scanopt.reference import run_model
from scanopt.verify import tolerance

MODELS = Path(__file__).resolve().parent.parent / "models"
INT64_MIN = np.iinfo(np.int64).min


# ---------------------------------------------------------------- helpers
def canon(model):
    return scanopt.optimize(model, passes=["canonicalize"], verify=False)


def outcomes(report, node="scan"):
    return [o for o in report.outcomes if o.node == node]


def applied_detail(report, node="scan") -> str:
    found = [o.detail for o in outcomes(report, node) if o.applied]
    assert len(found) == 1, [o.to_dict() for o in report.outcomes]
    return found[0]


def skip_reason(report, node="scan") -> str:
    (found,) = [o for o in outcomes(report, node)]
    assert not found.applied
    return found.detail


def scan_of(model, level=None):
    graph = model.graph if level is None else level
    (node,) = [n for n in graph.node if n.op_type == "Scan"]
    return node, {a.name: h.get_attribute_value(a) for a in node.attribute}


def graph(nodes, inputs, outputs, inits=()):
    return h.make_graph(nodes, "main", inputs, outputs, initializer=list(inits))


def scan(inputs, outputs, body, m, **attrs):
    return h.make_node("Scan", inputs, outputs, name="scan", body=body, num_scan_inputs=m, **attrs)


def body(nodes, inputs, outputs, inits=()):
    return h.make_graph(nodes, "body", inputs, outputs, initializer=list(inits))


def reverse(x, y, axis, name):
    return h.make_node("Slice", [x, "r_start", "r_end", f"r_axis{axis}", "r_step"], [y], name=name)


REVERSAL_CONSTANTS = [b.init("r_start", [-1]), b.init("r_end", [INT64_MIN]), b.init("r_step", [-1])] + [
    b.init(f"r_axis{a}", [a]) for a in (0, 1, -1)
]


def add_body(width=(2, 3)):
    """s, x -> (s + x, s + x, x * 2): a running sum, its trace and a doubled copy."""
    return body(
        [h.make_node("Add", ["s", "x"], ["s_next"]), h.make_node("Identity", ["s_next"], ["y"]),
         h.make_node("Mul", ["x", "two"], ["dbl"])],
        [b.vi("s", list(width)), b.vi("x", list(width))],
        [b.vi("s_next", list(width)), b.vi("y", list(width)), b.vi("dbl", list(width))],
        [b.init("two", np.float32(2.0))],
    )


# ---------------------------------------------------------------- axes
def test_axes_move_to_zero_with_transposes_outside_and_names_kept():
    """X [2, T, 3] scanned on axis 1; y stacked on axis 2 ([2, 3, T]); dbl on axis -2."""
    m = b.model(graph(
        [scan(["s0", "X"], ["s_n", "Y", "D"], add_body(), 1, scan_input_axes=[1], scan_output_axes=[2, -2])],
        [b.vi("s0", [2, 3]), b.vi("X", [2, 4, 3])],
        [b.vi("s_n", [2, 3]), b.vi("Y", [2, 3, 4]), b.vi("D", [2, 4, 3])],
    ), opset=16)
    out, report = canon(m)
    node, attrs = scan_of(out)
    assert set(attrs) == {"body", "num_scan_inputs"}
    assert ops(out)["Transpose"] == 3
    assert [o.name for o in out.graph.output] == ["s_n", "Y", "D"]
    perms = {n.output[0]: list(n.attribute[0].ints) for n in out.graph.node if n.op_type == "Transpose"}
    assert perms["Y"] == [1, 2, 0] and perms["D"] == [1, 0, 2]
    assert "scan output 1 (outer tensor 'D'): axis -2 -> 0, Transpose[1, 0, 2] after" in applied_detail(report)
    assert_equivalent(m, out)


def test_scan9_positive_axes():
    m = b.model(graph(
        [scan(["s0", "X"], ["s_n", "Y", "D"], add_body(), 1, scan_input_axes=[2], scan_output_axes=[1, 0])],
        [b.vi("s0", [2, 3]), b.vi("X", [2, 3, 5])],
        [b.vi("s_n", [2, 3]), b.vi("Y", [2, 5, 3]), b.vi("D", [5, 2, 3])],
    ), opset=9)
    out, report = canon(m)
    _, attrs = scan_of(out)
    assert set(attrs) == {"body", "num_scan_inputs"}
    assert ops(out)["Transpose"] == 2
    assert_equivalent(m, out)


def test_unknown_rank_keeps_the_axis_and_says_why():
    m = b.model(graph(
        [scan(["s0", "X"], ["s_n", "Y", "D"], add_body(), 1, scan_input_axes=[1])],
        [b.vi("s0", [2, 3]), h.make_tensor_value_info("X", TP.FLOAT, None)],
        [b.vi("s_n", [2, 3]), b.vi("Y", None), b.vi("D", None)],
    ), opset=16)
    out, report = canon(m)
    assert out is m
    assert skip_reason(report) == (
        "not canonical: scan input 0 (outer tensor 'X') keeps axis 1: its rank is unknown (declare its shape)"
    )


def test_unknown_output_rank_keeps_the_axis_and_says_why():
    """y = Reshape(x, shp) with shp of unknown length: no rank to build the Transpose from."""
    bd = body([h.make_node("Reshape", ["x", "shp"], ["y"])], [b.vi("x", [6])], [h.make_tensor_value_info("y", TP.FLOAT, None)])
    m = b.model(graph(
        [scan(["X"], ["Y"], bd, 1, scan_output_axes=[1])],
        [b.vi("X", [4, 6]), b.vi("shp", ["k"], TP.INT64)], [h.make_tensor_value_info("Y", TP.FLOAT, None)],
    ), opset=16)
    out, report = canon(m)
    assert out is m
    assert skip_reason(report) == (
        "not canonical: scan output 0 (outer tensor 'Y') keeps axis 1: its rank is unknown (declare its shape)"
    )


def test_unknown_rank_does_not_block_the_other_rewrites():
    m = b.model(graph(
        [scan(["s0", "X"], ["s_n", "Y", "D"], add_body(), 1, scan_input_axes=[1])],
        [b.vi("s0", [2, 3]), h.make_tensor_value_info("X", TP.FLOAT, None)],
        [b.vi("s_n", [2, 3]), b.vi("Y", None)],
    ), opset=16)
    out, report = canon(m)
    detail = applied_detail(report)
    assert detail.startswith("removed scan output 1 (outer tensor 'D'), which nothing reads")
    assert detail.endswith("(left: scan input 0 (outer tensor 'X') keeps axis 1: its rank is unknown (declare its shape))")
    node, attrs = scan_of(out)
    assert attrs["scan_input_axes"] == [1] and len(node.output) == 2 and ops(out)["Mul"] == 0
    feeds = [{"s0": np.ones((2, 3), np.float32), "X": np.arange(24, dtype=np.float32).reshape(2, 4, 3)}]
    assert_equivalent(m, out, inputs=feeds)


# ---------------------------------------------------------------- dead outputs and states
def test_unread_scan_output_and_its_body_nodes_are_removed():
    m = b.model(graph(
        [scan(["s0", "X"], ["s_n", "Y", "D"], add_body(), 1)],
        [b.vi("s0", [2, 3]), b.vi("X", [4, 2, 3])],
        [b.vi("s_n", [2, 3]), b.vi("Y", [4, 2, 3])],
    ), opset=16)
    out, report = canon(m)
    node, _ = scan_of(out)
    assert list(node.output) == ["s_n", "Y"] and ops(out)["Mul"] == 0
    assert applied_detail(report) == "removed scan output 1 (outer tensor 'D'), which nothing reads"
    assert_equivalent(m, out)


def two_state_body():
    """a' = a + x; b' = b * 0.5 + a; y = a' (b feeds only itself and its final value)."""
    return body(
        [h.make_node("Add", ["a", "x"], ["a_next"]), h.make_node("Mul", ["b", "half"], ["b_half"]),
         h.make_node("Add", ["b_half", "a"], ["b_next"]), h.make_node("Identity", ["a_next"], ["y"])],
        [b.vi("a", [2]), b.vi("b", [2]), b.vi("x", [2])],
        [b.vi("a_next", [2]), b.vi("b_next", [2]), b.vi("y", [2])],
        [b.init("half", np.float32(0.5))],
    )


@pytest.mark.parametrize("read", [["Y"], ["a_n"]])
def test_state_nothing_reads_is_removed(read):
    m = b.model(graph(
        [scan(["a0", "b0", "X"], ["a_n", "b_n", "Y"], two_state_body(), 1)],
        [b.vi("a0", [2]), b.vi("b0", [2]), b.vi("X", [5, 2])],
        [b.vi(name, [2] if name == "a_n" else [5, 2]) for name in read],
    ), opset=16)
    out, report = canon(m)
    node, _ = scan_of(out)
    assert "removed dead state 1 (its final value, outer tensor 'b_n', is unread and nothing kept depends on it)" in applied_detail(report)
    assert list(node.input) == ["a0", "X"] and ops(out)["Mul"] == 0
    assert_equivalent(m, out)


def test_state_another_kept_state_depends_on_is_kept():
    """a's final value is unread, but b (read) reads a every step: both stay."""
    m = b.model(graph(
        [scan(["a0", "b0", "X"], ["a_n", "b_n", "Y"], two_state_body(), 1)],
        [b.vi("a0", [2]), b.vi("b0", [2]), b.vi("X", [5, 2])],
        [b.vi("b_n", [2])],
    ), opset=16)
    out, report = canon(m)
    node, _ = scan_of(out)
    assert list(node.input) == ["a0", "b0", "X"] and list(node.output) == ["a_n", "b_n"]
    assert applied_detail(report) == "removed scan output 0 (outer tensor 'Y'), which nothing reads"
    assert_equivalent(m, out)


def test_two_unread_states_feeding_each_other_are_both_removed():
    """p' = q + x, q' = p * 0.5: a cycle nothing outside it reads; y = x * 0.5 is kept."""
    bd = body(
        [h.make_node("Add", ["q", "x"], ["p_next"]), h.make_node("Mul", ["p", "half"], ["q_next"]),
         h.make_node("Mul", ["x", "half"], ["y"])],
        [b.vi("p", [2]), b.vi("q", [2]), b.vi("x", [2])],
        [b.vi("p_next", [2]), b.vi("q_next", [2]), b.vi("y", [2])],
        [b.init("half", np.float32(0.5))],
    )
    m = b.model(graph(
        [scan(["p0", "q0", "X"], ["p_n", "q_n", "Y"], bd, 1)],
        [b.vi("p0", [2]), b.vi("q0", [2]), b.vi("X", [3, 2])], [b.vi("Y", [3, 2])],
    ), opset=16)
    out, report = canon(m)
    node, _ = scan_of(out)
    assert list(node.input) == ["X"] and list(node.output) == ["Y"]
    assert ops(out)["Add"] == 0 and ops(out)["Mul"] == 1
    assert_equivalent(m, out)


def test_output_read_only_inside_a_later_body_is_kept():
    """D is read only by outer-scope capture in an If branch: it must stay."""
    branch = h.make_graph([h.make_node("Neg", ["D"], ["nd"])], "then", [], [b.vi("nd", [4, 2, 3])])
    m = b.model(graph(
        [scan(["s0", "X"], ["s_n", "Y", "D"], add_body(), 1),
         h.make_node("If", ["c"], ["r"], name="if", then_branch=branch, else_branch=branch)],
        [b.vi("s0", [2, 3]), b.vi("X", [4, 2, 3]), b.vi("c", [], TP.BOOL)],
        [b.vi("s_n", [2, 3]), b.vi("r", [4, 2, 3])],
    ), opset=16)
    out, report = canon(m)
    node, _ = scan_of(out)
    assert list(node.output) == ["s_n", "D"]
    assert applied_detail(report) == "removed scan output 0 (outer tensor 'Y'), which nothing reads"
    assert_equivalent(m, out)


def test_scan_nothing_reads_is_left_to_cleanup():
    m = b.model(graph(
        [scan(["s0", "X"], ["s_n", "Y", "D"], add_body(), 1), h.make_node("Neg", ["X"], ["nx"])],
        [b.vi("s0", [2, 3]), b.vi("X", [4, 2, 3])], [b.vi("nx", [4, 2, 3])],
    ), opset=16)
    out, report = canon(m)
    assert out is m
    assert skip_reason(report) == "none of its outputs is read; the cleanup pass removes it"


# ---------------------------------------------------------------- loop-invariant states
def invariant_body(wy="wy"):
    """w passes through unchanged; s' = s + x * w; y = s'; wy = w (the invariant as a scan output)."""
    return body(
        [h.make_node("Identity", ["w"], ["w_next"]), h.make_node("Mul", ["x", "w"], ["xw"]),
         h.make_node("Add", ["s", "xw"], ["s_next"]), h.make_node("Identity", ["s_next"], ["y"]),
         h.make_node("Identity", ["w"], ["wy"])],
        [b.vi("w", [2]), b.vi("s", [2]), b.vi("x", [2])],
        [b.vi("w_next", [2]), b.vi("s_next", [2]), b.vi("y", [2]), b.vi(wy, [2])],
    )


@pytest.mark.parametrize("reader", ["graph_output", "node"])
def test_loop_invariant_state_reads_the_initial_value_from_outside(reader):
    nodes = [scan(["w0", "s0", "X"], ["w_n", "s_n", "Y", "WY"], invariant_body(), 1)]
    outputs = [b.vi("s_n", [2]), b.vi("Y", [4, 2]), b.vi("WY", [4, 2])]
    if reader == "graph_output":
        outputs.append(b.vi("w_n", [2]))
    else:
        nodes.append(h.make_node("Neg", ["w_n"], ["neg_w"], name="neg"))
        outputs.append(b.vi("neg_w", [2]))
    m = b.model(graph(nodes, [b.vi("w0", [2]), b.vi("s0", [2]), b.vi("X", [4, 2])], outputs), opset=16)
    out, report = canon(m)
    node, _ = scan_of(out)
    assert list(node.input) == ["s0", "X"] and list(node.output) == ["s_n", "Y", "WY"]
    assert applied_detail(report) == "removed loop-invariant state 0: the body reads its initial value, outer tensor 'w0', directly"
    body_graph = node.attribute[0].g
    assert [i.name for i in body_graph.input] == ["s", "x"]
    assert next(n for n in body_graph.node if n.op_type == "Mul").input[1] == "w0"
    if reader == "graph_output":  # the graph output keeps its name
        assert [n for n in out.graph.node if n.output[0] == "w_n"][0].input[0] == "w0"
    else:
        assert next(n for n in out.graph.node if n.name == "neg").input[0] == "w0"
    assert_equivalent(m, out)


def test_scan_whose_only_read_outputs_are_invariant_is_removed():
    m = b.model(graph(
        [scan(["w0", "s0", "X"], ["w_n", "s_n", "Y", "WY"], invariant_body(), 1)],
        [b.vi("w0", [2]), b.vi("s0", [2]), b.vi("X", [4, 2])], [b.vi("w_n", [2])],
    ), opset=16)
    out, report = canon(m)
    assert ops(out) == {"Identity": 1}
    assert applied_detail(report).startswith("removed the Scan: every output it computes is unread or loop-invariant")
    assert_equivalent(m, out)


def test_invariant_state_passed_straight_to_a_scan_output_is_copied_in():
    """The body lists its input w itself as a scan output: after the rewrite an Identity of
    the outer w0 computes it. (onnxruntime 1.31 returns zeros for such a pass-through in the
    original, so the original is judged by the reference executor alone.)"""
    m = b.model(graph(
        [scan(["w0", "s0", "X"], ["w_n", "s_n", "Y", "WY"], invariant_body(wy="w"), 1)],
        [b.vi("w0", [2]), b.vi("s0", [2]), b.vi("X", [4, 2])], [b.vi("s_n", [2]), b.vi("WY", [4, 2])],
    ), opset=16)
    out, report = canon(m)
    node, _ = scan_of(out)
    body_graph = node.attribute[0].g
    copy = body_graph.node[0]
    assert (copy.op_type, list(copy.input), list(copy.output)) == ("Identity", ["w0"], ["w"])
    assert [o.name for o in body_graph.output] == ["s_next", "w"]
    assert_equivalent(m, out, engine="reference")
    rng = np.random.default_rng(0)
    feeds = {"w0": rng.standard_normal(2, np.float32), "s0": rng.standard_normal(2, np.float32),
             "X": rng.standard_normal((4, 2), np.float32)}
    _assert_outputs(out, feeds, run_model(m, feeds))


@pytest.mark.parametrize("other_input", ["w0", "v"])
def test_invariant_state_is_kept_when_the_body_reuses_its_initial_value_name(other_input):
    """State 1's body input is named w0, like state 0's initial value: the body could not
    read the outer w0 by name. (Named v instead, the rewrite applies.)"""
    bd = body(
        [h.make_node("Identity", ["w"], ["w_next"]), h.make_node("Add", [other_input, "x"], ["acc"]),
         h.make_node("Mul", ["acc", "w"], ["y"])],
        [b.vi("w", [2]), b.vi(other_input, [2]), b.vi("x", [2])],
        [b.vi("w_next", [2]), b.vi("acc", [2]), b.vi("y", [2])],
    )
    m = b.model(graph(
        [scan(["w0", "s0", "X"], ["w_n", "s_n", "Y"], bd, 1)],
        [b.vi("w0", [2]), b.vi("s0", [2]), b.vi("X", [3, 2])], [b.vi("s_n", [2]), b.vi("Y", [3, 2])],
    ), opset=16)
    out, report = canon(m)
    if other_input == "w0":
        assert out is m
        assert skip_reason(report) == (
            "not canonical: state 0 is loop-invariant but the body defines another value named 'w0'"
        )
    else:
        first, second = [o.detail for o in outcomes(report, "scan") if o.applied]
        assert first == "removed loop-invariant state 0: the body reads its initial value, outer tensor 'w0', directly"
        # then y = acc * w reads only acc's new value: stacked anew, y is computed after the loop
        assert second == ("scan output 0 (outer tensor 'Y') computed after the loop from the steps of state 0 "
                          "(a new scan output) (Mul)")
        assert_equivalent(m, out)


def test_skl2onnx_knn_pairwise_distance_state():
    path = MODELS / "skl_knn_regressor.onnx"
    if not path.exists():
        pytest.skip("models/skl_knn_regressor.onnx not generated")
    m = onnx.load(str(path))
    out, report = canon(m)
    node, _ = scan_of(out)
    assert len(node.input) == 1 and len(node.output) == 1
    assert applied_detail(report, "Sc_Scan") == "removed loop-invariant state 0: the body reads its initial value, outer tensor 'X', directly"
    expected = np.load(MODELS / "skl_knn_regressor.expected.npz")
    _assert_outputs(out, {"X": expected["X"]}, {"variable": expected["variable"]})
    assert_equivalent(m, out)


# ---------------------------------------------------------------- duplicates and unused inputs
def pair_body():
    """x1, x2 -> (x1 - x2, x1 + x2)."""
    return body(
        [h.make_node("Sub", ["x1", "x2"], ["d"]), h.make_node("Add", ["x1", "x2"], ["s"])],
        [b.vi("x1", [2]), b.vi("x2", [2])], [b.vi("d", [2]), b.vi("s", [2])],
    )


def test_same_scan_input_twice_in_the_same_direction_is_merged():
    m = b.model(graph(
        [scan(["X", "X"], ["D", "S"], pair_body(), 2)],
        [b.vi("X", [3, 2])], [b.vi("D", [3, 2]), b.vi("S", [3, 2])],
    ), opset=16)
    out, report = canon(m)
    node, attrs = scan_of(out)
    assert list(node.input) == ["X"] and attrs["num_scan_inputs"] == 1
    assert applied_detail(report) == "merged scan input 1 (outer tensor 'X') into scan input 0"
    assert_equivalent(m, out)


def test_same_scan_input_in_opposite_directions_is_not_merged():
    m = b.model(graph(
        [scan(["X", "X"], ["D", "S"], pair_body(), 2, scan_input_directions=[0, 1])],
        [b.vi("X", [3, 2])], [b.vi("D", [3, 2]), b.vi("S", [3, 2])],
    ), opset=16)
    out, report = canon(m)
    assert out is m and skip_reason(report) == "already canonical"


def test_scan_input_the_body_never_reads_is_removed_but_one_always_stays():
    bd = body([h.make_node("Add", ["s", "one"], ["s_next"])], [b.vi("s", [2]), b.vi("x1", [2]), b.vi("x2", [2])],
              [b.vi("s_next", [2])], [b.init("one", np.float32(1.0))])
    m = b.model(graph(
        [scan(["s0", "X1", "X2"], ["s_n"], bd, 2)],
        [b.vi("s0", [2]), b.vi("X1", [3, 2]), b.vi("X2", [3, 2])], [b.vi("s_n", [2])],
    ), opset=16)
    out, report = canon(m)
    node, attrs = scan_of(out)
    assert list(node.input) == ["s0", "X1"] and attrs["num_scan_inputs"] == 1
    assert applied_detail(report) == "stopped passing outer tensor 'X2' to the Scan (scan input 1): the body never reads it"
    assert_equivalent(m, out)


def test_duplicate_scan_outputs_merge_and_another_layout_becomes_a_transpose():
    """Y, Y2 and Y3 stack the same body value; Y3 on axis 1."""
    bd = body([h.make_node("Add", ["s", "x"], ["s_next"]), h.make_node("Identity", ["s_next"], ["y"]),
               h.make_node("Identity", ["s_next"], ["y2"]), h.make_node("Identity", ["y2"], ["y3"])],
              [b.vi("s", [2]), b.vi("x", [2])], [b.vi("s_next", [2]), b.vi("y", [2]), b.vi("y2", [2]), b.vi("y3", [2])])
    m = b.model(graph(
        [scan(["s0", "X"], ["s_n", "Y", "Y2", "Y3"], bd, 1, scan_output_axes=[0, 0, 1])],
        [b.vi("s0", [2]), b.vi("X", [3, 2])], [b.vi("Y", [3, 2]), b.vi("Y2", [3, 2]), b.vi("Y3", [2, 3])],
    ), opset=16)
    out, report = canon(m)
    node, attrs = scan_of(out)
    assert list(node.output) == ["s_n", "Y"] and set(attrs) == {"body", "num_scan_inputs"}
    assert ops(out)["Transpose"] == 1 and ops(out)["Identity"] == 2  # y in the body, Y2 outside
    assert "merged scan output 1 (outer tensor 'Y2') into scan output 0 (same body value); merged scan output 2 (outer tensor 'Y3') into scan output 0" in applied_detail(report)
    assert_equivalent(m, out)


# ---------------------------------------------------------------- reversals and directions
def rnn_like_body():
    return body(
        [h.make_node("Add", ["h", "x"], ["pre"]), h.make_node("Tanh", ["pre"], ["h_next"]),
         h.make_node("Identity", ["h_next"], ["y"])],
        [b.vi("h", [2]), b.vi("x", [2])], [b.vi("h_next", [2]), b.vi("y", [2])],
    )


def test_lone_reversals_around_the_scan_fold_into_directions():
    """Slice-reverse X, scan forward, Slice-reverse Y: the PyTorch export of scan(reverse=True)."""
    m = b.model(graph(
        [reverse("X", "X_rev", 0, "flip_in"), scan(["h0", "X_rev"], ["h_n", "Y_rev"], rnn_like_body(), 1),
         reverse("Y_rev", "Y", 0, "flip_out")],
        [b.vi("h0", [2]), b.vi("X", ["T", 2])], [b.vi("h_n", [2]), b.vi("Y", ["T", 2])], REVERSAL_CONSTANTS,
    ), opset=16)
    out, report = canon(m)
    node, attrs = scan_of(out)
    assert ops(out)["Slice"] == 0 and list(node.input) == ["h0", "X"] and list(node.output) == ["h_n", "Y"]
    assert attrs["scan_input_directions"] == [1] and attrs["scan_output_directions"] == [1]
    assert applied_detail(report) == (
        "folded the reversal node 'flip_in' of scan input 0 into its direction; "
        "folded the reversal node 'flip_out' of scan output 0 into its direction"
    )
    assert not out.graph.initializer  # the Slice constants went with the Slices
    assert_equivalent(m, out)


def test_reversal_on_another_axis_or_with_other_readers_is_not_folded():
    nodes = [reverse("X", "X_rev", 1, "flip_other_axis"), scan(["h0", "X_rev"], ["h_n", "Y"], rnn_like_body(), 1),
             reverse("Y", "Y_rev", 0, "flip_out")]
    outputs = [b.vi("h_n", [2]), b.vi("Y", [3, 2]), b.vi("Y_rev", [3, 2])]  # Y is read twice
    m = b.model(graph(nodes, [b.vi("h0", [2]), b.vi("X", [3, 2])], outputs, REVERSAL_CONSTANTS), opset=16)
    out, report = canon(m)
    assert out is m and skip_reason(report) == "already canonical"


def test_reversal_that_is_also_an_initial_state_is_not_folded():
    """X_rev feeds the Scan twice: as the state's initial value and as the scan input."""
    bd = body([h.make_node("Add", ["acc", "x"], ["acc_next"])], [b.vi("acc", [3, 2]), b.vi("x", [2])],
              [b.vi("acc_next", [3, 2])])
    m = b.model(graph(
        [reverse("X", "X_rev", 0, "flip"), scan(["X_rev", "X_rev"], ["acc_n"], bd, 1)],
        [b.vi("X", [3, 2])], [b.vi("acc_n", [3, 2])], REVERSAL_CONSTANTS,
    ), opset=16)
    out, report = canon(m)
    assert out is m and skip_reason(report) == "already canonical"


def test_reverse_input_with_prepend_output_is_left_alone():
    """The aligned backward pass (what a reverse native RNN computes) stays as written."""
    m = b.model(graph(
        [scan(["h0", "X"], ["h_n", "Y"], rnn_like_body(), 1, scan_input_directions=[1], scan_output_directions=[1])],
        [b.vi("h0", [2]), b.vi("X", [3, 2])], [b.vi("h_n", [2]), b.vi("Y", [3, 2])],
    ), opset=16)
    out, report = canon(m)
    assert out is m and skip_reason(report) == "already canonical"


def test_torch_reverse_scan_sample_folds_its_flips():
    path = MODELS / "torch_scan_rnn_rev_dim1.onnx"
    if not path.exists():
        pytest.skip("models/torch_scan_rnn_rev_dim1.onnx not generated")
    m = onnx.load(str(path))
    out, report = canon(m)
    node, attrs = scan_of(out)
    assert ops(out)["Slice"] == 0 and ops(out)["Transpose"] == 2
    assert attrs["scan_input_directions"] == [1] and attrs["scan_output_directions"] == [1]
    expected = np.load(MODELS / "torch_scan_rnn_rev_dim1.expected.npz")
    _assert_outputs(out, {"x": expected["x"], "h0": expected["h0"]}, {"y": expected["y"], "h_n": expected["h_n"]})
    assert_equivalent(m, out)


# ---------------------------------------------------------------- versions, nesting, defaults
def test_a_canonical_scan8_is_left_as_it_is():
    """Scan-8 gets only the edits that keep its batch semantics (tests/test_canonicalize_scan8.py);
    one with nothing to remove stays byte for byte."""
    m = b.scan8_sum()
    out, report = canon(m)
    assert skip_reason(report, "scan8_sum").startswith("already canonical (Scan-8: ")
    assert out.graph.SerializeToString() == m.graph.SerializeToString()


def test_inner_scan_of_a_nested_body_is_canonicalized():
    """The inner Scan scans its row on axis -1 and stacks on axis 1; the outer is canonical."""
    inner = body(
        [h.make_node("Add", ["acc", "e"], ["acc_next"]), h.make_node("Identity", ["acc_next"], ["t"])],
        [b.vi("acc", [2]), b.vi("e", [2])], [b.vi("acc_next", [2]), b.vi("t", [2])],
    )
    inner_scan = h.make_node("Scan", ["tot", "row"], ["tot_next", "row_out"], name="inner", body=inner,
                             num_scan_inputs=1, scan_input_axes=[-1], scan_output_axes=[1])
    outer = h.make_graph([inner_scan], "outer_body", [b.vi("tot", [2]), b.vi("row", [2, 3])],
                         [b.vi("tot_next", [2]), b.vi("row_out", [2, 3])])
    m = b.model(graph(
        [h.make_node("Scan", ["s0", "X"], ["s_n", "Y"], name="outer", body=outer, num_scan_inputs=1)],
        [b.vi("s0", [2]), b.vi("X", [4, 2, 3])], [b.vi("s_n", [2]), b.vi("Y", [4, 2, 3])],
    ), opset=16)
    out, report = canon(m)
    (applied,) = [o for o in report.outcomes if o.applied]
    assert (applied.node, applied.path) == ("inner", "outer/body")
    inner_out, attrs = scan_of(out, scan_of(out)[0].attribute[0].g)
    assert set(attrs) == {"body", "num_scan_inputs"}
    assert ops(out)["Transpose"] == 2
    assert_equivalent(m, out)


def test_state_read_only_by_a_nested_body_counts_as_needed():
    """The outer body's counter c (final value unread) is read only inside the inner Scan's
    body, by outer-scope capture; the inner Scan's output is read: c must stay. The outer
    scan output Z (unread) goes."""
    inner = body([h.make_node("Add", ["e", "c"], ["ec"])], [b.vi("e", [])], [b.vi("ec", [])])
    outer = h.make_graph(
        [h.make_node("Scan", ["row"], ["row_c"], name="inner", body=inner, num_scan_inputs=1),
         h.make_node("Add", ["c", "one"], ["c_next"]), h.make_node("Neg", ["row"], ["z"])],
        "outer_body", [b.vi("c", []), b.vi("row", [3])],
        [b.vi("c_next", []), b.vi("row_c", [3]), b.vi("z", [3])], [b.init("one", np.float32(1.0))],
    )
    m = b.model(graph(
        [h.make_node("Scan", ["c0", "X"], ["c_n", "Y", "Z"], name="outer", body=outer, num_scan_inputs=1)],
        [b.vi("c0", []), b.vi("X", [4, 3])], [b.vi("Y", [4, 3])],
    ), opset=16)
    out, report = canon(m)
    node, _ = scan_of(out)
    assert list(node.input) == ["c0", "X"] and list(node.output) == ["c_n", "Y"] and ops(out)["Neg"] == 0
    assert applied_detail(report, "outer") == "removed scan output 1 (outer tensor 'Z'), which nothing reads"
    assert_equivalent(m, out)


def test_default_valued_attributes_are_dropped():
    m = b.scan9_sum(opset=16, scan_input_axes=[0], scan_input_directions=[0], scan_output_directions=[0])
    out, report = canon(m)
    _, attrs = scan_of(out)
    assert set(attrs) == {"body", "num_scan_inputs"}
    assert applied_detail(report, "scan_sum") == (
        "dropped default attributes scan_input_axes, scan_input_directions, scan_output_directions"
    )
    assert_equivalent(m, out)


# ---------------------------------------------------------------- idempotence
def test_canonical_model_is_returned_untouched():
    m = b.scan9_sum(opset=16, weight=np.array([1.0, 2.0]))
    out, report = canon(m)
    assert out is m and not report.modified
    assert skip_reason(report, "scan_sum") == "already canonical"


def test_cli_output_of_canonicalize_is_a_fixed_point(cli, tmp_path):
    path = MODELS / "scan_axes_directions.onnx"
    if not path.exists():
        pytest.skip("models/scan_axes_directions.onnx not generated")
    first, second = tmp_path / "first.onnx", tmp_path / "second.onnx"
    result = cli("optimize", path, first, "--passes", "canonicalize")
    assert result.code == 0, result.err
    assert cli("optimize", first, second, "--passes", "canonicalize").code == 0
    assert first.read_bytes() == second.read_bytes() != path.read_bytes()
    _, attrs = scan_of(onnx.load(str(first)))
    assert set(attrs) == {"body", "num_scan_inputs", "scan_input_directions", "scan_output_directions"}


def test_cli_leaves_a_canonical_model_byte_identical(cli, tmp_path):
    src = tmp_path / "in.onnx"
    src.write_bytes(b.scan9_sum(opset=16).SerializeToString())
    out = tmp_path / "out.onnx"
    assert cli("optimize", src, out, "--passes", "canonicalize").code == 0
    assert out.read_bytes() == src.read_bytes()


# ---------------------------------------------------------------- sample models
SAMPLE_CHANGES = {  # op-count change canonicalize makes to each known sample (None: returned as is)
    "scan8_sum": None,
    "scan8_sum_seqlens": None,
    "scan8_reverse_seqlens": None,
    "scan9_sum": None,
    "scan_axes_directions": {"Transpose": 4},
    "scan_short_static": None,
    "scan_rnn": None,
    "scan_gru": None,
    "scan_gru_lbr1": None,
    "scan_lstm": None,
    "scan_nested": None,
    "keras_concat_lstm": {"Transpose": 2},  # axis-1 (batch-major) input and output
    "torch_scan_rnn": {},  # default-valued direction attributes dropped only
    "torch_scan_gru": {},
    "torch_scan_gru_unbatched": {},
    "torch_scan_lstm": {},
    "torch_scan_rnn_rev_dim1": {"Slice": -2},  # flips folded into directions
    "torch_scan_gru_manual_rev": {"Slice": -2},
    "skl_knn_regressor": {"Identity": -1},  # the loop-invariant state's pass-through
}
SAMPLES = sorted(p.stem for p in MODELS.glob("*.onnx"))


@pytest.mark.parametrize("name", SAMPLES)
def test_sample_models(name):
    """Every sample in models/: the expected change, the same numbers (also the source
    framework's own outputs where it saved them), and a fixed point."""
    m = onnx.load(str(MODELS / f"{name}.onnx"))
    out, report = canon(m)
    if name in SAMPLE_CHANGES and SAMPLE_CHANGES[name] is None:
        assert out is m and not report.modified
        return
    if name in SAMPLE_CHANGES:
        delta = ops(out)
        delta.subtract(ops(m))
        assert {op: d for op, d in delta.items() if d} == SAMPLE_CHANGES[name]
    if report.modified:
        assert_equivalent(m, out)
    expected_path = MODELS / f"{name}.expected.npz"
    if expected_path.exists():
        arrays = dict(np.load(expected_path))
        inputs = {i.name for i in out.graph.input}
        _assert_outputs(out, {k: v for k, v in arrays.items() if k in inputs},
                        {k: v for k, v in arrays.items() if k not in inputs})
    again, second = canon(out)
    assert again is out and not second.modified


def _assert_outputs(model, feeds, expected):
    """Both engines give the source framework's own outputs."""
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got_ort = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    got_ref = run_model(model, feeds)
    for name, want in expected.items():
        rtol, atol = tolerance(want.dtype)
        np.testing.assert_allclose(got_ort[name], want, rtol=rtol, atol=atol)
        np.testing.assert_allclose(got_ref[name], want, rtol=rtol, atol=atol)
