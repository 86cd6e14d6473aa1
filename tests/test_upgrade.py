"""The upgrade pass and scanopt.migrate.migrate: Scan-8 -> opset-9+ constructions, whole-model
migration. Every rewrite is checked for structure and, on onnxruntime and the reference
executor, for numbers; every decline for its reason."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

from builders import vi
from equivalence import assert_equivalent, assert_valid, ops, outer_initializers, the_scan
from scanopt import optimize
from scanopt.errors import ScanoptError, VerificationError
from scanopt.emit import HOLD_DOMAIN
from scanopt.migrate import migrate, migrate_verified, newest_target
from scanopt.protos import walk_proto_graphs
from scanopt.validate import default_opset
from scanopt.verify import compare_models

I64 = TP.INT64
NEWEST_TARGET = newest_target()  # probed: the newest opset the installed onnxruntime loads
RNG = np.random.default_rng(7)


# -- Scan-8 model builders -------------------------------------------------------------


def const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def scan8_model(body_nodes, *, states, scans, outputs, batch="B", steps="T", lens=False, directions=None,
                initializers=(), extra_inputs=(), name="scan8"):
    """A model whose only node is a Scan-8. ``states``/``scans``/``outputs``: (name, per-item
    shape); the body reads ``<s>_in`` and ``<x>_t`` and writes ``<s>_out`` and ``<y>_t``."""
    body = h.make_graph(
        body_nodes, "body",
        [vi(f"{s}_in", shp) for s, shp in states] + [vi(f"{x}_t", shp) for x, shp in scans],
        [vi(f"{s}_out", shp) for s, shp in states] + [vi(f"{y}_t", shp) for y, shp in outputs],
    )
    attrs = {"num_scan_inputs": len(scans), "body": body}
    if directions:
        attrs["directions"] = list(directions)
    node = h.make_node("Scan", ["lens" if lens else ""] + [s for s, _ in states] + [x for x, _ in scans],
                       [f"{s}_final" for s, _ in states] + [y for y, _ in outputs], name=name, **attrs)
    inputs = ([vi("lens", [batch], I64)] if lens else []) + [vi(s, [batch, *shp]) for s, shp in states]
    inputs += [vi(x, [batch, steps, *shp]) for x, shp in scans] + list(extra_inputs)
    graph_outputs = [vi(f"{s}_final", [batch, *shp]) for s, shp in states]
    graph_outputs += [vi(y, [batch, steps, *shp]) for y, shp in outputs]
    graph = h.make_graph([node], "main", inputs, graph_outputs, initializer=list(initializers))
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 8)], ir_version=4)


def sum_model(**kw):
    """The backend test_scan_sum: s += x_t, y_t = s."""
    nodes = [h.make_node("Add", ["s_in", "x_t"], ["s_out"]), h.make_node("Identity", ["s_out"], ["y_t"])]
    return scan8_model(nodes, states=[("s", [2])], scans=[("x", [2])], outputs=[("y", [2])], **kw)


def bidaf_like(**kw):
    """BiDAF-style recurrence: h = tanh(concat(x_t, h) @ W + b), W and b read from the outer graph."""
    i, hidden = 3, 4
    nodes = [
        h.make_node("Concat", ["x_t", "h_in"], ["xh"], axis=0),
        h.make_node("MatMul", ["xh", "W"], ["pre"]),
        h.make_node("Add", ["pre", "bias"], ["act"]),
        h.make_node("Tanh", ["act"], ["h_out"]),
        h.make_node("Identity", ["h_out"], ["y_t"]),
    ]
    weights = [const("W", RNG.uniform(-0.5, 0.5, (i + hidden, hidden)).astype(np.float32)),
               const("bias", RNG.uniform(-0.5, 0.5, hidden).astype(np.float32))]
    return scan8_model(nodes, states=[("h", [hidden])], scans=[("x", [i])], outputs=[("y", [hidden])],
                       initializers=weights, **kw)


def gemm_model(**kw):
    """A body with Gemm (2-D only): not batch-polymorphic, so strategy (c)."""
    nodes = [
        h.make_node("Gemm", ["x_t", "W", "h_in"], ["h_out"], transB=1),
        h.make_node("Relu", ["h_out"], ["y_t"]),
    ]
    w = const("W", RNG.uniform(-0.5, 0.5, (2, 3)).astype(np.float32))
    return scan8_model(nodes, states=[("h", [1, 2])], scans=[("x", [1, 3])], outputs=[("y", [1, 2])],
                       initializers=[w], **kw)


def multi_model(**kw):
    """Two states, two scan inputs of different ranks, three scan outputs, an outer weight."""
    nodes = [
        h.make_node("Add", ["s_in", "a_t"], ["s_out"]),
        h.make_node("Mul", ["c_in", "b_t"], ["cb"]),
        h.make_node("Sub", ["cb", "b_t"], ["c_out"]),
        h.make_node("Mul", ["s_out", "V"], ["y1_t"]),
        h.make_node("ReduceSum", ["s_out"], ["rs"], axes=[0], keepdims=0),
        h.make_node("Add", ["rs", "c_out"], ["y2_t"]),
        h.make_node("ReduceMax", ["c_out"], ["y3_t"], keepdims=0),
    ]
    v = const("V", RNG.uniform(-1, 1, (2, 3)).astype(np.float32))
    return scan8_model(nodes, states=[("s", [2, 3]), ("c", [3])], scans=[("a", [2, 3]), ("b", [3])],
                       outputs=[("y1", [2, 3]), ("y2", [3]), ("y3", [])], initializers=[v], **kw)


def axes_model(**kw):
    """Axis-carrying ops whose opset-8 forms the converter must rewrite (and (b) must shift)."""
    nodes = [
        h.make_node("Unsqueeze", ["x_t"], ["u"], axes=[0]),
        h.make_node("ReduceSum", ["u"], ["r"], axes=[0], keepdims=0),
        h.make_node("Softmax", ["r"], ["sm"], axis=1),
        h.make_node("Transpose", ["sm"], ["tr"], perm=[1, 0]),
        h.make_node("Transpose", ["tr"], ["tr2"]),
        h.make_node("Slice", ["tr2"], ["sl"], starts=[0], ends=[2], axes=[1]),
        h.make_node("Pad", ["sl"], ["pd"], pads=[0, 0, 0, 1]),
        h.make_node("Add", ["s_in", "pd"], ["s_out"]),
        h.make_node("Reshape", ["s_out", "shape32"], ["rs"]),
        h.make_node("Gather", ["rs", "idx"], ["g"], axis=1),
        h.make_node("Squeeze", ["g"], ["y1_t"], axes=[1]),
        h.make_node("Split", ["s_out"], ["p0", "p1"], axis=0),
        h.make_node("Concat", ["p1", "p0"], ["y2_t"], axis=1),
        h.make_node("ReduceMean", ["s_out"], ["y3_t"], keepdims=0),
    ]
    inits = [const("shape32", np.array([3, 2], np.int64)), const("idx", np.array([1], np.int64))]
    return scan8_model(nodes, states=[("s", [2, 3])], scans=[("x", [2, 3])],
                       outputs=[("y1", [3]), ("y2", [1, 6]), ("y3", [])], initializers=inits, **kw)


def reverse_model(**kw):
    """x read forward and in reverse: the sample models/scan8_reverse_seqlens.onnx's body."""
    nodes = [
        h.make_node("Add", ["f_in", "xf_t"], ["f_out"]),
        h.make_node("Add", ["r_in", "xr_t"], ["r_out"]),
        h.make_node("Identity", ["f_out"], ["zf_t"]),
        h.make_node("Identity", ["r_out"], ["zr_t"]),
    ]
    model = scan8_model(nodes, states=[("f", [2]), ("r", [2])], scans=[("xf", [2]), ("xr", [2])],
                        outputs=[("zf", [2]), ("zr", [2])], directions=[0, 1], **kw)
    return model


def scan_count_by_version(model):
    return [default_opset(model)] * ops(model)["Scan"]


def feeds_for(model, batch, steps, lens=None, seed=0):
    """Explicit feeds: every float input random (B and T bound as given), lens as given."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        if value.name != "lens" and value.type.tensor_type.elem_type != TP.FLOAT:
            continue
        dims = [batch if d.dim_param == "B" else steps if d.dim_param == "T" else d.dim_value
                for d in value.type.tensor_type.shape.dim]
        if value.name == "lens":
            feeds["lens"] = np.asarray(lens, np.int64)
        else:
            feeds[value.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def upgrade(model, target=13, strategy=None):
    migration = migrate(model, target, options={"upgrade_strategy": strategy} if strategy else None)
    assert_valid(migration.model)
    assert default_opset(migration.model) == target
    assert not any(n.domain == HOLD_DOMAIN for g in walk_proto_graphs(migration.model.graph) for n in g.node)
    return migration.model, [o.detail for o in migration.outcomes]


def assert_same_on_reference(original, candidate, feeds):
    """Zero lengths: onnxruntime refuses them in Scan-8, so the reference executor decides."""
    result = compare_models(original, candidate, inputs=feeds, engine="reference")
    assert result.passed, result.format()


# -- what onnx.version_converter does (why this pass exists) ----------------------------


def test_version_converter_refuses_sequence_lens():
    with pytest.raises(Exception, match="Unsupported conversion to opset 9"):
        onnx.version_converter.convert_version(sum_model(batch=2, steps=3, lens=True), 9)


def test_version_converter_drops_the_batch_axis_and_upgrade_keeps_it():
    original = sum_model(batch=2, steps=3)
    converted = onnx.version_converter.convert_version(original, 9)
    dims = [[d.dim_value for d in v.type.tensor_type.shape.dim] for v in converted.graph.input]
    assert dims == [[2], [3, 2]]  # [B, 2] and [B, T, 2] lost their batch axis
    feeds = feeds_for(original, 2, 3)
    with pytest.raises(Exception, match="Invalid rank"):
        ort.InferenceSession(converted.SerializeToString()).run(None, feeds)
    ours, _ = upgrade(original, 9)
    assert [v.SerializeToString() for v in ours.graph.input] == [v.SerializeToString() for v in original.graph.input]
    assert [v.SerializeToString() for v in ours.graph.output] == [v.SerializeToString() for v in original.graph.output]
    assert_equivalent(original, ours, inputs=feeds)


# -- strategies on the running sum -------------------------------------------------------


@pytest.mark.parametrize("target", [9, 13, NEWEST_TARGET])
def test_batch_one_without_lengths_squeezes_around_one_scan9(target):
    original = sum_model(batch=1, steps=4)
    result, details = upgrade(original, target)
    assert details == [f"strategy (a): batch 1 squeezed around one Scan-9 (opset {target})"]
    assert ops(result) == {"Squeeze": 2, "Scan": 1, "Unsqueeze": 2, "Add": 1, "Identity": 1}
    assert_equivalent(original, result)


@pytest.mark.parametrize("batch,lens,target", [(2, False, 9), ("B", False, 13), ("B", True, 9), (3, True, 17)])
def test_polymorphic_body_runs_one_scan9_over_time(batch, lens, target):
    original = sum_model(batch=batch, steps="T", lens=lens)
    result, details = upgrade(original, target)
    assert details[0].startswith("strategy (b)")
    counts = ops(result)
    assert counts["Scan"] == 1 and "Loop" not in counts
    assert counts["Where"] == (2 if lens else 0)  # one per state (in the body), one per scan output (after)
    scan = the_scan(result)
    attrs = {a.name: h.get_attribute_value(a) for a in scan.attribute}
    # x, and with lengths the precomputed step mask, scanned along axis 1
    assert attrs["scan_input_axes"] == [1] * (2 if lens else 1) and attrs["scan_output_axes"] == [1]
    assert_equivalent(original, result)
    if lens:
        b = 3 if batch == 3 else 4
        feeds = feeds_for(original, b, 3, lens=[0, 3, 1, 2][:b])
        assert_same_on_reference(original, result, feeds)


@pytest.mark.parametrize("lens,target", [(False, 9), (True, 9), (True, 11), (False, NEWEST_TARGET), (True, NEWEST_TARGET)])
def test_per_item_strategy_is_correct_for_the_running_sum(lens, target):
    original = sum_model(batch="B", lens=lens)
    result, details = upgrade(original, target, strategy="c")
    assert details[0].startswith("strategy (c)")
    assert ops(result)["Scan"] == 2  # the loop over items and the Scan-9 per item
    assert_equivalent(original, result)
    if lens:
        assert_same_on_reference(original, result, feeds_for(original, 4, 3, lens=[0, 3, 1, 2]))


def test_batch_one_with_lengths_slices_instead_of_masking():
    original = sum_model(batch=1, lens=True)
    result, details = upgrade(original, 13)
    assert details[0].startswith("strategy (c)")
    assert "not (b): batch 1 with sequence_lens: slicing one item is cheaper than masking" in details[0]
    assert "Where" not in ops(result) and ops(result)["Scan"] == 2  # per item: slice, Scan-9, pad
    assert_equivalent(original, result)
    assert_same_on_reference(original, result, feeds_for(original, 1, 3, lens=[0]))


def test_outputs_are_zero_past_each_length_and_states_stop_there():
    """Against numpy, not against another model: lengths 0..T mixed in one batch."""
    original = reverse_model(batch="B", lens=True)
    lens = np.array([0, 4, 2, 1])
    feeds = feeds_for(original, 4, 4, lens=lens)
    x = feeds["xf"]
    for strategy in ("b", "c"):
        result, _ = upgrade(original, 13, strategy=strategy)
        from scanopt.reference import run_model

        got = run_model(result, {**feeds, "xr": x})
        for b, n in enumerate(lens):
            fwd = feeds["f"][b] + np.cumsum(x[b, :n], axis=0)
            bwd = feeds["r"][b] + np.cumsum(x[b, :n][::-1], axis=0)  # reads len-1 .. 0
            np.testing.assert_allclose(got["zf"][b, :n], fwd, rtol=1e-6)
            np.testing.assert_allclose(got["zr"][b, :n], bwd, rtol=1e-6)
            assert not got["zf"][b, n:].any() and not got["zr"][b, n:].any()
            np.testing.assert_allclose(got["f_final"][b], fwd[-1] if n else feeds["f"][b], rtol=1e-6)
            np.testing.assert_allclose(got["r_final"][b], bwd[-1] if n else feeds["r"][b], rtol=1e-6)


# -- directions, several states/inputs/outputs, captures -------------------------------


@pytest.mark.parametrize("lens,target,strategy", [
    (False, 13, None), (True, 10, None), (True, 9, None), (True, 13, "c"), (False, 9, "c"),
])
def test_reverse_inputs(lens, target, strategy):
    original = reverse_model(batch="B", lens=lens)
    result, details = upgrade(original, target, strategy)
    expected = "strategy (c)" if strategy == "c" or (lens and target < 10) else "strategy (b)"
    assert details[0].startswith(expected)
    if lens and target < 10 and strategy is None:
        assert "reverse inputs with sequence_lens need ReverseSequence (opset 10)" in details[0]
    if expected == "strategy (b)" and lens:
        assert ops(result)["ReverseSequence"] == 1
    assert_equivalent(original, result)
    if lens:
        assert_same_on_reference(original, result, feeds_for(original, 3, 4, lens=[4, 0, 2]))


def test_the_sample_models_upgrade():
    for path in ("models/scan8_sum.onnx", "models/scan8_sum_seqlens.onnx", "models/scan8_reverse_seqlens.onnx"):
        original = onnx.load(path)
        result, details = upgrade(original, 17)
        assert details[0].startswith("strategy (b)"), path
        assert_equivalent(original, result)


@pytest.mark.parametrize("strategy", [None, "c"])
def test_several_states_scan_inputs_and_outputs(strategy):
    original = multi_model(batch="B", lens=True, directions=[1, 0])
    result, details = upgrade(original, 13, strategy)
    assert details[0].startswith("strategy (c)" if strategy else "strategy (b)")
    assert_equivalent(original, result)
    assert_same_on_reference(original, result, feeds_for(original, 3, 2, lens=[2, 0, 1]))


@pytest.mark.parametrize("lens", [False, True])
def test_bidaf_like_body_with_outer_weights_is_batched(lens):
    original = bidaf_like(batch="batch", steps="seq", lens=lens)
    result, details = upgrade(original, 17)
    assert details[0].startswith("strategy (b)")
    body = the_scan(result).attribute[0].g
    assert [n.op_type for n in body.node][:3] == ["Concat", "MatMul", "Add"]
    assert set(outer_initializers(result)) >= {"W", "bias"}  # still read from outside the body
    assert_equivalent(original, result)


def test_body_reading_a_graph_input_from_the_outer_scope():
    nodes = [h.make_node("Mul", ["x_t", "scale"], ["xs"]), h.make_node("Add", ["s_in", "xs"], ["s_out"]),
             h.make_node("Identity", ["s_out"], ["y_t"])]
    original = scan8_model(nodes, states=[("s", [2])], scans=[("x", [2])], outputs=[("y", [2])],
                           lens=True, extra_inputs=[vi("scale", [2])])
    for strategy in (None, "c"):
        result, _ = upgrade(original, 13, strategy)
        assert_equivalent(original, result)


@pytest.mark.parametrize("target", [11, 13, 18])
def test_axis_ops_are_shifted_and_converted(target):
    original = axes_model(batch="B", lens=True)
    result, details = upgrade(original, target)
    assert details[0].startswith("strategy (b)")
    body = the_scan(result).attribute
    body = next(a.g for a in body if a.name == "body")
    by_op = {n.op_type: n for n in body.node}
    attrs = lambda op: {a.name: h.get_attribute_value(a) for a in by_op[op].attribute}  # noqa: E731
    assert attrs("Transpose")["perm"] in ([0, 2, 1],)
    assert attrs("Concat")["axis"] == 2 and attrs("Gather")["axis"] == 2
    if target >= 13:  # axes became inputs: the converter rewrote the shifted attributes
        assert len(by_op["ReduceSum"].input) == 2 and len(by_op["Squeeze"].input) == 2
    else:
        assert attrs("ReduceSum")["axes"] == [1]
    assert_equivalent(original, result)
    assert_same_on_reference(original, result, feeds_for(original, 3, 2, lens=[0, 2, 1]))


def test_gemm_body_falls_back_to_per_item_with_the_reason():
    original = gemm_model(batch="B", lens=True)
    result, details = upgrade(original, 13)
    assert details[0].startswith("strategy (c)")
    assert "not (b): Gemm" in details[0] and "2-D operands" in details[0]
    assert_equivalent(original, result)
    assert_same_on_reference(original, result, feeds_for(original, 2, 3, lens=[0, 3]))


# -- nesting ------------------------------------------------------------------------------


def scan8_in_loop():
    """A Loop-1 whose body runs a Scan-8 over the outer X with the loop-carried state."""
    inner = sum_model().graph.node[0]
    body = h.make_graph(
        [h.make_node("Identity", ["c_in"], ["c_out"]),
         h.make_node("Scan", ["", "s", "X"], ["s_next", "ys"], name="inner", num_scan_inputs=1,
                     body=next(a.g for a in inner.attribute if a.name == "body")),
         h.make_node("Mul", ["s_next", "half"], ["s_scaled"])],
        "loop_body", [vi("it", [], I64), vi("c_in", [], TP.BOOL), vi("s", ["B", 2])],
        [vi("c_out", [], TP.BOOL), vi("s_scaled", ["B", 2])])
    graph = h.make_graph(
        [h.make_node("Loop", ["trips", "cond", "s0"], ["s_final"], name="loop", body=body)], "main",
        [vi("trips", [], I64), vi("cond", [], TP.BOOL), vi("s0", ["B", 2]), vi("X", ["B", "T", 2])],
        [vi("s_final", ["B", 2])], initializer=[const("half", np.float32(0.5))])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 8)], ir_version=4)


def scan8_in_if():
    model = sum_model(lens=True)
    then = h.make_graph(list(model.graph.node), "then", [], [vi("s_final", ["B", 2]), vi("y", ["B", "T", 2])])
    other = h.make_graph([h.make_node("Identity", ["s"], ["s_keep"]), h.make_node("Neg", ["x"], ["x_neg"])],
                         "else", [], [vi("s_keep", ["B", 2]), vi("x_neg", ["B", "T", 2])])
    graph = h.make_graph(
        [h.make_node("If", ["flag"], ["out_s", "out_y"], name="branch", then_branch=then, else_branch=other)],
        "main", [vi("flag", [], TP.BOOL)] + list(model.graph.input),
        [vi("out_s", ["B", 2]), vi("out_y", ["B", "T", 2])])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 8)], ir_version=4)


def scan8_in_scan8(outer_lens=True):
    """An outer Scan-8 whose body runs an inner Scan-8 (batch 2, its own sequence_lens)."""
    inner_body = sum_model().graph.node[0].attribute
    inner_body = next(a.g for a in inner_body if a.name == "body")
    nodes = [
        h.make_node("Scan", ["inner_lens", "s_in", "x_t"], ["s_inner", "y_inner"], name="inner",
                    num_scan_inputs=1, body=inner_body),
        h.make_node("Tanh", ["s_inner"], ["s_out"]),
        h.make_node("Identity", ["y_inner"], ["y_t"]),
    ]
    return scan8_model(nodes, states=[("s", [2, 2])], scans=[("x", [2, 3, 2])], outputs=[("y", [2, 3, 2])],
                       lens=outer_lens, initializers=[const("inner_lens", np.array([3, 1], np.int64))], name="outer")


def test_scan8_inside_a_loop_body():
    original = scan8_in_loop()
    result, details = upgrade(original, 13)
    assert len(details) == 1 and details[0].startswith("strategy (b)")
    assert ops(result)["Loop"] == 1 and ops(result)["Scan"] == 1
    feeds = [{"trips": np.array(t, np.int64), "cond": np.array(True), **feeds_for(original, b, 3, seed=t)}
             for t, b in ((2, 2), (3, 1))]
    assert_equivalent(original, result, inputs=feeds)


def test_scan8_inside_if_branches():
    original = scan8_in_if()
    result, details = upgrade(original, 13)
    assert details[0].startswith("strategy (b)")
    for flag in (True, False):
        feeds = {"flag": np.array(flag), **feeds_for(original, 3, 2, lens=[2, 1, 2])}
        assert_equivalent(original, result, inputs=feeds)


@pytest.mark.parametrize("target", [9, 13])
def test_scan8_inside_another_scan8(target):
    original = scan8_in_scan8()
    migration = migrate(original, target)
    assert_valid(migration.model)
    outcomes = {o.node: o for o in migration.outcomes}
    assert outcomes["inner"].detail.startswith("strategy (b)") and outcomes["inner"].path == "outer/body"
    # the outer body now holds the rewritten inner Scan: not provably polymorphic, so (c)
    assert outcomes["outer"].detail.startswith("strategy (c)")
    assert "not an ai.onnx op" in outcomes["outer"].detail
    assert_equivalent(original, migration.model)
    assert_same_on_reference(original, migration.model, feeds_for(original, 3, 2, lens=[0, 2, 1]))


# -- declines and errors ---------------------------------------------------------------


def test_optimize_without_a_target_keeps_scan8_and_says_how():
    original = sum_model(lens=True)
    result, report = optimize(original, passes=["upgrade"])
    assert result is original
    (outcome,) = [o for o in report.outcomes if o.pass_name == "upgrade"]
    assert not outcome.applied
    assert "kept as Scan-8" in outcome.detail and "--target-opset" in outcome.detail
    assert "scanopt upgrade" in outcome.detail


def test_optimize_with_a_target_migrates_and_reports_the_strategy():
    original = bidaf_like(lens=True)
    result, report = optimize(original, passes=["upgrade", "cleanup"], options={"target_opset": 15})
    assert default_opset(result) == 15
    applied = [o for o in report.outcomes if o.pass_name == "upgrade" and o.applied]
    assert len(applied) == 1 and applied[0].detail.startswith("strategy (b)")
    assert report.verification["passed"] and report.verification["summary"].startswith("opset 8 -> 15")
    assert report.ops_before["Scan"] == 1 and report.ops_after["Where"] == 2
    assert_equivalent(original, result)


def test_optimize_target_needs_the_upgrade_pass():
    with pytest.raises(ScanoptError, match="needs the upgrade pass"):
        optimize(sum_model(), passes=["cleanup"], options={"target_opset": 13})


@pytest.mark.parametrize("strategy,model,reason", [
    ("a", lambda: sum_model(batch=2), "strategy (a) needs batch 1"),
    ("a", lambda: sum_model(batch=1, lens=True), "strategy (a) needs batch 1"),
    ("b", lambda: gemm_model(), "strategy (b) does not apply: Gemm"),
])
def test_a_forced_strategy_that_does_not_apply_is_refused_with_the_reason(strategy, model, reason):
    with pytest.raises(ScanoptError, match="Scan-8 node.*stay") as info:
        migrate(model(), 13, options={"upgrade_strategy": strategy})
    assert reason in str(info.value)


@pytest.mark.parametrize("target,message", [(8, "out of range"), (NEWEST_TARGET + 1, "out of range")])
def test_targets_outside_the_supported_range(target, message):
    with pytest.raises(ScanoptError, match=message):
        migrate(sum_model(), target)


def test_lowering_where_every_op_keeps_its_form():
    """Below the model's opset only where no op changes form (issue 32): renumbered, verified."""
    model = migrate(sum_model(), 13).model
    lowered = migrate_verified(model, 11)
    assert default_opset(lowered.model) == 11 and lowered.verification["passed"]


@pytest.mark.parametrize("elem,error", [(TP.FLOAT, None), (TP.FLOAT16, "does not hold at opset 26: .*Range.*float16")])
def test_lowering_checks_the_older_ops_types(elem, error):
    """Range-27 left without stash_type is Range-11 for the types Range-11 takes; float16 it does not."""
    inputs = [vi(n, [], elem) for n in ("a", "b", "c")]
    graph = h.make_graph([h.make_node("Range", ["a", "b", "c"], ["y"])], "g", inputs, [vi("y", ["n"], elem)])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 27)], ir_version=10)
    if error:
        with pytest.raises(ScanoptError, match=error):
            migrate(model, 26)
    else:
        assert default_opset(migrate(model, 26).model) == 26


def test_no_lowering_where_an_op_changed_form():
    x = vi("x", [2, 3])
    graph = h.make_graph([h.make_node("Unsqueeze", ["x", "axes"], ["y"])], "g", [x], [vi("y", [1, 2, 3])],
                         initializer=[const("axes", np.array([0], np.int64))])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    with pytest.raises(ScanoptError, match="does not lower it to 11: 'Unsqueeze' changed form at opset 13"):
        migrate(model, 11)


def test_converter_failure_elsewhere_is_a_clear_error():
    """BatchNormalization-7 with spatial=0 has no opset-9 form; the Scan-8 would upgrade."""
    model = sum_model(batch=2, steps=3)
    model.graph.node.append(h.make_node("BatchNormalization", ["y", "g", "g", "g", "g"], ["bn"], spatial=0))
    model.graph.initializer.append(const("g", np.ones((3, 2), np.float32)))
    model.graph.output.append(vi("bn", [2, 3, 2]))
    with pytest.raises(ScanoptError, match="onnx.version_converter cannot convert the model from opset 8 to 13.*spatial"):
        migrate(model, 13)


def test_a_failed_verification_raises_and_returns_nothing(monkeypatch):
    import scanopt.verify as verify

    class Failed:
        passed = False

        def summary(self):
            return "NOT equivalent: injected"

        def to_dict(self):
            return {}

    monkeypatch.setattr(verify, "compare_models", lambda *a, **k: Failed())
    with pytest.raises(VerificationError, match="not equivalent.*injected"):
        migrate_verified(sum_model(), 13)


# -- the migration as a whole -------------------------------------------------------------


def test_every_target_runs_in_onnxruntime():
    original = sum_model(batch="B", lens=True)
    feeds = feeds_for(original, 3, 4, lens=[4, 1, 3])
    expected = ort.InferenceSession(original.SerializeToString()).run(None, feeds)
    for target in range(9, NEWEST_TARGET + 1):
        result = migrate(original, target).model
        got = ort.InferenceSession(result.SerializeToString()).run(None, feeds)
        for e, g in zip(expected, got):
            np.testing.assert_allclose(g, e, rtol=1e-6, err_msg=f"opset {target}")


def test_converter_names_are_unique_model_wide():
    """onnx 1.23's converter names the axes constants it adds _v_N per graph, so a Loop body
    and its parent both get a _v_9 (SSA broken); migrate renames them model-wide."""
    body = h.make_graph(
        [h.make_node("Identity", ["c"], ["c2"]), h.make_node("Unsqueeze", ["s"], ["su"], axes=[0]),
         h.make_node("ReduceSum", ["su"], ["r"], axes=[0], keepdims=0), h.make_node("Add", ["r", "s"], ["s2"])],
        "b", [vi("i", [], I64), vi("c", [], TP.BOOL), vi("s", [2])], [vi("c2", [], TP.BOOL), vi("s2", [2])])
    graph = h.make_graph(
        [h.make_node("Unsqueeze", ["x"], ["xu"], axes=[0]), h.make_node("Squeeze", ["xu"], ["x2"], axes=[0]),
         h.make_node("Loop", ["n", "cond", "x2"], ["y"], body=body)],
        "g", [vi("n", [], I64), vi("cond", [], TP.BOOL), vi("x", [2])], [vi("y", [2])])
    original = h.make_model(graph, opset_imports=[h.make_opsetid("", 8)], ir_version=4)
    raw = onnx.version_converter.convert_version(original, 13)
    with pytest.raises(onnx.checker.ValidationError, match="single static assignment"):
        onnx.checker.check_model(raw, full_check=True)
    result = migrate(original, 13).model
    onnx.checker.check_model(result, full_check=True)
    defined = [o for g in walk_proto_graphs(result.graph) for n in g.node for o in n.output if o]
    assert len(defined) == len(set(defined))
    feeds = {"n": np.array(2, np.int64), "cond": np.array(True), "x": np.array([1.0, -2.0], np.float32)}
    assert_equivalent(original, result, inputs=feeds)


def test_migration_is_deterministic():
    a = migrate(scan8_in_scan8(), 13).model.SerializeToString()
    b = migrate(scan8_in_scan8(), 13).model.SerializeToString()
    assert a == b


def test_a_model_already_at_the_target_is_returned_as_is():
    model = migrate(sum_model(), 13).model
    assert migrate(model, 13).model is model


# -- the batch-polymorphism proof declines with reasons -----------------------------------


DECLINES = {
    "shape": ([h.make_node("Add", ["s_in", "x_t"], ["s_out"]), h.make_node("Shape", ["x_t"], ["sh"]),
               h.make_node("Cast", ["sh"], ["y_t"], to=TP.FLOAT)], [1], [],
              "Shape 'Shape->sh' touches a per-item value and its result would include the batch size"),
    "broadcast": ([h.make_node("Add", ["s_in", "x_t"], ["s_out"]), h.make_node("Mul", ["x_t", "C32"], ["y_t"])],
                  [3, 2], [const("C32", np.arange(6, dtype=np.float32).reshape(3, 2))],
                  "broadcasts a per-item value of rank 1 against rank 2"),
    "matmul_right_vector": ([h.make_node("Add", ["s_in", "x_t"], ["s_out"]), h.make_node("MatMul", ["C32", "x_t"], ["y_t"])],
                            [3], [const("C32", np.arange(6, dtype=np.float32).reshape(3, 2))],
                            "multiplies ranks 2 x 1 with the batched operand(s) right"),
    "squeeze_without_axes": ([h.make_node("Add", ["s_in", "x_t"], ["s_out"]), h.make_node("Unsqueeze", ["x_t"], ["u"], axes=[0]),
                              h.make_node("Squeeze", ["u"], ["y_t"])], [2], [],
                             "has no axes; it would also drop a batch of size 1"),
    "reshape_runtime_shape": ([h.make_node("Add", ["s_in", "x_t"], ["s_out"]), h.make_node("Reshape", ["x_t", "shp"], ["y_t"])],
                              [2], [], "its target shape is computed at run time"),
    "constant_output": ([h.make_node("Add", ["s_in", "x_t"], ["s_out"]), h.make_node("Identity", ["C2"], ["y_t"])],
                        [2], [const("C2", np.ones(2, np.float32))],
                        "body output 1 ('y_t') does not depend on the states or scan inputs"),
}


@pytest.mark.parametrize("case", sorted(DECLINES))
def test_proof_declines_with_a_reason_and_per_item_is_used(case):
    nodes, y_shape, inits, reason = DECLINES[case]
    extra = [vi("shp", [1], I64)] if case == "reshape_runtime_shape" else []
    original = scan8_model(nodes, states=[("s", [2])], scans=[("x", [2])], outputs=[("y", y_shape)],
                           initializers=inits, extra_inputs=extra, lens=True)
    result, details = upgrade(original, 13)
    assert details[0].startswith("strategy (c)")
    assert reason in details[0]
    feeds = feeds_for(original, 2, 3, lens=[3, 1])
    if extra:
        feeds["shp"] = np.array([2], np.int64)
    assert_equivalent(original, result, inputs=feeds)


def test_proof_declines_random_ops():
    nodes = [h.make_node("RandomNormalLike", ["x_t"], ["noise"]), h.make_node("Add", ["s_in", "noise"], ["s_out"]),
             h.make_node("Identity", ["s_out"], ["y_t"])]
    original = scan8_model(nodes, states=[("s", [2])], scans=[("x", [2])], outputs=[("y", [2])])
    _, details = upgrade(original, 13)
    assert details[0].startswith("strategy (c)") and "draws random numbers" in details[0]


def test_proof_declines_control_flow_reading_per_item_values():
    branch = h.make_graph([h.make_node("Neg", ["x_t"], ["neg"])], "then", [], [vi("neg", [2])])
    other = h.make_graph([h.make_node("Identity", ["x_t"], ["same"])], "else", [], [vi("same", [2])])
    nodes = [h.make_node("If", ["flag"], ["picked"], then_branch=branch, else_branch=other),
             h.make_node("Add", ["s_in", "picked"], ["s_out"]), h.make_node("Identity", ["s_out"], ["y_t"])]
    original = scan8_model(nodes, states=[("s", [2])], scans=[("x", [2])], outputs=[("y", [2])],
                           extra_inputs=[vi("flag", [], TP.BOOL)])
    result, details = upgrade(original, 13)
    assert "has a body that reads per-item values" in details[0]
    for flag in (True, False):
        assert_equivalent(original, result, inputs={"flag": np.array(flag), **feeds_for(original, 2, 3)})


def test_integer_and_double_states_are_masked_and_padded():
    body = h.make_graph(
        [h.make_node("Add", ["n_in", "k_t"], ["n_out"]), h.make_node("Add", ["d_in", "v_t"], ["d_out"]),
         h.make_node("Identity", ["n_out"], ["yn_t"]), h.make_node("Identity", ["d_out"], ["yd_t"])],
        "body", [vi("n_in", [2], I64), vi("d_in", [2], TP.DOUBLE), vi("k_t", [2], I64), vi("v_t", [2], TP.DOUBLE)],
        [vi("n_out", [2], I64), vi("d_out", [2], TP.DOUBLE), vi("yn_t", [2], I64), vi("yd_t", [2], TP.DOUBLE)])
    node = h.make_node("Scan", ["lens", "n", "d", "k", "v"], ["n_final", "d_final", "yn", "yd"], name="typed",
                       num_scan_inputs=2, body=body)
    graph = h.make_graph([node], "main",
                         [vi("lens", ["B"], I64), vi("n", ["B", 2], I64), vi("d", ["B", 2], TP.DOUBLE),
                          vi("k", ["B", "T", 2], I64), vi("v", ["B", "T", 2], TP.DOUBLE)],
                         [vi("n_final", ["B", 2], I64), vi("d_final", ["B", 2], TP.DOUBLE),
                          vi("yn", ["B", "T", 2], I64), vi("yd", ["B", "T", 2], TP.DOUBLE)])
    original = h.make_model(graph, opset_imports=[h.make_opsetid("", 8)], ir_version=4)
    rng = np.random.default_rng(3)
    zero_feeds = {"lens": np.array([0, 3, 1]), "n": rng.integers(0, 9, (3, 2)), "d": rng.standard_normal((3, 2)),
                  "k": rng.integers(0, 9, (3, 3, 2)), "v": rng.standard_normal((3, 3, 2))}
    for strategy in ("b", "c"):
        result, details = upgrade(original, 9, strategy)
        assert details[0].startswith(f"strategy ({strategy})")
        assert_equivalent(original, result)
        assert_same_on_reference(original, result, zero_feeds)


def test_string_outputs_with_lengths_cannot_be_padded():
    body = h.make_graph([h.make_node("Identity", ["s_in"], ["s_out"]), h.make_node("Identity", ["w_t"], ["y_t"])],
                        "body", [vi("s_in", [2]), vi("w_t", [], TP.STRING)], [vi("s_out", [2]), vi("y_t", [], TP.STRING)])
    node = h.make_node("Scan", ["lens", "s", "w"], ["s_final", "y"], name="words", num_scan_inputs=1, body=body)
    graph = h.make_graph([node], "main", [vi("lens", ["B"], I64), vi("s", ["B", 2]), vi("w", ["B", "T"], TP.STRING)],
                         [vi("s_final", ["B", 2]), vi("y", ["B", "T"], TP.STRING)])
    original = h.make_model(graph, opset_imports=[h.make_opsetid("", 8)], ir_version=4)
    with pytest.raises(ScanoptError, match="'words': scan outputs of type object cannot be zero-padded at opset 13"):
        migrate(original, 13)


def test_softmax_family_keeps_its_opset8_coercion_to_2d():
    """Softmax-1 at axis 0 normalizes over the whole item; batched it must use axis 1, and
    the converter must keep that meaning at opset 13. onnx.reference runs Softmax-1 with
    opset-13 semantics, so onnxruntime alone is the judge here."""
    nodes = [h.make_node("Softmax", ["x_t"], ["p"], axis=0), h.make_node("LogSoftmax", ["x_t"], ["q"], axis=1),
             h.make_node("Hardmax", ["x_t"], ["m"], axis=0), h.make_node("Add", ["p", "q"], ["pq"]),
             h.make_node("Add", ["pq", "m"], ["upd"]), h.make_node("Add", ["s_in", "upd"], ["s_out"]),
             h.make_node("Identity", ["upd"], ["y_t"])]
    original = scan8_model(nodes, states=[("s", [2, 3])], scans=[("x", [2, 3])], outputs=[("y", [2, 3])], lens=True)
    for target in (12, 13):
        result, details = upgrade(original, target)
        assert details[0].startswith("strategy (b)")
        assert_equivalent(original, result, engine="ort", seeds=3)


def test_hardmax_keeps_its_meaning_across_opset_13():
    """onnx 1.23's converter bumps Hardmax 12 -> 13 without adapting the axis meaning."""
    graph = h.make_graph([h.make_node("Hardmax", ["x"], ["y"], axis=0)], "g", [vi("x", [2, 3])], [vi("y", [2, 3])])
    original = h.make_model(graph, opset_imports=[h.make_opsetid("", 8)], ir_version=4)
    feeds = {"x": np.array([[0.1, -0.1, 0.6], [0.1, -0.5, 0.4]], np.float32)}
    raw = onnx.version_converter.convert_version(original, 13)
    assert ort.InferenceSession(raw.SerializeToString()).run(None, feeds)[0].sum() == 3  # one per column: wrong
    result = migrate(original, 13).model
    assert ops(result) == {"Flatten": 1, "Hardmax": 1, "Shape": 1, "Reshape": 1}
    np.testing.assert_array_equal(ort.InferenceSession(result.SerializeToString()).run(None, feeds)[0],
                                  [[0, 0, 1], [0, 0, 0]])  # one for the whole 2-D item
    assert_equivalent(original, result, engine="ort")


@pytest.mark.parametrize("target", [9, 13, 18])
def test_bidaf_like_graph_around_the_scan_is_converted_too(target):
    """Ops outside the Scan (Gather embedding, ReduceMax, Unsqueeze, Softmax, Squeeze) move
    to the target opset with the converter; the Scan-8 becomes strategy (b)."""
    model = bidaf_like(batch="batch", steps="seq", lens=True)
    g = model.graph
    del g.input[2]  # x now comes from an embedding lookup
    g.input.append(vi("tokens", ["batch", "seq"], I64))
    g.initializer.append(const("E", RNG.standard_normal((10, 3)).astype(np.float32)))
    g.node.insert(0, h.make_node("Gather", ["E", "tokens"], ["x"], axis=0))
    g.node.extend([h.make_node("ReduceMax", ["y"], ["pooled"], axes=[1], keepdims=0),
                   h.make_node("Unsqueeze", ["pooled"], ["pu"], axes=[1]),
                   h.make_node("Softmax", ["pu"], ["sm"], axis=2),
                   h.make_node("Squeeze", ["sm"], ["probs"], axes=[1])])
    g.output.append(vi("probs", ["batch", 4]))
    result, details = upgrade(model, target)
    assert details[0].startswith("strategy (b)")
    top = {n.op_type: n for n in result.graph.node}
    assert len(top["ReduceMax"].input) == (2 if target >= 18 else 1)
    assert len(top["Squeeze"].input) == (2 if target >= 13 else 1)
    assert_equivalent(model, result)


def _scan8_after_untyped_op(body_declares_type: bool):
    """A Scan-8 whose scan input comes from an ai.onnx.ml Normalizer, which onnx's shape
    inference cannot type."""
    x_in = vi("x", [3, 4]) if body_declares_type else onnx.ValueInfoProto(name="x")
    body = h.make_graph(
        [h.make_node("ReduceSum", ["x"], ["r"], axes=[0], keepdims=0), h.make_node("Add", ["s", "r"], ["s2"]),
         h.make_node("Identity", ["s2"], ["y"])],
        "body", [vi("s", [4]), x_in], [vi("s2", [4]), vi("y", [4])])
    graph = h.make_graph(
        [h.make_node("Normalizer", ["X2"], ["Xn"], domain="ai.onnx.ml", norm="L2"),
         h.make_node("Reshape", ["Xn", "shape"], ["X"]),
         h.make_node("Scan", ["", "S", "X"], ["SF", "Y"], body=body, num_scan_inputs=1)],
        "main", [vi("S", [1, 4]), vi("X2", [6, 4])], [vi("SF", [1, 4]), vi("Y", [1, 2, 4])],
        initializer=[const("shape", np.array([1, 2, 3, 4], np.int64))])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 8), h.make_opsetid("ai.onnx.ml", 1)], ir_version=4)


@pytest.mark.parametrize("target", [9, 13])
def test_an_input_nothing_types_takes_the_type_its_body_declares(target):
    original = _scan8_after_untyped_op(body_declares_type=True)
    result = migrate(original, target).model
    assert default_opset(result) == target
    feeds = {"S": RNG.standard_normal((1, 4)).astype(np.float32), "X2": RNG.standard_normal((6, 4)).astype(np.float32)}
    # compare_models, not assert_equivalent: strict shape inference fails on the original too
    verdict = compare_models(original, result, inputs=feeds, engine="ort")
    assert verdict.passed, verdict.format()


def test_an_input_neither_the_graph_nor_the_body_types_is_declined_with_the_reason():
    with pytest.raises(ScanoptError, match="an input of the Scan has no known element type"):
        migrate(_scan8_after_untyped_op(body_declares_type=False), 13)


@pytest.mark.parametrize("strategy", ["b", "c"])
def test_an_upgraded_scan_runs_on_an_empty_batch_and_zero_steps(strategy):
    """onnxruntime runs Scan-8 over zero steps (the initial states, an empty Y) and refuses an
    empty batch cleanly; a Scan-9 over axis 1 died of SIGFPE on both, and one over zero steps
    was refused: the upgraded form sits behind If(B == 0 or T == 0) and gives Scan-8's result
    there (child processes: a crash must not end the test)."""
    from child_run import run_in_child

    original = sum_model(batch="B", steps="T")
    result, details = upgrade(original, 17, strategy=strategy)
    assert details[0].startswith(f"strategy ({strategy})")
    s0 = np.arange(6, dtype=np.float32).reshape(3, 2)
    status, out = run_in_child(result, {"s": s0, "x": np.zeros([3, 0, 2], np.float32)})
    assert status == "ok", out
    expected = run_in_child(original, {"s": s0, "x": np.zeros([3, 0, 2], np.float32)})
    assert expected[0] == "ok" and [v.shape for v in out.values()] == [v.shape for v in expected[1].values()]
    assert np.array_equal(list(out.values())[0], s0)
    status, out = run_in_child(result, {"s": np.zeros([0, 2], np.float32), "x": np.zeros([0, 5, 2], np.float32)})
    assert status == "ok" and [v.shape for v in out.values()] == [(0, 2), (0, 5, 2)], out
    assert_equivalent(original, result)
