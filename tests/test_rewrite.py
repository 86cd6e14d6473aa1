"""Edit helpers: new producers take over old output tensors; uses are redirected."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest

import builders as b
from scanopt.graph import NameAllocator, remove_node
from scanopt.ir import export_model, import_model
from scanopt.rewrite import Builder, Guard, rebind_outputs, replace_all_uses, replacing


def _run(m, feeds):
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def test_replacing_a_scan_keeps_output_names_and_values():
    """Replace the running-sum Scan by CumSum + Gather: same outputs, same names."""
    m = b.scan9_sum(steps=4)
    graph = import_model(m)
    scan = graph.nodes[0]
    s0, x = scan.inputs
    build = Builder(graph, NameAllocator(graph))
    axis = build.constant("axis", np.int64(0))
    csum = build.op("CumSum", [x, axis])
    y = build.op("Add", [csum, s0])
    last = build.op("Gather", [y, build.constant("last", np.int64(-1))], axis=0)
    rebind_outputs(scan, [last, y], graph)
    graph.cleanup()
    out = export_model(graph, m)
    assert [n.op_type for n in out.graph.node] == ["CumSum", "Add", "Gather"]
    assert [o.name for o in out.graph.output] == ["s_final", "Y"]
    feeds = {"s0": np.array([1.0, -1.0], np.float32), "X": np.arange(8, dtype=np.float32).reshape(4, 2)}
    want, got = _run(m, feeds), _run(out, feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6)


def test_rebinding_to_a_graph_input_uses_an_identity():
    m = b.scan9_sum()
    graph = import_model(m)
    scan = graph.nodes[0]
    s0 = scan.inputs[0]
    rebind_outputs(scan, [s0, None], graph)
    assert [n.op for n in graph.nodes] == ["Identity"]
    assert graph.nodes[0].outputs[0].name == "s_final"


def test_replace_all_uses_reaches_into_bodies():
    m = b.scan9_sum(weight=np.array([2.0, 3.0]))
    graph = import_model(m)
    body = graph.nodes[0].attrs["body"]
    w = next(n for n in body.nodes if n.op == "Mul").inputs[1]
    build = Builder(graph, NameAllocator(graph))
    w2 = build.constant("W_half", np.array([1.0, 1.5], np.float32))
    replace_all_uses(w, w2, graph)
    assert next(n for n in body.nodes if n.op == "Mul").inputs[1] is w2
    assert not w.outputs


def test_replacing_gives_the_nodes_position_the_append_start_and_a_named_builder():
    graph = gs.Graph()
    nodes = [gs.Node("Identity", name=f"n{i}") for i in range(3)]
    graph.nodes.extend(nodes)
    position, start, build = replacing(nodes[1], graph, NameAllocator(graph))
    assert (position, start) == (1, 3)
    assert build.op("Relu", [gs.Variable("x")]).name.startswith("n1_")
    with pytest.raises(ValueError, match="not in graph"):
        replacing(gs.Node("Identity", name="stray"), graph, NameAllocator(graph))


def _guarded_scan(steps):
    """scan9_sum's Scan behind If(Size(X) == 0) through a Guard: the then branch gives the
    initial state and X itself (empty), the else branch runs the Scan."""
    m = b.scan9_sum(steps=steps, weight=np.array([2.0, 3.0]))
    graph = import_model(m)
    scan = graph.nodes[0]
    s0, x = scan.inputs
    outputs = list(scan.outputs)
    names = NameAllocator(graph)
    outer = Builder(graph, names)
    remove_node(graph, scan)
    guard = Guard(names, "scan_empty", "scan_steps")
    scanned = guard.orelse.take(scan, "{}_scanned")
    empty = [guard.then.b.op("Identity", [s0]), guard.then.b.op("Identity", [x])]
    flag = outer.op("Equal", [outer.op("Size", [x]), outer.constant("zero", np.int64(0))])
    node = guard.close(outer, flag, outputs, empty, scanned)
    return m, graph, node, scanned


def test_a_guard_moves_the_node_into_a_branch_and_the_if_writes_its_outputs():
    """The Scan writes new values of its branch named and typed after its outputs; the If
    writes the outer tensors (names kept); the body's outer-scope read (W) still resolves;
    the guarded model runs zero steps, which onnxruntime's Scan-9 refuses."""
    m, graph, node, scanned = _guarded_scan("T")
    assert [t.name for t in scanned] == ["s_final_scanned", "Y_scanned"]
    assert [t.dtype for t in scanned] == [np.float32, np.float32] and scanned[1].shape == ["T", 2]
    assert node.op == "If" and [t.name for t in node.outputs] == ["s_final", "Y"]
    assert node.attrs["else_branch"].outputs == scanned
    out = export_model(graph, m)
    onnx.checker.check_model(out, full_check=True)
    assert [n.op_type for n in out.graph.node] == ["Size", "Equal", "If"]
    assert [o.name for o in out.graph.output] == ["s_final", "Y"]
    s0 = np.array([1.0, -1.0], np.float32)
    for steps in (3, 0):
        x = np.arange(2 * steps, dtype=np.float32).reshape(steps, 2)
        got = _run(out, {"s0": s0, "X": x})
        np.testing.assert_allclose(got["Y"], s0 + np.cumsum(x * [2.0, 3.0], axis=0), rtol=1e-6)
        np.testing.assert_allclose(got["s_final"], s0 + (x * [2.0, 3.0]).sum(axis=0), rtol=1e-6)


def test_a_branch_leaves_an_omitted_output_omitted_and_a_guard_checks_its_values():
    graph = gs.Graph()
    guard = Guard(NameAllocator(graph), "then", "else")
    named = gs.Variable("y", dtype=np.float32, shape=[3])
    made = guard.orelse.values([named, gs.Variable.empty()], "{}_form")
    assert made[0].name == "y_form" and made[0].shape == [3] and made[0].shape is not named.shape
    assert made[1].name == "" and made[1] is not named
    with pytest.raises(ValueError, match="writes 1 outputs: its branches give 2 and 1"):
        guard.close(Builder(graph, NameAllocator(graph)), gs.Variable("c"), [named], made, made[:1])
