"""Graph helpers: walking, outer-scope capture, fresh names, constants, cleanup."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from onnx import helper as h

import builders as b
from scanopt.graph import NameAllocator, cleanup, constant_axes, constant_value, identity_root, outer_captures, walk_graphs
from scanopt.ir import export_model, import_model


def test_walk_graphs_visits_every_level_with_paths_and_parents():
    graph = import_model(b.scan_in_loop())
    levels = list(walk_graphs(graph))
    assert [lv.path for lv in levels] == [
        "",
        "loop/body",
        "loop/body > outer_scan/body",
        "loop/body > outer_scan/body > inner_scan/body",
    ]
    assert [lv.depth for lv in levels] == [0, 1, 2, 3]
    assert levels[3].parents[0] is graph


def test_outer_captures_reach_through_nesting():
    graph = import_model(b.scan_in_loop())
    levels = list(walk_graphs(graph))
    loop_body, outer_body, inner_body = (lv.graph for lv in levels[1:])
    assert [t.name for t in outer_captures(inner_body)] == ["W"]
    # The outer Scan's body reads W only through its nested body: still a capture.
    assert [t.name for t in outer_captures(outer_body)] == ["W"]
    assert sorted(t.name for t in outer_captures(loop_body)) == ["W", "X"]


def test_body_initializer_is_not_a_capture():
    m = b.scan9_sum()
    body = m.graph.node[0].attribute[0].g
    body.initializer.append(b.init("K", np.ones(2, np.float32)))
    body.node[0].input[1] = "K"
    graph = import_model(m)
    assert outer_captures(graph.nodes[0].attrs["body"]) == []


def test_name_allocator_avoids_names_at_every_level():
    graph = import_model(b.scan_in_loop())
    names = NameAllocator(graph)
    # i_x is a name deep inside the innermost body; W an outer initializer.
    assert names.fresh("i_x") == "i_x_1"
    assert names.fresh("i_x") == "i_x_2"
    assert names.fresh("W") == "W_1"
    assert names.fresh("brand_new") == "brand_new"
    assert "brand_new" in names


def test_name_allocator_is_deterministic():
    a = NameAllocator(import_model(b.scan_in_loop()))
    c = NameAllocator(import_model(b.scan_in_loop()))
    assert [a.fresh("s") for _ in range(3)] == [c.fresh("s") for _ in range(3)]


@pytest.mark.parametrize(
    "attr, value, expected",
    [
        ("value", h.make_tensor("t", 1, [2], [1.5, 2.5]), np.array([1.5, 2.5], np.float32)),
        ("value_float", 3.0, np.float32(3.0)),
        ("value_int", 7, np.int64(7)),
        ("value_floats", [1.0, 2.0], np.array([1.0, 2.0], np.float32)),
        ("value_ints", [4, 5], np.array([4, 5], np.int64)),
    ],
)
def test_constant_value_reads_constant_nodes(attr, value, expected):
    node = h.make_node("Constant", [], ["c"], **{attr: value})
    g = h.make_graph([node, h.make_node("Identity", ["c"], ["o"])], "g", [], [b.vi("o", None)])
    graph = import_model(b.model(g))
    got = constant_value(graph.nodes[1].inputs[0])
    np.testing.assert_array_equal(got, expected)
    assert got.dtype == np.asarray(expected).dtype


def test_constant_value_reads_outer_initializer_from_inside_a_body():
    graph = import_model(b.scan9_sum(weight=np.array([3.0, 4.0])))
    body = graph.nodes[0].attrs["body"]
    mul = next(n for n in body.nodes if n.op == "Mul")
    np.testing.assert_array_equal(constant_value(mul.inputs[1]), [3.0, 4.0])
    assert constant_value(mul.inputs[0]) is None  # the scanned element


def test_constant_axes_reads_the_attribute_or_a_constant_input():
    x = gs.Variable("x", np.float32, [2, 1])
    attr = gs.Node("Squeeze", attrs={"axes": [-1]}, inputs=[x], outputs=[gs.Variable("a")])
    given = gs.Node("Squeeze", inputs=[x, gs.Constant("ax", np.array([1], np.int64))], outputs=[gs.Variable("b")])
    computed = gs.Node("Squeeze", inputs=[x, gs.Variable("run_time", np.int64, [1])], outputs=[gs.Variable("c")])
    omitted = gs.Node("ReduceSum", inputs=[x], outputs=[gs.Variable("d")])
    assert [constant_axes(n) for n in (attr, given, computed, omitted)] == [[-1], [1], None, None]


def test_identity_root_follows_identity_chains_only():
    x, a, b_, c = (gs.Variable(n, np.float32, [2]) for n in "xabc")
    gs.Node("Identity", inputs=[x], outputs=[a])
    gs.Node("Identity", inputs=[a], outputs=[b_])
    gs.Node("Neg", inputs=[b_], outputs=[c])
    assert identity_root(b_) is x and identity_root(x) is x and identity_root(c) is c


def test_cleanup_keeps_outer_values_used_only_in_bodies_and_removes_dead_nodes():
    m = b.scan9_sum(weight=np.array([1.0, 2.0]))
    m.graph.node.append(h.make_node("Neg", ["X"], ["dead"], name="dead_neg"))
    graph = cleanup(import_model(m))
    assert [n.name for n in graph.nodes] == ["scan_sum"]
    out = export_model(graph, m)
    assert [i.name for i in out.graph.initializer] == ["W"]


def test_cleanup_does_not_reorder_a_sorted_graph():
    g = h.make_graph(
        [h.make_node("Neg", ["a"], ["n1"], name="second_in_sort"), h.make_node("Abs", ["a"], ["n2"], name="first")],
        "g",
        [b.vi("a", [2])],
        [b.vi("n2", [2]), b.vi("n1", [2])],
    )
    graph = cleanup(import_model(b.model(g)))
    assert [n.name for n in graph.nodes] == ["second_in_sort", "first"]


def test_cleanup_sorts_an_unsorted_graph():
    g = h.make_graph(
        [h.make_node("Neg", ["n1"], ["n2"], name="late"), h.make_node("Abs", ["a"], ["n1"], name="early")],
        "g",
        [b.vi("a", [2])],
        [b.vi("n2", [2])],
    )
    graph = cleanup(import_model(b.model(g)))
    assert [n.name for n in graph.nodes] == ["early", "late"]
    assert isinstance(graph.nodes[0], gs.Node)


def _chain(n: int) -> gs.Graph:
    """x -> Neg -> Neg ... (n nodes) -> y, in order."""
    graph = gs.Graph(inputs=[gs.Variable("x", dtype=np.float32, shape=[2])])
    value = graph.inputs[0]
    for i in range(n):
        out = gs.Variable(f"v{i}", dtype=np.float32, shape=[2])
        graph.nodes.append(gs.Node("Neg", name=f"neg{i}", inputs=[value], outputs=[out]))
        value = out
    graph.outputs = [value]
    return graph


def test_toposort_is_stable_and_orders_producers_first():
    from scanopt.graph import toposort

    graph = _chain(4)
    graph.nodes[:] = [graph.nodes[i] for i in (2, 0, 3, 1)]
    dead = gs.Node("Relu", name="side", inputs=[graph.inputs[0]], outputs=[gs.Variable("s", dtype=np.float32)])
    graph.nodes.insert(0, dead)  # ready from the start and first: stays first
    toposort(graph)
    assert [n.name for n in graph.nodes] == ["side", "neg0", "neg1", "neg2", "neg3"]


def test_toposort_counts_outer_values_read_inside_a_body_as_inputs():
    from scanopt.graph import toposort

    graph = _chain(1)
    v = graph.outputs[0]
    branches = []
    for tag in ("then", "else"):
        out = gs.Variable(f"{tag}_out", dtype=np.float32, shape=[2])
        branches.append(gs.Graph(nodes=[gs.Node("Identity", inputs=[v], outputs=[out])], outputs=[out]))
    cond = gs.Variable("c", dtype=np.bool_, shape=[])
    graph.inputs.append(cond)
    result = gs.Variable("r", dtype=np.float32, shape=[2])
    branch = gs.Node("If", name="if", inputs=[cond], outputs=[result],
                     attrs={"then_branch": branches[0], "else_branch": branches[1]})
    graph.nodes.insert(0, branch)  # reads v (inside its bodies) before neg0 computes it
    toposort(graph)
    assert [n.name for n in graph.nodes] == ["neg0", "if"]


def test_cleanup_unhooks_removed_nodes_so_their_inputs_are_unread():
    from scanopt.graph import is_removed

    graph = _chain(3)
    x = graph.inputs[0]
    dead = gs.Node("Relu", name="dead", inputs=[x], outputs=[gs.Variable("d", dtype=np.float32)])
    graph.nodes.append(dead)
    cleanup(graph)
    assert [n.name for n in graph.nodes] == ["neg0", "neg1", "neg2"]
    assert is_removed(dead) and all(reader is not dead for reader in x.outputs)


def test_name_allocator_resumes_probing_and_still_skips_taken_names():
    names = NameAllocator.from_names({"a", "a_2"})
    assert [names.fresh("a") for _ in range(3)] == ["a_1", "a_3", "a_4"]
    assert names.fresh("b") == "b" and names.fresh("b") == "b_1"


def test_is_topologically_sorted_is_deferred_inside_a_pass_and_sorted_at_its_end():
    from scanopt.graph import editing, is_topologically_sorted

    graph = _chain(3)
    graph.nodes.reverse()
    assert not is_topologically_sorted(graph)
    with editing(graph):
        assert is_topologically_sorted(graph)  # the pass does not pay for a walk per rewrite
    assert [n.name for n in graph.nodes] == ["neg0", "neg1", "neg2"]


def test_in_graph_outputs_index_sees_redirected_outputs_and_forgets_removed_ones():
    from scanopt.graph import editing, in_graph_outputs
    from scanopt.rewrite import replace_all_uses

    graph = _chain(2)
    last, other = graph.outputs[0], graph.nodes[0].outputs[0]
    with editing(graph):
        assert in_graph_outputs(last, graph) and not in_graph_outputs(other, graph)
        replace_all_uses(last, other, graph)
        assert in_graph_outputs(other, graph) and not in_graph_outputs(last, graph)


def test_remove_node_inside_a_pass_finds_nodes_after_earlier_removals_and_other_edits():
    from scanopt.graph import editing, remove_node

    graph = _chain(6)
    nodes = list(graph.nodes)
    with editing(graph):
        remove_node(graph, nodes[1])  # builds the index
        remove_node(graph, nodes[4])  # shifted by one removal
        graph.nodes.insert(0, nodes[1])  # an edit the index does not know: checked, rebuilt
        remove_node(graph, nodes[3])
        remove_node(graph, nodes[1])
        remove_node(graph, nodes[1])  # not there any more: nothing happens
    assert [n.name for n in graph.nodes] == ["neg0", "neg2", "neg5"]


def test_shape_table_dtype_is_declared_else_inferred_else_none():
    from scanopt.shapes import ShapeTable

    m = b.scan9_sum(weight=np.array([1.0, 2.0]))
    table, graph = ShapeTable(m), import_model(m)
    body = graph.nodes[0].attrs["body"]
    undeclared = next(t for n in body.nodes for t in n.outputs if t.dtype is None)
    assert table.dtype(graph.inputs[0]) == np.float32  # declared
    assert table.dtype(undeclared) == np.dtype(np.float32)  # inferred
    assert table.dtype(gs.Variable("nowhere")) is None


def test_a_whole_slice_is_known_through_computed_constants():
    """TorchScript's x[..., None, :]: Slice(x, [0], [INT64_MAX], Unsqueeze(c), Unsqueeze(1))."""
    import numpy as np
    import onnx_graphsurgeon as gs

    from scanopt.constexpr import ConstantFolder
    from scanopt.graph import is_whole_slice

    def unsqueezed(value, name):
        out = gs.Variable(name, np.int64)
        gs.Node("Unsqueeze", inputs=[gs.Constant(name + "_c", np.array(value, np.int64)),
                                     gs.Constant(name + "_a", np.array([0], np.int64))], outputs=[out])
        return out

    def sliced(end, step):
        y = gs.Variable("y", np.float32)
        return gs.Node("Slice", inputs=[gs.Variable("x", np.float32), gs.Constant("s", np.array([0], np.int64)),
                                        gs.Constant("e", np.array([end], np.int64)), unsqueezed(3, "axes"),
                                        unsqueezed(step, "steps")], outputs=[y])

    whole = sliced(2**63 - 1, 1)
    assert is_whole_slice(whole, ConstantFolder().value)
    assert not is_whole_slice(whole)  # its steps are computed: constant_value alone does not see them
    assert not is_whole_slice(sliced(5, 1), ConstantFolder().value)
    assert not is_whole_slice(sliced(2**63 - 1, 2), ConstantFolder().value)
