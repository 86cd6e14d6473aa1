"""Loop fission on hypothesis-generated state graphs: each state's next value reads old or
new values of random other states (cycles included), scan outputs read random values, in
random directions and axes, Scan-9+ and Scan-8 with sequence_lens. Split wherever the states
allow (option fission=always), the result must compute the same numbers (onnxruntime and
the reference executor) and hold one Scan per strongly connected group of states, which the
test works out on its own from the generator's reads (transitive closure)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

import scanopt
from equivalence import assert_equivalent, ops

W = 3  # every state and the scan input element are [W]


@st.composite
def state_graphs(draw):
    n = draw(st.integers(2, 4))
    states = []
    for i in range(n):
        # (state, "old"|"new"): a new value only of a state updated earlier in the body
        reads = draw(st.lists(st.tuples(st.integers(0, n - 1), st.sampled_from(["old", "new"])), max_size=3))
        reads = sorted({(j, kind if j < i else "old") for j, kind in reads})
        states.append((draw(st.sampled_from(["Tanh", "Add"])), reads))
    outputs = draw(st.lists(st.lists(st.tuples(st.integers(0, n - 1), st.sampled_from(["old", "new"])),
                                     max_size=2), max_size=3))
    version = draw(st.sampled_from([8, 9, 16]))
    in_dir = draw(st.integers(0, 1))
    out_dirs = [draw(st.integers(0, 1)) if version > 8 else 0 for _ in outputs]
    out_axes = [draw(st.integers(0, 1)) if version > 8 else 0 for _ in outputs]
    return n, states, outputs, version, in_dir, out_dirs, out_axes


def _model(n, states, outputs, version, in_dir, out_dirs, out_axes):
    """state i: s_i' = op(x·a_i + Σ c·read), op Tanh or (Add) s_i + that."""
    rng = np.random.default_rng(n + len(outputs))
    nodes, inits = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def value(j, kind):
        return f"s{j}" if kind == "old" else f"s{j}_next"

    for i, (op, reads) in enumerate(states):
        terms = [f"x_a{i}"]
        nodes.append(h.make_node("Mul", ["x", const(f"a{i}", rng.uniform(-1, 1, W))], [f"x_a{i}"]))
        for j, kind in reads:
            nodes.append(h.make_node("Mul", [value(j, kind), const(f"c{i}_{j}_{kind}", rng.uniform(-0.5, 0.5, W))],
                                     [f"t{i}_{j}_{kind}"]))
            terms.append(f"t{i}_{j}_{kind}")
        nodes.append(h.make_node("Sum", terms, [f"pre{i}"]))
        if op == "Tanh":
            nodes.append(h.make_node("Tanh", [f"pre{i}"], [f"s{i}_next"]))
        else:
            nodes.append(h.make_node("Add", [f"s{i}", f"pre{i}"], [f"s{i}_next"]))
    for k, reads in enumerate(outputs):
        nodes.append(h.make_node("Sum", ["x"] + [value(j, kind) for j, kind in reads], [f"y{k}"]))
    step = [W]
    body = h.make_graph(
        nodes, "body", [h.make_tensor_value_info(f"s{i}", TP.FLOAT, step) for i in range(n)]
        + [h.make_tensor_value_info("x", TP.FLOAT, step)],
        [h.make_tensor_value_info(f"s{i}_next", TP.FLOAT, step) for i in range(n)]
        + [h.make_tensor_value_info(f"y{k}", TP.FLOAT, step) for k in range(len(outputs))], initializer=inits)
    finals = [f"s{i}_n" for i in range(n)]
    ys = [f"Y{k}" for k in range(len(outputs))]
    vi = h.make_tensor_value_info
    if version == 8:
        attrs = {"directions": [in_dir]} if in_dir else {}
        scan = h.make_node("Scan", ["lens"] + [f"s{i}_0" for i in range(n)] + ["X"], finals + ys,
                           body=body, num_scan_inputs=1, **attrs)
        inputs = [vi("lens", TP.INT64, ["B"]), vi("X", TP.FLOAT, ["B", "T", W])]
        inputs += [vi(f"s{i}_0", TP.FLOAT, ["B", W]) for i in range(n)]
        outs = [vi(f, TP.FLOAT, ["B", W]) for f in finals] + [vi(y, TP.FLOAT, ["B", "T", W]) for y in ys]
    else:
        attrs = {"scan_input_directions": [in_dir]}
        if outputs:
            attrs.update(scan_output_directions=out_dirs, scan_output_axes=out_axes)
        scan = h.make_node("Scan", [f"s{i}_0" for i in range(n)] + ["X"], finals + ys, body=body, num_scan_inputs=1,
                           **attrs)
        inputs = [vi("X", TP.FLOAT, ["T", W])] + [vi(f"s{i}_0", TP.FLOAT, [W]) for i in range(n)]
        outs = [vi(f, TP.FLOAT, [W]) for f in finals]
        outs += [vi(y, TP.FLOAT, ["T", W] if a == 0 else [W, "T"]) for y, a in zip(ys, out_axes)]
    graph = h.make_graph([scan], "g", inputs, outs)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", version)], ir_version=8)


def _groups(n, states) -> int:
    """Strongly connected groups of the states: i depends on j when s_i' reads s_j (an Add
    state reads itself), or reads s_k' of a state k that depends on j."""
    direct = []
    for i, (op, reads) in enumerate(states):
        deps = {i} if op == "Add" else set()  # s_i + ...
        for j, kind in reads:
            deps |= {j} if kind == "old" else direct[j]
        direct.append(deps)
    reach = [set(d) for d in direct]
    for _ in range(n):
        reach = [r | set().union(*(reach[j] for j in r)) for r in reach]
    classes = {frozenset(j for j in range(n) if (j == i or j in reach[i]) and (i == j or i in reach[j])) for i in range(n)}
    return len(classes)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state_graphs())
def test_fission_over_random_state_graphs(graph):
    model = _model(*graph)
    out, report = scanopt.optimize(model, passes=["canonicalize"], options={"fission": "always"})
    groups = _groups(graph[0], graph[1])
    assert ops(out)["Scan"] == groups, [o.detail for o in report.outcomes]
    if groups > 1:
        assert report.verification["passed"] is True, report.verification
        assert_equivalent(model, out)
