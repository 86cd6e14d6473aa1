"""unroll on hypothesis-generated Scans: random static lengths 0..8, numbers of states,
scan inputs and outputs, axes (negative ones too) and directions, at opsets before and
after Unsqueeze's axes became an input. The original and the unrolled model must agree
on onnxruntime and on the reference executor."""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper as h

import builders as b
from equivalence import assert_equivalent, ops
from scanopt.engines import run
from scanopt.passes import unroll as unroll_module
from scanopt.pipeline import optimize

ELEMENT = [2, 3]  # every state and per-step element


@st.composite
def scans(draw):
    opset = draw(st.sampled_from([9, 11, 13, 17]))
    steps = draw(st.integers(0, 8))
    n = draw(st.integers(0, 2))
    m = draw(st.integers(1, 2))
    k = draw(st.integers(0 if n else 1, 2))
    low = -3 if opset >= 11 else 0  # negative axes exist from Scan-11
    in_axes = draw(st.lists(st.integers(low, 2), min_size=m, max_size=m))
    out_axes = draw(st.lists(st.integers(low, 2), min_size=k, max_size=k))
    in_dirs = draw(st.lists(st.integers(0, 1), min_size=m, max_size=m))
    out_dirs = draw(st.lists(st.integers(0, 1), min_size=k, max_size=k))
    return opset, steps, n, m, k, in_axes, out_axes, in_dirs, out_dirs


def with_axis(shape, axis, size):
    shape = list(shape)
    shape.insert(axis if axis >= 0 else axis + len(shape) + 1, size)
    return shape


def scan_model(opset, steps, n, m, k, in_axes, out_axes, in_dirs, out_dirs) -> onnx.ModelProto:
    """acc = x_0 * W (+ x_1 * c); s_i' = s_i * (i + 0.5) + acc; y_j = s'_{j mod n} - x_{j mod m}
    (or x_{j mod m} * (j + 2) without states). W is an outer capture, c a body initializer."""
    nodes = [h.make_node("Mul", ["x0", "W"], ["acc0"])]
    acc = "acc0"
    if m == 2:
        nodes += [h.make_node("Mul", ["x1", "c"], ["x1c"]), h.make_node("Add", ["acc0", "x1c"], ["acc1"])]
        acc = "acc1"
    inits = [b.init("c", np.full(ELEMENT, 0.5, np.float32))] if m == 2 else []
    for i in range(n):
        inits.append(b.init(f"f{i}", np.float32(i + 0.5)))
        nodes += [h.make_node("Mul", [f"s{i}", f"f{i}"], [f"s{i}f"]), h.make_node("Add", [f"s{i}f", acc], [f"s{i}_next"])]
    for j in range(k):
        if n:
            nodes.append(h.make_node("Sub", [f"s{j % n}_next", f"x{j % m}"], [f"y{j}"]))
        else:
            inits.append(b.init(f"g{j}", np.float32(j + 2)))
            nodes.append(h.make_node("Mul", [f"x{j % m}", f"g{j}"], [f"y{j}"]))
    body = h.make_graph(
        nodes, "body",
        [b.vi(f"s{i}", ELEMENT) for i in range(n)] + [b.vi(f"x{j}", ELEMENT) for j in range(m)],
        [b.vi(f"s{i}_next", ELEMENT) for i in range(n)] + [b.vi(f"y{j}", ELEMENT) for j in range(k)],
        initializer=inits,
    )
    lists = {"scan_input_axes": in_axes, "scan_output_axes": out_axes,
             "scan_input_directions": in_dirs, "scan_output_directions": out_dirs}
    scan = h.make_node(
        "Scan", [f"S{i}" for i in range(n)] + [f"X{j}" for j in range(m)],
        [f"S{i}_final" for i in range(n)] + [f"Y{j}" for j in range(k)],
        name="scan", body=body, num_scan_inputs=m, **{key: v for key, v in lists.items() if v},
    )
    graph = h.make_graph(
        [scan], "main",
        [b.vi(f"S{i}", ELEMENT) for i in range(n)] + [b.vi(f"X{j}", with_axis(ELEMENT, a, steps)) for j, a in enumerate(in_axes)],
        [b.vi(f"S{i}_final", ELEMENT) for i in range(n)] + [b.vi(f"Y{j}", with_axis(ELEMENT, a, steps)) for j, a in enumerate(out_axes)],
        initializer=[b.init("W", np.array([[1.0, -2.0, 0.5], [0.25, 3.0, -1.0]], np.float32))],
    )
    return b.model(graph, opset)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scans())
def test_random_static_scans_unroll_to_the_same_numbers(params):
    opset, steps, n, m, k, *_ = params
    model = scan_model(*params)
    out, report = optimize(model, passes=["unroll"], verify=False, options={"unroll_max": 8})
    outcomes = [o for o in report.outcomes if o.pass_name == "unroll"]
    assert len(outcomes) == 1 and outcomes[0].applied, outcomes
    counts = ops(out)
    assert "Scan" not in counts
    assert counts["Gather"] == steps * m
    assert counts["Unsqueeze"] == steps * k
    assert counts["Concat"] == (k if steps > 1 else 0)
    if steps:
        assert_equivalent(model, out, seeds=1)
        return
    # onnxruntime fails on a zero-length Scan: the original runs on the reference executor
    assert_equivalent(model, out, engine="reference", seeds=1)
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    got = run(out, feeds, "ort")
    for i in range(n):
        np.testing.assert_array_equal(got[f"S{i}_final"], feeds[f"S{i}"])
    for j, axis in enumerate(params[6]):
        assert got[f"Y{j}"].shape == tuple(with_axis(ELEMENT, axis, 0))


def test_the_default_pipeline_threshold_is_the_module_constant():
    """Without unroll_max the pass uses DEFAULT_UNROLL_MAX: a Scan one step longer stays."""
    limit = unroll_module.DEFAULT_UNROLL_MAX
    params = (17, limit + 1, 1, 1, 1, [0], [0], [0], [0])
    out, report = optimize(scan_model(*params), passes=["unroll"], verify=False)
    assert "Scan" in ops(out)
    params = (17, limit, 1, 1, 1, [0], [0], [0], [0])
    out, report = optimize(scan_model(*params), passes=["unroll"], verify=False)
    assert "Scan" not in ops(out)


@st.composite
def scan8s(draw):
    batch = draw(st.integers(1, 3))
    steps = draw(st.integers(0, 4))
    n = draw(st.integers(0, 2))
    m = draw(st.integers(1, 2))
    k = draw(st.integers(0 if n else 1, 2))
    dirs = draw(st.lists(st.integers(0, 1), min_size=m, max_size=m))
    lens = draw(st.one_of(st.none(), st.lists(st.integers(0, steps), min_size=batch, max_size=batch)))
    return batch, steps, n, m, k, dirs, lens


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scan8s())
def test_random_scan8_unroll_in_place(params):
    """Scan-8 with random batch, length 0..4, states, inputs, outputs, directions and per-item
    lengths in [0, T] (the reference executor: onnxruntime rejects length 0 and T = 0)."""
    batch, steps, n, m, k, dirs, lens = params
    body = scan_model(9, steps, n, m, k, [0] * m, [0] * k, [0] * m, [0] * k).graph.node[0].attribute
    body = next(a.g for a in body if a.name == "body")
    inputs = ["L" if lens is not None else ""] + [f"S{i}" for i in range(n)] + [f"X{j}" for j in range(m)]
    scan = h.make_node("Scan", inputs, [f"S{i}_final" for i in range(n)] + [f"Y{j}" for j in range(k)],
                       name="scan8", body=body, num_scan_inputs=m, directions=dirs)
    graph_inputs = ([b.vi("L", [batch], onnx.TensorProto.INT64)] if lens is not None else [])
    graph_inputs += [b.vi(f"S{i}", [batch] + ELEMENT) for i in range(n)]
    graph_inputs += [b.vi(f"X{j}", [batch, steps] + ELEMENT) for j in range(m)]
    graph = h.make_graph(
        [scan], "main", graph_inputs,
        [b.vi(f"S{i}_final", [batch] + ELEMENT) for i in range(n)] + [b.vi(f"Y{j}", [batch, steps] + ELEMENT) for j in range(k)],
        initializer=[b.init("W", np.array([[1.0, -2.0, 0.5], [0.25, 3.0, -1.0]], np.float32))],
    )
    model = b.model(graph, 8)
    out, report = optimize(model, passes=["unroll"], verify=False, options={"unroll_max": 8})
    outcomes = [o for o in report.outcomes if o.pass_name == "unroll"]
    assert len(outcomes) == 1 and outcomes[0].applied, outcomes
    assert "Scan" not in ops(out) and out.opset_import[0].version == 8
    rng = np.random.default_rng(batch * 10 + steps)
    feeds = {f"S{i}": rng.standard_normal([batch] + ELEMENT).astype(np.float32) for i in range(n)}
    feeds.update({f"X{j}": rng.standard_normal([batch, steps] + ELEMENT).astype(np.float32) for j in range(m)})
    if lens is not None:
        feeds["L"] = np.array(lens, np.int64)
    assert_equivalent(model, out, inputs=[feeds], engine="reference")
