"""The reference executor's Scan, one feature per test.

Expected values come from plain numpy loops written here, index by index, from the
semantics in DESIGN.md; none is computed by the code under test.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper as oh
from onnx.reference import ReferenceEvaluator
from onnx.reference.ops.op_scan import Scan as OnnxReferenceScan

from builders import vi
from reference_helpers import BOOL, FLOAT, INT64, STRING, const, floats, make_model, scan_node
from scanopt.errors import InvalidModelError
from scanopt.reference import make_evaluator, run_model
from scanopt.reference.scan import Scan as ScanoptScan

V9_OPSETS = (9, 11, 16, 19, 21, 23, 24, 25)
rng = np.random.default_rng(0)


def rand(*shape) -> np.ndarray:
    return rng.uniform(-1, 1, shape).astype(np.float32)


def body(nodes, inputs, outputs):
    return oh.make_graph(nodes, "body", inputs, outputs)


# -- Scan-8 ---------------------------------------------------------------------------


def bidirectional_body(out_shape=(2,)):
    """s' = s + (xf - xr); outputs s', xr, xf."""
    return body(
        [
            oh.make_node("Sub", ["xf", "xr"], ["d"]),
            oh.make_node("Add", ["s", "d"], ["s_out"]),
            oh.make_node("Identity", ["s_out"], ["y1"]),
            oh.make_node("Identity", ["xr"], ["y2"]),
            oh.make_node("Identity", ["xf"], ["y3"]),
        ],
        [vi("s", [2]), vi("xf", [2]), vi("xr", [2])],
        [vi("s_out", [2]), vi("y1", out_shape), vi("y2", out_shape), vi("y3", out_shape)],
    )


def scan8_bidirectional_model(lens_name="L", out_shape=(2,)):
    node = scan_node([lens_name, "init", "x", "x"], ["final", "y1", "y2", "y3"], bidirectional_body(out_shape), 2,
                     directions=[0, 1])
    inputs = floats("init", "x") + ([vi("L", None, INT64)] if lens_name else [])
    return make_model(8, [node], inputs, floats("final", "y1", "y2", "y3"))


def expected_bidirectional(init, x, lens):
    batch, length = x.shape[:2]
    final = init.copy()
    ys = [np.zeros((batch, length, 2), np.float32) for _ in range(3)]
    for b in range(batch):
        s = init[b].copy()
        n = lens[b]
        for t in range(n):
            xf, xr = x[b, t], x[b, n - 1 - t]
            s = s + (xf - xr)
            ys[0][b, t], ys[1][b, t], ys[2][b, t] = s, xr, xf
        final[b] = s
    return {"final": final, "y1": ys[0], "y2": ys[1], "y3": ys[2]}


def test_scan8_mixed_sequence_lens_with_reverse_input():
    init, x = rand(4, 2), rand(4, 4, 2)
    lens = np.array([0, 1, 4, 2], np.int64)
    got = run_model(scan8_bidirectional_model(), {"init": init, "x": x, "L": lens})
    want = expected_bidirectional(init, x, lens)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, err_msg=name)
    # item 0 ran no step: initial state, all-zero outputs; item 3 reversed from position 1
    np.testing.assert_array_equal(got["final"][0], init[0])
    assert not got["y1"][0].any() and not got["y1"][3, 2:].any()
    np.testing.assert_array_equal(got["y2"][3, :2], x[3, [1, 0]])


def test_scan8_absent_sequence_lens_means_full_length():
    init, x = rand(3, 2), rand(3, 5, 2)
    got = run_model(scan8_bidirectional_model(lens_name=""), {"init": init, "x": x})
    want = expected_bidirectional(init, x, [5, 5, 5])
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, err_msg=name)
    full = run_model(scan8_bidirectional_model(), {"init": init, "x": x, "L": np.full(3, 5, np.int64)})
    for name in want:
        np.testing.assert_array_equal(full[name], got[name])


@pytest.mark.parametrize("out_shape", [(2,), None], ids=["declared", "inferred"])
def test_scan8_every_item_empty_takes_element_shape_from_body(out_shape):
    init, x = rand(2, 2), rand(2, 3, 2)
    model = scan8_bidirectional_model(out_shape=out_shape)
    got = run_model(model, {"init": init, "x": x, "L": np.zeros(2, np.int64)})
    np.testing.assert_array_equal(got["final"], init)
    for name in ("y1", "y2", "y3"):
        assert got[name].shape == (2, 3, 2) and got[name].dtype == np.float32
        assert not got[name].any()


def test_scan8_empty_batch():
    got = run_model(scan8_bidirectional_model(lens_name=""), {"init": rand(0, 2), "x": rand(0, 3, 2)})
    assert got["final"].shape == (0, 2)
    assert got["y1"].shape == (0, 3, 2)


def test_scan8_zero_length_sequence_axis():
    init = rand(2, 2)
    got = run_model(scan8_bidirectional_model(lens_name=""), {"init": init, "x": rand(2, 0, 2)})
    np.testing.assert_array_equal(got["final"], init)
    assert got["y1"].shape == (2, 0, 2)


def test_scan8_pads_string_outputs_with_empty_strings():
    b = body([oh.make_node("Identity", ["x"], ["s_out"]), oh.make_node("Identity", ["x"], ["y"])],
             [vi("s", [], STRING), vi("x", [], STRING)], [vi("s_out", [], STRING), vi("y", [], STRING)])
    model = make_model(8, [scan_node(["L", "init", "x"], ["final", "y"], b, 1)],
                       [vi("L", None, INT64), vi("init", None, STRING), vi("x", None, STRING)],
                       [vi("final", None, STRING), vi("y", None, STRING)])
    x = np.array([["a", "b", "c"], ["d", "e", "f"]], dtype=object)
    got = run_model(model, {"L": np.array([1, 3], np.int64), "init": np.array(["p", "q"], dtype=object), "x": x})
    assert got["final"].tolist() == ["a", "f"]
    assert got["y"].tolist() == [["a", "", ""], ["d", "e", "f"]]


def test_scan8_body_reads_outer_scope_per_batch_item():
    b = body([oh.make_node("Mul", ["x", "w"], ["wx"]), oh.make_node("Add", ["s", "wx"], ["s_out"])],
             [vi("s", [3]), vi("x", [3])], [vi("s_out", [3])])
    model = make_model(8, [scan_node(["L", "init", "x"], ["final"], b, 1)],
                       [vi("L", None, INT64), vi("init", None), vi("x", None), vi("w", None)], floats("final"))
    init, x, w = rand(2, 3), rand(2, 4, 3), rand(3)
    lens = np.array([3, 1], np.int64)
    want = init.copy()
    for bi in range(2):
        for t in range(lens[bi]):
            want[bi] = want[bi] + x[bi, t] * w
    got = run_model(model, {"L": lens, "init": init, "x": x, "w": w})
    np.testing.assert_allclose(got["final"], want, rtol=1e-6)


# -- Scan-9 and later -----------------------------------------------------------------


def accumulate_body(shape, out_shapes=None):
    """s' = s + x; outputs s' and x."""
    out_shapes = out_shapes or (shape, shape)
    return body([oh.make_node("Add", ["s", "x"], ["s_out"]), oh.make_node("Identity", ["s_out"], ["y1"]),
                 oh.make_node("Identity", ["x"], ["y2"])],
                [vi("s", shape), vi("x", shape)],
                [vi("s_out", shape), vi("y1", out_shapes[0]), vi("y2", out_shapes[1])])


def accumulate_model(opset, shape, out_shapes=None, **attrs):
    node = scan_node(["init", "x"], ["final", "y1", "y2"], accumulate_body(shape, out_shapes), 1, **attrs)
    return make_model(opset, [node], floats("init", "x"), floats("final", "y1", "y2"))


@pytest.mark.parametrize("opset", V9_OPSETS)
def test_scan9_reverse_input_axis_1_and_prepend_output_axis_2(opset):
    model = accumulate_model(opset, [2, 4], scan_input_axes=[1], scan_input_directions=[1],
                             scan_output_axes=[0, 2], scan_output_directions=[0, 1])
    init, x = rand(2, 4), rand(2, 3, 4)
    length = 3
    y1 = np.zeros((length, 2, 4), np.float32)
    y2 = np.zeros((2, 4, length), np.float32)
    s = init.copy()
    for t in range(length):
        element = x[:, length - 1 - t, :]
        s = s + element
        y1[t] = s
        y2[:, :, length - 1 - t] = element  # prepended: step t lands at position T-1-t
    got = run_model(model, {"init": init, "x": x})
    np.testing.assert_allclose(got["final"], s, rtol=1e-6)
    np.testing.assert_allclose(got["y1"], y1, rtol=1e-6)
    # reverse input + prepend output puts every element back at its input position
    np.testing.assert_array_equal(got["y2"], np.moveaxis(x, 1, 2))
    np.testing.assert_array_equal(got["y2"], y2)


@pytest.mark.parametrize("opset", [o for o in V9_OPSETS if o >= 11])
def test_scan11_negative_axes(opset):
    model = accumulate_model(opset, [2, 3], scan_input_axes=[-1], scan_output_axes=[-1, -3])
    init, x = rand(2, 3), rand(2, 3, 4)
    y1 = np.zeros((2, 3, 4), np.float32)
    y2 = np.zeros((4, 2, 3), np.float32)
    s = init.copy()
    for t in range(4):
        s = s + x[:, :, t]
        y1[:, :, t] = s
        y2[t] = x[:, :, t]
    got = run_model(model, {"init": init, "x": x})
    np.testing.assert_allclose(got["y1"], y1, rtol=1e-6)
    np.testing.assert_array_equal(got["y2"], y2)
    np.testing.assert_allclose(got["final"], s, rtol=1e-6)


@pytest.mark.parametrize("opset", [9, 10])
def test_scan9_rejects_negative_axes_before_opset_11(opset):
    model = accumulate_model(opset, [2, 3], scan_input_axes=[-1])
    with pytest.raises(InvalidModelError, match="negative axes"):
        run_model(model, {"init": rand(2, 3), "x": rand(2, 3, 4)})


@pytest.mark.parametrize("opset", [8, 9, 16])
def test_attributes_of_other_versions_are_rejected(opset):
    attrs = {"scan_input_axes": [0]} if opset == 8 else {"directions": [0]}
    inputs = ([""] if opset == 8 else []) + ["init", "x"]
    node = scan_node(inputs, ["final", "y1", "y2"], accumulate_body([2]), 1, **attrs)
    with pytest.raises(InvalidModelError, match="has no attribute"):
        make_evaluator(make_model(opset, [node], floats("init", "x"), floats("final", "y1", "y2")))


def test_body_outputs_that_are_inputs_or_outer_values_pass_straight_through():
    # onnxruntime 1.31 returns zeros or uninitialized memory for the first two and refuses
    # the third ("an outer scope value being returned directly"); the spec allows all three.
    b = body([oh.make_node("Add", ["s", "x"], ["s_out"])], [vi("s", [2]), vi("x", [2])],
             [vi("s_out", [2]), vi("x", [2]), vi("s", [2]), vi("c", [2])])
    node = scan_node(["init", "x"], ["final", "xs", "ss", "cs"], b, 1, scan_input_directions=[1])
    model = make_model(11, [node], floats("init", "x", "c"),
                       floats("final", "xs", "ss", "cs"))
    init, x, c = rand(2), rand(3, 2), rand(2)
    xs, ss, cs = (np.zeros((3, 2), np.float32) for _ in range(3))
    s = init.copy()
    for t in range(3):
        xs[t], ss[t], cs[t] = x[2 - t], s, c
        s = s + x[2 - t]
    got = run_model(model, {"init": init, "x": x, "c": c})
    np.testing.assert_array_equal(got["xs"], xs)
    np.testing.assert_allclose(got["ss"], ss, rtol=1e-6)
    np.testing.assert_array_equal(got["cs"], cs)


# -- zero-length sequences ------------------------------------------------------------


@pytest.mark.parametrize("opset", V9_OPSETS)
def test_zero_length_scan_keeps_states_and_uses_declared_element_shape(opset):
    model = accumulate_model(opset, [3], scan_output_axes=[0, 1])
    init = rand(3)
    got = run_model(model, {"init": init, "x": rand(0, 3)})
    np.testing.assert_array_equal(got["final"], init)
    assert got["y1"].shape == (0, 3) and got["y2"].shape == (3, 0)
    assert got["y1"].dtype == got["y2"].dtype == np.float32


def test_zero_length_scan_infers_undeclared_shape_through_outer_scope_weight():
    b = body([oh.make_node("MatMul", ["x", "W"], ["y"]), oh.make_node("Cast", ["y"], ["yi"], to=INT64)],
             [vi("x", [3])], [vi("y", None), vi("yi", [None], INT64)])
    node = scan_node(["x"], ["y", "yi"], b, 1, scan_output_axes=[-1, 0])
    model = make_model(11, [node], floats("x", "W"), [vi("y", None), vi("yi", None, INT64)])
    got = run_model(model, {"x": rand(0, 3), "W": rand(3, 5)})
    assert got["y"].shape == (5, 0) and got["y"].dtype == np.float32
    assert got["yi"].shape == (0, 5) and got["yi"].dtype == np.int64


def test_zero_length_scan_with_uninferable_element_shape_says_so():
    b = body([oh.make_node("Reshape", ["x", "s"], ["y"]), oh.make_node("Identity", ["s"], ["s_out"])],
             [vi("s", [2], INT64), vi("x", [6])], [vi("s_out", [2], INT64), vi("y", None)])
    model = make_model(11, [scan_node(["s", "x"], ["s_final", "y"], b, 1)],
                       [vi("s", None, INT64), vi("x", None)], [vi("s_final", None, INT64), vi("y", None)])
    with pytest.raises(ValueError, match="neither declared in the body nor inferable"):
        run_model(model, {"s": np.array([2, 3], np.int64), "x": rand(0, 6)})


# -- nesting and outer scope ----------------------------------------------------------


def prefix_sum_scan(row: str, out: str):
    """A Scan-11 node: prefix sums of the 1-D ``row``, each step adding e * w + k."""
    inner = body(
        [oh.make_node("Mul", ["e", "w"], ["ew"]), oh.make_node("Add", ["c", "ew"], ["c1"]),
         oh.make_node("Add", ["c1", "k"], ["c_out"]), oh.make_node("Identity", ["c_out"], ["p"])],
        [vi("c", []), vi("e", [])], [vi("c_out", []), vi("p", [])],
    )
    return [const("zero", np.float32(0)), scan_node(["zero", row], ["c_last", out], inner, 1)]


def nested_scan_model():
    """Scan over the rows of X (reversed) whose body runs a Scan over the row's elements.

    The inner body reads k = ReduceSum(row) one level up and w (main graph) two levels up.
    """
    outer = body(
        [oh.make_node("ReduceSum", ["row"], ["k"], keepdims=0)] + prefix_sum_scan("row", "prefix")
        + [oh.make_node("Add", ["acc", "prefix"], ["acc_out"]), oh.make_node("Identity", ["prefix"], ["rows"])],
        [vi("acc", [4]), vi("row", [4])], [vi("acc_out", [4]), vi("rows", [4])],
    )
    node = scan_node(["acc0", "X"], ["acc", "rows"], outer, 1, scan_input_directions=[1])
    return make_model(11, [node], floats("acc0", "X", "w"), floats("acc", "rows"))


def test_scan_in_scan_with_capture_two_levels_deep():
    model = nested_scan_model()
    acc0, x, w = rand(4), rand(3, 4), rand()
    rows = np.zeros((3, 4), np.float32)
    acc = acc0.copy()
    for t in range(3):
        row = x[2 - t]
        k = sum(row[j] for j in range(4))
        c = np.float32(0)
        for j in range(4):
            c = c + row[j] * w + k
            rows[t, j] = c
        acc = acc + rows[t]
    got = run_model(model, {"acc0": acc0, "X": x, "w": np.float32(w)})
    np.testing.assert_allclose(got["rows"], rows, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["acc"], acc, rtol=1e-5, atol=1e-6)


def test_scan_in_loop_reads_loop_counter_and_main_graph_input():
    # Scan outputs leave the Loop through a loop-carried sum: onnx.reference's Loop
    # concatenates (vstack) its own scan outputs instead of stacking them.
    scan_body = body([oh.make_node("Mul", ["x", "i_f"], ["xi"]), oh.make_node("Add", ["s", "xi"], ["s_out"]),
                      oh.make_node("Identity", ["s_out"], ["y"])],
                     [vi("s", [2]), vi("x", [2])], [vi("s_out", [2]), vi("y", [2])])
    loop_body = body(
        [oh.make_node("Cast", ["i"], ["i_f"], to=FLOAT), scan_node(["v", "X"], ["v_out", "ys"], scan_body, 1),
         oh.make_node("Add", ["acc", "ys"], ["acc_out"]), oh.make_node("Identity", ["cond"], ["cond_out"])],
        [vi("i", [], INT64), vi("cond", [], BOOL), vi("v", [2]), vi("acc", [4, 2])],
        [vi("cond_out", [], BOOL), vi("v_out", [2]), vi("acc_out", [4, 2])],
    )
    # onnx.reference's Loop treats an omitted condition as false, so pass one
    loop = oh.make_node("Loop", ["M", "true", "v0", "acc0"], ["v", "acc"], body=loop_body)
    model = make_model(16, [const("true", np.array(True)), loop],
                       [vi("M", [], INT64), vi("v0", None), vi("acc0", None), vi("X", None)], floats("v", "acc"))
    v0, acc0, x = rand(2), rand(4, 2), rand(4, 2)
    acc = acc0.copy()
    v = v0.copy()
    for i in range(3):
        for t in range(4):
            v = v + x[t] * np.float32(i)
            acc[t] = acc[t] + v
    got = run_model(model, {"M": np.array(3, np.int64), "v0": v0, "acc0": acc0, "X": x})
    np.testing.assert_allclose(got["v"], v, rtol=1e-6)
    np.testing.assert_allclose(got["acc"], acc, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cond", [True, False])
def test_scan_in_if_branches(cond):
    def branch(out, **attrs):
        scan = scan_node(["s0", "X"], ["s_" + out, out + "_sums", out], accumulate_body([2]), 1, **attrs)
        return body([scan], [], [vi(out, [3, 2])])

    then_branch = branch("then_y", scan_input_directions=[1])
    else_branch = branch("else_y", scan_output_directions=[0, 1])
    node = oh.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch)
    model = make_model(16, [node], [vi("cond", [], BOOL), vi("s0", None), vi("X", None)], floats("y"))
    x = rand(3, 2)
    want = np.zeros((3, 2), np.float32)
    for t in range(3):
        if cond:
            want[t] = x[2 - t]  # reverse input, appended
        else:
            want[2 - t] = x[t]  # forward input, prepended
    got = run_model(model, {"cond": np.array(cond), "s0": rand(2), "X": x})
    np.testing.assert_array_equal(got["y"], want)


def local_function_model():
    """The main graph calls a model-local function whose body is a reverse Scan."""
    fn = oh.make_function(
        "local", "RevCumSum", ["init", "x"], ["final", "y1", "y2"],
        [scan_node(["init", "x"], ["final", "y1", "y2"], accumulate_body([2]), 1, scan_input_directions=[1])],
        [oh.make_opsetid("", 16)],
    )
    node = oh.make_node("RevCumSum", ["init", "x"], ["final", "y1", "y2"], domain="local")
    return make_model(16, [node], floats("init", "x"), floats("final", "y1", "y2"),
                      functions=[fn], extra_opsets=[oh.make_opsetid("local", 1)])


def test_scan_in_model_local_function():
    init, x = rand(2), rand(3, 2)
    y1 = np.zeros((3, 2), np.float32)
    s = init.copy()
    for t in range(3):
        s = s + x[2 - t]
        y1[t] = s
    got = run_model(local_function_model(), {"init": init, "x": x})
    np.testing.assert_allclose(got["y1"], y1, rtol=1e-6)


def _op_instances(evaluator):
    """Every OpRun instance of ``evaluator``, its subgraphs and its functions."""
    for op in evaluator.rt_nodes_:
        yield op
        for name in ("body", "then_branch", "else_branch"):
            sub = getattr(op, name, None)
            if isinstance(sub, ReferenceEvaluator):
                yield from _op_instances(sub)
        impl = getattr(op, "impl_", None)
        if isinstance(impl, ReferenceEvaluator):
            yield from _op_instances(impl)
    for fn in evaluator.functions_.values():
        yield from _op_instances(fn)


def test_no_evaluator_at_any_depth_uses_onnx_reference_scan():
    # Scan in Scan (main graph), Scan in a local function, Scan in Loop, Scan in If
    models = [nested_scan_model(), local_function_model()]
    loop_body = body([scan_node(["v", "X"], ["v_out", "y1", "y2"], accumulate_body([2]), 1),
                      oh.make_node("Identity", ["cond"], ["cond_out"])],
                     [vi("i", [], INT64), vi("cond", [], BOOL), vi("v", [2])], [vi("cond_out", [], BOOL), vi("v_out", [2])])
    loop = oh.make_node("Loop", ["M", "true", "v0"], ["v"], body=loop_body)
    models.append(make_model(16, [const("true", np.array(True)), loop],
                             [vi("M", [], INT64), vi("v0", None), vi("X", None)], floats("v")))
    branch = body([scan_node(["s0", "X"], ["s", "y1", "y"], accumulate_body([2]), 1)], [], [vi("y", [3, 2])])
    models.append(make_model(16, [oh.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)],
                             [vi("c", [], BOOL), vi("s0", None), vi("X", None)], floats("y")))
    for model in models:
        ops = list(_op_instances(make_evaluator(model)))
        assert not any(isinstance(op, OnnxReferenceScan) for op in ops)
        assert sum(isinstance(op, ScanoptScan) for op in ops) >= 1


@pytest.mark.parametrize(
    "attrs, feeds_shape",
    [({"scan_input_directions": [1]}, (3, 2)), ({"scan_output_axes": [0, 1]}, (3, 2)),
     ({"scan_output_directions": [1, 0]}, (3, 2)), ({}, (0, 2))],
    ids=["reverse-input", "output-axis", "prepend-output", "zero-length"],
)
def test_onnx_reference_alone_cannot_run_these(attrs, feeds_shape):
    """What the coverage table in the README claims for plain onnx.reference."""
    model = accumulate_model(16, [2], **attrs)
    feeds = {"init": rand(2), "x": rand(*feeds_shape)}
    with pytest.raises(RuntimeError):
        ReferenceEvaluator(model).run(None, feeds)
    assert run_model(model, feeds)["final"].shape == (2,)


def test_onnx_reference_alone_cannot_run_scan8():
    model = scan8_bidirectional_model(lens_name="")
    feeds = {"init": rand(1, 2), "x": rand(1, 3, 2)}
    with pytest.raises((RuntimeError, TypeError)):
        ReferenceEvaluator(model).run(None, feeds)
    assert run_model(model, feeds)["y1"].shape == (1, 3, 2)


# -- invalid inputs -------------------------------------------------------------------


@pytest.mark.parametrize("lens", [[3, 5], [-1, 2], [2]], ids=["too-long", "negative", "wrong-size"])
def test_scan8_rejects_bad_sequence_lens(lens):
    feeds = {"init": rand(2, 2), "x": rand(2, 4, 2), "L": np.array(lens, np.int64)}
    with pytest.raises(ValueError, match="sequence_lens"):
        run_model(scan8_bidirectional_model(), feeds)


def test_state_that_changes_shape_is_rejected():
    b = body([oh.make_node("Concat", ["s", "x"], ["s_out"], axis=0)],
             [vi("s", [None]), vi("x", [1])], [vi("s_out", [None])])
    model = make_model(11, [scan_node(["init", "x"], ["final"], b, 1)], floats("init", "x"), floats("final"))
    with pytest.raises(ValueError, match="changed shape"):
        run_model(model, {"init": rand(1), "x": rand(3, 1)})


def test_missing_feed_is_named():
    with pytest.raises(ValueError, match="'x'"):
        run_model(accumulate_model(11, [2]), {"init": rand(2)})
