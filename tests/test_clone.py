"""scanopt.clone: copies of a body get fresh names at every level, read their own values
in nested graphs, keep outer captures, hoist the body's constants, and leave the original
(and the input proto) untouched."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper as h

import builders as b
from equivalence import assert_valid
from scanopt.clone import BodyInliner, clone_graph
from scanopt.graph import NameAllocator, walk_graphs
from scanopt.ir import export_model, import_model
from scanopt.protos import walk_proto_graphs


def _run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def _names(graph: gs.Graph) -> list[str]:
    """Every value and node name defined at every level: graph inputs, node names and
    outputs, initializers (each tensor object once)."""
    seen: dict[int, str] = {}
    nodes = []
    for level in walk_graphs(graph):
        g = level.graph
        seen.update((id(t), t.name) for t in g.inputs)
        for node in g.nodes:
            nodes.append(node.name)
            seen.update((id(t), t.name) for t in node.outputs)
            seen.update((id(t), t.name) for t in node.inputs if isinstance(t, gs.Constant))
    return [n for n in nodes if n] + list(seen.values())


def _body_model() -> onnx.ModelProto:
    """A Scan whose body has an initializer C, a Constant node K, reads outer W, and holds an
    If whose branches read the body's input x, the outer W and their own initializer."""
    then_branch = h.make_graph(
        [h.make_node("Mul", ["x", "W"], ["t_out"], name="then_mul")],
        "then", [], [b.vi("t_out", [2])],
    )
    else_branch = h.make_graph(
        [h.make_node("Add", ["x", "E"], ["e_out"], name="else_add")],
        "else", [], [b.vi("e_out", [2])], initializer=[b.init("E", np.array([10.0, 20.0], np.float32))],
    )
    body = h.make_graph(
        [
            h.make_node("Constant", [], ["K"], name="k_const", value=b.init("k", np.array([1.0, -1.0], np.float32))),
            h.make_node("If", ["flag"], ["branch"], name="pick", then_branch=then_branch, else_branch=else_branch),
            h.make_node("Mul", ["branch", "C"], ["scaled"], name="scale"),
            h.make_node("Add", ["s", "scaled"], ["s_mid"], name="acc"),
            h.make_node("Add", ["s_mid", "K"], ["s_next"], name="shift"),
            h.make_node("Identity", ["s_next"], ["y"], name="emit"),
        ],
        "body",
        [b.vi("s", [2]), b.vi("x", [2])],
        [b.vi("s_next", [2]), b.vi("y", [2])],
        initializer=[b.init("C", np.array([0.5, 3.0], np.float32))],
    )
    scan = h.make_node("Scan", ["s0", "X"], ["s_final", "Y"], name="scan", body=body, num_scan_inputs=1)
    graph = h.make_graph(
        [scan], "main",
        [b.vi("flag", [], TP.BOOL), b.vi("s0", [2]), b.vi("X", [2, 2])],
        [b.vi("s_final", [2]), b.vi("Y", [2, 2])],
        initializer=[b.init("W", np.array([2.0, -3.0], np.float32))],
    )
    return b.model(graph, 16)


def _two_copies():
    """The body inlined twice into the top graph, chained: out = body(body(s0, X[0]), X[1])."""
    m = _body_model()
    graph = import_model(m)
    scan = graph.nodes[0]
    s0, x = scan.inputs
    body = scan.attrs["body"]
    names = NameAllocator(graph)
    inliner = BodyInliner(body, graph, names)
    rows = []
    for i in range(2):
        row = gs.Variable(names.fresh(f"row{i}"), dtype=np.float32, shape=[2])
        index = gs.Constant(names.fresh(f"i{i}"), np.array(i, np.int64))
        graph.nodes.append(gs.Node("Gather", inputs=[x, index], outputs=[row], attrs={"axis": 0}))
        rows.append(row)
    state = s0
    ys = []
    for i, row in enumerate(rows):
        state, y = inliner.inline([state, row], suffix=f"_c{i}")
        ys.append(y)
    return m, graph, scan, body, state, ys


def test_inlined_copies_compute_the_body_and_every_name_is_fresh():
    m, graph, scan, body, state, ys = _two_copies()
    body_names = _names(body)
    graph.nodes.remove(scan)
    graph.outputs = [state, ys[0], ys[1]]
    for t in graph.outputs:
        t.dtype = np.float32
    graph.cleanup()
    out = export_model(graph, m)
    assert_valid(out)  # onnx.checker rejects a name defined twice at any level
    assert _names(body) == body_names  # the original body is untouched
    defined = _names(import_model(out))
    assert len(defined) == len(set(defined))
    # two If copies, each with two fresh branches; the branches' own initializer copied per copy
    ifs = [n for n in out.graph.node if n.op_type == "If"]
    assert len(ifs) == 2 and ifs[0].name != ifs[1].name
    branch_inits = [i.name for g in walk_proto_graphs(out.graph) for i in g.initializer if i.name.startswith("E")]
    assert len(branch_inits) == 2 and "E" not in branch_inits
    # the body's initializer C and Constant node K are hoisted once; outer W is not copied
    assert [n.op_type for n in out.graph.node].count("Constant") == 1
    top_inits = [i.name for i in out.graph.initializer]
    assert sum(n.startswith("C") for n in top_inits) == 1
    assert sum(n.startswith("W") for n in top_inits) == 1
    w, c, k, e = np.array([2.0, -3.0]), np.array([0.5, 3.0]), np.array([1.0, -1.0]), np.array([10.0, 20.0])
    s0 = np.array([1.0, 2.0], np.float32)
    x = np.array([[1.0, 2.0], [3.0, 5.0]], np.float32)
    for flag in (True, False):
        got = _run(out, {"flag": np.array(flag), "s0": s0, "X": x})
        s = s0.astype(np.float64)
        expected_ys = []
        for row in x:
            s = s + (row * w if flag else row + e) * c + k
            expected_ys.append(s)
        values = list(got.values())
        np.testing.assert_allclose(values[0], s, rtol=1e-6)
        np.testing.assert_allclose(values[1], expected_ys[0], rtol=1e-6)
        np.testing.assert_allclose(values[2], expected_ys[1], rtol=1e-6)


def test_nested_graph_reads_are_rewired_to_the_copy_and_outer_reads_kept():
    _, graph, scan, body, _, _ = _two_copies()
    original_x = body.inputs[1]
    w = body.nodes[1].attrs["then_branch"].nodes[0].inputs[1]
    assert w.name == "W"
    copies = [n for n in graph.nodes if n.op == "If"]
    assert len(copies) == 2
    for copy in copies:
        then_mul = copy.attrs["then_branch"].nodes[0]
        else_add = copy.attrs["else_branch"].nodes[0]
        assert then_mul.inputs[1] is w  # the outer capture is the same tensor object
        assert then_mul.inputs[0] is not original_x and then_mul.inputs[0].name.startswith("row")
        assert else_add.inputs[0] is then_mul.inputs[0]
        assert copy.attrs["then_branch"] is not body.nodes[1].attrs["then_branch"]
    assert copies[0].attrs["then_branch"].nodes[0].inputs[0] is not copies[1].attrs["then_branch"].nodes[0].inputs[0]


def test_copies_keep_declared_types_and_shapes():
    _, graph, _, body, state, ys = _two_copies()
    assert state.dtype == np.float32 and state.shape == [2]
    mid = next(t for n in graph.nodes for t in n.outputs if t.name.startswith("s_mid"))
    assert mid.name == "s_mid_c0" and mid.shape is None  # the body declared none: none invented


def test_clone_graph_is_detached_and_bindings_redirect_captures():
    m = _body_model()
    graph = import_model(m)
    scan = graph.nodes[0]
    body = scan.attrs["body"]
    names = NameAllocator(graph)
    w2 = gs.Constant(names.fresh("W_half"), np.array([1.0, -1.5], np.float32))
    copy = clone_graph(body, names, suffix="_v2", bindings={"W": w2})
    assert {t.name for t in copy.inputs} == {"s_v2", "x_v2"}
    then_mul = next(n for n in copy.nodes if n.op == "If").attrs["then_branch"].nodes[0]
    assert then_mul.inputs[1] is w2
    assert not set(_names(copy)) & set(_names(body))
    # used as the body of the Scan instead of the original: valid, and W_half is what it reads
    scan.attrs["body"] = copy
    out = export_model(graph, m)
    assert_valid(out)
    feeds = {"flag": np.array(True), "s0": np.zeros(2, np.float32), "X": np.ones((2, 2), np.float32)}
    got = _run(out, feeds)
    np.testing.assert_allclose(got["s_final"], 2 * (np.array([1.0, -1.5]) * [0.5, 3.0] + [1.0, -1.0]), rtol=1e-6)


def test_copying_lazily_loaded_initializers_leaves_the_input_proto_alone():
    """gs's exporter renames the TensorProto a lazily loaded constant came from; a copy must
    not share it, or exporting the copy renames the original model's initializer."""
    m2 = b.scan9_sum(steps=2)
    m2.graph.node[0].attribute[0].g.initializer.append(b.init("bias", np.ones(2, np.float32)))
    m2.graph.node[0].attribute[0].g.node[0].input[1] = "xb"
    m2.graph.node[0].attribute[0].g.node.insert(0, h.make_node("Add", ["x", "bias"], ["xb"]))
    before = m2.SerializeToString()  # body: xb = x + bias (bias a body initializer)
    graph = import_model(m2)
    scan = graph.nodes[0]
    names = NameAllocator(graph)
    inliner = BodyInliner(scan.attrs["body"], graph, names)
    s_final, y = inliner.inline(list(scan.inputs[:1]) + [gs.Variable(names.fresh("row"), np.float32, [2])])
    export_model(graph, m2)
    assert m2.SerializeToString() == before
