"""hoist: state-independent body work leaves the loop (once, or batched as a new scan input).

Structure (what stays in the body) and numbers (onnxruntime and the reference executor) for
every rewrite; the reason for every decline; hypothesis-random recurrences with a liftable
per-step prefix.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from onnx import TensorProto as TP
from onnx import helper as h

import builders as b
from equivalence import assert_equivalent, ops
from map_builders import rand
from scanopt.pipeline import optimize
from test_vectorize_random import chains

MODELS = Path(__file__).resolve().parent.parent / "models"


def hoist(model, **options):
    """The pass's own verdicts (target portable: whether onnxruntime runs the hoisted loop
    faster is the cost policy's question, tests/test_cost.py and test_tune.py)."""
    options.setdefault("target", "portable")
    options.setdefault("portable_runtimes", [])  # the hoisted loop as written, not as OpenVINO needs it
    out, report = optimize(model, passes=["hoist"], verify=False, options=options)
    return out, [(o.applied, o.detail) for o in report.outcomes if o.pass_name == "hoist"]


def body_ops(model) -> dict:
    scan = next(n for n in model.graph.node if n.op_type == "Scan")
    body = next(a.g for a in scan.attribute if a.name == "body")
    return sorted(n.op_type for n in body.node)


def recurrence(nodes, elements, *, steps=4, opset=17, inits=None, state=("s", [2, 3]), outputs=("s_next",),
               input_axes=None, input_dirs=None):
    """s' = <nodes>(s, elements); scan outputs ``outputs`` (body values)."""
    name, shape = state
    body_in = [b.vi(name, shape)] + [b.vi(n, s) for n, s in elements]
    body_out = [b.vi("s_next", shape)] + [h.make_tensor_value_info(o, TP.FLOAT, None) for o in outputs]
    outs = list(outputs)
    copies = [h.make_node("Identity", [o], [f"{o}_y"]) for o in outs]
    body_out = [b.vi("s_next", shape)] + [h.make_tensor_value_info(f"{o}_y", TP.FLOAT, None) for o in outs]
    body = h.make_graph(list(nodes) + copies, "body", body_in, body_out)
    attrs = {}
    if input_axes:
        attrs["scan_input_axes"] = input_axes
    if input_dirs:
        attrs["scan_input_directions"] = input_dirs
    graph_inputs = [b.vi("S0", shape)]
    for j, (_, s) in enumerate(elements):
        full = list(s)
        axis = (input_axes or [0] * len(elements))[j]
        full.insert(axis, steps)
        graph_inputs.append(b.vi(f"X{j}", full))
    scan = h.make_node("Scan", ["S0"] + [f"X{j}" for j in range(len(elements))],
                       ["S"] + [f"Y{k}" for k in range(len(outs))], name="scan_cell", body=body,
                       num_scan_inputs=len(elements), **attrs)
    graph = h.make_graph([scan], "main", graph_inputs,
                         [b.vi("S", shape)] + [h.make_tensor_value_info(f"Y{k}", TP.FLOAT, None) for k in range(len(outs))],
                         initializer=[b.init(k, v) for k, v in (inits or {}).items()])
    return b.model(graph, opset)


W = rand(4, 3, seed=1)
R = rand(3, 3, seed=2)


# ---------------------------------------------------------------- samples
def test_input_projection_of_a_residual_rnn_leaves_the_loop():
    m = onnx.load(MODELS / "maps" / "cell_rnn_residual.onnx")
    out, outcomes = hoist(m)
    assert outcomes[0] == (True, "hoisted 2 body node(s) out of the loop (2 nodes before the Scan); "
                                 "1 per-step result(s) became scan inputs; 6 node(s) stay in the body")
    assert body_ops(out) == ["Add", "Add", "Identity", "MatMul", "Mul", "Tanh"]  # only h·R is left
    assert [n.op_type for n in out.graph.node] == ["MatMul", "Add", "Scan"]
    assert_equivalent(m, out, engine="both")


def test_per_step_input_normalization_leaves_the_loop():
    m = onnx.load(MODELS / "maps" / "cell_normalized_input.onnx")
    out, outcomes = hoist(m)
    assert outcomes[0][0], outcomes
    assert body_ops(out) == ["Add", "Identity", "Mul"]
    assert ops(out)["Gemm"] == 0 and ops(out)["MatMul"] == 1  # Gemm on a per-step operand: MatMul outside
    assert_equivalent(m, out, engine="both")


def test_in_the_default_pipeline_after_fuse_declines():
    m = onnx.load(MODELS / "maps" / "cell_rnn_residual.onnx")
    out, report = optimize(m, options={"target": "portable"})  # every pass, cost aside
    assert report.verification["passed"] is True
    applied = [(o.pass_name, o.detail) for o in report.outcomes if o.applied]
    # hoist, then canonicalize drops the original scan input, which the body no longer reads
    assert [p for p, _ in applied] == ["hoist", "canonicalize"]
    assert "Scan" in ops(out) and body_ops(out).count("MatMul") == 1


# ---------------------------------------------------------------- forms
def test_invariant_work_is_computed_once_and_captured():
    nodes = [h.make_node("Transpose", ["R"], ["RT"]), h.make_node("Mul", ["RT", "two"], ["R2"]),
             h.make_node("MatMul", ["s", "R2"], ["sr"]), h.make_node("Add", ["sr", "x"], ["s_next"])]
    m = recurrence(nodes, [("x", [2, 3])], inits={"R": R, "two": np.float32(2)})
    out, outcomes = hoist(m)
    assert outcomes[0][0]
    assert body_ops(out) == ["Add", "Identity", "MatMul"]
    assert_equivalent(m, out, engine="both")


@pytest.mark.parametrize("axes, dirs", [([1], [0]), ([0], [1]), ([-1], [1])])
def test_scan_inputs_on_other_axes_and_reversed(axes, dirs):
    nodes = [h.make_node("MatMul", ["x", "W"], ["xw"]), h.make_node("Tanh", ["xw"], ["t"]),
             h.make_node("Add", ["s", "t"], ["s_next"])]
    m = recurrence(nodes, [("x", [2, 4])], inits={"W": W}, input_axes=axes, input_dirs=dirs, opset=16,
                   outputs=("s_next", "t"))
    out, outcomes = hoist(m)
    assert outcomes[0][0], outcomes
    scan = next(n for n in out.graph.node if n.op_type == "Scan")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in scan.attribute}
    assert attrs["num_scan_inputs"] == 2
    assert attrs["scan_input_axes"] == axes + [0]
    assert attrs["scan_input_directions"] == dirs + [0]
    # 't' was a scan output: the body now outputs an Identity of the new scan input
    assert_equivalent(m, out, engine="both")


def test_opset_9_reverse_input_stays_in_the_loop():
    nodes = [h.make_node("Mul", ["x", "two"], ["x2"]), h.make_node("Add", ["s", "x2"], ["s_next"])]
    m = recurrence(nodes, [("x", [2, 3])], opset=9, input_dirs=[1], inits={"two": np.float32(2)})
    _, outcomes = hoist(m)
    assert outcomes == [(False, "nothing to hoist: every computing node depends on a state")]


# ---------------------------------------------------------------- declines
def test_a_map_is_left_to_vectorize():
    m = onnx.load(MODELS / "maps" / "map_elementwise.onnx")
    assert hoist(m)[1] == [(False, "no body node depends on a state: the Scan is a map (vectorize's case)")]


def test_nothing_but_state_work_is_declined():
    m = b.scan9_sum(opset=11)
    assert hoist(m)[1] == [(False, "nothing to hoist: every computing node depends on a state")]


def test_elementwise_only_per_step_work_is_not_worth_a_scan_input():
    m = b.scan9_sum(opset=11, weight=np.array([2.0, 0.5]))  # s' = s + x * W
    assert hoist(m)[1] == [(False, "nothing worth hoisting: the per-step work that could move is elementwise "
                                   "only (Mul 'xw'); as a new scan input it would cost as much per step as it saves")]


def test_an_unliftable_node_stays_with_its_dependents_and_the_reason():
    nodes = [h.make_node("LpNormalization", ["x"], ["xn"]), h.make_node("Add", ["s", "xn"], ["s_next"])]
    m = recurrence(nodes, [("x", [2, 3])])
    assert hoist(m)[1] == [(False, "nothing to hoist: every computing node depends on a state "
                                   "(LpNormalization 'LpNormalization->xn' reads a per-step value and is not among "
                                   "the ops vectorize can lift)")]


def test_the_memory_bound_keeps_a_large_projection_in_the_loop():
    nodes = [h.make_node("MatMul", ["x", "W"], ["xw"]), h.make_node("Add", ["s", "xw"], ["s_next"])]
    m = recurrence(nodes, [("x", [2, 4])], steps=50, inits={"W": W})
    assert hoist(m, vectorize_max_bytes=1000)[1] == [
        (False, "nothing to hoist: every computing node depends on a state ('xw' would exceed vectorize_max_bytes lifted)")
    ]
    assert hoist(m, vectorize_max_bytes=1200)[1][0][0]  # 50 x 24 bytes fits


def test_scan8_is_declined():
    assert hoist(b.scan8_sum(batch=2, steps=3))[1] == [
        (False, "opset-8 batched Scan: hoist handles Scan-9+ (the upgrade pass converts it first)")
    ]


# ---------------------------------------------------------------- random
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(chains())
def test_random_per_step_prefixes_are_hoisted(spec):
    if spec is None:
        return
    steps, nodes, inits, value, _, in_dir, _, _, _ = spec
    nodes = list(nodes) + [h.make_node("ReduceSum", [value], ["r"], keepdims=0),
                           h.make_node("Mul", ["s", "half"], ["sh"]), h.make_node("Add", ["sh", "r"], ["s_next"])]
    inits = {**inits, "half": np.float32(0.5)}
    m = recurrence(nodes, [("x", [2, 3]), ("u", [3])], steps=max(steps, 1), inits=inits, state=("s", []),
                   input_dirs=[in_dir, 0], outputs=("s_next", value))
    out, outcomes = hoist(m)
    assert outcomes[0][0], outcomes
    assert_equivalent(m, out, engine="both")


def test_inside_a_loop_body():
    cell = h.make_graph([h.make_node("MatMul", ["x", "W"], ["xw"]), h.make_node("Tanh", ["xw"], ["t"]),
                         h.make_node("Add", ["s", "t"], ["s2"]), h.make_node("Identity", ["s2"], ["y"])],
                        "cb", [b.vi("s", [3]), b.vi("x", [4])], [b.vi("s2", [3]), b.vi("y", [3])])
    loop_body = h.make_graph(
        [h.make_node("Identity", ["c_in"], ["c_out"]),
         h.make_node("Scan", ["s", "X"], ["s_next", "ys"], name="cell_scan", body=cell, num_scan_inputs=1)],
        "lb", [b.vi("i", [], TP.INT64), b.vi("c_in", [], TP.BOOL), b.vi("s", [3])],
        [b.vi("c_out", [], TP.BOOL), b.vi("s_next", [3])])
    graph = h.make_graph([h.make_node("Loop", ["trips", "", "s0"], ["s_final"], name="loop", body=loop_body)], "main",
                         [b.vi("trips", [], TP.INT64), b.vi("s0", [3]), b.vi("X", [6, 4])], [b.vi("s_final", [3])],
                         initializer=[b.init("W", rand(4, 3, seed=3))])
    m = b.model(graph, 16)
    out, outcomes = hoist(m)
    assert outcomes[0][0], outcomes
    loop = next(a.g for a in out.graph.node[0].attribute if a.name == "body")
    assert [n.op_type for n in loop.node] == ["Identity", "MatMul", "Tanh", "Scan"]
    assert_equivalent(m, out, engine="both")


def test_a_split_18_keeps_num_outputs_when_hoisted():
    """PyTorch's GRU cell chunks its input projection with Split-18 `num_outputs`; the hoisted
    Split must keep the attribute (onnxruntime refuses a Split with neither sizes nor count)."""
    m = onnx.load(MODELS / "cells" / "torch_bigru.onnx")
    out, outcomes = hoist(m)
    assert any(applied for applied, _ in outcomes)
    splits = [n for n in out.graph.node if n.op_type == "Split"]
    assert splits and all(any(a.name == "num_outputs" for a in n.attribute) for n in splits)
    assert_equivalent(m, out, engine="ort")
