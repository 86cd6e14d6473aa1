"""scanopt.widen: a model's float64 twin computes what the float32 model approximates."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

from scanopt.engines import run
from scanopt.widen import widened, widened_feeds


def _model() -> onnx.ModelProto:
    """y = cumsum over a Scan of (x * c) + Cast(int ones to float) - a Constant; float16 z too."""
    vi = h.make_tensor_value_info
    body = h.make_graph(
        [h.make_node("Mul", ["x_t", "c"], ["xc"]), h.make_node("Add", ["s_in", "xc"], ["s_out"]),
         h.make_node("Identity", ["s_out"], ["y_t"])],
        "body", [vi("s_in", TP.FLOAT, [3]), vi("x_t", TP.FLOAT, [3])], [vi("s_out", TP.FLOAT, [3]), vi("y_t", TP.FLOAT, [3])])
    nodes = [h.make_node("Scan", ["s0", "x"], ["s", "ys"], num_scan_inputs=1, body=body),
             h.make_node("Cast", ["n"], ["nf"], to=TP.FLOAT),
             h.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.float32([0.1, 0.2, 0.3]), "k")),
             h.make_node("Add", ["s", "nf"], ["a"]), h.make_node("Sub", ["a", "k"], ["out"]),
             h.make_node("Cast", ["out"], ["half"], to=TP.FLOAT16)]
    graph = h.make_graph(nodes, "g", [vi("x", TP.FLOAT, ["T", 3]), vi("n", TP.INT64, [3])],
                         [vi("out", TP.FLOAT, [3]), vi("ys", TP.FLOAT, ["T", 3]), vi("half", TP.FLOAT16, [3])],
                         initializer=[numpy_helper.from_array(np.float32([0.1, 1e-3, 3.0]), "c"),
                                      numpy_helper.from_array(np.zeros(3, np.float32), "s0")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def test_the_twin_computes_in_float64_what_the_model_rounds_in_float32():
    x = np.random.default_rng(0).standard_normal((4096, 3)).astype(np.float32) * 1000
    n = np.array([1, 2, 3], np.int64)
    feeds = {"x": x, "n": n}
    wide = widened(_model())
    got = run(wide, widened_feeds(feeds), "reference")
    c = np.float32([0.1, 1e-3, 3.0]).astype(np.float64)
    k = np.float32([0.1, 0.2, 0.3]).astype(np.float64)
    ys = np.cumsum(x.astype(np.float64) * c, axis=0)
    assert got["ys"].dtype == np.float64 and got["half"].dtype == np.float64
    np.testing.assert_allclose(got["ys"], ys, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(got["out"], ys[-1] + n - k, rtol=1e-12, atol=1e-9)
    narrow = run(_model(), feeds, "ort")["ys"]
    assert np.max(np.abs(narrow - ys)) > 1e3 * np.max(np.abs(got["ys"] - ys))  # float32's own error is far larger
    assert run(wide, widened_feeds(feeds), "ort")["ys"].dtype == np.float64  # onnxruntime loads the twin too
    assert n.dtype == widened_feeds(feeds)["n"].dtype  # integers stay


def test_a_constants_float_literal_is_widened():
    """onnxscript writes 1 - z as Sub(Constant(value_float=1.0), z): the twin's Sub then mixed
    float32 and float64 and no engine ran it (the truth was skipped on such models)."""
    from onnx import TensorProto as TP
    from onnx import helper as oh

    from scanopt.engines import prepare
    from scanopt.widen import widened, widened_feeds

    graph = oh.make_graph(
        [oh.make_node("Constant", [], ["one"], value_float=1.0), oh.make_node("Constant", [], ["two"], value_floats=[2.0, 3.0]),
         oh.make_node("Sub", ["one", "z"], ["a"]), oh.make_node("Mul", ["a", "two"], ["y"])], "g",
        [oh.make_tensor_value_info("z", TP.FLOAT, [2])], [oh.make_tensor_value_info("y", TP.FLOAT, [2])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    feeds = {"z": np.array([0.25, 0.5], np.float32)}
    for engine in ("ort", "reference"):
        out = prepare(widened(model), engine)(widened_feeds(feeds))["y"]
        assert out.dtype == np.float64 and np.array_equal(out, [1.5, 1.5])


def test_a_float32_default_is_written_out_wide():
    """PyTorch's ``new_zeros`` exports as ConstantOfShape with no ``value``: float32 zeros by
    default. Left so, the twin's value_info said float64 and its Mul refused float64 * float32
    ("Input type mismatch"), the truth did not run, and mamba_ssm's selective_scan_ref had its
    correct linrec rewrite rolled back at T=1024 (4 of 65,536 elements over the table, as far
    from the truth as the loop's own)."""
    vi = h.make_tensor_value_info
    graph = h.make_graph(
        [h.make_node("Shape", ["x"], ["shape"]), h.make_node("ConstantOfShape", ["shape"], ["zeros"]),
         h.make_node("Add", ["zeros", "x"], ["z"]), h.make_node("Mul", ["z", "x"], ["y"]),
         h.make_node("RandomNormal", [], ["noise"], shape=[2])],
        "g", [vi("x", TP.FLOAT, [2])], [vi("y", TP.FLOAT, [2]), vi("noise", TP.FLOAT, [2])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    wide = widened(model)
    onnx.checker.check_model(wide, full_check=True)
    x = np.float32([1.5, -2.25])
    got = run(wide, widened_feeds({"x": x}))
    assert got["y"].dtype == np.float64 and got["noise"].dtype == np.float64
    np.testing.assert_array_equal(got["y"], np.float64(x) * np.float64(x))


def test_a_zipmap_output_keeps_its_float_map():
    """ZipMap writes seq(map(int64, float)) whatever it reads; the twin declared it double and
    failed onnx's strict inference (skl2onnx's KNN classifiers with their probabilities)."""
    import os

    from onnx import shape_inference

    path = os.path.join(os.path.dirname(__file__), "..", "models", "skl", "pipelines", "knn_classifier_zipmap.onnx")
    model = onnx.load(path)
    shape_inference.infer_shapes(model, strict_mode=True)
    wide = widened(model)
    shape_inference.infer_shapes(wide, strict_mode=True)
    (probabilities,) = [o for o in wide.graph.output if o.type.WhichOneof("value") == "sequence_type"]
    assert probabilities.type.sequence_type.elem_type.map_type.value_type.tensor_type.elem_type == TP.FLOAT
