"""canonicalize on hypothesis-generated Scans: random axes (negative too), directions,
dead and duplicate outputs, dead, cross-dependent and loop-invariant states, duplicate
scan inputs. Every result must compute the same numbers (onnxruntime and the reference
executor), reach the canonical form the generator predicts, and be a fixed point."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper as h

import builders as b
import scanopt
from equivalence import assert_equivalent, ops

E = (2, 3)  # the state shape; a scan element of rank e has shape E[2 - e:] (broadcasts to E)
T = 3


@dataclass
class Spec:
    opset: int
    xs: list  # (graph input index, element rank, axis as written, direction)
    states: list  # ("acc", scan input, other state or None) | ("invariant",)
    outputs: list  # (value, axis as written, direction): value ("x", i) | ("s_in", j) | ("s_out", j) | ("sum", i, j)
    read_finals: list  # bool per state
    read_outputs: list  # bool per scan output
    reader: str  # how read outputs are read: "graph" (graph outputs) or "node" (a Neg after the Scan)
    flipped_inputs: set  # graph inputs reversed (Slice, step -1) along the scan axis before the Scan
    flipped_outputs: set  # scan outputs whose only reader reverses them along the scan axis


@st.composite
def specs(draw):
    opset = draw(st.sampled_from([9, 11, 16]))
    neg_ok = opset >= 11
    xs = []
    for i in range(draw(st.integers(1, 3))):
        if xs and draw(st.booleans()):  # reuse an earlier graph input: a possible duplicate
            src, rank, axis, _ = xs[draw(st.integers(0, len(xs) - 1))]
            xs.append((src, rank, axis, draw(st.integers(0, 1))))
            continue
        rank = draw(st.integers(0, 2))
        axis = draw(st.integers(-(rank + 1) if neg_ok else 0, rank))
        xs.append((i, rank, axis, draw(st.integers(0, 1))))
    n = draw(st.integers(0, 2))
    states = []
    for j in range(n):
        if draw(st.integers(0, 2)) == 0:
            states.append(("invariant",))
        else:
            other = draw(st.sampled_from([None] + [o for o in range(n) if o != j]))
            states.append(("acc", draw(st.integers(0, len(xs) - 1)), other))
    values = [("x", i) for i in range(len(xs))]
    values += [(kind, j) for j in range(n) for kind in ("s_in", "s_out")]
    values += [("sum", i, j) for i in range(len(xs)) for j in range(n)]
    outputs = []
    for _ in range(draw(st.integers(0 if n else 1, 3))):
        reuse = outputs and draw(st.booleans())  # the same body value again: a possible duplicate
        value = outputs[draw(st.integers(0, len(outputs) - 1))][0] if reuse else draw(st.sampled_from(values))
        r = _value_rank(value, xs) + 1
        outputs.append((value, draw(st.integers(-r if neg_ok else 0, r - 1)), draw(st.integers(0, 1))))
    read_finals = [draw(st.booleans()) for _ in range(n)]
    read_outputs = [draw(st.booleans()) for _ in outputs]
    if not any(read_finals + read_outputs):
        (read_outputs if outputs else read_finals)[0] = True
    reader = draw(st.sampled_from(["graph", "node"]))
    flips_ok = opset >= 10  # Slice with steps
    flipped_inputs = {src for src, _, _, _ in xs if flips_ok and draw(st.booleans())}
    flipped_outputs = {k for k, read in enumerate(read_outputs) if read and flips_ok and draw(st.booleans())}
    return Spec(opset, xs, states, outputs, read_finals, read_outputs, reader, flipped_inputs, flipped_outputs)


def _value_rank(value, xs) -> int:
    return xs[value[1]][1] if value[0] == "x" else 2


def _stacked_shape(elem, axis):
    r = len(elem) + 1
    axis = axis + r if axis < 0 else axis
    return list(elem[:axis]) + [T] + list(elem[axis:])


def build(spec: Spec) -> onnx.ModelProto:
    n, m = len(spec.states), len(spec.xs)
    elem = [E[2 - rank:] for _, rank, _, _ in spec.xs]
    nodes = []
    s_out = []
    for j, state in enumerate(spec.states):
        if state[0] == "invariant":
            nodes.append(h.make_node("Identity", [f"s{j}"], [f"s{j}_next"]))
        else:
            _, i, other = state
            nodes.append(h.make_node("Add", [f"s{j}", f"x{i}"], [f"s{j}_acc"]))
            if other is None:
                nodes.append(h.make_node("Identity", [f"s{j}_acc"], [f"s{j}_next"]))
            else:
                nodes.append(h.make_node("Mul", [f"s{other}", "half"], [f"s{j}_half"]))
                nodes.append(h.make_node("Add", [f"s{j}_acc", f"s{j}_half"], [f"s{j}_next"]))
        s_out.append(f"s{j}_next")
    body_outputs = [b.vi(name, list(E)) for name in s_out]
    for k, (value, _, _) in enumerate(spec.outputs):
        src = {"x": lambda v: f"x{v[1]}", "s_in": lambda v: f"s{v[1]}", "s_out": lambda v: f"s{v[1]}_next"}
        if value[0] == "sum":
            nodes.append(h.make_node("Add", [f"x{value[1]}", f"s{value[2]}"], [f"y{k}"]))
        else:
            nodes.append(h.make_node("Identity", [src[value[0]](value)], [f"y{k}"]))
        shape = elem[value[1]] if value[0] == "x" else E
        body_outputs.append(b.vi(f"y{k}", list(shape)))
    body_inputs = [b.vi(f"s{j}", list(E)) for j in range(n)] + [b.vi(f"x{i}", list(elem[i])) for i in range(m)]
    body = h.make_graph(nodes, "body", body_inputs, body_outputs, initializer=[b.init("half", np.float32(0.5))])

    graph_inputs = [b.vi(f"init{j}", list(E)) for j in range(n)]
    seen = set()
    for (src, rank, axis, _), shape in zip(spec.xs, elem):
        if src not in seen:
            seen.add(src)
            graph_inputs.append(b.vi(f"X{src}", _stacked_shape(shape, axis)))
    finals = [f"final{j}" for j in range(n)]
    scan_outs = [f"Y{k}" for k in range(len(spec.outputs))]
    attrs = {
        "scan_input_axes": [a for _, _, a, _ in spec.xs],
        "scan_input_directions": [d for _, _, _, d in spec.xs],
    }
    if spec.outputs:
        attrs["scan_output_axes"] = [a for _, a, _ in spec.outputs]
        attrs["scan_output_directions"] = [d for _, _, d in spec.outputs]
    scan = h.make_node(
        "Scan", [f"init{j}" for j in range(n)] + [_scanned(src, spec) for src, _, _, _ in spec.xs], finals + scan_outs,
        name="scan", body=body, num_scan_inputs=m, **attrs,
    )
    out_shapes = [list(E)] * n + [
        _stacked_shape(elem[v[1]] if v[0] == "x" else E, a) for v, a, _ in spec.outputs
    ]
    graph_nodes, graph_outputs = [], []
    for src, _, axis, _ in spec.xs:
        if src in spec.flipped_inputs and not any(n.output[0] == f"X{src}_rev" for n in graph_nodes):
            graph_nodes.append(_reverse(f"X{src}", f"X{src}_rev", axis))
    graph_nodes.append(scan)
    for slot, (name, shape, read) in enumerate(zip(finals + scan_outs, out_shapes, spec.read_finals + spec.read_outputs)):
        if slot - n in spec.flipped_outputs:
            graph_nodes.append(_reverse(name, f"{name}_rev", spec.outputs[slot - n][1]))
            graph_outputs.append(b.vi(f"{name}_rev", shape))
        elif read and spec.reader == "graph":
            graph_outputs.append(b.vi(name, shape))
        elif read:
            graph_nodes.append(h.make_node("Neg", [name], [f"{name}_neg"]))
            graph_outputs.append(b.vi(f"{name}_neg", shape))
    constants = [b.init("rev_start", [-1]), b.init("rev_end", [np.iinfo(np.int64).min]), b.init("rev_step", [-1])]
    constants += [b.init(f"rev_axis{a}", [a]) for a in range(-3, 3)]
    used = {i for node in graph_nodes for i in node.input}
    initializers = [c for c in constants if c.name in used]
    return b.model(h.make_graph(graph_nodes, "main", graph_inputs, graph_outputs, initializer=initializers), spec.opset)


def _scanned(src: int, spec: Spec) -> str:
    return f"X{src}_rev" if src in spec.flipped_inputs else f"X{src}"


def _reverse(x: str, y: str, axis: int) -> onnx.NodeProto:
    """y = x reversed along ``axis`` (the whole axis, whatever its length)."""
    return h.make_node("Slice", [x, "rev_start", "rev_end", f"rev_axis{axis}", "rev_step"], [y])


def expected_form(spec: Spec) -> tuple[int, int, int]:
    """(states, scan inputs, scan outputs) of the canonical Scan, from the spec alone."""
    n = len(spec.states)
    effective = [(src, axis, d) for src, _, axis, d in spec.xs]
    canonical_x = [effective.index(e) for e in effective]  # first equal scan input

    def depends(value) -> tuple[set, set]:  # (states, scan inputs) a body value reads this step
        kind = value[0]
        if kind == "x":
            return set(), {canonical_x[value[1]]}
        if kind == "sum":
            return {value[2]}, {canonical_x[value[1]]}
        j = value[1]
        if kind == "s_out" and spec.states[j][0] == "acc":
            _, i, other = spec.states[j]
            return {j} | ({other} if other is not None else set()), {canonical_x[i]}
        return {j}, set()

    invariant = {j for j, s in enumerate(spec.states) if s[0] == "invariant"}
    distinct = []
    for k, ((value, _, d), read) in enumerate(zip(spec.outputs, spec.read_outputs)):
        root = ("x", canonical_x[value[1]]) if value[0] == "x" else value
        if value[0] == "sum":  # each is its own Add node
            root = ("sum", k)
        if value[0] == "s_out" and spec.states[value[1]][0] == "invariant":
            root = ("s_in", value[1])
        key = (root, d ^ (k in spec.flipped_outputs))  # every layout of one value: one axis-0 output
        if read and key not in [seen for seen, _ in distinct]:
            distinct.append((key, value))
    distinct = [(key, value) for key, value in distinct if not _moves_after_the_loop(spec, key, value, distinct, canonical_x)]
    kept = {j for j in range(n) if spec.read_finals[j] and j not in invariant}
    while True:
        reached_states = set()
        for _, value in distinct:
            reached_states |= depends(value)[0]
        for j in kept:
            reached_states |= depends(("s_out", j))[0]
        grown = kept | (reached_states - invariant)
        if grown == kept:
            break
        kept = grown
    used_x = set()
    for _, value in distinct:
        used_x |= depends(value)[1]
    for j in kept:
        used_x |= depends(("s_out", j))[1]
    return len(kept), max(1, len(used_x)), len(distinct)


def _moves_after_the_loop(spec: Spec, key, value, distinct, canonical_x) -> bool:
    """Whether canonicalize computes this output after the loop (passes/canonicalize/epilogue):
    an ``x_i + s_j`` that reads a value another kept output stacks in the same direction (x_i,
    or the old s_j), whose s_j is stacked so or loop-invariant (an outer value once the state
    goes), and whose x_i, when no output stacks it, is read from the scan input: forward,
    appending, not a reversal. Layouts match from the second round on: the first moves every
    axis to 0."""
    if value[0] != "sum":
        return False

    def stacked(root) -> bool:
        return any(other[0] == root and other[1] == key[1] for other, _ in distinct if other != key)

    i, j = value[1], value[2]
    x_stacked, s_stacked = stacked(("x", canonical_x[i])), stacked(("s_in", j))
    if not (x_stacked or s_stacked) or not (s_stacked or spec.states[j][0] == "invariant"):
        return False
    return x_stacked or not (spec.xs[i][3] or key[1] or spec.xs[i][0] in spec.flipped_inputs)


def _scan(model: onnx.ModelProto) -> onnx.NodeProto | None:
    return next((node for node in model.graph.node if node.op_type == "Scan"), None)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_random_scans_reach_the_canonical_form_with_the_same_numbers(spec):
    model = build(spec)
    onnx.checker.check_model(model, full_check=True)
    result, report = scanopt.optimize(model, passes=["canonicalize"], verify=False)
    n, m, k = expected_form(spec)
    scan = _scan(result)
    if n == 0 and k == 0:  # only loop-invariant finals were read: the Scan is gone
        assert scan is None and report.modified
    else:
        attrs = {a.name: h.get_attribute_value(a) for a in scan.attribute}
        assert "scan_input_axes" not in attrs and "scan_output_axes" not in attrs
        for key in ("scan_input_directions", "scan_output_directions"):
            assert key not in attrs or any(attrs[key])
        assert attrs["num_scan_inputs"] == m
        assert (len(scan.input) - m, len(scan.output) - n) == (n, k)
        assert ops(result)["Slice"] == 0  # every reversal folded into a direction
    if report.modified:
        assert_equivalent(model, result, engine="both", seeds=1)
        assert ops(result)["Transpose"] <= m + sum(spec.read_outputs)
    again, second = scanopt.optimize(result, passes=["canonicalize"], verify=False)
    assert not second.modified and again is result
