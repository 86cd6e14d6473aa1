"""Loops inside model-local functions (models/functions/, written by onnxscript; see
models/generate_functions.py): a function called several times is rewritten in place, one
called once is inlined, and the whole model is compared with the original through every
caller, in onnxruntime and the reference executor."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import helper as oh

import scanopt
from builders import vi
from equivalence import assert_equivalent, ops

FUNCTIONS = os.path.join(os.path.dirname(__file__), "..", "models", "functions")
rng = np.random.default_rng(0)


def load(name: str) -> onnx.ModelProto:
    return scanopt.load_model(os.path.join(FUNCTIONS, f"{name}.onnx"))


def function_ops(model: onnx.ModelProto, name: str):
    """Op types of function ``name``, with those of the If branches in it (a fused op sits
    behind an If on an empty input)."""
    fn = next(f for f in model.functions if f.name == name)

    def ops(nodes):
        for n in nodes:
            yield n.op_type
            if n.op_type == "If":
                for a in n.attribute:
                    yield from ops(a.g.node)

    return list(ops(fn.node))


def feeds(flag=None, t=4, b=3):
    data = {"x": rng.standard_normal((t, b, 3)).astype(np.float32), "h0": rng.standard_normal((b, 4)).astype(np.float32),
            "w": rng.uniform(-0.5, 0.5, (3, 4)).astype(np.float32), "r": rng.uniform(-0.5, 0.5, (4, 4)).astype(np.float32)}
    if flag is not None:
        data["flag"] = np.array(flag)
    return data


@pytest.mark.parametrize("name", ["fn_rnn_twice", "fn_rnn_if_branches"])
def test_a_function_called_twice_is_rewritten_in_place(name):
    model = load(name)
    optimized, report = scanopt.optimize(model, options={"target": "portable"})
    assert report.verification["passed"] is True
    assert "function layers.rnn_layer: equivalent" in report.verification["summary"]
    body = function_ops(optimized, "rnn_layer")
    assert "RNN" in body and "Scan" not in body
    calls = [n for g in [optimized.graph] + [a.g for n in optimized.graph.node for a in n.attribute if a.type == 5]
             for n in g.node if n.op_type == "rnn_layer"]
    assert len(calls) == 2  # still a function, called from both places
    fused = [o for o in report.outcomes if o.pass_name == "fuse" and o.applied]
    assert fused and fused[0].path == "function layers.rnn_layer"
    if name == "fn_rnn_twice":
        extra = feeds()
        extra["w2"] = rng.uniform(-0.5, 0.5, (3, 4)).astype(np.float32)
        assert_equivalent(model, optimized, inputs=[extra], engine="both")
    else:
        assert_equivalent(model, optimized, inputs=[feeds(True), feeds(False)], engine="both")


def test_a_loop_in_a_function_called_twice_becomes_a_scan_and_fuses():
    """onnxscript's ``for i in range(...)`` over ``Gather(xs, i)`` in a function: loop_to_scan
    runs on the function body too, then fuse."""
    model = load("fn_loop_twice")
    optimized, report = scanopt.optimize(model, options={"target": "portable"})
    assert report.verification["passed"] is True
    body = function_ops(optimized, "rnn_loop_layer")
    assert "RNN" in body and "Loop" not in body and "Scan" not in body
    assert any(o.pass_name == "loop_to_scan" and o.applied and o.path == "function layers.rnn_loop_layer"
               for o in report.outcomes)
    extra = feeds()
    extra["w2"] = rng.uniform(-0.5, 0.5, (3, 4)).astype(np.float32)
    assert_equivalent(model, optimized, inputs=[extra], engine="both")


def test_a_function_called_once_is_inlined_and_fused():
    model = load("fn_rnn_once")
    optimized, report = scanopt.optimize(model, options={"target": "portable"})
    assert report.verification["passed"] is True
    assert not optimized.functions and ops(optimized)["RNN"] == 1 and ops(optimized)["rnn_layer"] == 0
    assert any(o.pass_name == "functions" and "inlined" in o.detail for o in report.outcomes)
    assert_equivalent(model, optimized, inputs=[feeds()], engine="both")


def test_a_map_in_a_function_called_twice_is_vectorized_in_place():
    model = load("fn_map_twice")
    optimized, report = scanopt.optimize(model)
    assert report.verification["passed"] is True
    assert "Scan" not in function_ops(optimized, "relu_map")
    data = {"x": rng.standard_normal((5, 2, 3)).astype(np.float32),
            "w": rng.standard_normal((3, 4)).astype(np.float32), "w2": rng.standard_normal((3, 4)).astype(np.float32)}
    assert_equivalent(model, optimized, inputs=[data], engine="both")


def test_without_verification_functions_are_still_rewritten():
    optimized, report = scanopt.optimize(load("fn_rnn_twice"), verify=False, options={"target": "portable"})
    assert "RNN" in function_ops(optimized, "rnn_layer")
    assert report.verification["passed"] is None


def _map_function():
    body = oh.make_graph([oh.make_node("Neg", ["x"], ["y"])], "body", [oh.make_value_info("x", onnx.TypeProto())],
                         [oh.make_value_info("y", onnx.TypeProto())])
    return oh.make_function("local", "cumsum", ["s0", "X"], ["Y"],
                            [oh.make_node("Scan", ["X"], ["Y"], body=body, num_scan_inputs=1)],
                            opset_imports=[oh.make_opsetid("", 17)])


def _cumsum_function(attribute=False):
    body = oh.make_graph([oh.make_node("Add", ["s", "x"], ["s2"]), oh.make_node("Identity", ["s2"], ["y"])],
                         "body", [oh.make_value_info("s", onnx.TypeProto()), oh.make_value_info("x", onnx.TypeProto())],
                         [oh.make_value_info("s2", onnx.TypeProto()), oh.make_value_info("y", onnx.TypeProto())])
    return oh.make_function("local", "cumsum", ["s0", "X"], ["Y"],
                            [oh.make_node("Scan", ["s0", "X"], ["sT", "Y"], body=body, num_scan_inputs=1)],
                            opset_imports=[oh.make_opsetid("", 17)], attributes=["unused"] if attribute else [])


def _two_calls(shapes, attribute=False, function=None):
    (s_a, x_a), (s_b, x_b) = shapes
    nodes = [oh.make_node("cumsum", ["s_a", "x_a"], ["y_a"], domain="local"),
             oh.make_node("cumsum", ["s_b", "x_b"], ["y_b"], domain="local")]
    graph = oh.make_graph(nodes, "main", [vi("s_a", s_a), vi("x_a", x_a), vi("s_b", s_b), vi("x_b", x_b)],
                          [vi("y_a", x_a), vi("y_b", x_b)])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("local", 1)], ir_version=8,
                         functions=[function or _cumsum_function(attribute)])


@pytest.mark.parametrize("model, reason", [
    (_two_calls([([2], [3, 2]), ([2, 2], [3, 2, 2])]), "different or unknown types"),
    (_two_calls([([2], [3, 2]), ([2], [3, 2])], attribute=True), "takes attributes"),
])
def test_functions_that_cannot_be_specialized_stay(model, reason):
    optimized, report = scanopt.optimize(model)
    assert optimized is model and not report.modified
    outcome = next(o for o in report.outcomes if o.pass_name == "functions")
    assert not outcome.applied and reason in outcome.detail and outcome.node == "local.cumsum"


def test_call_sites_with_different_lengths_share_one_rewrite():
    """Both calls give rank-2 inputs with different static lengths: the body (a map) is
    vectorized for a named length and both calls are verified."""
    model = _two_calls([([2], [3, 2]), ([2], [5, 2])], function=_map_function())
    optimized, report = scanopt.optimize(model)
    assert report.verification["passed"] is True
    assert function_ops(optimized, "cumsum") == ["Neg"] or "Scan" not in function_ops(optimized, "cumsum")
    assert_equivalent(model, optimized, engine="both")


def test_cli_reports_the_rewrite_inside_the_function(cli, tmp_path):
    out = tmp_path / "out.onnx"
    result = cli("optimize", os.path.join(FUNCTIONS, "fn_rnn_twice.onnx"), out, "--target", "portable")
    assert result.code == 0
    assert "layers.rnn_layer: n0: fuse applied: fused into RNN" in result.out
    assert "verification: function layers.rnn_layer: equivalent" in result.out
    assert "RNN" in function_ops(onnx.load(out), "rnn_layer")


def test_a_loop_in_a_function_that_is_no_scan_stays_with_its_reason():
    """A function whose Loop uses its counter in arithmetic, called twice: kept, with the
    loop_to_scan reason named under the function."""
    body = oh.make_graph([oh.make_node("Cast", ["i"], ["fi"], to=onnx.TensorProto.FLOAT),
                          oh.make_node("Add", ["s", "fi"], ["s2"]), oh.make_node("Identity", ["c"], ["c2"])],
                         "body", [vi("i", [], onnx.TensorProto.INT64), vi("c", [], onnx.TensorProto.BOOL),
                                  oh.make_value_info("s", onnx.TypeProto())],
                         [vi("c2", [], onnx.TensorProto.BOOL), oh.make_value_info("s2", onnx.TypeProto())])
    fn = oh.make_function("local", "count", ["n", "s0"], ["sT"], [oh.make_node("Loop", ["n", "", "s0"], ["sT"], body=body)],
                          opset_imports=[oh.make_opsetid("", 17)])
    graph = oh.make_graph([oh.make_node("count", ["n", "s0"], ["a"], domain="local"),
                           oh.make_node("count", ["n", "s1"], ["b"], domain="local")], "main",
                          [vi("n", [], onnx.TensorProto.INT64), vi("s0", [2]), vi("s1", [2])], [vi("a", [2]), vi("b", [2])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("local", 1)], ir_version=8,
                          functions=[fn])
    optimized, report = scanopt.optimize(model)
    assert optimized is model and not report.modified
    reasons = [o for o in report.outcomes if o.pass_name == "loop_to_scan"]
    assert reasons and "used in arithmetic" in reasons[0].detail and reasons[0].path == "function local.count"


def _rnn_called_with(shapes_a, shapes_b):
    """fn_rnn_twice's layer called on (xa, ha) and (xb, hb) of the given shapes."""
    base = load("fn_rnn_twice")
    domain = base.graph.node[0].domain
    nodes = [oh.make_node("rnn_layer", [f"x{s}", f"h{s}", "w", "r"], [f"y{s}"], domain=domain) for s in "ab"]
    (xa, ha), (xb, hb) = shapes_a, shapes_b
    graph = oh.make_graph(nodes, "two_shapes", [vi("xa", xa), vi("ha", ha), vi("xb", xb), vi("hb", hb), vi("w", [3, 4]),
                                                vi("r", [4, 4])], [vi("ya", None), vi("yb", None)])
    return oh.make_model(graph, opset_imports=list(base.opset_import), ir_version=base.ir_version,
                         functions=list(base.functions))


@pytest.mark.parametrize("shapes_b", [([5, 2, 3], [2, 4]), ([6, 1, 3], [1, 4]), (["S", "N", 3], ["N", 4])])
def test_call_sites_with_different_shapes_share_one_fused_body(shapes_b):
    """One call symbolic, the other static, of batch 1, or with dims of other names: the
    body is fused once for all of them and every call agrees with the original."""
    model = _rnn_called_with((["T", "B", 3], ["B", 4]), shapes_b)
    optimized, report = scanopt.optimize(model, options={"target": "portable"})
    assert report.verification["passed"] is True
    assert "RNN" in function_ops(optimized, "rnn_layer")
    sizes_b = [(d if isinstance(d, int) else s) for d, s in zip(shapes_b[0][:2], (4, 3))]
    inputs = []
    for t, b in ((3, 2), (1, 1)):
        f_a, f_b = feeds(t=t, b=b), feeds(t=sizes_b[0], b=sizes_b[1])
        inputs.append({"xa": f_a["x"], "ha": f_a["h0"], "xb": f_b["x"], "hb": f_b["h0"], "w": f_a["w"], "r": f_a["r"]})
    assert_equivalent(model, optimized, inputs=inputs)


def _nested_map_model():
    """Layer ``inner`` (a map Scan: Sigmoid(x_t·w)) is called only by layer ``outer``
    (inner·2), which the main graph calls twice: onnxscript's layer-calling-a-layer form
    (models/heldout_producers_2/os_fn_nested_map_if calls it from both If branches)."""
    body = oh.make_graph([oh.make_node("MatMul", ["x_t", "w"], ["xw"]), oh.make_node("Sigmoid", ["xw"], ["y_t"])],
                         "each", [vi("x_t", ["B", 3])], [vi("y_t", ["B", 4])])
    inner = oh.make_function("layers", "inner", ["xs", "w"], ["ys"],
                             [oh.make_node("Scan", ["xs"], ["ys"], body=body, num_scan_inputs=1)],
                             [oh.make_opsetid("", 17)])
    outer = oh.make_function("layers", "outer", ["xs", "w"], ["ys"],
                             [oh.make_node("inner", ["xs", "w"], ["s"], domain="layers"),
                              oh.make_node("Constant", [], ["two"], value_float=2.0),
                              oh.make_node("Mul", ["s", "two"], ["ys"])],
                             [oh.make_opsetid("", 17), oh.make_opsetid("layers", 1)])
    graph = oh.make_graph([oh.make_node("outer", ["x", "w"], ["a"], domain="layers"),
                           oh.make_node("outer", ["x", "w2"], ["b"], domain="layers"),
                           oh.make_node("Sub", ["a", "b"], ["y"])],
                          "nested", [vi("x", ["T", "B", 3]), vi("w", [3, 4]), vi("w2", [3, 4])], [vi("y", None)])
    return oh.make_model(graph, functions=[inner, outer], ir_version=8,
                         opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("layers", 1)])


def test_a_function_called_only_from_another_function_gets_its_input_types_from_that_caller():
    model = _nested_map_model()
    optimized, report = scanopt.optimize(model, options={"target": "portable"})
    assert report.verification["passed"] is True
    assert "Scan" not in function_ops(optimized, "inner"), [o.detail for o in report.outcomes]
    assert function_ops(optimized, "outer") == function_ops(model, "outer")  # the caller keeps calling it
    data = {"x": rng.standard_normal((5, 2, 3)).astype(np.float32),
            "w": rng.uniform(-1, 1, (3, 4)).astype(np.float32), "w2": rng.uniform(-1, 1, (3, 4)).astype(np.float32)}
    assert_equivalent(model, optimized, inputs=[data], engine="both")


def test_declared_shapes_reach_a_function_called_twice():
    """``--input-shape`` binds the model's T and B; both calls of layers.rnn_layer get x [64, 8, 3],
    so its body is decided at those shapes (not the assumed range) and fused; the function keeps its
    symbolic interface and agrees with the original at other shapes too."""
    model = load("fn_rnn_twice")
    unshaped = scanopt.optimize(model)[1]
    fuse = [o for o in unshaped.outcomes if o.pass_name == "fuse"]
    assert fuse and "T=64 B=8" not in fuse[0].expected  # decided over the assumed range (it fuses there too)
    optimized, report = scanopt.optimize(model, input_shapes={"x": [64, 8, 3], "h0": [8, 4]})
    assert report.verification["passed"] is True
    fused = [o for o in report.outcomes if o.pass_name == "fuse"]
    assert fused and fused[0].applied and fused[0].path == "function layers.rnn_layer", [o.detail for o in fused]
    assert "T=64 B=8" in fused[0].expected and "(declared)" in fused[0].expected  # decided at the declared shapes
    assert "RNN" in function_ops(optimized, "rnn_layer")
    assert [d.dim_param for d in optimized.graph.input[0].type.tensor_type.shape.dim[:2]] == ["T", "B"]
    extra = feeds(t=5, b=2)
    extra["w2"] = rng.uniform(-0.5, 0.5, (3, 4)).astype(np.float32)
    assert_equivalent(model, optimized, inputs=[extra], engine="both")


def test_call_sites_at_different_declared_shapes_get_only_the_dims_they_agree_on():
    """Declared shapes that give the two calls different T: the body's x gets no deployment shape
    (the cost policy assumes its usual range for T), while h, at [8, 4] in both calls, gets it."""
    from scanopt.functions import _deployed_dims

    model = _rnn_called_with((["T", "B", 3], ["B", 4]), (["S", "B", 3], ["B", 4]))
    fn = next(f for f in model.functions if f.name == "rnn_layer")
    dims = _deployed_dims(model, fn, {"xa": [64, 8, 3], "xb": [32, 8, 3], "ha": [8, 4], "hb": [8, 4]})
    assert dims == {fn.input[1]: [8, 4], fn.input[2]: [3, 4], fn.input[3]: [4, 4]}
    same = _deployed_dims(model, fn, {"xa": [64, 8, 3], "xb": [64, 8, 3], "ha": [8, 4], "hb": [8, 4]})
    assert same[fn.input[0]] == [64, 8, 3]
