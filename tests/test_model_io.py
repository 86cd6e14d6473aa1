"""Model I/O: external data is read and written back; saving is atomic."""

from __future__ import annotations

import os

import numpy as np
import onnx

import builders as b
from scanopt.model_io import load, save_model


def _external_model(tmp_path):
    m = b.scan9_sum(steps="T", weight=np.arange(2, dtype=np.float32))
    big = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    m.graph.initializer.append(onnx.numpy_helper.from_array(big, "unused_big"))
    path = tmp_path / "ext.onnx"
    onnx.save_model(m, path, save_as_external_data=True, location="ext.onnx.data", size_threshold=1024)
    return path, big


def test_external_data_is_loaded_and_reported(tmp_path):
    path, big = _external_model(tmp_path)
    loaded = load(str(path))
    assert loaded.had_external_data
    init = {t.name: t for t in loaded.model.graph.initializer}["unused_big"]
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(init), big)


def test_external_data_is_written_beside_the_output(tmp_path):
    path, big = _external_model(tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "model.onnx"
    save_model(load(str(path)).model, str(out), external_data=True)
    assert sorted(os.listdir(out_dir)) == ["model.onnx", "model.onnx.data"]
    again = onnx.load(str(out))
    init = {t.name: t for t in again.graph.initializer}["unused_big"]
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(init), big)


def test_cli_keeps_external_data_for_an_unchanged_model(cli, tmp_path):
    path, big = _external_model(tmp_path)
    out = tmp_path / "o.onnx"
    result = cli("optimize", path, out, "--skip", "linrec")  # unchanged: linrec would take the sum
    assert result.code == 0, result.err
    assert (tmp_path / "o.onnx.data").exists()
    stored = {t.name: t for t in onnx.load(str(out), load_external_data=False).graph.initializer}
    assert stored["unused_big"].data_location == onnx.TensorProto.EXTERNAL
    assert not (tmp_path / "ext.onnx.data").read_bytes() == b""  # the input's data file is untouched


def test_missing_external_data_file_is_a_clear_error(cli, tmp_path):
    path, _ = _external_model(tmp_path)
    os.unlink(tmp_path / "ext.onnx.data")
    result = cli("optimize", path, tmp_path / "o.onnx")
    assert result.code == 2 and "external data" in result.err and "Traceback" not in result.err
    assert not (tmp_path / "o.onnx").exists()
