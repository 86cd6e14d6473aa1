"""The gs round-trip keeps what onnx-graphsurgeon alone would drop or duplicate."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper as h

import builders as b
from scanopt.ir import export_model, import_model
from scanopt.protos import walk_proto_graphs


def _roundtrip(m: onnx.ModelProto) -> onnx.ModelProto:
    return export_model(import_model(m), m)


def test_outer_initializer_read_only_by_a_body_stays_outer():
    m = b.scan9_sum(weight=np.array([1.0, 2.0]))
    out = _roundtrip(m)
    assert [i.name for i in out.graph.initializer] == ["W"]
    assert not out.graph.node[0].attribute[0].g.initializer
    assert out == m


def test_initializer_shared_by_outer_graph_and_body_is_not_duplicated():
    m = b.scan9_sum(weight=np.array([1.0, 2.0]))
    m.graph.node.insert(0, h.make_node("Add", ["s_in", "W"], ["s0"], name="pre"))
    m.graph.input[0].name = "s_in"
    out = _roundtrip(m)
    names = [i.name for g in walk_proto_graphs(out.graph) for i in g.initializer]
    assert names == ["W"]


def test_nested_bodies_keep_initializer_at_top_and_roundtrip_exactly():
    m = b.scan_in_loop()
    out = _roundtrip(m)
    assert out == m


def test_model_fields_doc_strings_metadata_and_functions_are_kept():
    m = b.scan9_sum()
    m.producer_name, m.producer_version, m.doc_string = "exporter", "1.2", "model doc"
    m.metadata_props.add(key="license", value="MIT")
    m.graph.node[0].doc_string = "the scan"
    m.graph.node[0].attribute[0].g.node[0].doc_string = "inside"
    fn = h.make_function("custom", "Twice", ["x"], ["y"], [h.make_node("Add", ["x", "x"], ["y"])], [h.make_opsetid("", 17)])
    m.functions.append(fn)
    m.opset_import.append(h.make_opsetid("custom", 1))
    out = _roundtrip(m)
    assert out == m


def test_rewritten_graph_exports_new_nodes_and_keeps_the_rest():
    m = b.scan9_sum()
    graph = import_model(m)
    y = graph.outputs[1]
    scan = graph.nodes[0]
    import onnx_graphsurgeon as gs

    doubled = gs.Variable("Y_raw", dtype=np.float32, shape=y.shape)
    scan.outputs[1] = doubled
    graph.layer(op="Add", inputs=[doubled, doubled], outputs=[y], name="double")
    out = export_model(graph, m)
    assert [n.op_type for n in out.graph.node] == ["Scan", "Add"]
    assert out.ir_version == m.ir_version and list(out.opset_import) == list(m.opset_import)


def test_every_sample_model_roundtrips_exactly():
    """Real exporters' extras (node and value metadata_props, initializers listed in
    value_info, initializer order) survive the gs round-trip."""
    import glob
    import os

    root = os.path.join(os.path.dirname(__file__), "..", "models")
    paths = sorted(glob.glob(os.path.join(root, "*.onnx")))
    assert len(paths) >= 10
    for path in paths:
        m = onnx.load(path)
        assert _roundtrip(m) == m, os.path.basename(path)
