"""Adversarial review of big weights left in their file (scanopt.external_data): the
committed corpus saved with every tensor external, odd external data, and paths."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import scanopt.external_data as external_data
from scanopt.cli import main
from scanopt.engines import run
from scanopt.external_data import FOLDER_KEY
from scanopt.inputs import synthesize_inputs

MODELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")


def _digests(folder) -> dict:
    return {os.path.relpath(os.path.join(root, f), folder): hashlib.sha256(open(os.path.join(root, f), "rb").read()).hexdigest()
            for root, _, names in os.walk(folder) for f in names}


def _save_external(source: str, folder, name="m.onnx", data="m.data", threshold=0):
    path = os.path.join(folder, name)
    onnx.save_model(onnx.load(source), path, save_as_external_data=True, location=data,
                    size_threshold=threshold, convert_attribute=True)
    return path


def _no_marks(folder) -> None:
    for root, _, names in os.walk(folder):
        for name in names:
            assert FOLDER_KEY.encode() not in open(os.path.join(root, name), "rb").read(), name


def test_same_named_weights_in_two_bodies_both_read_from_their_file(tmp_path, monkeypatch, capsys):
    """A bidirectional TF export keeps a weight 'R' in each direction's body: both must be
    read from the file (one used to get gs's own reader, which looks in the working
    directory: a ValidationError traceback)."""
    monkeypatch.setattr(external_data, "INLINE_BELOW", 32)  # the weights stay in their file
    source = os.path.join(MODELS, "heldout_cells", "tf_birnn_reverse_sequence_fill_lengths.onnx")
    (tmp_path / "in").mkdir()
    path = _save_external(source, tmp_path / "in")
    before = _digests(tmp_path / "in")
    out = str(tmp_path / "out.onnx")
    assert main(["optimize", path, out, "-q"]) == 0, capsys.readouterr().err
    assert _digests(tmp_path / "in") == before
    _no_marks(tmp_path)
    original = onnx.load(source)
    feeds = synthesize_inputs(original, seed=0)
    expected = run(original, feeds)
    got = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, feeds)
    for name, value in zip([o.name for o in original.graph.output], got):
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6)


def _rnn_saved(folder, name="m.onnx", data="w.bin"):
    from test_external_data import _rnn_model

    path = os.path.join(folder, name)
    onnx.save_model(_rnn_model(), path, save_as_external_data=True, location=data, size_threshold=1024)
    return path


def _rnn_outputs_match(path) -> bool:
    from test_external_data import _feeds, _rnn_model

    expected = ort.InferenceSession(_rnn_model().SerializeToString(), providers=["CPUExecutionProvider"]).run(None, _feeds())
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, _feeds())
    return all(np.allclose(a, b, atol=1e-5) for a, b in zip(got, expected))


def test_a_data_file_changed_after_loading_is_refused_not_written_into_out(tmp_path, monkeypatch, capsys):
    """The weights verification checked are the ones OUT gets: a data file rewritten
    (same size, new bytes) between load and save fails the run, and nothing is written."""
    import scanopt.cli.optimize_cmd as optimize_cmd

    path = _rnn_saved(tmp_path)
    data = tmp_path / "w.bin"
    optimize = optimize_cmd.optimize

    def optimize_then_edit(*args, **kwargs):
        result = optimize(*args, **kwargs)
        raw = bytearray(data.read_bytes())
        raw[100_000:100_008] = b"\x7f" * 8
        data.write_bytes(bytes(raw))
        return result

    monkeypatch.setattr(optimize_cmd, "optimize", optimize_then_edit)
    out = tmp_path / "o.onnx"
    assert main(["optimize", path, str(out), "--target", "portable"]) == 2
    err = capsys.readouterr().err.strip()
    assert "changed since the model was loaded" in err and len(err.splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "w.bin"]


def test_in_place_with_a_data_file_of_another_name_keeps_it_and_writes_out_data(tmp_path, capsys):
    path = _rnn_saved(tmp_path)
    before = _digests(tmp_path)["w.bin"]
    assert main(["optimize", path, path, "--in-place", "--target", "portable", "-q"]) == 0, capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data", "w.bin"]
    assert _digests(tmp_path)["w.bin"] == before
    assert _rnn_outputs_match(path)
    _no_marks(tmp_path)


def test_relative_paths_from_another_working_directory(tmp_path, monkeypatch, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _rnn_saved(tmp_path / "a")
    monkeypatch.chdir(tmp_path / "b")
    assert main(["optimize", "../a/m.onnx", "../o.onnx", "--target", "portable", "-q"]) == 0, capsys.readouterr().err
    assert main(["verify", "../a/m.onnx", "../o.onnx"]) == 0, capsys.readouterr().err
    assert _rnn_outputs_match(tmp_path / "o.onnx")
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "o.onnx", "o.onnx.data"]


@pytest.mark.parametrize("keep", [False, True])
def test_a_model_saved_with_external_data_saves_again_with_its_own_data_file(tmp_path, keep):
    """save_model converts the tensors to references in place; saving the same proto again
    elsewhere must give a model complete on its own (it used to point at the first
    save's data file, a file that is not beside it)."""
    from scanopt import load_model, save_model

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    model = load_model(_rnn_saved(tmp_path), keep_external_data=keep)
    save_model(model, str(tmp_path / "a" / "first.onnx"), external_data=True)
    save_model(model, str(tmp_path / "b" / "second.onnx"), external_data=True)
    save_model(model, str(tmp_path / "b" / "whole.onnx"), external_data=False)
    assert sorted(os.listdir(tmp_path / "b")) == ["second.onnx", "second.onnx.data", "whole.onnx"]
    for folder in ("a", "b"):
        _no_marks(tmp_path / folder)
    for path in (tmp_path / "a" / "first.onnx", tmp_path / "b" / "second.onnx", tmp_path / "b" / "whole.onnx"):
        assert _rnn_outputs_match(path), path
    (tmp_path / "b" / "second.onnx.data").write_bytes(b"")  # the file the proto now refers to changed
    with pytest.raises(Exception, match="changed since"):
        save_model(model, str(tmp_path / "b" / "third.onnx"), external_data=True)
    assert "third.onnx" not in os.listdir(tmp_path / "b")


def test_a_windows_style_location_is_one_line_that_says_what_to_change(tmp_path, capsys):
    """onnx and onnxruntime read 'sub\\w.bin' only on Windows; scanopt refuses it with a
    line that names the fix, and writes nothing."""
    (tmp_path / "sub").mkdir()
    path = _rnn_saved(tmp_path, data="sub/w.bin")
    model = onnx.load(path, load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "sub\\w.bin"
    onnx.save(model, path)
    before = _digests(tmp_path)
    assert main(["optimize", path, str(tmp_path / "o.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Windows path" in err and "'sub/w.bin'" in err
    assert _digests(tmp_path) == before


# -- the committed corpus with every tensor in external data --------------------------------

SAMPLE = [
    "scan_gru.onnx", "scan8_reverse_seqlens.onnx", "torch_scan_rnn.onnx",
    "real/nested_scan8_in_if_o8.onnx", "real/ort_mixed_types_o16.onnx", "real/untidy_onnxscript_scan_rnn.onnx",
    "cells/rnn_packed_slice_leakyrelu_clip.onnx", "skl/gp_regressor_sum.onnx", "maps/map_state_gemm.onnx",
    "heldout_cells/tf_birnn_reverse_sequence_fill_lengths.onnx",
]
CORPUS = sorted(os.path.relpath(os.path.join(root, f), MODELS) for root, _, names in os.walk(MODELS)
                for f in names if f.endswith(".onnx"))
FLAGS = {"default": [], "both": ["--engine", "both"], "hoist": ["--passes", "hoist"], "opset17": ["--target-opset", "17"]}


def _matrix():
    if os.environ.get("SCANOPT_FULL_MATRIX") == "1":
        return [(name, flags) for name in CORPUS for flags in FLAGS]
    return [(name, "default") for name in SAMPLE] + [(SAMPLE[i], flags) for i, flags in ((1, "opset17"), (6, "hoist"), (7, "both"))] + [
        ("scan_lstm.onnx", "opset17")]  # migration checked a model whose weights are in a file: exit 2


def _report(path) -> dict:
    import json

    with open(path) as handle:
        return json.load(handle)


def _without_data(model: onnx.ModelProto) -> bytes:
    """The model's structure with every tensor's bytes and data location left out."""
    copy = onnx.ModelProto.FromString(model.SerializeToString())
    for tensor in onnx.external_data_helper._get_all_tensors(copy):
        for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data",
                      "string_data", "external_data", "data_location", "name"):
            tensor.ClearField(field)
    return copy.SerializeToString()


def _values(model: onnx.ModelProto) -> dict:
    return {t.name: numpy_helper.to_array(t) for t in onnx.external_data_helper._get_all_tensors(model) if t.name}


@pytest.mark.parametrize("name, flags", _matrix())
def test_the_corpus_with_every_tensor_external_optimizes_as_inline(name, flags, tmp_path, monkeypatch, capsys):
    """Each sample saved with every tensor (Constant attributes and body initializers too)
    in one data file: optimize gives the same exit code, the same per-node outcomes and
    the same model as from the inline file; OUT has no scanopt mark and loads in onnx and
    onnxruntime; the input files are untouched. Weights of 256 bytes or more stay in
    their file (the default keeps those under 64 KiB in memory, which would leave these
    small models nothing to keep)."""
    monkeypatch.setattr(external_data, "INLINE_BELOW", 256)
    source = os.path.join(MODELS, name)
    (tmp_path / "in").mkdir()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    inline = str(tmp_path / "inline.onnx")
    onnx.save(onnx.load(source), inline)
    path = _save_external(source, tmp_path / "in")
    before = _digests(tmp_path / "in")
    extra = FLAGS[flags]
    code_inline = main(["optimize", inline, str(tmp_path / "a" / "o.onnx"), "-q", "--report", str(tmp_path / "a.json")] + extra)
    err_inline = capsys.readouterr().err
    code = main(["optimize", path, str(tmp_path / "b" / "o.onnx"), "-q", "--report", str(tmp_path / "b.json")] + extra)
    err = capsys.readouterr().err
    assert code == code_inline, (err_inline, err)
    assert _digests(tmp_path / "in") == before
    if code != 0:
        assert os.listdir(tmp_path / "b") == []
        return
    assert _report(tmp_path / "a.json")["outcomes"] == _report(tmp_path / "b.json")["outcomes"]
    _no_marks(tmp_path / "b")
    want, got = onnx.load(str(tmp_path / "a" / "o.onnx")), onnx.load(str(tmp_path / "b" / "o.onnx"))
    assert _without_data(got) == _without_data(want)
    want_values, got_values = _values(want), _values(got)
    assert want_values.keys() == got_values.keys()
    for key, value in want_values.items():
        np.testing.assert_array_equal(got_values[key], value, err_msg=key)
    try:
        ort.InferenceSession(str(tmp_path / "a" / "o.onnx"), providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - the inline result is not loadable either: nothing to compare
        return
    ort.InferenceSession(str(tmp_path / "b" / "o.onnx"), providers=["CPUExecutionProvider"])


def test_every_dtype_and_a_zero_size_tensor_survive_a_trip_through_the_file(tmp_path, monkeypatch, capsys):
    """float16, bfloat16, bool, int8, int4 (packed), float64 and an empty tensor, each left
    in the data file (a string tensor cannot be): OUT holds the same values, with every
    engine."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from onnx import helper as h

    monkeypatch.setattr(external_data, "INLINE_BELOW", 0)
    n = 4000
    arrays = {
        "f16": np.arange(n, dtype=np.float16).reshape(40, 100),
        "bf16": np.arange(n, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(40, 100),
        "b": (np.arange(n) % 3 == 0).reshape(40, 100),
        "i8": (np.arange(n) % 100).astype(np.int8).reshape(40, 100),
        "i4": ((np.arange(n) % 16) - 8).astype(ml_dtypes.int4).reshape(40, 100),
        "f64": np.arange(n, dtype=np.float64).reshape(40, 100),
        "zero": np.zeros((0, 5), np.float32),
    }
    inits = [numpy_helper.from_array(a, name) for name, a in arrays.items()]
    inits.append(h.make_tensor("s", onnx.TensorProto.STRING, [3], [b"a", b"bb", b"ccc"]))
    names = [t.name for t in inits]
    graph = h.make_graph([h.make_node("Identity", [x], [x + "_o"]) for x in names], "g", [],
                         [h.make_tensor_value_info(x + "_o", t.data_type, list(t.dims)) for x, t in zip(names, inits)],
                         initializer=inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 21)], ir_version=10)
    (tmp_path / "in").mkdir()
    path = str(tmp_path / "in" / "m.onnx")
    onnx.save_model(model, path, save_as_external_data=True, location="w.bin", size_threshold=0)
    for engine in ("auto", "reference", "both"):
        out = tmp_path / f"o_{engine}.onnx"
        assert main(["optimize", path, str(out), "--engine", engine, "-q"]) == 0, capsys.readouterr().err
        got = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(out)).graph.initializer}
        for name, value in arrays.items():
            assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
            np.testing.assert_array_equal(got[name].astype(np.float64), value.astype(np.float64), err_msg=name)
        assert [x.decode() if isinstance(x, bytes) else x for x in got["s"]] == ["a", "bb", "ccc"]
    _no_marks(tmp_path)


@pytest.mark.parametrize("engine", ["ort", "reference"])
def test_a_feed_overrides_a_weight_in_the_file_that_is_also_a_graph_input(tmp_path, engine):
    """An initializer that is also a graph input is a default: a feed for it wins, whether
    the weight is in memory or left in its file (the reference executor used to feed the
    file's weight over the user's value)."""
    from onnx import helper as h
    from test_external_data import _feeds, _rnn_model

    from scanopt import load_model

    model = _rnn_model()
    model.graph.input.append(h.make_tensor_value_info("table", onnx.TensorProto.FLOAT, [1024, 128]))
    feeds = {**_feeds(), "table": np.full((1024, 128), 0.5, np.float32)}
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    path = str(tmp_path / "m.onnx")
    onnx.save_model(model, path, save_as_external_data=True, location="w.bin", size_threshold=1024)
    got = run(load_model(path, keep_external_data=True), feeds, engine)
    for want, name in zip(expected, [o.name for o in model.graph.output]):
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-5)


def test_an_out_data_file_no_out_owns_is_refused_not_overwritten(tmp_path, capsys):
    """OUT.data without OUT beside it is another file that happens to have the name (say
    another export's weights): never overwritten. Beside an existing OUT (an earlier
    output being replaced) it is replaced with OUT."""
    path = _rnn_saved(tmp_path)
    other = tmp_path / "c.onnx.data"
    other.write_bytes(b"someone else's weights")
    assert main(["optimize", path, str(tmp_path / "c.onnx"), "-q"]) == 2
    assert "no c.onnx beside it owns it" in capsys.readouterr().err
    assert other.read_bytes() == b"someone else's weights" and not (tmp_path / "c.onnx").exists()
    other.unlink()
    assert main(["optimize", path, str(tmp_path / "c.onnx"), "-q"]) == 0, capsys.readouterr().err
    assert main(["optimize", path, str(tmp_path / "c.onnx"), "-q"]) == 0, capsys.readouterr().err  # replaces its own pair
    assert _rnn_outputs_match(tmp_path / "c.onnx")
