"""The indexes and caches that keep the optimizer's cost linear in the model (README,
"Optimizer cost: linear in the model"): each must give the answer a fresh walk would,
after the edits a pass makes. Speed itself is measured in benchmarks/bench_scale.py."""

from __future__ import annotations

import gc

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

import cell_builders as cb
from equivalence import assert_equivalent, ops
from scanopt.errors import InvalidModelError
from scanopt.graph import NameAllocator, cleanup, editing, has_node, output_positions, remove_node, walk_graphs
from scanopt.ir import import_model
from scanopt.pass_api import PassContext
from scanopt.pipeline import select_passes
from scanopt.rewrite import is_graph_output, replace_all_uses
from scanopt.scan_view import ScanView
from scanopt.shapes import ShapeTable
from scanopt.validate import validate_model

vi = h.make_tensor_value_info
F = TP.FLOAT
T, B, I, H = 4, 2, 3, 4


def _rnn_body(tag: str, hidden: int = H) -> onnx.GraphProto:
    nodes = [h.make_node("MatMul", ["x_t", f"w_{tag}"], [f"xw_{tag}"]),
             h.make_node("MatMul", ["h_in", f"r_{tag}"], [f"hr_{tag}"]),
             h.make_node("Add", [f"xw_{tag}", f"hr_{tag}"], [f"pre_{tag}"]),
             h.make_node("Tanh", [f"pre_{tag}"], ["h_out"]),
             h.make_node("Identity", ["h_out"], ["y_t"])]
    return h.make_graph(nodes, f"body_{tag}", [vi("h_in", F, [B, hidden]), vi("x_t", F, [B, I])],
                        [vi("h_out", F, [B, hidden]), vi("y_t", F, [B, hidden])])


def shared_x_model(directions: list[int], hiddens: list[int] | None = None) -> onnx.ModelProto:
    """One RNN Scan per entry of ``directions`` (1: scans X in reverse and prepends its
    outputs), each with its own weights and hidden size, all reading the graph input X."""
    rng = np.random.default_rng(0)
    hiddens = hiddens or [H] * len(directions)
    nodes, inits, ins, outs = [], [], [vi("X", F, [T, B, I])], []
    for k, (d, hid) in enumerate(zip(directions, hiddens)):
        inits += [numpy_helper.from_array((rng.standard_normal((I, hid)) * 0.4).astype(np.float32), f"w_{k}"),
                  numpy_helper.from_array((rng.standard_normal((hid, hid)) * 0.4).astype(np.float32), f"r_{k}")]
        nodes.append(h.make_node("Scan", [f"h0_{k}", "X"], [f"h_{k}", f"y_{k}"], name=f"scan_{k}", num_scan_inputs=1,
                                 body=_rnn_body(str(k), hid), scan_input_directions=[d], scan_output_directions=[d]))
        ins.append(vi(f"h0_{k}", F, [B, hid]))
        outs += [vi(f"h_{k}", F, [B, hid]), vi(f"y_{k}", F, [T, B, hid])]
    graph = h.make_graph(nodes, "shared_x", ins, outs, initializer=inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


# -- fuse: bidirectional partners among many Scans over one X ---------------------------------

def test_pairs_among_many_scans_over_one_x_each_fuse_once():
    """Three forward and three reverse Scans over one X: X's readers are sorted by direction
    once, and each pair fused removes both, so the next forward Scan skips the reverse one
    already taken and pairs with another."""
    model = shared_x_model([0, 1, 0, 1, 1, 0])
    out, outcomes = cb.fuse(model)
    assert sum(o.applied for o in outcomes) == 3, [o.detail for o in outcomes]
    merged = [o.detail.split("merged with Scan ")[1].split(",")[0] for o in outcomes if o.applied]
    assert len(set(merged)) == 3
    assert ops(out)["Scan"] == 0 and ops(out)["RNN"] == 3
    assert all(h.get_attribute_value(a) == b"bidirectional" for n in cb.guarded_nodes(out.graph) if n.op_type == "RNN"
               for a in n.attribute if a.name == "direction")
    assert_equivalent(model, out)


def test_only_a_partner_of_matching_size_is_taken():
    """The reverse Scan of another hidden size is a candidate by direction but not a partner."""
    model = shared_x_model([0, 1, 1], hiddens=[H, H + 1, H])
    out, outcomes = cb.fuse(model)
    detail = {o.node: o.detail for o in outcomes if o.applied}
    assert "merged with Scan 'scan_2'" in detail["scan_0"]
    assert "bidirectional" not in detail["scan_1"]
    assert_equivalent(model, out)


def _dry_run(model):
    graph = import_model(model)
    ctx = PassContext(opset=17, names=NameAllocator(graph), shapes=ShapeTable(model), options={"target": "portable"})
    fuse = select_passes(["fuse"])[0]
    return graph, ctx, fuse


def test_dry_run_partner_lists_are_refreshed_after_a_rewrite():
    """A dry run (another pass asking whether fuse would match) keeps X's readers in
    ctx.memo; a rewrite in between (ctx.edits) may add a Scan reading X, which must be seen."""
    model = shared_x_model([0, 1])
    graph, ctx, fuse = _dry_run(model)
    forward, reverse = graph.nodes
    view = ScanView.from_gs(forward, 17, ctx.shapes)
    level = next(walk_graphs(graph))
    remove_node(graph, reverse)
    saved = list(reverse.inputs)
    reverse.inputs.clear()  # not reading X: the forward Scan has no partner
    assert len(type(fuse)().match(forward, view, level, ctx).dirs) == 1
    reverse.inputs.extend(saved)  # a pass puts a reverse Scan over X back ...
    graph.nodes.append(reverse)
    ctx.edits += 1  # ... and counts it, as ScanPass does after each rewrite
    plan = type(fuse)().match(forward, view, level, ctx)
    assert [d.node.name for d in plan.dirs] == ["scan_0", "scan_1"]


# -- graph: node and output indexes inside a pass ---------------------------------------------

def _chain(n: int) -> gs.Graph:
    x = gs.Variable("x", np.float32, [2])
    graph, prev = gs.Graph(inputs=[x]), x
    for i in range(n):
        out = gs.Variable(f"v{i}", np.float32, [2])
        graph.nodes.append(gs.Node("Neg", name=f"neg{i}", inputs=[prev], outputs=[out]))
        prev = out
    graph.outputs = [prev]
    return graph


def test_has_node_inside_a_pass_follows_removals_appends_and_other_edits():
    graph, other = _chain(6), _chain(2)
    nodes = list(graph.nodes)
    with editing(graph):
        assert has_node(graph, nodes[4])  # builds the index
        remove_node(graph, nodes[1])
        assert has_node(graph, nodes[4]) and not has_node(graph, nodes[1])
        extra = gs.Node("Neg", name="extra", inputs=[nodes[5].outputs[0]], outputs=[gs.Variable("e", np.float32)])
        graph.nodes.append(extra)  # appended: indexed on the next look
        assert has_node(graph, extra)
        graph.nodes.insert(0, nodes[1])  # an edit the index does not know: hits are checked
        assert has_node(graph, nodes[1]) and has_node(graph, nodes[5]) and has_node(graph, extra)
        assert not has_node(graph, other.nodes[0])
        remove_node(graph, extra)
        assert not has_node(graph, extra) and [n.name for n in graph.nodes][-1] == "neg5"
    assert has_node(graph, nodes[0]) and not has_node(graph, extra)  # outside a pass: a scan


def test_graph_outputs_listed_twice_are_all_redirected_inside_a_pass():
    graph = _chain(3)
    last, first = graph.outputs[0], graph.nodes[0].outputs[0]
    graph.outputs = [last, first, last]
    with editing(graph):
        assert output_positions(last, graph) == [0, 2] and is_graph_output(first, graph)
        replace_all_uses(last, first, graph)
        assert output_positions(first, graph) == [0, 1, 2] and not is_graph_output(last, graph)
        graph.outputs.reverse()  # positions the index holds are checked, then the list scanned
        assert output_positions(first, graph) == [0, 1, 2]
    assert [t.name for t in graph.outputs] == ["v0"] * 3


def test_a_body_output_set_by_a_pass_directly_is_seen():
    """Passes edit body output lists in place (hoist, upgrade): bodies are never indexed."""
    top, body = _chain(2), _chain(2)
    with editing(top):
        body.outputs[0] = body.nodes[0].outputs[0]
        assert is_graph_output(body.nodes[0].outputs[0], body)


# -- cleanup and validation at depth ------------------------------------------------------------

def _nested(depth: int, capture: str = "X") -> onnx.ModelProto:
    """If inside If ``depth`` deep; the innermost then-branch reads ``capture`` from the
    top graph. Each level's outputs come from the level below."""
    def level(d):
        if d == depth:
            return [h.make_node("Neg", [capture], [f"n{d}"])], f"n{d}"
        nodes, out = level(d + 1)
        then_g = h.make_graph(nodes, f"then{d}", [], [vi(out, F, [2])])
        else_g = h.make_graph([h.make_node("Identity", ["X"], [f"e{d}"])], f"else{d}", [], [vi(f"e{d}", F, [2])])
        return [h.make_node("If", ["c"], [f"if{d}"], then_branch=then_g, else_branch=else_g)], f"if{d}"

    nodes, out = level(1)
    nodes = [h.make_node("Relu", ["X0"], ["X"]), h.make_node("Identity", ["X"], ["unused"])] + nodes
    graph = h.make_graph(nodes, "m", [vi("X0", F, [2]), vi("c", TP.BOOL, [])], [vi(out, F, [2])])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def test_cleanup_keeps_the_producer_of_a_value_read_30_levels_down():
    graph = import_model(_nested(30))
    cleanup(graph)
    assert [n.op for n in graph.nodes] == ["Relu", "If"]  # the unused Identity went, Relu stays


def test_validation_sees_outer_names_at_depth_and_not_a_sibling_branchs():
    assert validate_model(_nested(30)) == []
    # the innermost level reads a name only the else-branch one level up defines
    with pytest.raises(InvalidModelError, match="reads 'e29', which nothing defines"):
        validate_model(_nested(30, capture="e29"))


def test_validation_orders_by_captures_at_every_level():
    """A value a body 20 levels down reads, produced after the node holding it: untidy
    (sorted on the way out); a cycle through such a capture: broken."""
    model = _nested(20)
    relu = model.graph.node[0]
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(nodes[1:] + [relu])
    assert any("out of topological order in the main graph" in w for w in validate_model(model))
    cyclic = _nested(20)
    cyclic.graph.node[0].input[0] = "if1"
    cyclic.graph.input[0].name = "unread"
    with pytest.raises(InvalidModelError, match="cycle"):
        validate_model(cyclic)


def test_optimize_leaves_the_callers_collector_settings_alone():
    model = shared_x_model([0, 1])
    gc.freeze()
    frozen = gc.get_freeze_count()
    try:
        cb.fuse(model)
        # neither frozen again nor unfrozen (frozen objects freed by reference counting
        # may lower the count)
        assert 0 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()
    cb.fuse(model)
    assert gc.get_freeze_count() == 0 and gc.isenabled()


def test_a_tidy_model_is_checked_as_read():
    """With the bytes it was parsed from, a tidy model goes to onnx.checker as those bytes
    (no second serialization): what the checker rejects in them is rejected."""
    good = shared_x_model([0])
    broken = onnx.ModelProto()
    broken.CopyFrom(good)
    broken.graph.node[0].attribute.add().CopyFrom(h.make_attribute("num_scan_inputs", 1))  # listed twice
    assert validate_model(good, serialized=good.SerializeToString()) == []
    with pytest.raises(InvalidModelError, match="onnx.checker rejects it"):
        validate_model(good, serialized=broken.SerializeToString())
    with pytest.raises(InvalidModelError, match="onnx.checker rejects it"):
        validate_model(broken)


def test_a_pass_that_rewrites_nothing_leaves_the_node_order_alone():
    """No rewrite, no sort at the end of the pass: an unsorted graph stays as it is."""
    from scanopt.pass_api import ScanPass, Skip

    class Declines(ScanPass):
        name = "declines"

        def match(self, node, view, level, ctx):
            return Skip("no")

    model = shared_x_model([0, 1])
    graph = import_model(model)
    graph.nodes.append(gs.Node("Identity", inputs=[graph.nodes[0].outputs[0]], outputs=[gs.Variable("late", np.float32)]))
    graph.nodes.insert(0, graph.nodes.pop())  # reads h_0 before the Scan computes it
    order = [n.op for n in graph.nodes]
    ctx = PassContext(opset=17, names=NameAllocator(graph), shapes=ShapeTable(model))
    assert not Declines()(graph, ctx).modified
    assert [n.op for n in graph.nodes] == order


def test_walks_are_pre_order_at_depth():
    """The iterative walks give the order the recursive definition does: a graph, then each
    body of its nodes in node order, each body's own bodies before its next sibling."""
    from scanopt.graph import subgraphs_of
    from scanopt.protos import attribute_graphs, walk_proto_graphs

    model = _nested(25)

    def proto_reference(g):
        yield g.name
        for node in g.node:
            for attr in node.attribute:
                for sub in attribute_graphs(attr):
                    yield from proto_reference(sub)

    def gs_reference(g, depth=0):
        yield g.name, depth
        for node in g.nodes:
            for _, sub in subgraphs_of(node):
                yield from gs_reference(sub, depth + 1)

    names = [g.name for g in walk_proto_graphs(model.graph)]
    assert names == list(proto_reference(model.graph)) and names[:4] == ["m", "else1", "then1", "else2"]
    graph = import_model(model)
    assert [(lv.graph.name, lv.depth) for lv in walk_graphs(graph)] == list(gs_reference(graph))


# -- inspect: linear in the number of Scans ------------------------------------------------------

def _graphs_walked_by_inspect(count: int, monkeypatch) -> int:
    """How many node visits the walks of the model make while inspect describes ``count``
    Scans with every pass's dry run (walk_graphs lists each node's bodies through
    subgraphs_of, looked up at call time)."""
    import scanopt.graph as graph_module
    from scanopt.chooser import Chooser
    from scanopt.inspect import describe_scans
    from scanopt.pass_api import ScanPass

    model = shared_x_model([k % 2 for k in range(count)])
    scans = list(model.graph.node)
    del model.graph.node[:]
    for k, scan in enumerate(scans):  # each over its own copy of X, as exporters write it
        model.graph.node.append(h.make_node("Identity", ["X"], [f"x_{k}"]))
        scan.input[-1] = f"x_{k}"
        model.graph.node.append(scan)
    graph = import_model(model)
    options = {"target": "onnxruntime"}
    ctx = PassContext(opset=17, names=NameAllocator(graph), shapes=ShapeTable(model), options=options,
                      chooser=Chooser.from_options(options))
    passes = [p for p in select_passes(None) if isinstance(p, ScanPass)]
    visits = [0]
    real = graph_module.subgraphs_of

    def counted(node):
        visits[0] += 1
        return real(node)

    monkeypatch.setattr(graph_module, "subgraphs_of", counted)
    scans = describe_scans(graph, ctx, passes)
    assert len(scans) == count and all(len(s["passes"]) == len(passes) for s in scans)
    return visits[0]


def test_inspect_walks_the_model_a_bounded_number_of_times_per_scan(monkeypatch):
    """The dry runs ask, per Scan, whether its outputs are graph outputs: answered from one
    index, not a walk of the whole model per question (which made inspect quadratic: 8, 28,
    83 s for 250, 500, 1,000 Scans)."""
    small, large = _graphs_walked_by_inspect(8, monkeypatch), _graphs_walked_by_inspect(32, monkeypatch)
    assert large <= 4.5 * small, (small, large)


# -- shape inference: a graph with many Scans is inferred in pieces ------------------------------

def _scans_with_shape_arithmetic(count: int) -> onnx.ModelProto:
    """``count`` Scans over X [B, T, I] along axis 1, each from an h0 that ConstantOfShape
    makes from Shape(X)'s batch and a constant (computed once, before every Scan), each
    result added to its h0: shapes that need data propagation across the whole graph."""
    def const(name, value):
        return h.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, np.int64)))

    nodes = [h.make_node("Shape", ["X"], ["s"]), const("i0", [0]), h.make_node("Gather", ["s", "i0"], ["batch"]),
             const("width", [H]), h.make_node("Concat", ["batch", "width"], ["h_shape"], axis=0)]
    outs = []
    for k in range(count):
        body = _rnn_body(str(k))
        for value in list(body.input) + list(body.output):
            value.type.tensor_type.shape.dim[0].dim_param = "B"
        nodes += [h.make_node("ConstantOfShape", ["h_shape"], [f"h0_{k}"]),
                  h.make_node("Scan", [f"h0_{k}", "X"], [f"h_{k}", f"y_{k}"], name=f"scan_{k}", num_scan_inputs=1,
                              body=body, scan_input_axes=[1], scan_output_axes=[1]),
                  h.make_node("Add", [f"h_{k}", f"h0_{k}"], [f"z_{k}"])]
        outs += [vi(f"z_{k}", F, None), vi(f"y_{k}", F, None)]
    inits = [numpy_helper.from_array(np.ones((I, H), np.float32), f"{w}_{k}") for k in range(count) for w in "wr"]
    inits = [t if t.name.startswith("w") else numpy_helper.from_array(np.ones((H, H), np.float32), t.name) for t in inits]
    graph = h.make_graph(nodes, "shape_arithmetic", [vi("X", F, ["B", "T", I])], outs, initializer=inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def _all_types(model: onnx.ModelProto) -> dict:
    """name -> (type, dims) at every level, made-up symbols (unk__N) as '?'."""
    from scanopt.shapes import inferred_model

    inferred = inferred_model(model)
    found = {}
    for g in [inferred.graph] + [a.g for n in inferred.graph.node for a in n.attribute if a.g.name]:
        for v in list(g.input) + list(g.value_info) + list(g.output):
            dims = [d.dim_value if d.HasField("dim_value") else ("?" if d.dim_param.startswith("unk__") else d.dim_param)
                    for d in v.type.tensor_type.shape.dim]
            found[v.name] = (v.type.tensor_type.elem_type, dims)
    return found


def test_inference_in_pieces_finds_what_one_inference_finds(monkeypatch):
    import scanopt.inference as inference

    model = _scans_with_shape_arithmetic(10)
    whole = _all_types(model)
    monkeypatch.setattr(inference, "PIECE_BODIES", 3)  # four pieces, the Shape chain in the first
    pieces = _all_types(model)
    assert pieces == whole
    assert whole["z_9"] == (F, ["B", H]) and whole["y_9"] == (F, ["B", "T", H])  # data propagation reached it
    assert whole["pre_9"] == (F, ["B", H])  # inside the last body


def test_no_inference_sees_more_than_a_piece_of_a_graph_with_many_scans(monkeypatch):
    """onnx copies the whole type map of a graph into each body it infers: one inference
    of N Scans costs N², pieces of a bounded size cost N (32 s -> 1.4 s at 5,000 Scans)."""
    import scanopt.inference as inference

    sizes = []
    real = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes",
                        lambda m, *a, **k: sizes.append(len(m.graph.node)) or real(m, *a, **k))
    monkeypatch.setattr(inference, "PIECE_BODIES", 8)
    found = _all_types(_scans_with_shape_arithmetic(40))
    assert max(sizes) <= 8 * 3 + 5  # a piece: 8 Scans, their ConstantOfShape and Add, the Shape chain
    assert len(sizes) >= 2 * 5 and found["z_39"] == (F, ["B", H])


def test_inference_in_pieces_of_an_ir3_model_reads_initializers_listed_as_inputs(monkeypatch):
    """IR 3 (onnx's backend Scan-8 models): inference reads an initializer's type only when
    the graph lists it as an input too, so each piece lists it both ways."""
    import builders as b
    import scanopt.inference as inference

    base = b.scan8_sum()
    nodes, outs = [h.make_node("Relu", ["s0"], ["s0r"])], []
    for k in range(6):
        nodes.append(h.make_node("Scan", ["lens", "s0r", "X"], [f"sf{k}", f"Y{k}"], num_scan_inputs=1,
                                 body=b.sum_body(prefix=f"p{k}_", weight="W")))
        outs += [b.vi(f"sf{k}", ["B", 2]), b.vi(f"Y{k}", None)]
    graph = h.make_graph(nodes, "m", list(base.graph.input) + [b.vi("W", [2])], outs,
                         initializer=[b.init("W", np.ones(2, np.float32))])
    model = b.model(graph, opset=8, ir_version=3)
    whole = _all_types(model)
    monkeypatch.setattr(inference, "PIECE_BODIES", 2)
    assert _all_types(model) == whole and whole["p5_xw"] == (F, [2]) and whole["Y5"] == (F, ["B", "T", 2])
