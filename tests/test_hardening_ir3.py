"""IR 3 models (onnx's backend test models are IR 3): there every initializer must also be a
graph input. A pass that adds weights (unrolled step indices, fused gates, hoisted or
vectorized values, the upgrade's constants) must not write a model onnx.checker rejects
and scanopt refuses to read back: such a model is written as IR 4 (scanopt.ir's export)."""

from __future__ import annotations

import json
import os

import onnx
import pytest
from onnx import helper as h

from scanopt.model_io import load
from scanopt.protos import walk_proto_graphs

MODELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")


def as_ir3(path: str) -> onnx.ModelProto:
    """The model at IR 3: its weights as Constant nodes (constants still, unlike IR 3's
    initializers, which are overridable inputs), so the passes that need constant weights apply."""
    model = onnx.load(path)
    for graph in walk_proto_graphs(model.graph):
        constants = [h.make_node("Constant", [], [t.name], value=t) for t in graph.initializer]
        nodes = constants + list(graph.node)
        del graph.initializer[:]
        del graph.node[:]
        graph.node.extend(nodes)
    model.ir_version = 3
    onnx.checker.check_model(model)
    return model


def native_ir3(path: str) -> onnx.ModelProto:
    model = onnx.load(path)
    assert model.ir_version == 3
    return model


CASES = [
    ("unroll", native_ir3, "real/backend_test_scan_sum.onnx", ["--unroll-max", "8"]),
    ("upgrade", native_ir3, "real/backend_test_scan_sum.onnx", ["--target-opset", "13"]),
    ("fuse", as_ir3, "scan_rnn.onnx", ["--target", "portable"]),
    ("hoist", as_ir3, "cells/torch_scan_gru.onnx", ["--target", "portable"]),
    ("vectorize", as_ir3, "maps/map_matmul_outer.onnx", ["--target", "portable"]),
]


@pytest.mark.parametrize("pass_name, make, model, extra", CASES, ids=[c[0] for c in CASES])
def test_every_pass_that_adds_weights_writes_a_valid_model_from_ir3(cli, tmp_path, pass_name, make, model, extra):
    src, out, report = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "report.json"
    onnx.save(make(os.path.join(MODELS, model)), src)
    result = cli("optimize", src, out, "--passes", pass_name, "--report", report, "-q", *extra)
    assert result.code == 0, result
    applied = json.loads(report.read_text())
    assert applied["modified"], applied
    written = onnx.load(out)
    onnx.checker.check_model(written, full_check=True)
    free = [t.name for g in walk_proto_graphs(written.graph) for t in g.initializer if t.name not in {v.name for v in g.input}]
    assert written.ir_version == (4 if free else 3), (written.ir_version, free)
    load(str(out))  # scanopt reads its own output back
    assert cli("verify", src, out, "--seeds", "1").code == 0


def test_the_export_layer_raises_ir3_only_when_a_weight_is_not_an_input():
    """The one place every pass's weights pass through, whatever pass made them."""
    import numpy as np
    import onnx_graphsurgeon as gs

    from scanopt.ir import export_model, import_model

    original = native_ir3(os.path.join(MODELS, "real/backend_test_scan_sum.onnx"))
    assert export_model(import_model(original), original).ir_version == 3  # nothing added: kept
    graph = import_model(original)
    out = graph.outputs[0]
    shifted = gs.Variable("shifted", dtype=out.dtype, shape=out.shape)
    graph.nodes.append(gs.Node("Add", inputs=[out, gs.Constant("one", np.ones((1,), np.float32))], outputs=[shifted]))
    graph.outputs[0] = shifted
    exported = export_model(graph, original)
    assert exported.ir_version == 4 and "one" in [t.name for t in exported.graph.initializer]
    onnx.checker.check_model(exported)
