"""Regression tests for defects an adversarial review of the rewriting passes found (hoist,
vectorize, unroll, canonicalize, upgrade, loop_to_scan, lift): each builds the smallest model
that showed the defect and checks the rewrite against the original."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h

import builders as b
from equivalence import assert_equivalent, ops
from scanopt.pipeline import optimize


def run_pass(model, passes, **options):
    options.setdefault("target", "portable")
    options.setdefault("portable_runtimes", [])
    out, report = optimize(model, passes=passes, verify=False, options=options)
    return out, [(o.pass_name, o.applied, o.detail) for o in report.outcomes]


# ---------------------------------------------------------------- hoist
def _hoist_concat_from_second_input():
    """s' = tanh(s * x0 + Concat(x1, C) @ W): the lifted Concat repeats the invariant C over the
    steps, which it counts on scan input 1; scan input 0 is read only by state-dependent work."""
    rng = np.random.default_rng(0)
    body = h.make_graph([
        h.make_node("Mul", ["s", "x0"], ["sx"]),
        h.make_node("Concat", ["x1", "C"], ["xc"], axis=0),
        h.make_node("MatMul", ["xc", "W"], ["p"]),
        h.make_node("Add", ["sx", "p"], ["s2"]),
        h.make_node("Tanh", ["s2"], ["s_next"]),
        h.make_node("Identity", ["s_next"], ["y"]),
    ], "body", [b.vi("s", [3]), b.vi("x0", [3]), b.vi("x1", [3])], [b.vi("s_next", [3]), b.vi("y", [3])])
    graph = h.make_graph(
        [h.make_node("Scan", ["S0", "X0", "X1"], ["S", "Y"], name="scan", body=body, num_scan_inputs=2)],
        "main", [b.vi("S0", [3]), b.vi("X0", [4, 3]), b.vi("X1", [4, 3])], [b.vi("S", [3]), b.vi("Y", [4, 3])],
        initializer=[b.init("W", rng.standard_normal((5, 3)).astype(np.float32)),
                     b.init("C", np.ones(2, np.float32))])
    return b.model(graph)


def test_hoist_counts_steps_on_a_scan_input_the_lifted_nodes_read():
    # before: KeyError in the rewrite (the step count was taken from scan input 0, which no
    # lifted node reads), and optimize() crashed on the model
    m = _hoist_concat_from_second_input()
    out, outcomes = run_pass(m, ["hoist"])
    assert ("hoist", True) in [(p, a) for p, a, _ in outcomes]
    assert ops(out)["Concat"] >= 2  # the lifted Concat and the step count's shape
    assert_equivalent(m, out)
