"""Lenient about what is untidy, strict about what is broken: what real exporters write and
onnxruntime runs is accepted with a warning naming the values; the output stays valid."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper as h

import builders as b
from scanopt.errors import InvalidModelError
from scanopt.inputs import synthesize_inputs
from scanopt.validate import sort_nodes, validate_model

REAL = os.path.join(os.path.dirname(__file__), "..", "models", "real")


def _run(model_or_path, feeds):
    data = model_or_path if isinstance(model_or_path, (str, os.PathLike)) else model_or_path.SerializeToString()
    if isinstance(data, os.PathLike):
        data = str(data)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _save(tmp_path, model, name="in.onnx"):
    path = tmp_path / name
    path.write_bytes(model.SerializeToString())
    return path


@pytest.mark.parametrize(
    "name, untyped, feeds",
    [
        (
            "untidy_onnxscript_scan_sum.onnx",
            "'s_final', 's_next', 'y'",
            {"s0": np.array([1, -2], np.float32), "X": np.arange(8, dtype=np.float32).reshape(4, 2)},
        ),
        (
            "untidy_onnxscript_scan_rnn.onnx",
            "'h_final', 'ys', 'h_next', 'y'",
            {"h0": np.full((1, 4), 0.1, np.float32), "X": np.linspace(-1, 1, 9, dtype=np.float32).reshape(3, 1, 3)},
        ),
    ],
)
def test_onnxscript_scans_are_accepted_with_a_warning_naming_the_values(cli, tmp_path, name, untyped, feeds):
    src = os.path.join(REAL, name)
    model = onnx.load(src)
    with pytest.raises(onnx.checker.ValidationError, match="'type' of 'value_info' is required"):
        onnx.checker.check_model(model)
    expected = _run(src, feeds)  # onnxruntime runs it
    out = tmp_path / "out.onnx"
    result = cli("optimize", src, out)
    assert result.code == 0, result.err
    assert f"warning: values declared without a type: {untyped}" in result.out
    inspected = cli("inspect", src)
    assert inspected.code == 0 and f"values declared without a type: {untyped}" in inspected.out
    for got, want in zip(_run(out, feeds), expected):  # the output stays a model onnxruntime runs
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert cli("inspect", out).code == 0  # and one scanopt reads again


def test_onnxscript_scan_rewritten_without_verification_stays_valid(cli, tmp_path):
    """The RNN sample is fused when verification is off: the rewritten file must still run."""
    src = os.path.join(REAL, "untidy_onnxscript_scan_rnn.onnx")
    feeds = {"h0": np.full((1, 4), -0.2, np.float32), "X": np.linspace(-2, 2, 9, dtype=np.float32).reshape(3, 1, 3)}
    out = tmp_path / "out.onnx"
    result = cli("optimize", src, out, "--no-verify")
    assert result.code == 0, result.err
    rewritten = onnx.load(out)
    assert "Scan" not in {n.op_type for n in rewritten.graph.node}
    for got, want in zip(_run(out, feeds), _run(src, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _unused_value_info():
    m = b.scan9_sum(steps="T")
    m.graph.value_info.append(b.vi("left_over", [2]))
    return m, "value_info for values nothing computes: 'left_over' (ignored)"


def _unsorted_main():
    m = b.no_scan_model()
    m.graph.node.insert(0, h.make_node("Neg", ["c"], ["d"], name="neg"))
    m.graph.output.append(b.vi("d", [2]))
    return m, "nodes out of topological order in the main graph"


def _unsorted_body():
    m = b.scan9_sum(steps="T")
    m.graph.node[0].attribute[0].g.node.reverse()
    return m, "nodes out of topological order in body 'body'"


def _capture_defined_later():
    """A Scan whose body reads W, which a node after the Scan computes."""
    m = b.scan9_sum(steps="T", weight=np.ones(2, np.float32))
    w = m.graph.initializer.pop()
    w.name = "W0"
    m.graph.initializer.append(w)
    m.graph.node.append(h.make_node("Identity", ["W0"], ["W"], name="make_w"))
    return m, "nodes out of topological order in the main graph"


def _repeated_opset():
    m = b.no_scan_model()
    m.opset_import.append(h.make_opsetid("", 17))
    return m, "imports domain ai.onnx (opset 17) 2 times"


def _typeless_value_info():
    m = b.no_scan_model()
    m.graph.value_info.append(onnx.ValueInfoProto(name="c"))
    return m, "values declared without a type: 'c'"


def _shapeless_output():
    m = b.scan9_sum(steps="T")
    m.graph.output[1].type.tensor_type.ClearField("shape")
    return m, "values with a type but no shape: 'Y'"


@pytest.mark.parametrize(
    "build",
    [_unused_value_info, _unsorted_main, _unsorted_body, _capture_defined_later, _repeated_opset, _typeless_value_info, _shapeless_output],
)
def test_untidy_forms_are_accepted_with_a_warning_and_kept(cli, tmp_path, build):
    model, warning = build()
    src = _save(tmp_path, model)
    out = tmp_path / "out.onnx"
    result = cli("optimize", src, out)
    assert result.code == 0, result.err
    assert f"warning: {warning}" in result.out
    if "(unchanged)" in result.out and "topological order" not in warning:
        assert out.read_bytes() == src.read_bytes()  # nothing to rewrite: kept byte for byte
    # what is written runs, and computes what the input computes (the input with its nodes
    # sorted: onnxruntime refuses an unsorted body)
    reference = onnx.ModelProto()
    reference.CopyFrom(model)
    sort_nodes(reference)
    feeds = synthesize_inputs(reference, 0)
    for got, want in zip(_run(out, feeds), _run(reference, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    if "topological order" in warning:
        onnx.checker.check_model(onnx.load(out))  # written sorted


def test_empty_doc_fields_are_no_warning(cli, tmp_path):
    m = b.scan9_sum(steps="T")
    m.doc_string = m.graph.doc_string = m.graph.node[0].doc_string = ""
    m.producer_name = m.producer_version = m.domain = ""
    m.metadata_props.add(key="note", value="")
    result = cli("optimize", _save(tmp_path, m), tmp_path / "out.onnx")
    assert result.code == 0 and "warning" not in result.out


def test_unsorted_model_that_is_rewritten_comes_out_sorted(cli, tmp_path):
    m = b.scan9_sum(steps=2)  # unrolled
    m.graph.node.insert(0, h.make_node("Neg", ["Y"], ["negY"], name="neg"))
    m.graph.output.append(b.vi("negY", [2, 2]))
    src = _save(tmp_path, m)
    out = tmp_path / "out.onnx"
    result = cli("optimize", src, out)
    assert result.code == 0 and "nodes out of topological order" in result.out, result.err
    written = onnx.load(out)
    onnx.checker.check_model(written)  # sorted now
    assert "Scan" not in {n.op_type for n in written.graph.node}
    feeds = {"s0": np.array([1, 2], np.float32), "X": np.array([[1, 2], [3, 4]], np.float32)}
    for got, want in zip(_run(out, feeds), _run(src, feeds)):
        np.testing.assert_array_equal(got, want)


# -- broken stays broken ------------------------------------------------------------------------


def test_cycle_is_broken_and_the_message_is_whole(cli, tmp_path):
    m = b.no_scan_model()
    m.graph.node[0].input[1] = "e"
    m.graph.node.extend([h.make_node("Neg", ["c"], ["d"], name="n1"), h.make_node("Neg", ["d"], ["e"], name="n2")])
    result = cli("optimize", _save(tmp_path, m), tmp_path / "out.onnx")
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1
    assert "the main graph has a cycle: 'add' reads 'e' from 'n2', which reads 'd' from 'n1', which reads 'c' from 'add'" in result.err
    assert not (tmp_path / "out.onnx").exists()


def test_cycle_inside_a_body_is_broken(tmp_path):
    m = b.scan9_sum()
    body = m.graph.node[0].attribute[0].g
    body.node[0].input[1] = "y"  # s_next = s + y, y = Identity(s_next)
    with pytest.raises(InvalidModelError, match=r"body 'body' has a cycle: 'Add' reads 'y' from 'Identity', which reads 's_next' from 'Add'"):
        validate_model(m, name="m")


def test_conflicting_opset_imports_are_broken():
    m = b.no_scan_model()
    m.opset_import.append(h.make_opsetid("", 13))
    with pytest.raises(InvalidModelError, match=r"m: imports domain ai.onnx at several opsets \(17, 13\)"):
        validate_model(m, name="m")


def test_checker_messages_are_one_whole_line(cli, tmp_path):
    """onnx.checker's messages span lines; the first one alone can stop mid-sentence."""
    m = b.no_scan_model()
    m.graph.node[0].op_type = "NoSuchOp"
    result = cli("inspect", _save(tmp_path, m))
    assert result.code == 2
    line = result.err.strip()
    assert "\n" not in line and "onnx.checker rejects it:" in line and "NoSuchOp" in line
    assert not line.endswith(":")
