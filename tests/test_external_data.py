"""Big weights stay in their file: loading leaves them there, passes read them on demand,
engines map them, and writing streams them into OUT's data file (scanopt.external_data)."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

from cell_builders import guarded_nodes

from scanopt.engines import run
from scanopt.external_data import FOLDER_KEY, INLINE_BELOW, source
from scanopt.ir import export_model, import_model
from scanopt.model_io import load, load_model, save_model
from scanopt.protos import walk_proto_graphs
from scanopt.verify import compare_models

E = H = 128  # W and R are 64 KiB each: big enough to stay in the file
ROWS, T = 1024, 4


def _rnn_model(rows: int = ROWS) -> onnx.ModelProto:
    """An embedding table [rows, E] gathered into X, a tanh RNN Scan over X reading W and
    R from the outer graph, and another big table the Scan does not read."""
    rng = np.random.default_rng(0)
    vi = h.make_tensor_value_info
    n = h.make_node
    body = h.make_graph(
        [n("MatMul", ["x_t", "W"], ["xw"]), n("MatMul", ["h_in", "R"], ["hr"]), n("Add", ["xw", "hr"], ["pre"]),
         n("Add", ["pre", "b"], ["pre_b"]), n("Tanh", ["pre_b"], ["h_out"]), n("Identity", ["h_out"], ["y_t"])],
        "body", [vi("h_in", TP.FLOAT, [1, H]), vi("x_t", TP.FLOAT, [1, E])],
        [vi("h_out", TP.FLOAT, [1, H]), vi("y_t", TP.FLOAT, [1, H])])
    nodes = [n("Gather", ["table", "ids"], ["X"], name="embed"),
             n("Scan", ["h0", "X"], ["h_n", "Y"], name="rnn", num_scan_inputs=1, body=body),
             n("Gather", ["other", "ids"], ["Z"], name="side")]
    inits = [numpy_helper.from_array(rng.standard_normal((rows, E), dtype=np.float32), "table"),
             numpy_helper.from_array((rng.standard_normal((E, H)) * 0.1).astype(np.float32), "W"),
             numpy_helper.from_array((rng.standard_normal((H, H)) * 0.1).astype(np.float32), "R"),
             numpy_helper.from_array((rng.standard_normal(H) * 0.1).astype(np.float32), "b"),
             numpy_helper.from_array(rng.standard_normal((256, 256), dtype=np.float32), "other")]
    graph = h.make_graph(nodes, "main", [vi("ids", TP.INT64, [T, 1]), vi("h0", TP.FLOAT, [1, H])],
                         [vi("h_n", TP.FLOAT, [1, H]), vi("Y", TP.FLOAT, [T, 1, H]), vi("Z", TP.FLOAT, [T, 1, 256])],
                         initializer=inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def _saved(folder, name="m.onnx", data="weights.bin"):
    path = folder / name
    onnx.save_model(_rnn_model(), path, save_as_external_data=True, location=data, size_threshold=1024)
    return path


def _digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _feeds(seed=0):
    rng = np.random.default_rng(seed)
    return {"ids": rng.integers(0, 256, (T, 1)).astype(np.int64), "h0": rng.standard_normal((1, H), dtype=np.float32)}


def _run_file(path, feeds):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def test_loading_leaves_big_tensors_in_their_file(tmp_path):
    path = _saved(tmp_path)
    loaded = load(str(path))
    inits = {t.name: t for t in loaded.model.graph.initializer}
    assert loaded.had_external_data
    assert loaded.model.ByteSize() < INLINE_BELOW  # the 512 KiB table and the weights are not in the proto
    for name in ("table", "W", "R", "other"):
        where = source(inits[name])
        assert where is not None and where.path == os.path.realpath(tmp_path / "weights.bin"), name
    assert inits["b"].data_location == TP.DEFAULT and len(inits["b"].raw_data) == 4 * H  # small: read in


def test_a_weight_a_pass_reads_is_mapped_and_written_back_as_its_reference(tmp_path):
    loaded = load(str(_saved(tmp_path)))
    graph = import_model(loaded.model)
    table = graph.tensors()["table"]
    values = table.values
    assert isinstance(values, np.memmap) and not values.flags.writeable
    expected = numpy_helper.to_array(_rnn_model().graph.initializer[0])
    np.testing.assert_array_equal(values[[0, 5, ROWS - 1]], expected[[0, 5, ROWS - 1]])
    exported = export_model(graph, loaded.model)
    assert source({t.name: t for t in exported.graph.initializer}["table"]) is not None
    assert exported.ByteSize() < INLINE_BELOW


def test_optimize_streams_every_weight_into_outs_data_file(cli, tmp_path):
    src_dir, out_dir = tmp_path / "in", tmp_path / "out"
    src_dir.mkdir()
    out_dir.mkdir()
    src = _saved(src_dir)
    before = {name: _digest(src_dir / name) for name in os.listdir(src_dir)}
    out = out_dir / "o.onnx"
    result = cli("optimize", src, out, "--target", "portable")
    assert result.code == 0, result.err
    assert "fused into RNN" in result.out and "equivalent" in result.out
    assert {name: _digest(src_dir / name) for name in os.listdir(src_dir)} == before  # inputs untouched
    assert sorted(os.listdir(out_dir)) == ["o.onnx", "o.onnx.data"]
    written = onnx.load(str(out), load_external_data=False)
    assert [n.op_type for n in guarded_nodes(written.graph)].count("RNN") == 1
    data_size = os.path.getsize(out_dir / "o.onnx.data")
    tensors = {t.name: t for g in walk_proto_graphs(written.graph) for t in g.initializer}  # some in an If branch
    for tensor in tensors.values():
        info = {e.key: e.value for e in tensor.external_data}
        if tensor.data_location == TP.EXTERNAL:
            assert set(info) == {"location", "offset", "length"}, info  # no scanopt mark left
            assert info["location"] == "o.onnx.data" and int(info["offset"]) + int(info["length"]) <= data_size
        else:
            assert len(tensor.raw_data) < 1024, tensor.name
    rnn = next(n for n in guarded_nodes(written.graph) if n.op_type == "RNN")
    new_weight = tensors[rnn.input[1]]
    assert new_weight.data_location == TP.EXTERNAL  # a weight the rewrite made lands in OUT's data file
    stored = {t.name: t for t in onnx.load(str(out)).graph.initializer}
    original = {t.name: t for t in _rnn_model().graph.initializer}
    for name in ("table", "other"):
        np.testing.assert_array_equal(numpy_helper.to_array(stored[name]), numpy_helper.to_array(original[name]))
    for seed in range(2):
        want, got = _run_file(src, _feeds(seed)), _run_file(out, _feeds(seed))
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)


def test_big_tensors_are_aligned_for_memory_mapping(cli, tmp_path):
    src = tmp_path / "m.onnx"
    model = _rnn_model(rows=4096)  # a 2 MiB table, after a 1 KiB tensor
    model.graph.initializer.insert(0, numpy_helper.from_array(np.ones(256, np.float32), "first"))
    model.graph.node.insert(0, h.make_node("Identity", ["first"], ["first_copy"]))
    model.graph.output.append(h.make_tensor_value_info("first_copy", TP.FLOAT, [256]))
    onnx.save_model(model, src, save_as_external_data=True, location="m.data", size_threshold=1024)
    out = tmp_path / "o.onnx"
    assert cli("optimize", src, out, "--no-verify").code == 0
    offsets = {t.name: int({e.key: e.value for e in t.external_data}["offset"])
               for t in onnx.load(str(out), load_external_data=False).graph.initializer if t.data_location == TP.EXTERNAL}
    assert offsets["first"] == 0 and offsets["table"] % 65536 == 0 and offsets["table"] > 0


def test_saving_without_external_data_reads_the_bytes_in(tmp_path):
    loaded = load(str(_saved(tmp_path)))
    out = tmp_path / "inline.onnx"
    save_model(loaded.model, str(out), external_data=False)
    assert sorted(os.listdir(tmp_path)) == ["inline.onnx", "m.onnx", "weights.bin"]
    written = onnx.load(str(out), load_external_data=False)
    assert all(t.data_location != TP.EXTERNAL for t in written.graph.initializer)
    want, got = _run_file(tmp_path / "m.onnx", _feeds()), _run_file(out, _feeds())
    np.testing.assert_array_equal(got["Y"], want["Y"])


@pytest.mark.parametrize("engine", ["ort", "reference"])
def test_engines_run_a_model_whose_weights_are_in_its_file(tmp_path, engine):
    path = _saved(tmp_path)
    loaded = load(str(path))
    got = run(loaded.model, _feeds(), engine)
    want = _run_file(path, _feeds())
    np.testing.assert_allclose(got["Y"], want["Y"], rtol=1e-5, atol=1e-6)
    table = loaded.model.graph.initializer[0]
    assert source(table) is not None and FOLDER_KEY in {e.key for e in table.external_data}  # not read in in place


def test_models_in_two_folders_compare(tmp_path):
    """`scanopt verify A B`: each model's references are relative to its own folder."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = load(str(_saved(tmp_path / "a"))), load(str(_saved(tmp_path / "b", data="other.bin")))
    os.unlink(tmp_path / "a" / "m.onnx")  # the proto is in memory; only the data file is read
    assert compare_models(a.model, b.model, engine="ort", seeds=1).passed


def test_a_truncated_data_file_is_a_clear_error(cli, tmp_path):
    path = _saved(tmp_path)
    with open(tmp_path / "weights.bin", "r+b") as handle:
        handle.truncate(1000)
    result = cli("optimize", path, tmp_path / "o.onnx")
    assert result.code == 2 and "cannot read its external data" in result.err and "Traceback" not in result.err
    assert not (tmp_path / "o.onnx").exists()


def test_a_length_that_disagrees_with_the_shape_is_refused(cli, tmp_path):
    path = _saved(tmp_path)
    model = onnx.load(str(path), load_external_data=False)
    table = next(t for t in model.graph.initializer if t.name == "table")
    table.dims[0] = ROWS // 2
    path.write_bytes(model.SerializeToString())
    result = cli("inspect", path)
    assert result.code == 2 and "its type and shape need" in result.err


def test_original_and_candidate_sessions_share_one_mapping_of_a_weight(tmp_path):
    """Both sessions of a verification get the same memory-mapped buffer for a weight that
    stays in its file: onnxruntime uses it as it is, so the weight is resident once."""
    import onnxruntime as ort_module

    from scanopt.engines import ort_source

    loaded = load(str(_saved(tmp_path)))
    candidate = export_model(import_model(loaded.model), loaded.model)
    _, original_values = ort_source(loaded.model, ort_module.SessionOptions())
    _, candidate_values = ort_source(candidate, ort_module.SessionOptions())
    assert len(original_values) == 4  # table, W, R, other: every main-graph weight left in the file
    assert [id(v) for v in original_values] == [id(v) for v in candidate_values]


def test_weights_inside_a_body_stay_in_the_file_and_are_written_out(cli, tmp_path):
    """W and R as the Scan body's own initializers: onnxruntime maps them from the folder,
    and OUT's data file gets them (or what a rewrite made of them) at every level."""
    model = _rnn_model()
    scan = next(n for n in model.graph.node if n.op_type == "Scan")
    body = scan.attribute[0].g
    moved = [t for t in model.graph.initializer if t.name in ("W", "R")]
    body.initializer.extend(moved)
    kept = [t for t in model.graph.initializer if t.name not in ("W", "R")]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    src = tmp_path / "m.onnx"
    onnx.save_model(model, src, save_as_external_data=True, location="m.bin", size_threshold=1024)
    loaded = load(str(src))
    assert source(next(t for t in loaded.model.graph.node[1].attribute[0].g.initializer if t.name == "W")) is not None
    out = tmp_path / "o.onnx"
    result = cli("optimize", src, out)
    assert result.code == 0 and "equivalent" in result.out, result.out + result.err
    written = onnx.load(str(out), load_external_data=False)
    for tensor in onnx.external_data_helper._get_initializer_tensors(written):
        if tensor.data_location == TP.EXTERNAL:
            assert {e.key: e.value for e in tensor.external_data}["location"] == "o.onnx.data"
        else:
            assert len(tensor.raw_data) < 1024, tensor.name
    for seed in range(2):
        want, got = _run_file(src, _feeds(seed)), _run_file(out, _feeds(seed))
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)


def test_both_engines_check_a_model_whose_weights_are_in_its_file(tmp_path):
    """The reference executor takes the weights as feeds (shared memory maps), onnxruntime
    as initializers: both agree with each other and with the candidate."""
    loaded = load(str(_saved(tmp_path)))
    candidate = export_model(import_model(loaded.model), loaded.model)
    result = compare_models(loaded.model, candidate, engine="both", seeds=1)
    assert result.passed and result.engine == "both"
    assert {c.label for c in result.comparisons} >= {"original: reference vs ort", "candidate vs original [reference]"}


def test_library_load_model_gives_an_ordinary_proto_unless_asked_to_keep_weights_in_their_file(tmp_path):
    """A conversion pipeline that loads with scanopt and saves with onnx must get a file
    onnxruntime loads; keep_external_data=True is the opt-in for the low-memory proto."""
    src = _saved(tmp_path)
    plain = load_model(str(src))
    assert not any(e.key == "scanopt.folder" for t in plain.graph.initializer for e in t.external_data)
    assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in plain.graph.initializer)
    out = tmp_path / "elsewhere" / "plain.onnx"
    out.parent.mkdir()
    onnx.save(plain, str(out))
    feeds = _feeds()
    np.testing.assert_array_equal(_run_file(out, feeds)["Y"], _run_file(src, feeds)["Y"])  # no scanopt marks in it
    kept = load_model(str(src), keep_external_data=True)
    assert any(e.key == "scanopt.folder" for t in kept.graph.initializer for e in t.external_data)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64])
def test_a_big_tensor_in_a_typed_field_goes_to_the_data_file_too(tmp_path, dtype):
    """Exporters also write values in float_data/int32_data/int64_data instead of raw_data;
    such a tensor over the threshold belongs in OUT.data like any other."""
    values = (np.arange(4096) % 97).astype(dtype).reshape(64, 64)
    tensor = h.make_tensor("W", onnx.helper.np_dtype_to_tensor_dtype(values.dtype), values.shape,
                           values.flatten().tolist())
    assert not tensor.HasField("raw_data")
    elem = tensor.data_type
    graph = h.make_graph([h.make_node("Identity", ["W"], ["Y"])], "g", [], [h.make_tensor_value_info("Y", elem, [64, 64])],
                         initializer=[tensor])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    out = tmp_path / "o.onnx"
    save_model(model, str(out), external_data=True)
    (stored,) = onnx.load(str(out), load_external_data=False).graph.initializer
    assert stored.data_location == onnx.TensorProto.EXTERNAL and not stored.float_data and not stored.int32_data
    assert os.path.getsize(tmp_path / "o.onnx.data") == values.nbytes
    np.testing.assert_array_equal(run(str(out), {}, "ort")["Y"], values)


def _with_entries(path, name, entries):
    """Rewrite ``path`` so that tensor ``name``'s external_data holds ``entries`` as given."""
    model = onnx.load(str(path), load_external_data=False)
    tensor = next(t for t in model.graph.initializer if t.name == name)
    del tensor.external_data[:]
    for key, value in entries:
        tensor.external_data.add(key=key, value=value)
    path.write_bytes(model.SerializeToString())


@pytest.mark.parametrize("command", ["optimize", "run", "inspect"])
@pytest.mark.parametrize("second", ["location", "offset", "length"])
def test_a_key_named_twice_in_external_data_is_refused(cli, tmp_path, command, second):
    """The confinement check once read the first 'location', the loader the last: a model
    could pass 'w.bin' and read '/etc/passwd'. Every duplicate key is refused."""
    outside = tmp_path / "secret.bin"
    outside.write_bytes(b"s" * (ROWS * E * 4))
    (tmp_path / "m").mkdir()
    path = _saved(tmp_path / "m")
    first = {e.key: e.value for e in next(t for t in onnx.load(str(path), load_external_data=False).graph.initializer
                                         if t.name == "table").external_data}
    entries = list(first.items())
    entries.append((second, {"location": str(outside), "offset": "0", "length": first["length"]}[second]))
    _with_entries(path, "table", entries)
    out = tmp_path / "m" / "o.onnx"
    args = {"optimize": (path, out, "--no-verify"), "run": (path,), "inspect": (path,)}[command]
    result = cli(command, *args)
    assert result.code == 2, result
    assert f"external data key '{second}' twice" in result.err and "Traceback" not in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert not out.exists() and "sss" not in result.out


@pytest.mark.parametrize("key", ["scanopt.folder", "basepath", "Location"])
def test_an_unknown_external_data_key_is_refused(cli, tmp_path, key):
    path = _saved(tmp_path)
    model = onnx.load(str(path), load_external_data=False)
    entries = [(e.key, e.value) for e in next(t for t in model.graph.initializer if t.name == "table").external_data]
    _with_entries(path, "table", entries + [(key, "/etc")])
    result = cli("inspect", path)
    assert result.code == 2 and f"unknown external data key '{key}'" in result.err


def test_a_checksum_key_is_accepted_as_onnxruntime_accepts_it(cli, tmp_path):
    path = _saved(tmp_path)
    model = onnx.load(str(path), load_external_data=False)
    entries = [(e.key, e.value) for e in next(t for t in model.graph.initializer if t.name == "table").external_data]
    _with_entries(path, "table", entries + [("checksum", "0")])
    out = tmp_path / "o.onnx"
    assert cli("optimize", path, out, "--no-verify").code == 0
    np.testing.assert_allclose(_run_file(out, _feeds())["Y"], _run_file(tmp_path / "m.onnx", _feeds())["Y"], rtol=1e-5, atol=1e-6)
