"""scanopt.constexpr: the value behind a chain of shape ops over initializers and Constant
nodes, read through outer scope; None as soon as a leaf is not constant; the graph untouched."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

from scanopt.constexpr import ConstantFolder
from scanopt.ir import import_model

W = np.arange(24, dtype=np.float32).reshape(4, 6) / 7


def folded(nodes, inits, out, extra_inputs=()):
    """Import a graph of ``nodes`` and fold tensor ``out``."""
    vi = h.make_tensor_value_info
    graph = h.make_graph(nodes, "g", [vi(n, TP.FLOAT, [4]) for n in extra_inputs], [vi(out, TP.FLOAT, None)],
                         initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    g = import_model(model)
    before = [n.op for n in g.nodes]
    value = ConstantFolder(17).value(g.outputs[0])
    assert [n.op for n in g.nodes] == before  # nothing folded into the graph
    return value


def ints(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def test_a_chain_of_shape_ops_over_an_initializer():
    nodes = [
        h.make_node("Transpose", ["W"], ["t"], perm=[1, 0]),
        h.make_node("Cast", ["t"], ["c"], to=TP.FLOAT16),
        h.make_node("Cast", ["c"], ["c2"], to=TP.FLOAT),
        h.make_node("Reshape", ["c2", "shape"], ["r"]),
        h.make_node("Slice", ["r", "starts", "ends", "axes"], ["s"]),
        h.make_node("Split", ["s"], ["p", "q"], axis=0, num_outputs=2),
        h.make_node("Concat", ["q", "p"], ["cat"], axis=0),
        h.make_node("Unsqueeze", ["cat", "ax"], ["u"]),
        h.make_node("Identity", ["u"], ["y"]),
    ]
    inits = {"W": W, "shape": np.array([3, 8], np.int64), "starts": np.array([1], np.int64),
             "ends": np.array([3], np.int64), "axes": np.array([0], np.int64), "ax": np.array([0], np.int64)}
    got = folded(nodes, inits, "y")
    r = W.T.astype(np.float16).astype(np.float32).reshape(3, 8)[1:3]
    np.testing.assert_array_equal(got, np.concatenate([r[1:], r[:1]])[None])


def test_constant_nodes_negative_step_slice_and_an_op_run_by_the_reference_evaluator():
    nodes = [
        h.make_node("Constant", [], ["k"], value=numpy_helper.from_array(W, "k")),
        h.make_node("Slice", ["k", "st", "en", "ax", "step"], ["rev"]),
        h.make_node("Tile", ["rev", "reps"], ["y"]),  # not in the numpy table
    ]
    inits = {"st": np.array([-1], np.int64), "en": np.array([np.iinfo(np.int64).min], np.int64),
             "ax": np.array([1], np.int64), "step": np.array([-1], np.int64), "reps": np.array([2, 1], np.int64)}
    np.testing.assert_array_equal(folded(nodes, inits, "y"), np.tile(W[:, ::-1], (2, 1)))


def test_a_non_constant_leaf_gives_none():
    nodes = [h.make_node("Add", ["W0", "x"], ["y"])]
    assert folded(nodes, {"W0": W[0, :4].copy()}, "y", extra_inputs=["x"]) is None


def test_values_of_enclosing_graphs_fold_at_any_depth():
    """Transpose in the main graph, Cast in a Scan body, Identity two bodies down."""
    vi = h.make_tensor_value_info
    inner = h.make_graph([h.make_node("Identity", ["c"], ["wi"]), h.make_node("Identity", ["a"], ["a2"]),
                          h.make_node("Identity", ["wi"], ["probe"])],
                         "inner", [vi("a", TP.FLOAT, [1])], [vi("a2", TP.FLOAT, [1])])
    mid = h.make_graph([h.make_node("Cast", ["t"], ["c"], to=TP.DOUBLE),
                        h.make_node("Scan", ["s", "xs"], ["s2"], num_scan_inputs=1, body=inner)],
                       "mid", [vi("s", TP.FLOAT, [1]), vi("xs", TP.FLOAT, [2, 1])], [vi("s2", TP.FLOAT, [1])])
    top = h.make_graph([h.make_node("Transpose", ["W"], ["t"]),
                        h.make_node("Scan", ["s0", "X"], ["sn"], num_scan_inputs=1, body=mid)],
                       "top", [vi("s0", TP.FLOAT, [1]), vi("X", TP.FLOAT, [3, 2, 1])], [vi("sn", TP.FLOAT, [1])],
                       initializer=[numpy_helper.from_array(W, "W")])
    g = import_model(h.make_model(top, opset_imports=[h.make_opsetid("", 17)]))
    body = g.nodes[1].attrs["body"].nodes[1].attrs["body"]
    probe = next(n for n in body.nodes if n.outputs[0].name == "probe").outputs[0]
    value = ConstantFolder(17).value(probe)
    assert value.dtype == np.float64
    np.testing.assert_array_equal(value, W.T.astype(np.float64))


def test_a_long_chain_folds_without_recursion():
    g = gs.Graph()
    t = gs.Constant("w", W)
    for i in range(20_000):
        out = gs.Variable(f"v{i}")
        g.nodes.append(gs.Node("Identity", inputs=[t], outputs=[out]))
        t = out
    np.testing.assert_array_equal(ConstantFolder(17).value(t), W)


def test_random_ops_are_not_constants():
    nodes = [h.make_node("RandomUniform", [], ["y"], shape=[2, 2])]
    assert folded(nodes, {}, "y") is None


def test_scalar_is_the_one_element_of_a_constant_of_any_rank():
    folder = ConstantFolder(17)
    one = gs.Constant("one", np.array([[1]], np.int64))
    pair = gs.Constant("pair", np.array([1, 1], np.int64))
    flag = gs.Constant("flag", np.array(True))
    assert folder.scalar(one) == 1 and isinstance(folder.scalar(one), int)
    assert folder.scalar(pair) is None  # two elements: no scalar
    assert folder.scalar(flag) is True
    assert folder.scalar(gs.Variable("x", dtype=np.float32, shape=[])) is None  # not a constant
