"""Bad input: one line on stderr naming the file and the problem, exit 2, no traceback,
no output file left behind, input bytes unchanged."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper as h

import builders as b


def _save(tmp_path, model_or_bytes, name="in.onnx"):
    path = tmp_path / name
    data = model_or_bytes if isinstance(model_or_bytes, bytes) else model_or_bytes.SerializeToString()
    path.write_bytes(data)
    return path


def _assert_rejected(cli, tmp_path, src, *, expect: str, out=None, names=None):
    before = src.read_bytes() if src.is_file() else None
    out = out or tmp_path / "out.onnx"
    result = cli("optimize", src, out)
    assert result.code == 2, result
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert lines[0].startswith("scanopt: ") and str(names or src) in lines[0], lines[0]
    assert expect in lines[0], lines[0]
    assert "Traceback" not in result.err
    assert not os.path.exists(out)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".scanopt-")]
    if before is not None:
        assert src.read_bytes() == before
    return lines[0]


def test_missing_file(cli, tmp_path):
    _assert_rejected(cli, tmp_path, tmp_path / "nope.onnx", expect="no such file")


def test_directory(cli, tmp_path):
    (tmp_path / "dir.onnx").mkdir()
    _assert_rejected(cli, tmp_path, tmp_path / "dir.onnx", expect="is a directory")


def test_empty_file(cli, tmp_path):
    _assert_rejected(cli, tmp_path, _save(tmp_path, b""), expect="empty file")


@pytest.mark.parametrize("seed", range(5))
def test_random_bytes(cli, tmp_path, seed):
    data = np.random.default_rng(seed).integers(0, 256, 300, dtype=np.uint8).tobytes()
    _assert_rejected(cli, tmp_path, _save(tmp_path, data), expect="not an ONNX model")


@pytest.mark.parametrize("fraction", [0.3, 0.5, 0.9])
def test_truncated_protobuf(cli, tmp_path, fraction):
    data = b.scan9_sum(weight=np.ones(2)).SerializeToString()
    src = _save(tmp_path, data[: int(len(data) * fraction)])
    _assert_rejected(cli, tmp_path, src, expect="")


def test_undefined_name(cli, tmp_path):
    m = b.no_scan_model()
    m.graph.node[0].input[1] = "ghost"
    _assert_rejected(cli, tmp_path, _save(tmp_path, m), expect="reads 'ghost', which nothing defines")


def test_undefined_name_inside_body(cli, tmp_path):
    m = b.scan9_sum()
    m.graph.node[0].attribute[0].g.node[0].input[1] = "ghost"
    _assert_rejected(cli, tmp_path, _save(tmp_path, m), expect="'ghost'")


def test_unknown_opset(cli, tmp_path):
    m = b.no_scan_model()
    m.opset_import[0].version = 99
    _assert_rejected(cli, tmp_path, _save(tmp_path, m), expect="unsupported opset 99")


def test_unknown_ir_version(cli, tmp_path):
    m = b.no_scan_model()
    m.ir_version = 99
    _assert_rejected(cli, tmp_path, _save(tmp_path, m), expect="IR version 99")


def _set_attr(m, name, value):
    node = m.graph.node[0]
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(kept + [h.make_attribute(name, value, attr_type=onnx.AttributeProto.INTS if isinstance(value, list) else None)])
    return m


@pytest.mark.parametrize(
    "attr, value, expect",
    [
        ("num_scan_inputs", 0, "num_scan_inputs=0 is out of range"),
        ("num_scan_inputs", 3, "num_scan_inputs=3 is out of range"),
        ("scan_input_axes", [0, 0], "'scan_input_axes' has 2 entries; expected 1"),
        ("scan_output_axes", [], "'scan_output_axes' has 0 entries; expected 1"),
        ("scan_input_directions", [0, 1], "'scan_input_directions' has 2 entries"),
        ("scan_output_directions", [1, 1], "'scan_output_directions' has 2 entries"),
        ("scan_input_axes", [2], "'scan_input_axes'[0] = 2 is out of range for rank 2"),
        ("scan_input_axes", [-3], "'scan_input_axes'[0] = -3 is out of range for rank 2"),
        ("scan_output_axes", [5], "'scan_output_axes'[0] = 5 is out of range for rank 2"),
        ("scan_input_directions", [2], "must hold only 0 (forward) and 1 (reverse)"),
        ("scan_output_directions", [-1], "must hold only 0 (forward) and 1 (reverse)"),
        ("directions", [0], "exists only in Scan-8"),
    ],
)
def test_malformed_scan_attributes(cli, tmp_path, attr, value, expect):
    m = _set_attr(b.scan9_sum(opset=16), attr, value)
    _assert_rejected(cli, tmp_path, _save(tmp_path, m), expect=expect)


def test_negative_axis_before_opset_11(cli, tmp_path):
    m = _set_attr(b.scan9_sum(opset=9), "scan_input_axes", [-1])
    _assert_rejected(cli, tmp_path, _save(tmp_path, m), expect="negative axes need opset 11")


@pytest.mark.parametrize(
    "value, expect",
    [([0, 1], "'directions' has 2 entries; expected 1"), ([3], "must hold only 0 (forward) and 1 (reverse)")],
)
def test_malformed_scan8_directions(cli, tmp_path, value, expect):
    m = _set_attr(b.scan8_sum(), "directions", value)
    _assert_rejected(cli, tmp_path, _save(tmp_path, m), expect=expect)


def test_scan8_with_v9_attribute(cli, tmp_path):
    m = _set_attr(b.scan8_sum(), "scan_input_axes", [0])
    _assert_rejected(cli, tmp_path, _save(tmp_path, m), expect="does not exist in Scan-8")


def test_body_input_count_mismatch(cli, tmp_path):
    m = b.scan9_sum()
    body = m.graph.node[0].attribute[0].g
    body.input.append(b.vi("extra", [2]))
    _assert_rejected(cli, tmp_path, _save(tmp_path, m), expect="body has 3 inputs; expected N+M = 1+1 = 2")


def test_body_output_count_mismatch(cli, tmp_path):
    m = b.scan9_sum()
    del m.graph.node[0].attribute[0].g.output[1]
    _assert_rejected(cli, tmp_path, _save(tmp_path, m), expect="body has 1 outputs; expected N+K = 1+1 = 2")


def test_unwritable_output_directory(cli, tmp_path):
    src = _save(tmp_path, b.scan9_sum())
    out = tmp_path / "missing" / "out.onnx"
    _assert_rejected(cli, tmp_path, src, out=out, names=out, expect="output directory does not exist")


def test_output_under_a_file(cli, tmp_path):
    src = _save(tmp_path, b.scan9_sum())
    _assert_rejected(cli, tmp_path, src, out=src / "out.onnx", names=src / "out.onnx", expect="output directory does not exist")


def test_out_equal_to_in_is_refused(cli, tmp_path):
    src = _save(tmp_path, b.scan9_sum())
    before = src.read_bytes()
    result = cli("optimize", src, src)
    assert result.code == 2 and "--in-place" in result.err
    assert src.read_bytes() == before


def test_unknown_pass_is_a_usage_error(cli, tmp_path):
    src = _save(tmp_path, b.scan9_sum())
    result = cli("optimize", src, tmp_path / "out.onnx", "--passes", "nosuchpass")
    assert result.code == 2 and "unknown pass nosuchpass" in result.err
    assert not (tmp_path / "out.onnx").exists()


def test_missing_argument_is_one_line(cli):
    result = cli("optimize", "only-one.onnx")
    assert result.code == 2
    assert len(result.err.strip().splitlines()) == 1 and "required" in result.err


def test_subprocess_error_has_no_traceback(tmp_path):
    src = _save(tmp_path, b"\x08\x01garbage")
    proc = subprocess.run(
        [sys.executable, "-m", "scanopt", "inspect", str(src)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("scanopt: ") and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_missing_shape_is_accepted_with_a_warning(cli, tmp_path):
    """Exporters emit types without shapes; onnx.checker rejects them, onnxruntime runs them."""
    m = b.scan9_sum(steps="T")  # dynamic length: no pass rewrites it
    m.graph.output[1].type.tensor_type.ClearField("shape")
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(m)
    src = _save(tmp_path, m)
    result = cli("optimize", src, tmp_path / "out.onnx", "--skip", "linrec")  # linrec would take the sum
    assert result.code == 0, result.err
    assert "values with a type but no shape: 'Y'" in result.out
    assert (tmp_path / "out.onnx").read_bytes() == src.read_bytes()
