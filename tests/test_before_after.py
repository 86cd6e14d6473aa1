"""The before/after table under optimize's report (scanopt.before_after): inputs and outputs with
their types, each op type whose count changed, the size and the time, read off the models."""

from __future__ import annotations

import os
import re

import onnx

from scanopt.before_after import table

MODELS = os.path.join(os.path.dirname(__file__), "..", "models")


def _row(lines, *cells):
    pattern = r"\s+".join(re.escape(c) for c in cells)
    return [line for line in lines if re.fullmatch(pattern, line.strip())]


def test_the_table_names_each_input_output_and_changed_op(tmp_path, cli):
    out = tmp_path / "rnn.onnx"
    result = cli("optimize", os.path.join(MODELS, "scan_rnn.onnx"), out, "--input-shape", "X:100,8,3")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    original, written = onnx.load(os.path.join(MODELS, "scan_rnn.onnx")), onnx.load(out)
    assert re.search(r"^\s+original\s+optimized$", result.out, re.M)
    assert _row(lines, "input", "X", "float32 [seq, batch, 3]", "float32 [seq, batch, 3]")
    assert _row(lines, "output", "h_n", "float32 [batch, 4]", "float32 [batch, 4]")
    scans_after = sum(n.op_type == "Scan" for n in written.graph.node)
    assert _row(lines, "op", "Scan", "1", str(scans_after)) and scans_after == 0
    assert _row(lines, "op", "RNN", "0", "1")
    assert _row(lines, "op", "Tanh", "1", "0")  # the body's op, counted in the body
    assert not _row(lines, "op", "Scan", "1", "1")
    total = [line for line in lines if line.startswith("ops ")]
    assert len(total) == 1 and total[0].split()[2] == str(len(original.graph.node) + len(original.graph.node[0].attribute[0].g.node))
    assert any(line.startswith("size ") and line.rstrip().endswith("B") for line in lines)
    assert re.search(r"^time\s+\d+\.\d\d s$", result.out, re.M)
    assert not any(line.startswith("ops:") for line in lines)  # the table replaces the ops line


def test_an_unchanged_model_and_quiet_print_no_table(tmp_path, cli):
    quiet = cli("optimize", os.path.join(MODELS, "scan_rnn.onnx"), tmp_path / "q.onnx", "--input-shape", "X:100,8,3", "-q")
    assert quiet.code == 0 and "original" not in quiet.out
    kept = cli("optimize", os.path.join(MODELS, "scan_rnn.onnx"), tmp_path / "k.onnx", "--passes", "cleanup")
    assert kept.code == 0 and not re.search(r"^\s+original\s+optimized", kept.out, re.M)


def test_a_changed_output_type_and_a_missing_output_are_shown():
    vi = onnx.helper.make_tensor_value_info
    before = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"]), onnx.helper.make_node("Identity", ["x"], ["z"])], "g",
        [vi("x", onnx.TensorProto.FLOAT, ["n"])], [vi("y", onnx.TensorProto.FLOAT, ["n"]), vi("z", onnx.TensorProto.FLOAT, [])]))
    after = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])], "g",
        [vi("x", onnx.TensorProto.FLOAT, ["n"])], [vi("y", onnx.TensorProto.DOUBLE, [4])]))
    lines = table(before, after, None)
    assert _row(lines, "output", "y", "float32 [n]", "double [4]")
    assert _row(lines, "output", "z", "float32 []", "(missing)")
    assert _row(lines, "op", "Identity", "2", "1")
    assert not any(line.startswith("time") for line in lines)
