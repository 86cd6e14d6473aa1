"""vectorize: map Scans become their body applied once to the whole sequence.

Every rewrite is checked for structure (no Scan left) and numbers (onnxruntime and the
reference executor, or sklearn's own outputs); every decline for its reason.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

import builders as b
from equivalence import assert_equivalent, ops
from map_builders import map_scan, rand
from scanopt.engines import run
from scanopt.pipeline import optimize

MODELS = Path(__file__).resolve().parent.parent / "models"
SKL = sorted(p.stem for p in (MODELS / "skl").glob("*.onnx"))
MAPS = ["map_elementwise", "map_matmul_outer", "map_softmax_rows", "map_axis1", "map_reverse", "map_state_gemm"]


def vectorize(model, passes=("vectorize",), **options):
    out, report = optimize(model, passes=list(passes), verify=False, options=options)
    return out, [(o.applied, o.detail) for o in report.outcomes if o.pass_name == "vectorize"]


def applied(outcomes) -> bool:
    return len(outcomes) == 1 and outcomes[0][0]


def reason(outcomes) -> str:
    assert len(outcomes) == 1 and not outcomes[0][0], outcomes
    return outcomes[0][1]


# ---------------------------------------------------------------- real exporter output
@pytest.mark.parametrize("name", SKL)
def test_skl2onnx_pairwise_distance_scans(name):
    m = onnx.load(MODELS / "skl" / f"{name}.onnx")
    expected = dict(np.load(MODELS / "skl" / f"{name}.expected.npz"))
    out, outcomes = vectorize(m)
    assert applied(outcomes), outcomes
    assert "Scan" not in ops(out)
    feeds = {"X": expected["X"]}
    # bit-identical to the loop on the inputs sklearn was compared on, and on twice the rows
    # (near them: a radius estimator's output indexes -1 for a query with no neighbour)
    more = {"X": np.concatenate([expected["X"], expected["X"] * np.float32(0.9)])}
    for inputs in (feeds, more):
        before, after = run(m, inputs), run(out, inputs)
        for key in before:
            np.testing.assert_array_equal(before[key], after[key])
    assert_equivalent(m, out, inputs=[feeds], engine="ort")


def test_skl_knn_regressor_in_the_default_pipeline_matches_sklearn():
    """canonicalize first turns the pass-through state into an outer read; the distances pass
    (the GEMM form, before vectorize) takes the squared-distance body."""
    m = onnx.load(MODELS / "skl_knn_regressor.onnx")
    expected = dict(np.load(MODELS / "skl_knn_regressor.expected.npz"))
    out, report = optimize(m)
    assert report.verification["passed"] is True
    assert "Scan" not in ops(out)
    assert any(o.pass_name == "distances" and o.applied for o in report.outcomes)
    got = run(out, {"X": expected["X"]})
    np.testing.assert_allclose(got["variable"], expected["variable"], rtol=1e-5)


@pytest.mark.parametrize("name", MAPS)
def test_hand_written_maps(name):
    m = onnx.load(MODELS / "maps" / f"{name}.onnx")
    out, outcomes = vectorize(m)
    assert applied(outcomes), outcomes
    assert "Scan" not in ops(out)
    assert_equivalent(m, out, engine="both")


def test_recurrent_cells_are_not_maps():
    for name, state in (("cell_rnn_residual", "H0"), ("cell_normalized_input", "S0")):
        m = onnx.load(MODELS / "maps" / f"{name}.onnx")
        _, outcomes = vectorize(m)
        assert reason(outcomes) == f"state '{state}' changes across iterations: a recurrence, not a map"


# ---------------------------------------------------------------- op rules, one at a time
W34 = rand(3, 4, seed=2)
CASES = {
    # name: (nodes, elements, outputs, inits)
    "matmul_vector_left": ([h.make_node("MatMul", ["x", "W"], ["y"])], [("x", [3])], ["y"], {"W": W34}),
    "matmul_vector_right": ([h.make_node("MatMul", ["W", "x"], ["y"])], [("x", [4])], ["y"], {"W": W34}),
    "matmul_vector_vs_3d": ([h.make_node("MatMul", ["x", "W3"], ["y"])], [("x", [3])], ["y"],
                            {"W3": rand(2, 3, 4, seed=3)}),
    "matmul_both_per_step": ([h.make_node("MatMul", ["x", "u"], ["y"])], [("x", [2, 3]), ("u", [3, 4])], ["y"], {}),
    "matmul_vectors_both": ([h.make_node("MatMul", ["x", "u"], ["y"])], [("x", [3]), ("u", [3])], ["y"], {}),
    "matmul_outer_3d_right": ([h.make_node("MatMul", ["x", "W3"], ["y"])], [("x", [2, 3])], ["y"],
                              {"W3": rand(5, 3, 4, seed=4)}),
    "gemm_trans_c_per_step": ([h.make_node("Gemm", ["W", "x", "c"], ["y"], transA=1, alpha=2.0, beta=0.5)],
                              [("x", [3, 2]), ("c", [2])], ["y"], {"W": W34}),
    "gemm_per_step_b_transposed": ([h.make_node("Gemm", ["x", "W"], ["y"], transB=1)], [("x", [2, 4])], ["y"],
                                   {"W": W34}),
    "reduce_all_axes": ([h.make_node("ReduceMax", ["x"], ["y"], keepdims=0)], [("x", [2, 3])], ["y"], {}),
    "reduce_sum_axes_input": ([h.make_node("ReduceSum", ["x", "ax"], ["y"])], [("x", [2, 3])], ["y"],
                              {"ax": np.array([-1], np.int64)}),
    "softmax_axis0": ([h.make_node("LogSoftmax", ["x"], ["y"], axis=0)], [("x", [2, 3])], ["y"], {}),
    "transpose_default": ([h.make_node("Transpose", ["x"], ["y"])], [("x", [2, 3, 4])], ["y"], {}),
    "reshape_zero_and_minus_one": ([h.make_node("Reshape", ["x", "shp"], ["y"])], [("x", [2, 3, 2])], ["y"],
                                   {"shp": np.array([0, -1], np.int64)}),
    "concat_with_invariant": ([h.make_node("Concat", ["x", "W"], ["y"], axis=-2)], [("x", [2, 4])], ["y"],
                              {"W": W34}),
    "split_three_ways": ([h.make_node("Split", ["x", "parts"], ["y0", "y1", "y2"], axis=1)],
                         [("x", [2, 4])], ["y0", "y1", "y2"], {"parts": np.array([1, 1, 2], np.int64)}),
    "gather_data": ([h.make_node("Gather", ["x", "idx"], ["y"], axis=-1)], [("x", [2, 4])], ["y"],
                    {"idx": np.array([[3, 0], [1, 1]], np.int64)}),
    "squeeze_unsqueeze": ([h.make_node("Unsqueeze", ["x", "ax"], ["u"]), h.make_node("Squeeze", ["u", "ax"], ["y"])],
                          [("x", [2, 3])], ["y"], {"ax": np.array([-1, 0], np.int64)}),
    "topk_argmin_cast": ([h.make_node("TopK", ["x", "k"], ["v", "i"], axis=0, largest=0),
                          h.make_node("ArgMin", ["x"], ["a"], axis=-1, keepdims=1),
                          h.make_node("Cast", ["a"], ["y"], to=TP.FLOAT)],
                         [("x", [4, 3])], ["v", "y"], {"k": np.array([2], np.int64)}),
    "slice_where_broadcast": ([h.make_node("Slice", ["x", "st", "en", "ax"], ["s"]),
                               h.make_node("Greater", ["s", "z"], ["g"]),
                               h.make_node("Where", ["g", "s", "W"], ["y"])],
                              [("x", [3, 5])], ["y"],
                              {"st": np.array([1], np.int64), "en": np.array([5], np.int64),
                               "ax": np.array([-1], np.int64), "z": np.float32(0), "W": W34}),
    "output_is_invariant": ([h.make_node("Neg", ["W"], ["y"]), h.make_node("Abs", ["x"], ["a"])],
                            [("x", [2])], ["y", "a"], {"W": W34}),
    "output_is_the_element": ([h.make_node("Identity", ["x"], ["y"])], [("x", [2, 2])], ["x", "y"], {}),
}
# onnxruntime silently miscomputes a Scan whose body output is a body input (README): reference only
REFERENCE_ONLY = {"output_is_the_element"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_lifted_op_rule(case):
    nodes, elements, outputs, inits = CASES[case]
    m = map_scan(nodes, elements, outputs, steps=4, inits=inits)
    out, outcomes = vectorize(m)
    assert applied(outcomes), outcomes
    assert "Scan" not in ops(out)
    assert_equivalent(m, out, engine="reference" if case in REFERENCE_ONLY else "both")


def test_gather_with_per_step_indices_on_axis_0():
    m = map_scan([h.make_node("Gather", ["W", "i"], ["y"], axis=0)], [("i", [2])], ["y"],
                 inits={"W": W34}, elem_types={"i": TP.INT64})
    out, outcomes = vectorize(m)
    assert applied(outcomes)
    feeds = {"X0": np.array([[0, 2], [1, 1], [2, 0]], np.int64)}
    np.testing.assert_array_equal(run(out, feeds)["Y0"], run(m, feeds)["Y0"])


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_axes_forms_across_opsets(opset):
    """Unsqueeze/Squeeze/Reduce axes are attributes before 13 (18 for most Reduce ops), inputs after."""
    ax = {"ax": np.array([1], np.int64)} if opset >= 13 else {}
    red = ["r"] + (["ax"] if opset >= 18 else [])
    nodes = [
        h.make_node("Unsqueeze", ["x", "ax"] if opset >= 13 else ["x"], ["u"], **({} if opset >= 13 else {"axes": [1]})),
        h.make_node("ReduceL2", red if opset >= 18 else ["u"], ["r2"], **({} if opset >= 18 else {"axes": [1]})),
        h.make_node("Relu", ["r2"], ["y"]),
    ]
    nodes.insert(1, h.make_node("Identity", ["u"], ["r"]))
    m = map_scan(nodes, [("x", [2, 3])], ["y"], opset=opset, inits=ax)
    out, outcomes = vectorize(m)
    assert applied(outcomes), outcomes
    assert_equivalent(m, out, engine="both")


def test_axes_and_directions_everywhere():
    m = map_scan(
        [h.make_node("Mul", ["x", "u"], ["p"]), h.make_node("ReduceSum", ["p", "ax"], ["y"], keepdims=1),
         h.make_node("Sub", ["x", "u"], ["d"])],
        [("x", [2, 3]), ("u", [2, 3])], ["y", "d", "p"], steps=5, inits={"ax": np.array([0], np.int64)},
        input_axes=[1, -1], input_dirs=[1, 0], output_axes=[-1, 2, 1], output_dirs=[0, 1, 1],
    )
    out, outcomes = vectorize(m)
    assert applied(outcomes), outcomes
    assert_equivalent(m, out, engine="both")


def test_pass_through_states_keep_their_value():
    m = map_scan([h.make_node("Add", ["x", "q"], ["y"])], [("x", [3])], ["y"], states=[("q", [3])])
    out, outcomes = vectorize(m)
    assert applied(outcomes)
    feeds = {"S0": rand(3, seed=5), "X0": rand(3, 3, seed=6)}
    got = run(out, feeds)
    np.testing.assert_array_equal(got["S0_final"], feeds["S0"])
    np.testing.assert_array_equal(got["Y0"], feeds["X0"] + feeds["S0"])


def test_zero_length_map_gives_empty_outputs():
    """onnxruntime cannot run a zero-length Scan-9+: checked on the reference executor."""
    m = map_scan([h.make_node("MatMul", ["x", "W"], ["y"])], [("x", [3])], ["y"], steps=0, inits={"W": W34})
    out, outcomes = vectorize(m)
    assert applied(outcomes)
    got = run(out, {"X0": np.zeros((0, 3), np.float32)}, engine="reference")
    assert got["Y0"].shape == (0, 4)
    assert_equivalent(m, out, engine="reference")


def test_inside_a_loop_body_with_outer_capture():
    m = b.scan_in_loop()
    # the inner Scan's state is a recurrence; a map at that level is built below
    body = h.make_graph([h.make_node("Mul", ["e", "W"], ["y"])], "mb", [b.vi("e", [2])], [b.vi("y", [2])])
    loop_body = h.make_graph(
        [h.make_node("Identity", ["c_in"], ["c_out"]),
         h.make_node("Scan", ["X"], ["ys"], name="inner_map", body=body, num_scan_inputs=1),
         h.make_node("ReduceMax", ["ys"], ["s_next"], axes=[0], keepdims=0)],
        "lb", [b.vi("i", [], TP.INT64), b.vi("c_in", [], TP.BOOL), b.vi("s", [2])],
        [b.vi("c_out", [], TP.BOOL), b.vi("s_next", [2])],
    )
    graph = h.make_graph(
        [h.make_node("Loop", ["trips", "", "s0"], ["s_final"], name="loop", body=loop_body)], "main",
        [b.vi("trips", [], TP.INT64), b.vi("s0", [2]), b.vi("X", [4, 2])], [b.vi("s_final", [2])],
        initializer=[b.init("W", np.array([0.5, 2.0], np.float32))],
    )
    m = b.model(graph, 16)
    out, outcomes = vectorize(m)
    assert applied(outcomes), outcomes
    assert "Scan" not in ops(out)
    feeds = {"trips": np.array(3, np.int64), "s0": rand(2, seed=7), "X": rand(4, 2, seed=8)}
    for engine in ("ort", "reference"):
        np.testing.assert_allclose(run(out, feeds, engine=engine)["s_final"], run(m, feeds, engine=engine)["s_final"],
                                   rtol=1e-6)


# ---------------------------------------------------------------- memory bound
def test_memory_bound_chunks_a_static_length():
    m = map_scan([h.make_node("Sub", ["x", "W"], ["d"]), h.make_node("ReduceSumSquare", ["d"], ["y"], axes=[1], keepdims=0)],
                 [("x", [4])], ["y"], steps=10, inits={"W": W34})
    out, outcomes = vectorize(m, vectorize_max_bytes=200)  # d: 10 steps x 48 bytes = 480 bytes
    assert applied(outcomes) and outcomes[0][1].startswith("vectorized in 3 chunks"), outcomes
    assert ops(out)["Sub"] == 3 and ops(out)["Concat"] == 1
    assert_equivalent(m, out, engine="both")


def test_memory_bound_declines_with_the_estimate():
    m = map_scan([h.make_node("Sub", ["x", "W"], ["d"]), h.make_node("ReduceSumSquare", ["d"], ["y"], axes=[1], keepdims=0)],
                 [("x", [4])], ["y"], steps="T", inits={"W": W34})
    _, outcomes = vectorize(m, vectorize_max_bytes=16)
    assert reason(outcomes) == (
        "memory bound: 'd' would take about 0.0 KiB vectorized (T x its per-step size), over vectorize_max_bytes "
        "0.0 KiB; the length is symbolic, so it cannot be chunked"
    )
    m = map_scan([h.make_node("Sub", ["x", "W"], ["d"])], [("x", [4])], ["d"], steps=100, inits={"W": W34})
    _, outcomes = vectorize(m, vectorize_max_bytes=100)
    assert reason(outcomes).endswith("it would need 48 chunks (at most 8)")


# ---------------------------------------------------------------- declines
@pytest.mark.parametrize(
    "nodes, elements, inits, expected",
    [
        ([h.make_node("Shape", ["x"], ["y"])], [("x", [2])], {},
         "not vectorized: Shape 'Shape->y' reads a per-step value and its result would include the step count"),
        ([h.make_node("Flatten", ["x"], ["y"])], [("x", [2, 2])], {},
         "not vectorized: Flatten 'Flatten->y' reads a per-step value and it always returns 2-D, so the step axis "
         "cannot be kept apart"),
        ([h.make_node("LpNormalization", ["x"], ["y"])], [("x", [2])], {},
         "not vectorized: LpNormalization 'LpNormalization->y' reads a per-step value and is not among the ops "
         "vectorize can lift"),
        ([h.make_node("RandomNormalLike", ["x"], ["y"])], [("x", [2])], {},
         "not vectorized: RandomNormalLike 'RandomNormalLike->y' draws random numbers (per step they would differ)"),
        ([h.make_node("Squeeze", ["x"], ["y"])], [("x", [1, 2])], {},
         "not vectorized: Squeeze 'Squeeze->y' has no axes; it would also drop a step axis of size 1"),
        ([h.make_node("Reshape", ["x", "s"], ["y"])], [("x", [2]), ("s", [1])], {},
         "not vectorized: Reshape 'Reshape->y': its target shape differs per step"),
        ([h.make_node("PRelu", ["W", "x"], ["y"])], [("x", [4])], {"W": W34},
         "not vectorized: PRelu 'PRelu->y': its second operand (which broadcasts one way only) differs per step"),
        ([h.make_node("Gather", ["x", "i"], ["y"], axis=1)], [("x", [2, 3]), ("i", [2])], {},
         "not vectorized: Gather 'Gather->y': per-step indices need invariant data and axis 0"),
    ],
)
def test_declines_name_the_node_and_why(nodes, elements, inits, expected):
    types = {"s": TP.INT64, "i": TP.INT64}
    m = map_scan(nodes, elements, ["y"], inits=inits, elem_types=types)
    _, outcomes = vectorize(m)
    assert reason(outcomes) == expected


def test_control_flow_node_reason():
    inner = h.make_graph([h.make_node("Neg", ["x"], ["n"])], "g", [], [b.vi("n", [2])])
    m = map_scan([h.make_node("If", ["c"], ["y"], then_branch=inner, else_branch=inner)], [("x", [2])], ["y"],
                 inits={"c": np.array(True)})
    _, outcomes = vectorize(m)
    assert reason(outcomes) == "not vectorized: If 'If->y' has a body (control flow is not lifted)"


def test_scan8_and_opset9_reverse_are_declined():
    _, outcomes = vectorize(b.scan8_sum(batch=2, steps=3, seq_lens=False))
    assert reason(outcomes) == "opset-8 batched Scan: vectorize handles Scan-9+ (the upgrade pass converts it first)"
    m = map_scan([h.make_node("Neg", ["x"], ["y"])], [("x", [2])], ["y"], opset=9, input_dirs=[1])
    _, outcomes = vectorize(m)
    assert reason(outcomes) == "reverse directions need Slice with steps (opset 10+), the model is at opset 9"


def test_unknown_rank_is_declined():
    m = map_scan([h.make_node("Neg", ["x"], ["y"])], [("x", ["a"])], ["y"], output_axes=[1])
    m.graph.node[0].attribute[0].g.input[0].type.tensor_type.ClearField("shape")
    m.graph.input[0].type.tensor_type.ClearField("shape")
    _, outcomes = vectorize(m)
    assert reason(outcomes) == "not vectorized: Neg 'Neg->y': the rank of 'x' is unknown"


def test_cli_passes_vectorize_and_hoist(cli, tmp_path):
    out = tmp_path / "knn.opt.onnx"
    result = cli("optimize", MODELS / "skl" / "knn_classifier.onnx", out, "--passes", "vectorize,hoist")
    assert result.code == 0, result.err
    assert "vectorize     applied" in result.out or "vectorize applied" in " ".join(result.out.split())
    assert "Scan" not in ops(onnx.load(out))
    out = tmp_path / "cell.opt.onnx"
    result = cli("optimize", MODELS / "maps" / "cell_rnn_residual.onnx", out, "--passes", "vectorize,hoist",
                 "--target", "portable")  # hoisting a tiny cell pays at some sizes only (the cost policy's question)
    assert result.code == 0, result.err
    assert "hoist" in result.out and "hoisted 2 body node(s)" in result.out


def test_a_map_inside_a_map_vectorizes_at_both_levels():
    inner = h.make_graph([h.make_node("Mul", ["e", "W"], ["y"])], "ib", [b.vi("e", [3])], [b.vi("y", [3])])
    nodes = [h.make_node("Scan", ["row"], ["rows_out"], name="inner_map", body=inner, num_scan_inputs=1),
             h.make_node("ReduceSum", ["rows_out", "ax"], ["z"], keepdims=0)]
    m = map_scan(nodes, [("row", [2, 3])], ["z"], steps=4, inits={"W": rand(3, seed=1), "ax": np.array([0], np.int64)})
    out, report = optimize(m, passes=["vectorize"], verify=False)
    assert [(o.node, o.applied) for o in report.outcomes] == [("inner_map", True), ("scan_map", True)]
    assert dict(ops(out)) == {"Mul": 1, "ReduceSum": 1}
    assert_equivalent(m, out, engine="both")
