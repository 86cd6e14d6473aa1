"""Feeds from everything a model says about shapes (scanopt.feed_shapes), the size search,
the reference fallback and the memory budget (issues 10 and 11)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

import builders
from ort_scan_cases import counting_concat_split_body, counting_concat_split_model, crossing_model
from scanopt import engines
from scanopt.feed_shapes import TRIP_SIZES, free_size
from scanopt.inputs import FEED_BUDGET_BYTES, InputSynthesizer, synthesize_inputs
from scanopt.pipeline import optimize
from scanopt.verify import CannotVerifyError, compare_models


def shapes(model, seed=0):
    return InputSynthesizer(model).shapes(seed)


# -- Scan's shape contract -------------------------------------------------------------------


@pytest.mark.parametrize("opset", [8, 9, 11, 16])
def test_body_state_declared_1_sizes_an_undeclared_outer_state(opset):
    # onnxruntime's scan_test.cc, NoShapeInMainGraph: the body state input is [None], its
    # output [1]; the scan slices are [2]. Each unknown dim on its own gave [2] and failed.
    body = counting_concat_split_body(opset, dims_in_main=False)
    model = counting_concat_split_model(opset, body)
    for seed in range(2):
        got = shapes(model, seed)
        lead = got["scan_input_0"][:1] if opset == 8 else ()
        trip = got["scan_input_0"][len(lead)]
        assert got == {"scan_loop_state_in_0": (*lead, 1), "scan_input_0": (*lead, trip, 2), "scan_input_1": (*lead, trip, 2)}
        assert trip == TRIP_SIZES[seed]
        engines.run(model, synthesize_inputs(model, seed), "ort")


def test_scan8_batch_and_sequence_axes_are_shared_and_lengths_fit():
    model = crossing_model(8, [TP.FLOAT, TP.INT64], [1])  # inputs [batch, 1] and [batch, seq, 1]
    with_lens = onnx.ModelProto()
    with_lens.CopyFrom(model)
    node = with_lens.graph.node[0]
    node.input[0] = "lens"
    with_lens.graph.input.insert(0, h.make_tensor_value_info("lens", TP.INT64, None))
    for seed in range(3):
        feeds = synthesize_inputs(with_lens, seed)
        batch, seq = feeds["scan_input_0"].shape[:2]
        assert feeds["lens"].shape == (batch,) and feeds["initial_state_1"].shape == (batch, 1)
        assert feeds["lens"].min() >= 1 and feeds["lens"].max() == seq
        engines.run(with_lens, feeds, "ort")


def test_scan_input_axes_put_the_sequence_axis_where_they_say():
    body = counting_concat_split_body(16)
    model = counting_concat_split_model(16, body, scan_input_axes=[1, -1])
    got = shapes(model)
    assert got["scan_input_0"] == (2, TRIP_SIZES[0]) == got["scan_input_1"]
    engines.run(model, synthesize_inputs(model), "ort")


def test_a_loop_carried_state_gets_the_body_declaration():
    body = h.make_graph(
        [h.make_node("Add", ["acc", "step"], ["acc2"]), h.make_node("Identity", ["cond"], ["cond2"])],
        "body",
        [builders.vi("i", [], TP.INT64), builders.vi("cond", [], TP.BOOL), builders.vi("acc", [3])],
        [builders.vi("cond2", [], TP.BOOL), builders.vi("acc2", [3])],
    )
    graph = h.make_graph(
        [h.make_node("Loop", ["n", "go", "a0"], ["a"], body=body)],
        "main",
        [builders.vi("n", [], TP.INT64), builders.vi("go", [], TP.BOOL), builders.vi("a0", None), builders.vi("step", [3])],
        [builders.vi("a", None)],
    )
    model = builders.model(graph)
    assert shapes(model)["a0"] == (3,)


# -- hints and the search --------------------------------------------------------------------


def test_a_matmul_weight_sizes_the_contracted_dim():
    graph = h.make_graph(
        [h.make_node("MatMul", ["x", "W"], ["y"])], "mm",
        [builders.vi("x", ["N", "K"])], [builders.vi("y", None)],
        initializer=[builders.init("W", np.ones((3, 4), np.float32))],
    )
    model = builders.model(graph)
    for seed in range(3):
        assert shapes(model, seed)["x"][1] == 3
    assert compare_models(model, model, seeds=3).passed


def test_a_concat_makes_differently_named_dims_one_size():
    # Concat on axis 1 needs N == M: scanopt.dims unifies them, so no seed draws N != M.
    graph = h.make_graph(
        [h.make_node("Concat", ["x", "y"], ["z"], axis=1)], "cat",
        [builders.vi("x", ["N", 2]), builders.vi("y", ["M", 3])], [builders.vi("z", None)],
    )
    model = builders.model(graph)
    result = compare_models(model, model, engine="ort", seeds=2)
    # no seed was dropped for a shape error; the one note is the edge set (N = 0 empties M too)
    assert result.passed and result.notes == [
        "also checked on 1 edge input(s) the original accepts: dimension 'N' = 0 (an empty batch or sequence)"]
    for seed in (0, 1):
        shapes = InputSynthesizer(model).shapes(seed)
        assert shapes["x"][0] == shapes["y"][0]
    assert InputSynthesizer(model).shapes(0)["x"][0] == free_size(0, 0)


def test_when_the_preferred_sizes_fail_a_fallback_is_used_and_reported():
    # InstanceNormalization needs the scale's length M to be x's channels N, which nothing
    # declares and scanopt.dims does not read: seed 0 draws N != M.
    graph = h.make_graph(
        [h.make_node("InstanceNormalization", ["x", "y", "y"], ["z"])], "norm",
        [builders.vi("x", [1, "N", 4]), builders.vi("y", ["M"])], [builders.vi("z", None)],
    )
    model = builders.model(graph)
    result = compare_models(model, model, engine="ort", seeds=2)
    assert result.passed
    assert result.sizes["seed 0"] == "N=1 M=1"  # all-ones is the first fallback
    assert any(n.startswith(f"seed 0: the original fails at N={free_size(0, 0)} M={free_size(0, 1)}")
               and "used N=1 M=1" in n for n in result.notes)
    assert "sizes seed 0 N=1 M=1" in result.summary()


def test_onnxruntime_failing_on_every_input_falls_back_to_the_reference_executor():
    model = builders.scan9_sum(steps=0)  # a zero-length Scan-9: onnxruntime fails, the spec allows it
    result = compare_models(model, model, engine="auto", seeds=2)
    assert result.passed and result.engine == "reference"
    assert "onnxruntime runs the original on no synthesized input" in result.notes[0]


def test_a_model_no_input_of_its_declared_ranks_runs_cannot_be_verified(tmp_path, cli):
    model = builders.scan8_sum(batch="B", steps="T", seq_lens=False)
    model.graph.input[1].type.tensor_type.shape.dim[2].dim_value = 5  # the body adds [2] to it
    # the body leaves x's shape open (declaring [2] would contradict X, refused as bad input)
    model.graph.node[0].attribute[0].g.input[1].type.tensor_type.ClearField("shape")
    with pytest.raises(CannotVerifyError, match="at every size tried"):
        compare_models(model, model)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    result = cli("upgrade", "--target-opset", "11", path, tmp_path / "out.onnx")
    assert result.code == 1, result.err
    assert "cannot verify" in result.err and "--inputs" in result.err
    assert not (tmp_path / "out.onnx").exists()


# -- the memory budget -----------------------------------------------------------------------


def huge_model() -> onnx.ModelProto:
    """scan9_sum over X [10**12, 2] with a default attribute spelled out (canonicalize drops it)."""
    model = builders.scan9_sum(steps=10**12, scan_input_directions=[0])
    return model


def test_declared_inputs_over_the_budget_are_a_reason_not_a_memory_error(tmp_path, cli):
    model = huge_model()
    with pytest.raises(CannotVerifyError, match=r"cannot verify: the declared inputs need 7.3 TiB .*pass --inputs"):
        compare_models(model, model)
    out, report = optimize(model, passes=["canonicalize"])
    assert out is model
    assert report.verification["summary"].startswith("cannot verify, so nothing was rewritten: the declared inputs need")
    path = tmp_path / "huge.onnx"
    onnx.save(model, path)
    for argv in (("verify", path, path), ("run", path)):
        result = cli(*argv)
        assert result.code == 1 and "Traceback" not in result.err and "MemoryError" not in result.err
        assert f"over the {FEED_BUDGET_BYTES // 2**20}.0 MiB budget for synthesized inputs; pass --inputs" in result.err
    result = cli("optimize", path, tmp_path / "out.onnx")
    assert result.code == 0 and "the declared inputs need 7.3 TiB" in result.out


def test_an_undeclared_input_read_by_a_scan_inside_an_if_branch_gets_its_shape():
    body = builders.sum_body()  # state and slice [2]
    def branch(name):
        scan = h.make_node("Scan", ["s0", "X"], [f"{name}_s", f"{name}_y"], body=body, num_scan_inputs=1)
        return h.make_graph([scan], name, [], [builders.vi(f"{name}_s", None), builders.vi(f"{name}_y", None)])
    node = h.make_node("If", ["flag"], ["s", "y"], then_branch=branch("then"), else_branch=branch("else"))
    graph = h.make_graph(
        [node], "main",
        [builders.vi("flag", [], TP.BOOL), builders.vi("s0", None), builders.vi("X", None)],
        [builders.vi("s", None), builders.vi("y", None)],
    )
    model = builders.model(graph)
    got = shapes(model)
    assert got["s0"] == (2,) and got["X"] == (TRIP_SIZES[0], 2)
    assert compare_models(model, model, seeds=2).passed


def test_an_undeclared_input_behind_shape_preserving_ops_gets_the_scan_shape():
    scan = h.make_node("Scan", ["s0", "x2"], ["s", "y"], body=builders.sum_body(), num_scan_inputs=1)
    graph = h.make_graph(
        [h.make_node("Identity", ["X"], ["x1"]), h.make_node("Relu", ["x1"], ["x2"]), scan], "main",
        [builders.vi("s0", [2]), builders.vi("X", None)],
        [builders.vi("s", None), builders.vi("y", None)],
    )
    model = builders.model(graph)
    assert shapes(model)["X"] == (TRIP_SIZES[0], 2)
    assert compare_models(model, model, seeds=2).passed


def test_a_reshape_in_the_body_sizes_the_scan_slice():
    # The body reshapes its [?] slice to [2, 3]: only a slice of 6 elements runs.
    body = h.make_graph(
        [h.make_node("Reshape", ["x", "target"], ["x23"]), h.make_node("ReduceSum", ["x23"], ["y"], keepdims=0)],
        "body", [builders.vi("x", [None])], [builders.vi("y", None)],
        initializer=[builders.init("target", np.array([2, 3], np.int64))],
    )
    scan = h.make_node("Scan", ["X"], ["Y"], body=body, num_scan_inputs=1)
    model = builders.model(h.make_graph([scan], "main", [builders.vi("X", None)], [builders.vi("Y", None)]))
    assert shapes(model)["X"] == (TRIP_SIZES[0], 6)
    assert compare_models(model, model, seeds=2).passed


def test_pytorch_transpose_and_flip_before_the_scan_are_followed_back_to_the_input():
    # models/torch_scan_rnn_rev_dim1.onnx with its graph shapes removed: x reaches the Scan
    # through Transpose(perm [1, 0, 2]) and a reversing Slice, the body declares the slices.
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "models", "torch_scan_rnn_rev_dim1.onnx")
    model = onnx.load(path)
    for value in list(model.graph.input) + list(model.graph.output):
        value.type.tensor_type.ClearField("shape")
    got = shapes(model)
    assert got["x"][1] == TRIP_SIZES[0] and got["x"][0] == got["h0"][0]  # [batch, seq, 3], h0 [batch, 4]
    assert compare_models(model, model, seeds=2).passed


def test_seed_0_runs_every_free_dim_at_2_or_more_beside_the_long_sequence_and_seed_1_at_1():
    """Issue 20: T >= 2 and B >= 2 at one seed (seed 0: T long, batch and width free and
    distinct), and every free dim at 1 at seed 1 (what broadcasts)."""
    graph = h.make_graph(
        [h.make_node("Concat", ["x", "y"], ["z"], axis=2)], "cat",
        [builders.vi("x", ["T", "B", 2]), builders.vi("y", ["T", "B", "W"])], [builders.vi("z", None)],
    )
    seed0 = InputSynthesizer(builders.model(graph)).shapes(0)
    assert min(seed0["x"][:2]) >= 2 and seed0["y"][2] >= 2 and seed0["x"][1] != seed0["y"][2]
    seed1 = InputSynthesizer(builders.model(graph)).shapes(1)
    assert seed1["x"][:2] == (1, 1) and seed1["y"][2] == 1
