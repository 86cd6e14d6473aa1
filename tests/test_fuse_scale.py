"""fuse at scale: bodies of any depth are matched without recursion (or declined with a
reason, in time linear in the body), shared weights stay shared after fusion, and finding
bidirectional partners looks at X's readers only."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

import cell_builders as cb
from equivalence import assert_equivalent, ops, outer_initializers
from scanopt.passes.fuse.recognize import recognize

vi = h.make_tensor_value_info


def add_chain_model(n):
    """h' = tanh(h + x + x + ... + x): n Adds in a chain (fuses: W = n·I, R = I)."""
    nodes, prev = [], "h"
    for i in range(n):
        nodes.append(h.make_node("Add", [prev, "x"], [f"a{i}"]))
        prev = f"a{i}"
    nodes += [h.make_node("Tanh", [prev], ["h_new"]), h.make_node("Identity", ["h_new"], ["y"])]
    body = h.make_graph(nodes, "b", [vi("h", TP.FLOAT, ["batch", 4]), vi("x", TP.FLOAT, ["batch", 4])],
                        [vi("h_new", TP.FLOAT, ["batch", 4]), vi("y", TP.FLOAT, ["batch", 4])])
    scan = h.make_node("Scan", ["h0", "X"], ["hn", "Y"], num_scan_inputs=1, body=body)
    g = h.make_graph([scan], "m", [vi("h0", TP.FLOAT, ["batch", 4]), vi("X", TP.FLOAT, ["seq", "batch", 4])],
                     [vi("hn", TP.FLOAT, ["batch", 4]), vi("Y", TP.FLOAT, ["seq", "batch", 4])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def test_a_chain_of_250_adds_fuses_without_recursion_error():
    """The body reads x and h elementwise (h' = tanh(250 x + h)): fuse matches it as an RNN with
    diagonal W = 250 I and R = I, and the fused op equals the Scan on finite inputs. On a NaN
    step it does not: the RNN's matrix product spreads one NaN across its row (0 * NaN), where
    the Scan keeps it in one element, so the default verification's NaN edge input rolls it back."""
    from unittest import mock

    from equivalence import assert_equivalent, work_ops
    from scanopt import verify

    model = add_chain_model(250)
    out, outcomes = cb.fuse(model)
    assert [o.applied for o in outcomes] == [True] and work_ops(out)["RNN"] == 1
    W = onnx.numpy_helper.to_array(next(i for i in outer_initializers(out).values() if list(i.dims) == [1, 4, 4]))
    assert {float(np.abs(W).max())} & {250.0, 1.0}
    with mock.patch.object(verify, "edge_sets", lambda model, feeds, *loop_reads: iter(())):
        assert_equivalent(model, out)
    result = verify.compare_models(model, out, seeds=2)
    assert not result.passed and all(" with nan at step " in c.inputs for c in result.comparisons if not c.passed)


def test_inspect_dry_run_of_a_deep_body_gives_verdicts():
    """Every pass's match (fuse, canonicalize, unroll) on a 300-deep body, as inspect runs them."""
    from scanopt.graph import NameAllocator
    from scanopt.inspect import describe_scans
    from scanopt.ir import import_model
    from scanopt.pass_api import PassContext, ScanPass
    from scanopt.pipeline import select_passes
    from scanopt.shapes import ShapeTable

    model = add_chain_model(300)
    g = import_model(model)
    ctx = PassContext(opset=17, names=NameAllocator(g), shapes=ShapeTable(model))
    (scan,) = describe_scans(g, ctx, [p for p in select_passes(None) if isinstance(p, ScanPass)])
    assert scan["passes"]["fuse"] == "would apply"


def test_a_30k_node_body_is_matched_in_one_pass():
    """h' = tanh(h + c + x + c + x ...), built straight in gs (importing from protobuf is the
    slow part, not fuse): every value is expanded once, with no recursion. (100k nodes: see
    the README's measurements.)"""
    n = 30_000
    x = gs.Variable("x", np.float32, ["batch", 4])
    hs = gs.Variable("h", np.float32, ["batch", 4])
    body = gs.Graph(inputs=[hs, x])
    prev, one = hs, gs.Constant("one", np.ones(4, np.float32))
    for i in range(n):
        out = gs.Variable(f"a{i}", np.float32, ["batch", 4])
        body.nodes.append(gs.Node("Add", inputs=[prev, x if i % 2 else one], outputs=[out]))
        prev = out
    h_new = gs.Variable("h_new", np.float32, ["batch", 4])
    body.nodes.append(gs.Node("Tanh", inputs=[prev], outputs=[h_new]))
    body.outputs = [h_new]
    cell = recognize(x, [(hs, h_new)], lambda t: 2, body)
    assert cell.kind == "RNN"
    np.testing.assert_array_equal(cell.W, np.eye(4) * (n // 2))
    np.testing.assert_array_equal(cell.R, np.eye(4))
    np.testing.assert_array_equal(cell.B[:4], np.full(4, n // 2))


def test_a_product_of_sums_nested_past_the_bound_is_declined():
    """h' = tanh(((h·R + x)⊙h·R + x)⊙h ...): groups nest deeper than any cell's."""
    body = cb.Body()
    prev = "h"
    for i in range(40):
        prev = body.op("Mul", body.op("Add", body.linear(prev, cb.rand(i, cb.H, cb.H)), "x"), "h")
    h_new = body.op("Tanh", prev)
    model = cb.scan_model(body, [("h", h_new, cb.H)], ys=[h_new])
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_value = cb.H  # x has H features here
    model.graph.node[0].attribute[0].g.input[1].type.tensor_type.shape.dim[1].dim_value = cb.H
    out, outcomes = cb.fuse(model)
    assert [o.applied for o in outcomes] == [False]
    assert "nest more than" in outcomes[0].detail


def shared_weight_model(n):
    """n independent RNN Scans (each over its own X) reading one W, R, b of the main graph."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.uniform(-.5, .5, s).astype(np.float32), k)
             for k, s in (("W", (3, 4)), ("R", (4, 4)), ("b", (4,)))]
    body = h.make_graph(
        [h.make_node("MatMul", ["x", "W"], ["xw"]), h.make_node("MatMul", ["h", "R"], ["hr"]),
         h.make_node("Add", ["xw", "hr"], ["s"]), h.make_node("Add", ["s", "b"], ["p"]),
         h.make_node("Tanh", ["p"], ["h2"]), h.make_node("Identity", ["h2"], ["y"])],
        "b", [vi("h", TP.FLOAT, [2, 4]), vi("x", TP.FLOAT, [2, 3])], [vi("h2", TP.FLOAT, [2, 4]), vi("y", TP.FLOAT, [2, 4])])
    nodes, ins, outs = [], [], []
    for k in range(n):
        nodes.append(h.make_node("Scan", [f"h0_{k}", f"X{k}"], [f"hn{k}", f"Y{k}"], num_scan_inputs=1, body=body,
                                 name=f"scan{k}"))
        ins += [vi(f"h0_{k}", TP.FLOAT, [2, 4]), vi(f"X{k}", TP.FLOAT, [5, 2, 3])]
        outs += [vi(f"Y{k}", TP.FLOAT, [5, 2, 4])]
    g = h.make_graph(nodes, "m", ins, outs, initializer=inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def test_a_weight_shared_by_many_scans_stays_one_initializer():
    sizes = {}
    for n in (2, 8):
        model = shared_weight_model(n)
        out, outcomes = cb.fuse(model)
        assert all(o.applied for o in outcomes) and ops(out)["RNN"] == n
        sizes[n] = len(out.graph.initializer)
        if n == 2:
            assert_equivalent(model, out)
    assert sizes[8] == sizes[2] <= 8, sizes


def test_partner_search_reads_only_the_readers_of_x(monkeypatch):
    """n Scans over n different X: looking for a partner visits each X's readers (the Scan
    itself), not every node of the graph per Scan."""
    import scanopt.passes.fuse.directions as directions

    visited = []
    real = directions.is_op
    monkeypatch.setattr(directions, "is_op", lambda node, op: visited.append(node) or real(node, op))
    n = 12
    out, outcomes = cb.fuse(shared_weight_model(n))
    assert len(outcomes) == n and all(o.applied for o in outcomes)
    assert len(visited) <= 4 * n, len(visited)  # a walk over the graph per Scan would be n²
