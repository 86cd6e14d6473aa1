"""Memory on big inline models (README, "Bounds"): sizing a model for the protobuf limit
serializes nothing, a load reserves the file's size and not protobuf's 2 GiB, and running
out of memory anywhere is one line, exit 1, nothing written. Peaks themselves are measured
in benchmarks/bench_memory.py --inline."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import helper as h
from onnx import numpy_helper

import builders as b
from scanopt.external_data import serialized_size_bound


def _with_weight(model: onnx.ModelProto, array: np.ndarray, name: str = "big") -> onnx.ModelProto:
    model.graph.initializer.append(numpy_helper.from_array(array, name))
    return model


@pytest.mark.parametrize("array", [np.arange(50_000, dtype=np.float32), -np.arange(50_000, dtype=np.int64),
                                   np.ones((300, 300), np.float64)])
@pytest.mark.parametrize("typed", [False, True])
def test_the_size_bound_is_never_below_the_serialized_size_and_close_to_it(array, typed):
    tensor = numpy_helper.from_array(array, "big")
    if typed:  # the same values in the typed field (float_data, int64_data, double_data)
        field = {np.float32: "float_data", np.int64: "int64_data", np.float64: "double_data"}[array.dtype.type]
        tensor.ClearField("raw_data")
        getattr(tensor, field).extend(array.ravel().tolist())
    model = b.scan9_sum(weight=np.ones(2, np.float32))
    model.graph.initializer.append(tensor)
    size = model.ByteSize()
    assert size <= serialized_size_bound(model) <= size * 2.5 + 4096


def test_sizing_a_model_serializes_none_of_its_big_weights(monkeypatch):
    """upb's ByteSize encodes the message: on the big weight it would copy it whole."""
    model = _with_weight(b.scan9_sum(), np.zeros(1 << 18, np.float32))
    calls = []
    real = onnx.TensorProto.ByteSize
    monkeypatch.setattr(onnx.TensorProto, "ByteSize", lambda self: calls.append((self.name, self.HasField("raw_data"))) or real(self))
    assert serialized_size_bound(model) >= model.graph.initializer[0].ByteSize() - 16
    calls.clear()
    serialized_size_bound(model)
    assert ("big", True) not in calls and ("big", False) in calls  # only its skeleton (type, dims)


def test_a_load_reserves_the_files_size_not_protobufs_limit(tmp_path, monkeypatch):
    """read(n) allocates n bytes first: asked for the limit, every load took 2 GiB of
    address space (a memory-capped run failed there)."""
    import io

    from scanopt import model_io

    path = tmp_path / "m.onnx"
    onnx.save(b.scan9_sum(), path)
    asked = []
    real = io.FileIO.read

    class Recording(io.BufferedReader):
        def read(self, size=-1):
            asked.append(size)
            return super().read(size)

    monkeypatch.setattr(model_io, "open", lambda p, mode: Recording(io.FileIO(p, mode)), raising=False)
    model = model_io.load(str(path)).model
    assert model.graph.node[0].op_type == "Scan" and real is io.FileIO.read
    assert asked and max(asked) <= os.path.getsize(path) + 1


@pytest.mark.parametrize("where,commands", [
    ("scanopt.model_io.serialized_size_bound", ["optimize"]),  # deciding how to write OUT
    ("scanopt.model_io.validate_model", ["optimize", "inspect"]),  # loading
    ("scanopt.ir.export_model", ["optimize"]),  # building the candidate
])
def test_out_of_memory_anywhere_is_one_line_exit_1_and_nothing_written(cli, tmp_path, monkeypatch, where, commands):
    import importlib

    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(b.scan9_sum(steps=3, weight=np.ones(2, np.float32)), src)
    module, name = where.rsplit(".", 1)

    def exhausted(*args, **kwargs):
        raise MemoryError

    for module_name in {module, "scanopt.pipeline", "scanopt.cli.inspect_cmd"}:  # where it is imported by name
        if hasattr(importlib.import_module(module_name), name):
            monkeypatch.setattr(importlib.import_module(module_name), name, exhausted)
    argvs = {"optimize": ["optimize", src, out, "--unroll-max", "8"], "inspect": ["inspect", src]}
    for command in commands:
        result = cli(*argvs[command])
        assert result.code == 1, result
        assert result.err.strip().splitlines() == [
            "scanopt: out of memory: the run needs more memory than this process may use; nothing written"]
    assert sorted(os.listdir(tmp_path)) == ["in.onnx"]  # no OUT, no staging left behind


def test_inference_out_of_memory_only_costs_its_hints(cli, tmp_path, monkeypatch):
    """Shape inference is a hint: a MemoryError in it leaves fewer shapes, not a failed run."""
    from scanopt import shapes

    def exhausted(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(shapes, "bounded_inference", exhausted)
    src = tmp_path / "in.onnx"
    onnx.save(b.scan9_sum(steps=3), src)
    result = cli("inspect", src)
    assert result.code == 0 and "Scan-11" in result.out


def test_the_checker_gets_a_big_model_without_its_weights_and_still_rejects_what_is_broken(monkeypatch):
    from scanopt.errors import InvalidModelError
    from scanopt.validate import validate_model

    model = _with_weight(b.scan9_sum(weight=np.ones(2, np.float32)), np.zeros(1 << 18, np.float32))
    checked = []
    real = onnx.checker.check_model
    monkeypatch.setattr(onnx.checker, "check_model", lambda m, *a, **k: checked.append(len(m)) or real(m, *a, **k))
    assert validate_model(model) == []
    assert checked and max(checked) < 64 * 1024 < model.ByteSize()  # a 1 MB weight, not sent
    assert len(model.graph.initializer[-1].raw_data) == 4 << 18  # the model itself untouched
    model.graph.node[0].attribute.add().CopyFrom(h.make_attribute("num_scan_inputs", 1))  # listed twice
    with pytest.raises(InvalidModelError, match="onnx.checker rejects it"):
        validate_model(model)


def test_a_big_file_is_not_kept_beside_its_parse(tmp_path, monkeypatch):
    """Over CHECK_WHOLE_BELOW the bytes read are dropped before validation (the checker gets
    the copy without weights): the file is in memory once, as the parsed model."""
    from scanopt import model_io

    path = tmp_path / "m.onnx"
    onnx.save(_with_weight(b.scan9_sum(), np.zeros(1 << 16, np.float32)), path)
    seen = []
    real = model_io.validate_model
    monkeypatch.setattr(model_io, "validate_model", lambda m, **k: seen.append(k["serialized"]) or real(m, **k))
    model_io.load(str(path))
    monkeypatch.setattr(model_io, "CHECK_WHOLE_BELOW", 1024)
    model_io.load(str(path))
    assert seen[0] is not None and seen[1] is None
