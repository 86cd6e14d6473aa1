"""The verifier against deliberately wrong candidates (issue 11): every one must be caught.

The original is a small tanh recurrence written as a Scan over X [T, B, 3]. Each
candidate computes the same thing except in one narrow way: only for inputs above 5,
only for |x| > 12, only past 4 steps, only at step 40, in one region, one step, one batch entry, one output, by just over
the tolerance, or with its outputs in another order. They are checked with the seed
counts the CLI uses (``optimize``: 2, ``verify``: 3), so a candidate that slips through
here slips through for users.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper as h

import builders
from scanopt.verify import TOLERANCES, compare_models

OPTIMIZE_SEEDS = 2  # the smaller of the CLI defaults (verify uses 3)


def original() -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    body = h.make_graph(
        [
            h.make_node("MatMul", ["x", "W"], ["xw"]),
            h.make_node("MatMul", ["h", "R"], ["hr"]),
            h.make_node("Add", ["xw", "hr"], ["pre"]),
            h.make_node("Tanh", ["pre"], ["h_next"]),
            h.make_node("Identity", ["h_next"], ["y"]),
        ],
        "step",
        [builders.vi("h", ["B", 4]), builders.vi("x", ["B", 3])],
        [builders.vi("h_next", ["B", 4]), builders.vi("y", ["B", 4])],
    )
    scan = h.make_node("Scan", ["h0", "X"], ["h_final", "Y"], body=body, num_scan_inputs=1)
    graph = h.make_graph(
        [scan],
        "rnn",
        [builders.vi("h0", ["B", 4]), builders.vi("X", ["T", "B", 3])],
        [builders.vi("h_final", ["B", 4]), builders.vi("Y", ["T", "B", 4])],
        initializer=[
            builders.init("W", rng.uniform(-0.15, 0.15, (3, 4)).astype(np.float32)),
            builders.init("R", rng.uniform(-0.3, 0.3, (4, 4)).astype(np.float32)),
        ],
    )
    return builders.model(graph)


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _const(graph: onnx.GraphProto, name: str, value) -> str:
    graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(value), name))
    return name


def before_scan(make_nodes) -> onnx.ModelProto:
    """The original with X replaced by ``make_nodes(graph, 'X', 'X_wrong')`` before the Scan."""
    model = _copy(original())
    graph = model.graph
    graph.node[0].input[1] = "X_wrong"
    for node in reversed(make_nodes(graph, "X", "X_wrong")):
        graph.node.insert(0, node)
    return model


def after_scan(output: str, make_nodes) -> onnx.ModelProto:
    """The original with graph output ``output`` recomputed by ``make_nodes(graph, raw, output)``."""
    model = _copy(original())
    graph = model.graph
    node = graph.node[0]
    node.output[:] = [f"{o}_raw" if o == output else o for o in node.output]
    graph.node.extend(make_nodes(graph, f"{output}_raw", output))
    return model


def slice_axis(graph, src, dst, axis: int, start: int, end: int) -> onnx.NodeProto:
    names = [_const(graph, f"{dst}_{k}", np.array([v], np.int64)) for k, v in (("s", start), ("e", end), ("a", axis))]
    return h.make_node("Slice", [src, *names], [dst])


def wrong_at_index(axis: int, index: int, eps: float = 0.05):
    """Nodes adding ``eps`` to position ``index`` of ``axis`` only (nothing when the axis is shorter)."""

    def make(graph, src, dst):
        big = np.iinfo(np.int64).max
        return [
            slice_axis(graph, src, f"{dst}_head", axis, 0, index),
            slice_axis(graph, src, f"{dst}_mid", axis, index, index + 1),
            h.make_node("Add", [f"{dst}_mid", _const(graph, f"{dst}_eps", np.float32(eps))], [f"{dst}_mid2"]),
            slice_axis(graph, src, f"{dst}_tail", axis, index + 1, big),
            h.make_node("Concat", [f"{dst}_head", f"{dst}_mid2", f"{dst}_tail"], [dst], axis=axis),
        ]

    return make


def clip_above_5(graph, src, dst):
    return [h.make_node("Clip", [src, "", _const(graph, "five", np.float32(5.0))], [dst])]


def clip_beyond(limit: float):
    def make(graph, src, dst):
        low, high = _const(graph, "low", np.float32(-limit)), _const(graph, "high", np.float32(limit))
        return [h.make_node("Clip", [src, low, high], [dst])]

    return make


def steps_past_4_scaled(graph, src, dst):
    big = np.iinfo(np.int64).max
    return [
        slice_axis(graph, src, "first4", 0, 0, 4),
        slice_axis(graph, src, "rest", 0, 4, big),
        h.make_node("Mul", ["rest", _const(graph, "k", np.float32(1.5))], ["rest2"]),
        h.make_node("Concat", ["first4", "rest2"], [dst], axis=0),
    ]


def one_region(graph, src, dst):
    """The last feature column of every step and item is off."""
    return wrong_at_index(2, 3)(graph, src, dst)


def scaled(factor: float, offset: float):
    def make(graph, src, dst):
        return [
            h.make_node("Mul", [src, _const(graph, "factor", np.float32(factor))], [f"{dst}_m"]),
            h.make_node("Add", [f"{dst}_m", _const(graph, "offset", np.float32(offset))], [dst]),
        ]

    return make


def reordered() -> onnx.ModelProto:
    model = _copy(original())
    outputs = list(model.graph.output)
    del model.graph.output[:]
    model.graph.output.extend(reversed(outputs))
    return model


RTOL, ATOL = TOLERANCES["float32"]

WRONG = {
    # Y: over seed 0's long sequence the final state forgets the clipped early steps
    "wrong only when an input exceeds 5": (lambda: before_scan(clip_above_5), "Y"),
    # issue 19: these two passed when sequences stopped at 12 steps and values at |x| 12
    "wrong only for |x| > 12": (lambda: before_scan(clip_beyond(12.0)), "Y"),
    "wrong only past step 12 (at step 40)": (lambda: after_scan("Y", wrong_at_index(0, 40)), "Y"),
    "wrong only past 4 steps": (lambda: before_scan(steps_past_4_scaled), "Y"),
    "outputs reordered": (reordered, "#0"),
    "wrong in one region": (lambda: after_scan("Y", one_region), "Y"),
    "wrong in one step": (lambda: after_scan("Y", wrong_at_index(0, 1)), "Y"),
    "wrong in one batch entry": (lambda: after_scan("Y", wrong_at_index(1, 1)), "Y"),
    "wrong in one output": (lambda: after_scan("h_final", scaled(1.0, 0.01)), "h_final"),
    # every element out by twice the tolerance: |d| = 2 (atol + rtol |y|)
    "off by just over the tolerance": (lambda: after_scan("Y", scaled(1 + 2 * RTOL, 2 * ATOL)), "Y"),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_every_deliberately_wrong_candidate_is_caught(name):
    build, failing_output = WRONG[name]
    result = compare_models(original(), build(), engine="ort", seeds=OPTIMIZE_SEEDS)
    assert not result.passed, f"{name}: {result.summary()}"
    failed = {c.name for comp in result.comparisons for c in comp.checks if not c.passed}
    assert failing_output in failed


def test_the_reference_executor_catches_them_too():
    for name in ("wrong only when an input exceeds 5", "wrong only for |x| > 12", "wrong only past 4 steps", "outputs reordered"):
        build, _ = WRONG[name]
        assert not compare_models(original(), build(), engine="reference", seeds=OPTIMIZE_SEEDS).passed, name


def test_just_inside_the_tolerance_passes_so_the_cases_above_test_the_inputs():
    candidate = after_scan("Y", scaled(1 + RTOL / 2, ATOL / 2))
    assert compare_models(original(), candidate, engine="ort", seeds=OPTIMIZE_SEEDS).passed
    assert compare_models(original(), original(), engine="ort", seeds=OPTIMIZE_SEEDS).passed


def test_synthesized_inputs_reach_the_saturated_region_and_long_sequences():
    result = compare_models(original(), original(), engine="ort", seeds=OPTIMIZE_SEEDS)
    lengths = sorted(comp.checks[1].shape[0] for comp in result.comparisons)
    assert lengths[0] == 1 and lengths[-1] >= 64
    from scanopt.inputs import InputSynthesizer

    x = InputSynthesizer(original()).feeds(0)["X"]
    assert np.abs(x).max() >= 20 and x.max() > 5 and x.min() < -5 and np.isfinite(x).all()
