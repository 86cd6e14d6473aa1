"""skl2onnx pipelines and ZipMap classifiers (models/skl/pipelines, written by
models/generate_skl_pipelines.py): the map Scan behind StandardScaler -> PCA vectorizes once
the ranks shape inference leaves unknown (ai.onnx.ml Scaler has no inference function) are
recovered from the producers; a ZipMap output, ``seq(map(int64, tensor(float)))``, keeps its
type through the rewrite (with and without verification) and is compared element by element;
a run that cannot verify reports nothing as applied."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

import scanopt
from equivalence import ops
from scanopt.shapes import ShapeTable
from scanopt.verify import compare_models, compare_values

MODELS = Path(__file__).resolve().parent.parent / "models" / "skl" / "pipelines"
SAMPLES = sorted(p.stem for p in MODELS.glob("*.onnx"))


def _session(model):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _as_array(value):
    """A ZipMap's list of {class: probability} as [rows, classes] in class order."""
    if isinstance(value, list):
        return np.array([[row[k] for k in sorted(row)] for row in value], np.float32)
    return np.asarray(value)


def test_there_are_samples():
    assert len(SAMPLES) == 5 and sum(s.endswith("zipmap") for s in SAMPLES) == 2


@pytest.mark.parametrize("name", SAMPLES)
@pytest.mark.parametrize("verify", [True, False])
def test_pipeline_loses_its_loop_and_matches_sklearn(name, verify):
    model = onnx.load(str(MODELS / f"{name}.onnx"))
    out, report = scanopt.optimize(model, verify=verify)
    assert ops(out)["Scan"] == 0, [o.detail for o in report.outcomes]
    # squared-euclidean bodies go to distances' GEMM form first, vectorize's broadcast otherwise
    assert any(o.pass_name in ("distances", "vectorize") and o.applied for o in report.outcomes)
    if verify:
        assert report.verification["passed"] is True, report.verification
    assert [o.type for o in out.graph.output] == [o.type for o in model.graph.output]  # ZipMap's type kept
    stored = np.load(MODELS / f"{name}.expected.npz")
    feeds = {"X": stored["X"]}
    before, after = _session(model).run(None, feeds), _session(out).run(None, feeds)
    for output, b, a in zip(model.graph.output, before, after):
        np.testing.assert_allclose(_as_array(a), stored[output.name], rtol=1e-5, atol=1e-6)
        assert type(a) is type(b)


def test_ranks_after_an_ml_scaler_are_recovered_from_the_producers():
    model = onnx.load(str(MODELS / "pipeline_scaler_pca_knn_regressor.onnx"))
    graph = gs.import_onnx(model)
    table = ShapeTable(model)
    tensors = graph.tensors()
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    assert "variable1" not in {v.name for v in inferred.graph.value_info}  # inference alone does not know it
    assert table.rank(tensors["variable2"]) == 2  # Scaler keeps X's rank
    assert table.rank(tensors["variable1"]) == 2  # Sub, then MatMul by a [3, 2] matrix


def test_derived_rank_follows_matmul_rules_and_stops_at_unknown_ops():
    x = gs.Variable("x", np.float32, [None, 3])
    v = gs.Variable("v", np.float32, [3])
    w = gs.Constant("w", np.ones((3, 4), np.float32))
    unknown = gs.Variable("u", np.float32)
    outs = {k: gs.Variable(k, np.float32) for k in ("xw", "vw", "xv", "odd", "sum")}
    nodes = [gs.Node("MatMul", inputs=[x, w], outputs=[outs["xw"]]),
             gs.Node("MatMul", inputs=[v, w], outputs=[outs["vw"]]),
             gs.Node("MatMul", inputs=[x, v], outputs=[outs["xv"]]),
             gs.Node("TopK", inputs=[x], outputs=[outs["odd"]]),
             gs.Node("Add", inputs=[outs["xw"], unknown], outputs=[outs["sum"]])]
    graph = gs.Graph(nodes=nodes, inputs=[x, v, unknown], outputs=list(outs.values()), opset=17)
    model = gs.export_onnx(graph)
    table = ShapeTable(onnx.ModelProto())  # nothing inferred: every rank below is derived
    got = {k: table.rank(t) for k, t in outs.items()}
    assert got == {"xw": 2, "vw": 1, "xv": 1, "odd": None, "sum": None}
    assert model.graph.node  # the graph itself is well formed


def test_zipmap_output_type_survives_no_verify_and_onnxruntime_loads_it():
    model = onnx.load(str(MODELS / "knn_classifier_zipmap.onnx"))
    out, report = scanopt.optimize(model, verify=False)
    assert out.graph.output[1].type.HasField("sequence_type")
    assert out.graph.output[1].type == model.graph.output[1].type
    labels, probabilities = _session(out).run(None, {"X": np.zeros((2, 3), np.float32)})
    assert isinstance(probabilities, list) and isinstance(probabilities[0], dict)


def test_sequence_and_map_outputs_compare_element_by_element():
    good = [{0: 0.25, 1: 0.75}, {0: 1.0, 1: 0.0}]
    assert compare_values("p", good, [{0: 0.25, 1: 0.75 + 1e-12}, {0: 1.0, 1: 0.0}]).passed
    off = compare_values("p", good, [{0: 0.25, 1: 0.75}, {0: 0.5, 1: 0.0}])
    assert not off.passed and off.note.startswith("element [1]: ")
    assert "keys" in compare_values("p", good, [{0: 0.25, 1: 0.75}, {0: 1.0, 2: 0.0}]).note
    assert "length 1, expected 2" in compare_values("p", good, good[:1]).note
    assert "is a tensor, expected a sequence" in compare_values("p", good, np.zeros(2)).note
    arrays = [np.ones((2, 2), np.float32), np.zeros(3, np.float32)]
    assert compare_values("s", arrays, [a.copy() for a in arrays]).passed
    assert not compare_values("s", arrays, [arrays[0], np.ones(3, np.float32)]).passed


def test_a_wrong_zipmap_candidate_is_caught():
    """The candidate's ZipMap reads different class labels: its dict keys differ."""
    model = onnx.load(str(MODELS / "knn_classifier_zipmap.onnx"))
    wrong = onnx.ModelProto()
    wrong.CopyFrom(model)
    (zipmap,) = [n for n in wrong.graph.node if n.op_type == "ZipMap"]
    for a in zipmap.attribute:
        if a.name == "classlabels_int64s":
            a.ints[:] = [k + 10 for k in a.ints]
    result = compare_models(model, wrong)
    assert not result.passed and "keys" in result.format()


def test_cannot_verify_prints_no_applied_line():
    model = onnx.load(str(MODELS.parent / "knn_regressor_manhattan.onnx"))
    g = model.graph
    g.input.append(h.make_value_info("extra", h.make_sequence_type_proto(h.make_tensor_type_proto(TP.FLOAT, [2]))))
    g.node.append(h.make_node("SequenceLength", ["extra"], ["n_extra"]))
    g.output.append(h.make_tensor_value_info("n_extra", TP.INT64, []))
    out, report = scanopt.optimize(model)
    assert report.verification["passed"] is None and "cannot verify" in report.verification["summary"]
    assert not any(o.applied for o in report.outcomes)
    assert any(o.detail == "not applied: the model cannot be verified" for o in report.outcomes)
    assert out.SerializeToString() == model.SerializeToString()
